// Recursion reached only from a kernel no host code launches: nvlink removes
// the kernel (and the recursive function with it) before it checks stack
// sizes, so the link says nothing.
__device__ unsigned long long factorial(unsigned n) { return n <= 1 ? 1ull : n * factorial(n - 1) + (n & 1); }

__global__ void factorials(unsigned long long *out, int n) {
  int i = threadIdx.x;
  if (i < n) out[i] = factorial(i);
}

__global__ void squares(int *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * i;
}

void run_squares(int *out, int n) { squares<<<(n + 255) / 256, 256>>>(out, n); }
