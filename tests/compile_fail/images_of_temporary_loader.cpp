// expect: error: .*locus: images\(\) of a temporary loader would dangle
// Rule: images() keeps its loader by reference.
#include <locus/data/loader.hpp>
#include <locus/data/tensor_dataset.hpp>

void f(const locus::data::tensor_dataset& ds) {
#ifdef LOCUS_VIOLATION
  auto b = locus::data::images(locus::data::loader<locus::cpu, locus::data::tensor_dataset>(ds, {.batch_size = 2}), 1, 2, 2);
#else
  locus::data::loader<locus::cpu, locus::data::tensor_dataset> l(ds, {.batch_size = 2});
  auto b = locus::data::images(l, 1, 2, 2);
#endif
  (void)b;
}
