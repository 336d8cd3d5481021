// expect: error: .*locus: .*device
// Rule: ids live on the tape's device (one forward, one device).
#include <locus/ag/ops.hpp>

#include <cstdint>

void f(locus::ag::tape<float, locus::cpu>& t) {
#ifdef LOCUS_VIOLATION
  const auto ids = locus::zeros<std::int64_t, locus::pinned>({2, 3});
#else
  const auto ids = locus::zeros<std::int64_t, locus::cpu>({2, 3});
#endif
  (void)t.ids(ids);
}
