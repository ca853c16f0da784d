// libcu++ (cuda::std) in device code: its customization-point objects
// (cuda::std::ranges::begin and friends) are internal-linkage device
// variables, which nvlink keeps when host-reference pruning is off.
#include <cuda/std/array>
#include <cuda/std/span>
#include <cuda/std/functional>
#include <cuda/std/utility>

__global__ void clamp_sum(int* out, const int* in, int n) {
  cuda::std::span<const int> s(in, n);
  cuda::std::array<int, 4> acc{};
  for (auto it = cuda::std::ranges::begin(s); it != cuda::std::ranges::end(s); ++it) {
    acc[*it & 3] = cuda::std::plus<int>{}(acc[*it & 3], cuda::std::min(*it, 100));
  }
  out[threadIdx.x] = acc[threadIdx.x & 3];
}

void launch_clamp_sum(int* out, const int* in, int n) { clamp_sum<<<1, 4>>>(out, in, n); }
