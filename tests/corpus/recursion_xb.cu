// The other half of recursion_xa.cu's cycle, and a tail-recursive helper
// the compiler turns into a loop (no cycle left for nvlink to see).
__device__ int collatz_even(unsigned n, int depth);

__device__ int collatz_odd(unsigned n, int depth) {
  if (n <= 1) return depth;
  int steps = collatz_even(3 * n + 1, depth + 1);
  return steps > 1000 ? 1000 : steps;
}

__device__ int digits(unsigned n, int acc) { return n < 10 ? acc + 1 : digits(n / 10, acc + 1); }

__global__ void digitCount(const unsigned *v, int *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = digits(v[i], 0);
}

void count_digits(const unsigned *v, int *out, int n) { digitCount<<<(n + 255) / 256, 256>>>(v, out, n); }
