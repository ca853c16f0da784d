// Data-segment layout: an initialized global whose size is not a multiple of
// the shared-memory alignments that follow it (8 and 16), as in CUB-heavy code.
__device__ char shared_mix_tag[6] = {1, 2, 3, 4, 5, 6};
__device__ int shared_mix_count[7];

__global__ void shared_mix_v(float4* o) {
  __shared__ float4 s[17];
  s[threadIdx.x] = o[threadIdx.x];
  __syncthreads();
  o[threadIdx.x + 1] = s[threadIdx.x ^ 1];
  atomicAdd(&shared_mix_count[threadIdx.x % 7], 1);
}

__global__ void shared_mix_d(double* o) {
  __shared__ double s[33];
  s[threadIdx.x] = o[threadIdx.x];
  __syncthreads();
  o[threadIdx.x + 1] = s[threadIdx.x ^ 1] + shared_mix_tag[threadIdx.x % 6];
}

void shared_mix_launch(double* d, float4* v) {
  shared_mix_d<<<1, 32>>>(d);
  shared_mix_v<<<1, 16>>>(v);
}
