// A diagnostics unit, as libraries carry them: an error counter the
// application reads, the application's templated fill (a second, weak
// definition), and inspection kernels no host code launches. nvlink removes
// those kernels; the names they leave in the string tables open this unit's
// block, ahead of the names of its counter, its dynamic shared memory and its
// line information.
#include <cstdio>

__device__ unsigned int diag_errors;

template <typename T> __global__ void fill(T *p, T v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

__global__ void diag_dump(const float *p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && p[i] != p[i]) printf("bad value at %d\n", i);
}

__global__ void diag_block_sum(const float *p, float *sums, int n) {
  extern __shared__ float partial[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  partial[threadIdx.x] = i < n ? p[i] : 0.f;
  __syncthreads();
  for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) sums[blockIdx.x] = partial[0];
}

void diag_reset(float *p, int n) {
  fill<float><<<(n + 255) / 256, 256>>>(p, 0.f, n);
  cudaMemset(&diag_errors, 0, sizeof(diag_errors));
}
