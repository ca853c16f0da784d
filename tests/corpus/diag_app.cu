// An application unit: a templated fill and a scaling pass, launched from the
// host and, for a refinement step, from the device (dynamic parallelism); it
// counts bad values in a counter another unit (diag_kernels.cu) defines.
#include <cstdio>

extern __device__ unsigned int diag_errors;

template <typename T> __global__ void fill(T *p, T v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

__global__ void scale(float *p, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    if (p[i] != p[i]) atomicAdd(&diag_errors, 1u);
    p[i] *= s;
  }
}

__global__ void refine(float *p, int n) {
  if (threadIdx.x == 0 && blockIdx.x == 0) scale<<<(n + 255) / 256, 256>>>(p, 0.5f, n);
}

void diag_reset(float *p, int n);

int main() {
  const int n = 1 << 12;
  float *p;
  cudaMalloc(&p, n * sizeof(float));
  fill<float><<<(n + 255) / 256, 256>>>(p, 1.f, n);
  scale<<<(n + 255) / 256, 256>>>(p, 2.f, n);
  refine<<<1, 32>>>(p, n);
  diag_reset(p, n);
  unsigned int errors = 0;
  cudaMemcpyFromSymbol(&errors, diag_errors, sizeof(errors));
  printf("%u bad values\n", errors);
  cudaFree(p);
  return 0;
}
