// Kernels calling looping device functions of another unit (xcall_loop.cu).
// Under -dlto NVVM optimizes across the units; NVVM -split-compile gives this
// program different machine code (k3's loop), so nvlinkd never splits
// implicitly.
__device__ int f1(const int* a, int n, int t);
__device__ float f2(const float* a, int n, float lo, float hi);
__device__ unsigned f3(unsigned v, int n);
__device__ int f4(const int* a, int n);

__global__ void k1(int* o, const int* a, int n) { o[threadIdx.x] = f1(a, n, threadIdx.x) + f4(a, n); }
__global__ void k2(float* o, const float* a, int n) { o[threadIdx.x] = f2(a, n, -1.f, o[0]); }
__global__ void k3(unsigned* o, int n) { o[threadIdx.x] = f3(o[threadIdx.x], n); }

void launch_xcall(int* o, const int* a, float* fo, const float* fa, int n) {
  k1<<<1, 32>>>(o, a, n);
  k2<<<1, 32>>>(fo, fa, n);
  k3<<<1, 32>>>((unsigned*)o, n);
}
