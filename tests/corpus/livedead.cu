// A live kernel, a dead kernel (no host code launches it) and device
// variables; nvlink drops the dead ones only when every object in the link
// carries host-reference information.
__device__ int counter;
__device__ float table[64];
__constant__ float weights[4] = {0.5f, 0.25f, 0.125f, 0.125f};

__global__ void live_kernel(float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = weights[i % 4] * i;
}

__global__ void dead_kernel(float* out) {
  out[threadIdx.x] = table[threadIdx.x];
  atomicAdd(&counter, 1);
}

void launch_live(float* out, int n) { live_kernel<<<(n + 127) / 128, 128>>>(out, n); }
