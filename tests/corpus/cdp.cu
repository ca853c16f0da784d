// Dynamic parallelism: parent launches child from the device.
__global__ void child(int* out, int base) { out[base + threadIdx.x] = (base + threadIdx.x) * 3; }

__global__ void parent(int* out, int blocks) {
  if (threadIdx.x == 0) {
    for (int b = 0; b < blocks; ++b) child<<<1, 32>>>(out, b * 32);
  }
}

__global__ void dead_kernel(int* out) { out[0] = 42; }

void launch_parent(int* out, int blocks) { parent<<<1, 1>>>(out, blocks); }
