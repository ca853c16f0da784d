// Host-only C++ (an object without device code in the device link).
#include <cstdio>

void run_eval(float* out, const float* in, int n);
void run_parent(int* out, int blocks);
void run_histogram4(int* out, const int* in, int n);
void run_block_sum(int* out, const int* in, int blocks);

int main(int argc, char**) {
  // Built, not run: the check needs no GPU. Referencing the launchers keeps them linked.
  if (argc > 100) {
    run_eval(nullptr, nullptr, 0);
    run_parent(nullptr, 0);
    run_histogram4(nullptr, nullptr, 0);
    run_block_sum(nullptr, nullptr, 0);
  }
  std::puts("built");
  return 0;
}
