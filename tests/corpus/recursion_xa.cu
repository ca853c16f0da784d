// Recursion across units: a Collatz-style walk whose two halves call each
// other from two files (a cycle nvlink sees only once it has merged them).
__device__ int collatz_odd(unsigned n, int depth);

__device__ int collatz_even(unsigned n, int depth) {
  if (n <= 1) return depth;
  unsigned h = n / 2;
  return (h & 1) ? collatz_odd(h, depth + 1) : collatz_even(h, depth + 1);
}

__global__ void collatzSteps(const unsigned *start, int *steps, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) steps[i] = start[i] & 1 ? collatz_odd(start[i], 0) : collatz_even(start[i], 0);
}

void collatz(const unsigned *start, int *steps, int n) { collatzSteps<<<(n + 255) / 256, 256>>>(start, steps, n); }
