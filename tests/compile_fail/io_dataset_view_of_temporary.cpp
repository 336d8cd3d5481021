// expect: error: .*locus: images\(\) of a temporary dataset would dangle
// Rule: a dataset's images() and labels() are views: of a temporary dataset they do not compile.
#include <locus/data/idx.hpp>
#include <locus/tensor/factories.hpp>

locus::data::idx_dataset make();

int f() {
#ifdef LOCUS_VIOLATION
  auto imgs = make().images();
#else
  auto ds = make();
  auto imgs = ds.images();
#endif
  return static_cast<int>(imgs.numel());
}
