// CUB's flagged selection for three types, and a kernel calling a device
// function of another unit (select_xform.cu). Linked with -dlto, NVVM's code
// for the selection kernels depends on NVVM state a previous compile in the
// same process left behind (see core/src/worker.rs, WorkerPool::link).
#include <cub/cub.cuh>
#include <cstdint>

__device__ float select_xform(float x);

template <typename T>
void select_flagged(T* in, T* out, int* flags, int n, void* tmp, size_t bytes, cudaStream_t s) {
  cub::DeviceSelect::Flagged(tmp, bytes, in, flags, out, flags, n, s);
}

__global__ void apply_select_xform(float* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = select_xform(p[i]) + 1.0f;
}

void select_workload(void* tmp, size_t bytes, int* flags, cudaStream_t s) {
  select_flagged<float>(nullptr, nullptr, flags, 1 << 20, tmp, bytes, s);
  select_flagged<int>(nullptr, nullptr, flags, 1 << 20, tmp, bytes, s);
  select_flagged<std::uint64_t>(nullptr, nullptr, flags, 1 << 20, tmp, bytes, s);
  apply_select_xform<<<4, 256, 0, s>>>(nullptr, 1024);
}
