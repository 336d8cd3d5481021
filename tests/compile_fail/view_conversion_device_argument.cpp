// expect: error: .*locus: a view of cuda memory cannot be a view of cpu memory
// Rule: a cuda view passed where a cpu view is expected (a function, a std::function) is a compile error naming the transfer.
#include <functional>
#include <locus/transfer/copy.hpp>
void take(locus::tensor_view<const float, locus::cpu, 1>);

void f(locus::tensor<float, locus::cuda, 1>& g, const std::function<void(locus::tensor_view<const float, locus::cpu, 1>)>& cb) {
#ifdef LOCUS_VIOLATION
  take(g.view()); cb(g.view());
#else
  auto h = locus::to<locus::cpu>(g); take(h.view()); cb(h.view());
#endif
}
