// A host-only C++ translation unit, as CMake compiles a project's .cpp files
// (`g++ -c`): an object without device code in the device link.
#include <cstdio>

int report(int n) { return std::printf("%d\n", n); }
