__device__ float missing_symbol(float);
__global__ void uses_missing(float* p) { p[0] = missing_symbol(p[0]); }
void launch_uses_missing(float* p) { uses_missing<<<1, 1>>>(p); }
