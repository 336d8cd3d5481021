// expect: error: .*locus: ag::gather_rows of temporary ids would dangle
// Rule: backward reads gather_rows's ids again; temporary ids are freed before that.
#include <locus/ag/ops.hpp>

#include <cstdint>

void f(locus::ag::tape<float, locus::cpu>& t, const locus::tensor<float, locus::cpu, 2>& table) {
#ifdef LOCUS_VIOLATION
  (void)locus::ag::gather_rows(t.leaf(table), locus::zeros<std::int64_t, locus::cpu>({4}));
#else
  const auto ids = locus::zeros<std::int64_t, locus::cpu>({4});
  (void)locus::ag::gather_rows(t.leaf(table), ids);
#endif
}
