// expect: error: .*locus: master weights in f16 or bf16 lose every update.*f32
// Rule: master weights (what the optimizer updates) are f32; in bf16 or f16 an update
// smaller than half an ulp of the weight rounds away and training silently stalls.
#include <locus/train/trainer.hpp>

#include <string_view>

struct bf16_everywhere {
  using compute = locus::bf16;
#ifdef LOCUS_VIOLATION
  using master = locus::bf16;
#else
  using master = float;
#endif
  static constexpr bool requires_loss_scaling = false;
  static constexpr std::string_view name = "bf16-everywhere";
};

void build() {
  locus::nn::linear<locus::cpu, bf16_everywhere> layer(4, 3);
  (void)layer;
}
