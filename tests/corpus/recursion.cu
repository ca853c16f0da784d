// Recursion inside one unit, as real code writes it: a binary tree walked
// recursively (nodes in an array, children by index), a memo-less Fibonacci
// table, and a kernel no host code launches that reaches the recursion too
// (nvlink removes it and says nothing about it).
#include <cstdio>

struct TreeNode {
  int key;
  int left, right;  // indices into the node array, -1 for none
};

__device__ int subtree_sum(const TreeNode *nodes, int i) {
  if (i < 0) return 0;
  return nodes[i].key + subtree_sum(nodes, nodes[i].left) + subtree_sum(nodes, nodes[i].right);
}

__device__ int subtree_depth(const TreeNode *nodes, int i) {
  if (i < 0) return 0;
  int l = subtree_depth(nodes, nodes[i].left);
  int r = subtree_depth(nodes, nodes[i].right);
  return 1 + (l > r ? l : r);
}

__device__ long long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

__global__ void treeStats(const TreeNode *nodes, int root, int *out) {
  out[0] = subtree_sum(nodes, root);
  out[1] = subtree_depth(nodes, root);
}

__global__ void fibTable(long long *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = fib(i);
}

// Nobody launches this one.
__global__ void fibUnused(long long *out, int n) { out[0] = fib(n) * 2; }

int main() {
  TreeNode *nodes;
  int *stats;
  long long *table;
  cudaMalloc(&nodes, 3 * sizeof(TreeNode));
  cudaMalloc(&stats, 2 * sizeof(int));
  cudaMalloc(&table, 32 * sizeof(long long));
  treeStats<<<1, 1>>>(nodes, 0, stats);
  fibTable<<<1, 32>>>(table, 32);
  cudaDeviceSynchronize();
  printf("done\n");
  return 0;
}
