// pitfall-check: compile
// The same mistake, indexing the pending itself: float v = p(0, 0); before the copy has
// arrived. A pending has no call operator that would read the destination early.
#include <locus/locus.hpp>

int main() {
  locus::tensor<float, locus::cuda, 2> logits = locus::to<locus::cuda>(locus::randn<float, locus::cpu>({256, 10}, /*seed=*/1));
  auto p = locus::to_async<locus::pinned>(logits);  // still in flight
  float v = p(0, 0);
  return v > 0.0f;
}
