// Dynamic parallelism beside device variables the host writes (the demo's
// shape: demo/reduce.cu launches from the device, demo/main.cu writes
// poly_coeff and evaluations): under -dlto nvlink's partial LTO for
// libcudadevrt with host-referenced variables.
__device__ float gain;
__constant__ float offsets[4];
__device__ int never_read[8];
__device__ int bumped;

__global__ void child(float* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * gain + offsets[i & 3];
  if (i == 0) atomicAdd(&bumped, 1);
}

__global__ void parent(float* p, int n) {
  if (threadIdx.x == 0) child<<<(n + 63) / 64, 64>>>(p, n);
}

void run(float* p, int n) {
  float g = 2.0f, o[4] = {0, 1, 2, 3};
  cudaMemcpyToSymbol(gain, &g, sizeof g);
  cudaMemcpyToSymbol(offsets, o, sizeof o);
  parent<<<1, 32>>>(p, n);
}
