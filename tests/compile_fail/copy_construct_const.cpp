// expect: error: .*(use of deleted function .*tensor\(const locus::tensor<T, D, R>&\)|call to deleted constructor of 'locus::tensor<float, locus::cpu, 1>')
// expect-also: locus: tensor is move-only: write t.clone\(\), std::move\(t\) or t.view\(\)
// Rule: no hidden deep copies, from a const tensor too. The copy constructor is deleted
// (so std::is_copy_constructible_v is false); the compiler's note shows locus's comment.
#include <locus/transfer/copy.hpp>

static_assert(!std::is_copy_constructible_v<locus::tensor<float, locus::cpu, 1>>);
static_assert(!std::is_copy_assignable_v<locus::tensor<float, locus::cpu, 1>>);

locus::tensor<float, locus::cpu, 1> f(const locus::tensor<float, locus::cpu, 1>& a) {
#ifdef LOCUS_VIOLATION
  locus::tensor<float, locus::cpu, 1> b = a;
#else
  locus::tensor<float, locus::cpu, 1> b = a.clone();
#endif
  return b;
}
