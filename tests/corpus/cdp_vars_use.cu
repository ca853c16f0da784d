// The other unit (see cdp_vars_def.cu): the host writes a variable defined
// there and launches root, which launches leaf from the device; other is
// launched by no one.
extern __device__ float shared_gain;
__device__ float apply(float x);
__global__ void leaf(float* p) { p[threadIdx.x] = apply(p[threadIdx.x]); }
__global__ void root(float* p) { leaf<<<1, 32>>>(p); }
__global__ void other(float* p) { p[0] = shared_gain; }
void go(float* p) {
  float g = 1;
  cudaMemcpyToSymbol(shared_gain, &g, sizeof g);
  root<<<1, 1>>>(p);
}
