// expect: error: .*locus: a policy computes in f32, f64, bf16 or f16, but its `compute` is another type
// Rule: a model computes in a floating dtype; integer compute would truncate every
// activation.
#include <locus/nn/layers.hpp>

#include <cstdint>
#include <string_view>

struct my_policy {
#ifdef LOCUS_VIOLATION
  using compute = std::uint8_t;
#else
  using compute = locus::bf16;
#endif
  using master = float;
  static constexpr bool requires_loss_scaling = false;
  static constexpr std::string_view name = "mine";
};

void build() {
  locus::nn::dropout<locus::cpu, my_policy> layer(0.1f);
  (void)layer;
}
