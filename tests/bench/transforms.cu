// Device functions the workload units call across translation units.
__device__ float shared_transform1(float x) { return x * 1.5f + 0.25f; }
__device__ float shared_transform2(float x) { return sqrtf(fabsf(x)) - 1.0f; }
__device__ float shared_transform3(float x) { return __expf(-x * x); }
__device__ float shared_transform4(float x) { return x > 0.0f ? x : 0.01f * x; }
__device__ float shared_transform5(float x) { return __sinf(x) * __cosf(x); }
