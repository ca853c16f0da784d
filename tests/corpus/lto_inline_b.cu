// The callee, __forceinline__ (inlined at every call here, so absent from this unit's PTX).
__device__ __forceinline__ int g(int x){ return x*x+3; }
__global__ void kb(int*p){ p[1]=g(p[1]); }
