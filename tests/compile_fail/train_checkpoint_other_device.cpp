// expect: error: .*locus: the checkpoint was loaded onto pinned but the trainer's model lives on cpu; load it where the model lives: locus::train::load_checkpoint\(locus::io::load<locus::cpu>\(path\), t\)
// Rule: a checkpoint is loaded onto the device of the trainer it restores (otherwise
// a candidate list: "no matching function for call to load_checkpoint").
#define LOCUS_HAS_JSON 1
#include <locus/train.hpp>

using P = locus::amp::fp32;

long restore(const char* path) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::adamw<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
#ifdef LOCUS_VIOLATION
  return locus::train::load_checkpoint(locus::io::load<locus::pinned>(path), t);
#else
  return locus::train::load_checkpoint(locus::io::load<locus::cpu>(path), t);
#endif
}
