// expect: error: .*locus: get_with_source\(\) hands the value and the source over, so it needs an rvalue pending; write std::move\(p\).get_with_source\(\)
// Rule: a pending's value and source leave it only together, from an rvalue.
#include <locus/transfer/async.hpp>

using dev = locus::tensor<float, locus::cuda, 1>;
using host = locus::tensor<float, locus::pinned, 1>;

void f(locus::pending<dev, host>& p) {
#ifdef LOCUS_VIOLATION
  p.get_with_source();
#else
  auto [d, h] = std::move(p).get_with_source();
  (void)d;
  (void)h;
#endif
}
