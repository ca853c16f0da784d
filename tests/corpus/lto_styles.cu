// LTO IR alone (code=lto_90) in styles the other LTO units do not use: device
// and constant variables the host writes (cudaMemcpyToSymbol: host-referenced
// variables, nvlink's -host-ref-eg/-ec lists), a static kernel and one in an
// anonymous namespace (internal host references, -host-ref-ik), printf and
// device malloc (externs the driver provides), a recursive device function
// kept out of line, a template kernel also launched by lto_styles2.cu, a
// kernel the host never launches, and a call into the other unit.
#include <cstdio>

__device__ float gain = 1.0f;
__constant__ float taps[4] = {0.25f, 0.5f, 0.75f, 1.0f};
__device__ int never_read[32];

extern __device__ float styles_blend(float a, float b);

__device__ __noinline__ int collatz(int n, int depth) {
  if (n <= 1 || depth > 64) return depth;
  return collatz((n & 1) ? 3 * n + 1 : n / 2, depth + 1);
}

template <typename T>
__global__ void fill(T* out, T v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = v + T(i);
}

static __global__ void smooth(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = styles_blend(x[i] * taps[i & 3], gain);
}

namespace {
__global__ void steps(int* out, int n) {
  int i = threadIdx.x;
  if (i < n) out[i] = collatz(i + 1, 0);
  if (i == 0) printf("steps %d\n", out[0]);
}
}  // namespace

__global__ void scratch(int n) {
  int* p = static_cast<int*>(malloc(n * sizeof(int)));
  if (p) {
    p[0] = n;
    free(p);
  }
}

__global__ void forgotten(float* x) { x[threadIdx.x] *= gain; }

void styles_run(float* x, int* s, int n) {
  float g = 2.0f;
  cudaMemcpyToSymbol(gain, &g, sizeof g);
  float t[4] = {1, 2, 3, 4};
  cudaMemcpyToSymbol(taps, t, sizeof t);
  fill<float><<<1, 32>>>(x, 1.0f, n);
  smooth<<<1, 32>>>(x, n);
  steps<<<1, 32>>>(s, n);
  scratch<<<1, 1>>>(n);
}
