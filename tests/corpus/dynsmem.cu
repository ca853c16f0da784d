// Dynamic shared memory in the styles of NVIDIA's samples: a templated block
// reduction over `extern __shared__` (through a SharedMemory<T> helper, as the
// reduction sample does), a cooperative-groups tiled partition, and a second
// kernel sizing its buffer at launch. Host code launches both with a dynamic
// shared-memory size; nothing here uses the device runtime.
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

template <class T> struct SharedMemory {
  __device__ inline operator T *() {
    extern __shared__ int __smem[];
    return (T *)__smem;
  }
};

template <class T, unsigned blockSize>
__global__ void reduce(const T *g_idata, T *g_odata, unsigned n) {
  cg::thread_block cta = cg::this_thread_block();
  T *sdata = SharedMemory<T>();
  unsigned tid = threadIdx.x;
  unsigned i = blockIdx.x * (blockSize * 2) + threadIdx.x;
  T mySum = (i < n) ? g_idata[i] : 0;
  if (i + blockSize < n) mySum += g_idata[i + blockSize];
  sdata[tid] = mySum;
  cg::sync(cta);
  for (unsigned s = blockDim.x / 2; s > 32; s >>= 1) {
    if (tid < s) sdata[tid] = mySum = mySum + sdata[tid + s];
    cg::sync(cta);
  }
  cg::thread_block_tile<32> tile32 = cg::tiled_partition<32>(cta);
  if (cta.thread_rank() < 32) {
    if (blockSize >= 64) mySum += sdata[tid + 32];
    for (int offset = tile32.size() / 2; offset > 0; offset /= 2) mySum += tile32.shfl_down(mySum, offset);
  }
  if (cta.thread_rank() == 0) g_odata[blockIdx.x] = mySum;
}

__global__ void stencil(const float *in, float *out, int n) {
  extern __shared__ float tile[];
  int g = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x + 1] = g < n ? in[g] : 0.f;
  if (threadIdx.x == 0) tile[0] = g > 0 ? in[g - 1] : 0.f;
  __syncthreads();
  if (g < n) out[g] = 0.5f * tile[threadIdx.x + 1] + 0.25f * (tile[threadIdx.x] + tile[threadIdx.x + 2]);
}

void run_reduce(const int *in, int *out, unsigned n, int blocks) {
  reduce<int, 256><<<blocks, 256, 256 * sizeof(int)>>>(in, out, n);
  reduce<float, 128><<<blocks, 128, 128 * sizeof(float)>>>((const float *)in, (float *)out, n);
}

void run_stencil(const float *in, float *out, int n) { stencil<<<(n + 127) / 128, 128, 130 * sizeof(float)>>>(in, out, n); }
