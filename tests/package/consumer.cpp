// A consumer of the installed (or added) locus: includes the umbrella header, builds
// with a host compiler, and computes on the cpu.
#include <locus/locus.hpp>

#include <cstdio>

int main() {
  auto a = locus::arange<double, locus::cpu>(10);
  double s = 0;
  for (double v : a.span()) s += v;
  std::printf("consumer: sum 0..9 = %g, cuda compiled: %d\n", s, LOCUS_HAS_CUDA);
  return s == 45.0 ? 0 : 1;
}
