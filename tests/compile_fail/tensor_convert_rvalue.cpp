// expect: error: .*(use of deleted function .*locus::tensor<T, D, R>::tensor\(locus::tensor<.*&&\)|conversion function from .* invokes a deleted function)
// expect-also: locus: no conversion between devices, dtypes or ranks: write locus::to<D>\(x\)
// Rule: a temporary tensor of another device, dtype or rank does not convert. The
// conversion from an rvalue is deleted (so std::is_convertible_v and
// std::is_constructible_v tell the truth); the note shows locus's comment. From an
// lvalue the error is locus's own message (assign_cuda_to_cpu.cpp).
#include <locus/tensor/factories.hpp>

static_assert(!std::is_convertible_v<locus::tensor<float, locus::cuda, 1>, locus::tensor<float, locus::cpu, 1>>);
static_assert(!std::is_constructible_v<locus::tensor<float, locus::cpu, 1>, locus::tensor<float, locus::cuda, 1>>);
static_assert(!std::is_convertible_v<locus::tensor<double, locus::cpu, 1>, locus::tensor<float, locus::cpu, 1>>);
static_assert(!std::is_convertible_v<locus::tensor<float, locus::cpu, 2>, locus::tensor<float, locus::cpu, 1>>);

void f() {
#ifdef LOCUS_VIOLATION
  locus::tensor<float, locus::cpu, 1> h = locus::zeros<float, locus::cuda>({4});
#else
  locus::tensor<float, locus::cpu, 1> h = locus::to<locus::cpu>(locus::zeros<float, locus::cuda>({4}));
#endif
  (void)h;
}
