// The callee, plain inline, with a launched kernel of its own.
__device__ inline int g(int x){ return x*x+3; }
__global__ void kb(int*p){ p[1]=g(p[1]); }
void lb(int*p){ kb<<<1,1>>>(p); }
