// expect: error: .*locus: a loader over a temporary dataset would read freed memory
// Rule: a loader keeps its dataset by reference (its background thread reads it).
#include <locus/data/loader.hpp>
#include <locus/data/tensor_dataset.hpp>
#include <locus/tensor/factories.hpp>

void f() {
#ifdef LOCUS_VIOLATION
  locus::data::loader<locus::cpu, locus::data::tensor_dataset> l(
      locus::data::tensor_dataset(locus::zeros<float, locus::cpu>({4, 2}), locus::zeros<std::int64_t, locus::cpu>({4})),
      {.batch_size = 2});
#else
  locus::data::tensor_dataset ds(locus::zeros<float, locus::cpu>({4, 2}), locus::zeros<std::int64_t, locus::cpu>({4}));
  locus::data::loader<locus::cpu, locus::data::tensor_dataset> l(ds, {.batch_size = 2});
#endif
}
