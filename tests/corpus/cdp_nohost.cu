// Dynamic parallelism and no host code at all: no host references.
__global__ void child(float* p, int n) {
  int i = threadIdx.x;
  if (i < n) p[i] *= 2;
}
__global__ void parent(float* p, int n) {
  if (threadIdx.x == 0) child<<<1, 64>>>(p, n);
}
