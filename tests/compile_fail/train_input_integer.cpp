// expect: error: .*locus: the trainer's input batch holds floating-point features .f32, f64, f16 or bf16., but this one holds integers or bool; convert it first
// Rule: a model reads floating-point features; raw u8 pixels are converted (and
// scaled) explicitly, never cast silently.
#include <locus/train/trainer.hpp>

using P = locus::amp::fp32;

void train_one(locus::tensor<std::uint8_t, locus::cpu, 2>& pixels, locus::tensor<std::int64_t, locus::cpu, 1>& y) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(784, 10));
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
#ifdef LOCUS_VIOLATION
  t.step(pixels, y);
#else
  const auto x = locus::eval(locus::cast<float>(pixels) / 255.0f);
  t.step(x, y);
#endif
}
