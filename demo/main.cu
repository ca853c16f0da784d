// nvlinkd demo: three translation units, device globals across units, dynamic
// parallelism. Results are checked against values computed on the host.
#include <cmath>
#include <cstdio>
#include <vector>

extern __constant__ float poly_coeff[4];
extern __device__ unsigned int evaluations;
__device__ float poly(float x);
__global__ void tree_sum(const float* in, float* partial, int chunk, int n);

__global__ void transform(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = poly(x[i]);
}

#define CHECK(call)                                                                  \
  do {                                                                               \
    cudaError_t e = (call);                                                          \
    if (e != cudaSuccess) {                                                          \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      return 2;                                                                      \
    }                                                                                \
  } while (0)

int main() {
  const int n = 4096, chunk = 256, chunks = n / chunk;
  const float coeff[4] = {0.5f, -1.0f, 0.25f, 0.125f};
  std::vector<float> x(n), y(n), partial(chunks);
  for (int i = 0; i < n; ++i) x[i] = (i % 97) / 97.0f - 0.5f;

  float *dx, *dy, *dp;
  CHECK(cudaMalloc(&dx, n * sizeof(float)));
  CHECK(cudaMalloc(&dy, n * sizeof(float)));
  CHECK(cudaMalloc(&dp, chunks * sizeof(float)));
  CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dp, 0, chunks * sizeof(float)));
  CHECK(cudaMemcpyToSymbol(poly_coeff, coeff, sizeof(coeff)));
  unsigned int zero = 0;
  CHECK(cudaMemcpyToSymbol(evaluations, &zero, sizeof(zero)));

  transform<<<(n + 127) / 128, 128>>>(dx, dy, n);
  CHECK(cudaGetLastError());
  tree_sum<<<1, 32>>>(dy, dp, chunk, n);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());

  unsigned int evals = 0;
  CHECK(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(partial.data(), dp, chunks * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpyFromSymbol(&evals, evaluations, sizeof(evals)));

  int bad = 0;
  double total = 0.0, expect_total = 0.0;
  for (int i = 0; i < n; ++i) {
    float xi = x[i];
    float e = ((coeff[3] * xi + coeff[2]) * xi + coeff[1]) * xi + coeff[0];
    if (std::fabs(e - y[i]) > 1e-5f) ++bad;
    expect_total += e;
  }
  for (int c = 0; c < chunks; ++c) total += partial[c];
  if (std::fabs(total - expect_total) > 1e-2 * std::fabs(expect_total) + 1e-3) ++bad;
  if (evals != (unsigned)n) ++bad;
  std::printf("transform: %d values, evaluations %u, sum %.6f (host %.6f)\n", n, evals, total, expect_total);
  std::printf(bad ? "RESULT: MISMATCH (%d)\n" : "RESULT: OK\n", bad);
  return bad ? 1 : 0;
}
