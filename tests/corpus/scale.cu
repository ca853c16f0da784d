__device__ float scale(float x) { return 2.0f * x + 1.0f; }
