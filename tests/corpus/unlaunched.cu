// Kernels and a device function that no host code in the link launches or
// names: NVVM keeps the kernels of such a whole program (no host references).
__device__ float bias(float x) { return x + 1.0f; }
__global__ void idle_a(float* p) { p[threadIdx.x] = 1.0f; }
__global__ void idle_b(float* p) { p[threadIdx.x] = bias(p[threadIdx.x]); }
