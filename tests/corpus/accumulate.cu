// A kernel calling a device function from another translation unit, with a
// device counter and constant coefficients; plus a kernel nothing launches.
__device__ float scale(float x);
__device__ unsigned int hits;
__constant__ float coeff[4];

__global__ void accumulate(float* out, const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    out[i] += scale(in[i]) * coeff[i % 4];
    atomicAdd(&hits, 1u);
  }
}

__global__ void never_launched(float* p) { p[threadIdx.x] = -1.0f; }

void launch_accumulate(float* out, const float* in, int n) {
  accumulate<<<(n + 127) / 128, 128>>>(out, in, n);
}
