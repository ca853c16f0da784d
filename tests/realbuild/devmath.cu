// The static device library: a looping device function other units call.
__device__ float series(float x, int terms) {
  float acc = 0.0f, p = 1.0f;
  for (int k = 0; k < terms; ++k) {
    acc += p / (k + 1);
    p *= x;
  }
  return acc;
}
