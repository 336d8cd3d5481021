// expect: error: .*locus: amp::fp16_mixed needs loss scaling, and so does every policy that computes in f16 \(whatever its requires_loss_scaling says\).*grad_scaler
// Rule: loss scaling follows from f16 compute itself: a home-made policy computing in
// f16 that declares requires_loss_scaling = false still needs a grad scaler.
#include <locus/train/trainer.hpp>

#include <string_view>

struct my_f16 {
  using compute = locus::f16;
  using master = float;
  static constexpr bool requires_loss_scaling = false;
  static constexpr std::string_view name = "my-f16";
};

void build() {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, my_f16>(4, 3));
  locus::optim::adamw<locus::cpu> opt(model.parameters());
#ifdef LOCUS_VIOLATION
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
#else
  locus::amp::grad_scaler<locus::cpu> scaler;
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{}, scaler);
#endif
  (void)t;
}
