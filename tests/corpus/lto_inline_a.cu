// LTO: a kernel calling a device function another unit defines inline.
extern __device__ int g(int x);
__global__ void ka(int*p){ p[0]=g(p[0]); }
void la(int*p){ ka<<<1,1>>>(p); }
