// expect: error: .*locus: master weights must be f32 .or f64., but the policy's `master` is another type; declare `using master = float;`
// Rule: master weights (what the optimizer updates) are floating point, f32 for training.
#include <locus/nn/layers.hpp>

#include <cstdint>
#include <string_view>

struct my_policy {
  using compute = float;
#ifdef LOCUS_VIOLATION
  using master = std::int32_t;
#else
  using master = float;
#endif
  static constexpr bool requires_loss_scaling = false;
  static constexpr std::string_view name = "mine";
};

void build() {
  locus::nn::sequential m(locus::nn::linear<locus::cpu, my_policy>(4, 3), locus::nn::relu<locus::cpu, my_policy>());
  (void)m;
}
