// A CUB unit: a warp-level reduction (CUB's headers and templates in device code).
#include <cub/warp/warp_reduce.cuh>

__global__ void warp_sums(int* out, const int* in) {
  using WarpReduce = cub::WarpReduce<int>;
  __shared__ typename WarpReduce::TempStorage tmp;
  int v = in[threadIdx.x];
  int total = WarpReduce(tmp).Sum(v);
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

void launch_warp_sums(int* out, const int* in) { warp_sums<<<1, 32>>>(out, in); }
