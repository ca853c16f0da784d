// Host-only C++ of the second program.
#include <cstdio>

void run_histogram4(int* out, const int* in, int n);

int main(int argc, char**) {
  if (argc > 100) run_histogram4(nullptr, nullptr, 0);
  std::puts("built");
  return 0;
}
