// expect: error: .*locus: to_dlpack hands ownership of a tensor's memory to the consumer, .*a view owns nothing: clone it first, locus::to_dlpack\(v.clone\(\)\)
// Rule: a view borrows its memory, so it cannot be handed over as an owning
// DLManagedTensor (its deleter would free memory the view does not own); clone it first.
#include <locus/interop/dlpack.hpp>

DLManagedTensor* f(locus::tensor<float, locus::cpu, 2>& t) {
  auto v = t.slice(0, 1);
#ifdef LOCUS_VIOLATION
  return locus::to_dlpack(std::move(v));
#else
  return locus::to_dlpack(v.clone());
#endif
}
