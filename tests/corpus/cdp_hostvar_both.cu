// Host-written and host-read device variables beside a kernel the host and
// the device both launch (child), through a chain grand -> parent -> child.
__device__ int counter;
__device__ float scale_by;
__global__ void child(float* p, int n) {
  int i = threadIdx.x;
  if (i < n) p[i] *= scale_by;
  if (i == 0) atomicAdd(&counter, 1);
}
__global__ void parent(float* p, int n) {
  if (threadIdx.x == 0) child<<<1, 64>>>(p, n);
}
__global__ void grand(float* p, int n) {
  if (threadIdx.x == 0) parent<<<1, 1>>>(p, n);
}
int run(float* p, int n) {
  float s = 3;
  cudaMemcpyToSymbol(scale_by, &s, sizeof s);
  child<<<1, 64>>>(p, n);
  grand<<<1, 1>>>(p, n);
  int c = 0;
  cudaMemcpyFromSymbol(&c, counter, sizeof c);
  return c;
}
