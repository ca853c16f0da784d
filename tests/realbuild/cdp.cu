// Dynamic parallelism (links libcudadevrt).
__global__ void child(int* out, int base) { out[base + threadIdx.x] = base; }

__global__ void parent(int* out, int blocks) {
  if (threadIdx.x == 0)
    for (int b = 0; b < blocks; ++b) child<<<1, 32>>>(out, b * 32);
}

void run_parent(int* out, int blocks) { parent<<<1, 1>>>(out, blocks); }
