// A device variable the host writes, and a kernel no host code launches: host
// references to variables only.
__device__ float g;
__global__ void kv(float* p) { p[0] = g; }
void set() { float x = 1; cudaMemcpyToSymbol(g, &x, sizeof x); }
