// Only a static (internal) kernel launched by host code, beside a kernel nobody launches.
static __global__ void only_static(float* p) { p[threadIdx.x] = 2.0f; }
__global__ void other(float* p) { p[0] = 3.0f; }
void go(float* p) { only_static<<<1, 32>>>(p); }
