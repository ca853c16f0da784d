__device__ float lib_lerp(float a, float b, float t) { return a + t * (b - a); }
__device__ float lib_clamp(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }
