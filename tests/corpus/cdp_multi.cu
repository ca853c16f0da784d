// Dynamic parallelism under LTO in another style: templated children, a
// device function, a static (internal-linkage) kernel the host launches, and a
// launcher the host never launches.
template <typename T>
__global__ void fill(T* o, T v) { o[threadIdx.x] = v; }
__device__ int twice(int x) { return 2 * x; }
__global__ void launcher(int* o, float* f) {
  fill<int><<<1, 32>>>(o, twice(3));
  fill<float><<<1, 32>>>(f, 1.5f);
}
static __global__ void local_kernel(int* o) { o[0] = twice(o[0]); }
__global__ void unused_launcher(double* d) { fill<double><<<1, 1>>>(d, 2.0); }
void go_multi(int* o, float* f) {
  launcher<<<1, 1>>>(o, f);
  local_kernel<<<1, 1>>>(o);
}
