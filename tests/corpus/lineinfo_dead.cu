// Kernels no host code launches, compiled with line information (-lineinfo)
// and device debug information (-G): nvlink removes them, and the device
// function only they call, as it does for plain objects (their debug and
// line sections name every function and keep none alive).
__device__ __noinline__ int only_dead_calls(int x) { return x * 7 + 1; }

__global__ void used(int *p) { p[threadIdx.x] = threadIdx.x; }

__global__ void unused(int *p) { p[threadIdx.x] = only_dead_calls(p[threadIdx.x]); }

__global__ void also_unused(float *p) { p[0] = 2.f; }

void launch_used(int *p) { used<<<1, 32>>>(p); }
