// expect: error: .*locus: x\(\) of a const temporary dataset would dangle
// expect-also: locus: x\(\) of a const temporary dataset would dangle
// Rule: no reference into a dataset destroyed at the end of the statement (a non-const
// temporary's tensors are moved out instead).
#include <locus/data/tensor_dataset.hpp>

#include <utility>

const locus::data::tensor_dataset make();

void f() {
#ifdef LOCUS_VIOLATION
  const auto& x = make().x();
#else
  const auto d = make();
  const auto& x = d.x();
#endif
  (void)x;
}
