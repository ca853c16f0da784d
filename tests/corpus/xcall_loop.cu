// Device functions with loops, called from xcall_main.cu.
__device__ int f1(const int* a, int n, int t) {
  int c = 0;
  for (int i = 0; i < n && a[i] != t; ++i)
    if (a[i] > t || a[i] < -t) ++c;
  return c;
}

__device__ float f2(const float* a, int n, float lo, float hi) {
  float s = 0;
  for (int i = 0; i < n; ++i) {
    float v = a[i];
    if (v >= lo && v <= hi && v != 0.f)
      s += v * v;
    else if (v < lo || v > hi)
      s -= v;
  }
  return s;
}

__device__ unsigned f3(unsigned v, int n) {
  for (int i = 0; i < n; ++i) {
    v ^= v << 13;
    v ^= v >> 17;
    v ^= v << 5;
    if ((v & 7) == 3 && i > 2) break;
  }
  return v;
}

__device__ int f4(const int* a, int n) {
  int best = a[0];
  for (int i = 1; i < n; ++i) best = (a[i] > best && (a[i] & 1)) ? a[i] : best;
  return best;
}
