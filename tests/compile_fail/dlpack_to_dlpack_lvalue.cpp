// expect: error: .*locus: to_dlpack hands ownership of a tensor's memory to the consumer, so it takes a tensor by rvalue: move the tensor in, locus::to_dlpack\(std::move\(t\)\)
// Rule: a DLManagedTensor owns what it points to: an lvalue tensor, which the caller would
// still free, is not handed over; it is moved in.
#include <locus/interop/dlpack.hpp>

DLManagedTensor* f(locus::tensor<float, locus::cpu, 2>& t) {
#ifdef LOCUS_VIOLATION
  return locus::to_dlpack(t);
#else
  return locus::to_dlpack(std::move(t));
#endif
}
