// expect: error: .*locus: a precision policy needs `compute`, `master`, `requires_loss_scaling` and `name`, but this type lacks at least one of them
// Rule: a precision policy names its compute dtype, its master dtype, whether it
// needs loss scaling and its name (checkpoints record it); a policy missing one is
// reported once, not once per member that uses it.
#include <locus/nn/layers.hpp>

#include <string_view>

struct my_policy {
#ifndef LOCUS_VIOLATION
  using compute = float;
#endif
  using master = float;
  static constexpr bool requires_loss_scaling = false;
  static constexpr std::string_view name = "mine";
};

void build() {
  locus::nn::linear<locus::cpu, my_policy> layer(4, 3);
  (void)layer;
}
