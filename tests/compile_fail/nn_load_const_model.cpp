// expect: error: .*locus: nn::load writes the weights into the model, but this one is const; pass a non-const model
// Rule: nn::load writes into the model it is given (otherwise a long error deep inside
// the copy of the weights into a const parameter store).
#define LOCUS_HAS_JSON 1
#include <locus/train.hpp>

using P = locus::amp::fp32;

void restore(const char* path) {
#ifdef LOCUS_VIOLATION
  const locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
#else
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
#endif
  locus::nn::load(path, model);
}
