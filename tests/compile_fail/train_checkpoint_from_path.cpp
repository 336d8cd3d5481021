// expect: error: .*locus: load_checkpoint takes a loaded file, locus::io::archive<D> .*locus::train::resume\(path, t\)
// Rule: load_checkpoint takes an archive; a path goes to resume (otherwise a candidate
// list).
#define LOCUS_HAS_JSON 1
#include <locus/train.hpp>

using P = locus::amp::fp32;

long restore(const char* path) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
#ifdef LOCUS_VIOLATION
  return locus::train::load_checkpoint(path, t);
#else
  return locus::train::resume(path, t);
#endif
}
