// Dynamic parallelism: tree_sum launches one chunk_sum grid per chunk from the
// device; each child adds its chunk into the partial sums.
__global__ void chunk_sum(const float* in, float* partial, int chunk, int n) {
  int c = blockIdx.x;
  int i = c * chunk + threadIdx.x;
  float v = 0.0f;
  for (int k = i; k < min((c + 1) * chunk, n); k += blockDim.x) v += in[k];
  atomicAdd(&partial[c], v);
}

__global__ void tree_sum(const float* in, float* partial, int chunk, int n) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    int chunks = (n + chunk - 1) / chunk;
    chunk_sum<<<chunks, 64>>>(in, partial, chunk, n);
  }
}
