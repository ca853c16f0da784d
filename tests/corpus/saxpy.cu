// One program built several ways: PTX only, two real archs, LTO.
__device__ float fma_helper(float a, float x, float y) { return a * x + y; }

__global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fma_helper(a, x[i], y[i]);
}

void launch_saxpy(float a, const float* x, float* y, int n) { saxpy<<<(n + 255) / 256, 256>>>(a, x, y, n); }
