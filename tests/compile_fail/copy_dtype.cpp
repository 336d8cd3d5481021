// expect: error: .*locus: copy between different dtypes .f32 to bf16.; copy moves bytes and never converts
// Rule: copy needs the same dtype on both sides; converting is cast<T>.
#include <locus/transfer/copy.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& a, locus::tensor<locus::bf16, locus::cuda, 2>& b,
       locus::tensor<float, locus::cuda, 2>& c) {
#ifdef LOCUS_VIOLATION
  (void)c;
  locus::copy(a, b);
#else
  (void)b;
  locus::copy(a, c);
#endif
}
