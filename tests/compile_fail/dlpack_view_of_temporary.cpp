// expect: error: .*locus: view\(\) of a temporary dlpack_tensor would dangle: its destructor calls the producer's deleter at the end of the statement; keep it in a variable first
// Rule: nothing points into a temporary: the handle from from_dlpack releases the
// producer's memory when it dies, so a view of a temporary handle does not compile.
#include <locus/interop/dlpack.hpp>

float f(DLManagedTensor* m) {
#ifdef LOCUS_VIOLATION
  auto v = locus::from_dlpack<float, locus::cpu, 1>(m).view();
  return v(0);
#else
  auto h = locus::from_dlpack<float, locus::cpu, 1>(m);
  auto v = h.view();
  return v(0);
#endif
}
