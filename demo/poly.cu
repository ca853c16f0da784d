// Device-side pieces shared by the kernels: constant coefficients, a counter,
// and the polynomial itself (defined here, called from main.cu).
__constant__ float poly_coeff[4];
__device__ unsigned int evaluations;

__device__ float poly(float x) {
  atomicAdd(&evaluations, 1u);
  return ((poly_coeff[3] * x + poly_coeff[2]) * x + poly_coeff[1]) * x + poly_coeff[0];
}
