// The fix: let the trainer accumulate, {.accumulate = k}: it weights each micro-batch's
// loss by 1/k and takes the optimizer step after the k-th, so k micro-batches of B are
// one step on a batch of k*B (to rounding). By hand: pass the weight to the loss,
// loss.forward(out, y, nullptr, 1.0 / k), call backward for every micro-batch, and
// step and zero the gradients once per k. The program checks both against one step on
// the whole batch. Runs on the best available device (cuda on a GPU machine, cpu here;
// LOCUS_DEVICE or `fixed cpu` chooses); compiled by nvcc in a CUDA build.
#include <locus/train.hpp>

#include <cmath>
#include <cstdio>
#include <string>

#include "synthetic.hpp"

int main(int argc, char** argv) {
  const auto choice = argc > 1 ? locus::parse_device_choice(argv[1]) : locus::device_choice::automatic;
  return locus::with_device(choice, [](auto device) -> int {
    using D = decltype(device);
    using P = locus::amp::fp32;
    namespace nn = locus::nn;
    constexpr int k = 4;
    constexpr locus::index_t micro = 128, batch = k * micro;
    auto make_model = [] {
      nn::sequential model(nn::linear<D, P>(32, 64), nn::relu<D, P>(), nn::linear<D, P>(64, 4));
      model.reset_parameters(/*seed=*/7);
      return model;
    };
    auto distance = [](const auto& a, const auto& b) {  // |a - b| over every weight
      const locus::tensor<float, D, 1> d = a.parameters().master() - b.parameters().master();
      return std::sqrt(static_cast<double>(locus::to<locus::cpu>(locus::sum(d * d)).item()));
    };
    auto data = pitfalls::make_data(batch, 32, 4, /*seed=*/1);
    const locus::tensor<float, D, 2> x = locus::to<D>(data.x);
    const locus::tensor<std::int64_t, D, 1> y = locus::to<D>(data.y);
    const auto start = make_model();

    // The reference: one step on the whole batch.
    auto whole = make_model();
    locus::optim::sgd<D> opt_whole(whole.parameters(), {.lr = 0.01});
    locus::train::trainer t_whole(whole, opt_whole, nn::cross_entropy{});
    t_whole.step(x, y);

    // 1. The trainer: k micro-batches, one optimizer step.
    auto model = make_model();
    locus::optim::sgd<D> opt(model.parameters(), {.lr = 0.01});
    locus::train::trainer t(model, opt, nn::cross_entropy{}, {.accumulate = k});
    for (locus::index_t i = 0; i < k; ++i) t.step(x.slice(micro * i, micro * (i + 1)), y.slice(micro * i, micro * (i + 1)));

    // 2. By hand.
    auto model2 = make_model();
    locus::optim::sgd<D> opt2(model2.parameters(), {.lr = 0.01});
    nn::cross_entropy::state<D, P> loss(nn::cross_entropy{});
    for (locus::index_t i = 0; i < k; ++i) {
      auto out = model2.forward(x.slice(micro * i, micro * (i + 1)));
      loss.forward(out, y.slice(micro * i, micro * (i + 1)), nullptr, 1.0 / k);  // weighted 1/k
      model2.backward(loss.grad());                                                // adds to the gradients
    }
    opt2.step();  // once per k micro-batches
    model2.parameters().zero_grad();

    const double unit = distance(whole, start);
    const double d1 = distance(model, whole) / unit, d2 = distance(model2, whole) / unit;
    std::printf("on %s, in steps of the whole batch of %lld: the trainer's %d micro-batches moved the weights %.4f "
                "and ended %.1e from the whole batch's step; the loop by hand %.4f and %.1e (%lld optimizer step)\n",
                std::string(D::name).c_str(), (long long)batch, k, distance(model, start) / unit, d1,
                distance(model2, start) / unit, d2, (long long)t.report().optimizer_steps);
    if (!(d1 < 1e-4 && d2 < 1e-4)) {
      std::printf("fixed: the accumulated step differs from one step on the whole batch\n");
      return 1;
    }
    return 0;
  });
}
