// The same weak function, beside a kernel no host code launches (removed by nvlink).
__device__ __attribute__((weak)) int w(int x){ return x*3+1; }
__global__ void kb(int*p){ p[1]=w(p[1]); }
