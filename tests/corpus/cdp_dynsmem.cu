// Dynamic parallelism whose children size their shared memory at launch: a
// parent kernel launches a child with `<<<blocks, threads, bytes>>>`, the
// child uses `extern __shared__`; host code launches the parent.
__global__ void child(const float *in, float *out, int n) {
  extern __shared__ float buf[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x] = i < n ? in[i] : 0.f;
  __syncthreads();
  if (i < n) out[i] = buf[blockDim.x - 1 - threadIdx.x];
}

__global__ void parent(const float *in, float *out, int n) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    int threads = n < 256 ? 32 : 256;
    child<<<(n + threads - 1) / threads, threads, threads * sizeof(float)>>>(in, out, n);
  }
}

void launch_parent(const float *in, float *out, int n) { parent<<<1, 32>>>(in, out, n); }
