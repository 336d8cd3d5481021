// The fix: dynamic loss scaling with locus::amp::grad_scaler<D> (PyTorch's GradScaler):
// the loss gradient is multiplied by the scale (65536 at first) so small gradients stay
// representable in f16, then every gradient is divided by it before the step; a step
// whose gradients overflowed is skipped on the device and the scale halves, and the
// scale doubles after growth_interval clean steps.
//   1. the trainer: pass the scaler, it makes every call;
//   2. a hand-written loop: loss.forward(out, y, scaler.scale_ptr()), model.backward,
//      scaler.unscale(params), opt.step(scaler.state()), scaler.update().
// (amp::bf16_mixed needs no scaler: bf16 has f32's range.) Runs on the best available
// device (cuda on a GPU machine, cpu here; LOCUS_DEVICE or `fixed cpu` chooses);
// compiled by nvcc in a CUDA build.
#include <locus/train.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

#include "synthetic.hpp"

int main(int argc, char** argv) {
  const auto choice = argc > 1 ? locus::parse_device_choice(argv[1]) : locus::device_choice::automatic;
  return locus::with_device(choice, [](auto device) -> int {
    using D = decltype(device);
    using P = locus::amp::fp16_mixed;
    namespace nn = locus::nn;
    auto data = pitfalls::make_data(4096, 32, 4, /*seed=*/1);
    locus::tensor<float, D, 2> x = locus::to<D>(data.x);
    locus::tensor<std::int64_t, D, 1> y = locus::to<D>(data.y);
    const locus::index_t n = x.extent(0), batch = 128;

    // 1. The trainer with a grad scaler (it casts the f32 batches to f16 itself).
    nn::sequential model(nn::linear<D, P>(32, 64), nn::relu<D, P>(), nn::linear<D, P>(64, 4));
    locus::optim::adamw<D> opt(model.parameters(), {.lr = 3e-3});
    locus::amp::grad_scaler<D> scaler({.growth_interval = 50});
    locus::train::trainer t(model, opt, nn::cross_entropy{}, scaler);
    double first = 0.0, last = 0.0;
    for (int epoch = 0; epoch < 5; ++epoch) {
      for (locus::index_t b = 0; b < n; b += batch) t.step(x.slice(b, b + batch), y.slice(b, b + batch));
      (epoch == 0 ? first : last) = t.report().loss;
    }
    std::printf("trainer on %s in f16: loss %.3f in epoch 1, %.3f in epoch 5; scale now %g, %lld steps skipped\n",
                std::string(D::name).c_str(), first, last, static_cast<double>(scaler.scale()),
                static_cast<long long>(scaler.skipped_steps()));

    // 2. The same by hand.
    nn::sequential model2(nn::linear<D, P>(32, 64), nn::relu<D, P>(), nn::linear<D, P>(64, 4));
    locus::optim::adamw<D> opt2(model2.parameters(), {.lr = 3e-3});
    locus::amp::grad_scaler<D> scaler2({.growth_interval = 50});
    nn::cross_entropy::state<D, P> loss(nn::cross_entropy{});
    locus::tensor<locus::f16, D, 2> x16 = locus::cast<locus::f16>(x);  // the model's compute dtype
    double first2 = 0.0, last2 = 0.0;
    for (int epoch = 0; epoch < 5; ++epoch) {
      for (locus::index_t b = 0; b < n; b += batch) {
        auto out = model2.forward(x16.slice(b, b + batch));
        auto l = loss.forward(out, y.slice(b, b + batch), scaler2.scale_ptr());  // gradient of scale * loss
        model2.backward(loss.grad());
        scaler2.unscale(model2.parameters());  // gradients / scale, and the overflow check
        opt2.step(scaler2.state());            // skipped on the device after an overflow
        scaler2.update();
        model2.parameters().zero_grad();
        if (b == 0) (epoch == 0 ? first2 : last2) = locus::to<locus::cpu>(l).item();
      }
    }
    std::printf("hand-written loop in f16: loss of the first batch %.3f in epoch 1, %.3f in epoch 5; scale now %g\n",
                first2, last2, static_cast<double>(scaler2.scale()));
    if (!(last < 0.5 * first && last2 < 0.5 * first2)) {
      std::printf("fixed: f16 training with loss scaling did not learn\n");
      return 1;
    }
    return 0;
  });
}
