// Host references to variables alone (a device and a constant variable the
// host writes; no kernel launched from the host) beside dynamic parallelism,
// device functions used and unused, and a kernel nothing launches.
__device__ float gain;
__constant__ float c0;
__device__ __noinline__ float helper(float x) { return x * gain; }
__device__ __noinline__ float unused_helper(float x) { return x + 1; }
__global__ void child(float* p, int n) {
  int i = threadIdx.x;
  if (i < n) p[i] = helper(p[i]);
}
__global__ void parent(float* p, int n) {
  if (threadIdx.x == 0) child<<<1, 64>>>(p, n);
}
__global__ void lonely(float* p) { p[0] = unused_helper(c0); }
void set_gain() {
  float g = 2;
  cudaMemcpyToSymbol(gain, &g, sizeof g);
  cudaMemcpyToSymbol(c0, &g, sizeof g);
}
