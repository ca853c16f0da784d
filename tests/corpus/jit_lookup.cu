// A lookup table shipped as PTX only (nvcc -gencode arch=compute_80,code=compute_80),
// called from a unit compiled for sm_90: the device runtime's members must be
// chosen from the JIT-compiled code, not from the undefined call seen before.
__device__ int lookup(int i) { return i * 3 + 1; }
