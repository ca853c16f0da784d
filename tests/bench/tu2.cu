// Benchmark workload unit 2: CUB device algorithms instantiated for several
// types, plus a kernel that calls a device function defined in another unit.
#include <cub/cub.cuh>
#include <cstdint>

__device__ float shared_transform2(float x);

template <typename T>
void run_algorithms_2(T* d_in, T* d_out, int* d_flags, int n, void* tmp, size_t bytes, cudaStream_t s) {
  cub::DeviceReduce::Sum(tmp, bytes, d_in, d_out, n, s);
  cub::DeviceReduce::Max(tmp, bytes, d_in, d_out, n, s);
  cub::DeviceScan::InclusiveSum(tmp, bytes, d_in, d_out, n, s);
  cub::DeviceScan::ExclusiveSum(tmp, bytes, d_in, d_out, n, s);
  cub::DeviceRadixSort::SortKeys(tmp, bytes, d_in, d_out, n, 0, sizeof(T) * 8, s);
  cub::DeviceSelect::Flagged(tmp, bytes, d_in, d_flags, d_out, d_flags, n, s);
}

__global__ void apply_transform_2(float* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = shared_transform2(p[i]) + 2.0f;
}

void workload_2(void* tmp, size_t bytes, int* flags, cudaStream_t s) {
  run_algorithms_2<float>(nullptr, nullptr, flags, 1 << 20, tmp, bytes, s);
  run_algorithms_2<int>(nullptr, nullptr, flags, 1 << 20, tmp, bytes, s);
  run_algorithms_2<std::uint64_t>(nullptr, nullptr, flags, 1 << 20, tmp, bytes, s);
  apply_transform_2<<<4, 256, 0, s>>>(nullptr, 1024);
}
