// expect: error: .*locus: tape.ids\(\) of a temporary tensor would dangle
// Rule: backward reads the ids again (an embedding's gradient); temporary ids are freed before that.
#include <locus/ag/ops.hpp>

#include <cstdint>

void f(locus::ag::tape<float, locus::cpu>& t) {
#ifdef LOCUS_VIOLATION
  (void)t.ids(locus::zeros<std::int64_t, locus::cpu>({2, 3}));
#else
  const auto ids = locus::zeros<std::int64_t, locus::cpu>({2, 3});
  (void)t.ids(ids);
#endif
}
