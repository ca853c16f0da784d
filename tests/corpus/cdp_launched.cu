// Dynamic parallelism with every kernel live: the host launches parent,
// parent launches child, no variables, no dead kernel. After nvlink's partial
// LTO for libcudadevrt, child is kept only because parent's launch names it.
__global__ void child(float* p, int n) {
  int i = threadIdx.x;
  if (i < n) p[i] *= 2.0f;
}
__global__ void parent(float* p, int n) {
  if (threadIdx.x == 0) child<<<1, 64>>>(p, n);
}
void run(float* p, int n) { parent<<<1, 32>>>(p, n); }
