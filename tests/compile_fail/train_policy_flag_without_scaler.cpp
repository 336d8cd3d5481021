// expect: error: .*locus: this precision policy declares requires_loss_scaling = true, but the trainer has no grad scaler
// Rule: requires_loss_scaling = true adds the need for a grad scaler to a policy of
// any compute dtype (here bf16, which would not need one by itself).
#include <locus/train/trainer.hpp>

#include <string_view>

struct scaled_bf16 {
  using compute = locus::bf16;
  using master = float;
  static constexpr bool requires_loss_scaling = true;
  static constexpr std::string_view name = "scaled-bf16";
};

void build() {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, scaled_bf16>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters());
#ifdef LOCUS_VIOLATION
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
#else
  locus::amp::grad_scaler<locus::cpu> scaler;
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{}, scaler);
#endif
  (void)t;
}
