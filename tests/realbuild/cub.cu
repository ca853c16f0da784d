// A CUB unit: a block-wide sum.
#include <cub/block/block_reduce.cuh>

__global__ void block_sum(int* out, const int* in) {
  using Reduce = cub::BlockReduce<int, 128>;
  __shared__ typename Reduce::TempStorage tmp;
  int total = Reduce(tmp).Sum(in[blockIdx.x * 128 + threadIdx.x]);
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

void run_block_sum(int* out, const int* in, int blocks) { block_sum<<<blocks, 128>>>(out, in); }
