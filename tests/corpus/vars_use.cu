extern __device__ int lookup[16];
extern __constant__ int bias;

__global__ void fib_bias(int* out, int n) {
  int i = threadIdx.x;
  if (i < n) out[i] = lookup[i % 16] + bias;
}

void launch_fib_bias(int* out, int n) { fib_bias<<<1, n>>>(out, n); }
