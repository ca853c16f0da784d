// A Thrust unit: sequential Thrust algorithms inside a kernel.
#include <thrust/execution_policy.h>
#include <thrust/sort.h>
#include <thrust/reduce.h>

__global__ void sort_rows(int* data, int* sums, int width) {
  int* row = data + blockIdx.x * width;
  thrust::sort(thrust::seq, row, row + width);
  sums[blockIdx.x] = thrust::reduce(thrust::seq, row, row + width);
}

void launch_sort_rows(int* data, int* sums, int rows, int width) { sort_rows<<<rows, 1>>>(data, sums, width); }
