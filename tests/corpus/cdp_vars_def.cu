// Device and constant variables, and a device function using them, defined in
// one unit (no kernel) and used by another (cdp_vars_use.cu), as demo/poly.cu.
__device__ float shared_gain;
__constant__ int lut[4];
__device__ float apply(float x) { return x * shared_gain + lut[1]; }
