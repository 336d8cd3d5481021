// expect: error: .*locus: operands live on different devices \(cpu and pinned\)
// Rule: gather_rows's ids live on the table's device (one operation, one device).
#include <locus/ag/ops.hpp>

#include <cstdint>

void f(locus::ag::tape<float, locus::cpu>& t, const locus::tensor<float, locus::cpu, 2>& table,
       const locus::tensor<std::int64_t, locus::pinned, 1>& pinned_ids,
       const locus::tensor<std::int64_t, locus::cpu, 1>& ids) {
#ifdef LOCUS_VIOLATION
  (void)locus::ag::gather_rows(t.leaf(table), pinned_ids);
#else
  (void)pinned_ids;
  (void)locus::ag::gather_rows(t.leaf(table), ids);
#endif
}
