// Dynamic parallelism only in a kernel host code never launches: nvlink sees
// the device-runtime reference in the LTO IR and does partial LTO, although
// NVVM would drop that kernel under the host references.
__global__ void child(int* o) { o[threadIdx.x] = 1; }
__global__ void dead_launcher(int* o) { child<<<1, 32>>>(o); }
__global__ void live(int* o) { o[0] = 2; }
void go(int* o) { live<<<1, 1>>>(o); }
