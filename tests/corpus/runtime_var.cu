// A variable libcudadevrt defines, declared here and read by a kernel: an
// undefined variable takes nothing from libcudadevrt (nvlink reports an
// undefined reference), only an undefined function does.
extern __device__ int __CNPRT_VERSION_NUMBER__;
__global__ void read_runtime_var(int* p) { p[0] = __CNPRT_VERSION_NUMBER__; }
void launch_read_runtime_var(int* p) { read_runtime_var<<<1, 1>>>(p); }
