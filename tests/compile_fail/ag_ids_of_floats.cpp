// expect: error: .*locus: tape.ids\(\) takes int32 or int64 ids
// Rule: ids are int32 or int64 (token ids, positions), not floating point or bool.
#include <locus/ag/ops.hpp>

#include <cstdint>

void f(locus::ag::tape<float, locus::cpu>& t) {
#ifdef LOCUS_VIOLATION
  const auto ids = locus::zeros<float, locus::cpu>({2, 3});
#else
  const auto ids = locus::zeros<std::int32_t, locus::cpu>({2, 3});
#endif
  (void)t.ids(ids);
}
