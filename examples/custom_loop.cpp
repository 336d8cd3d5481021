// custom_loop: a training loop written by hand from locus's building blocks, for code
// that needs more control than train::trainer gives (a custom schedule, several
// losses, a model inside a larger program). It fits an MLP to a smooth function of
// four inputs (synthetic data, so it needs no dataset) with the mean squared error:
//
//   forward -> loss (value and gradient in one kernel) -> backward -> optimizer step
//
// on the best available device (LOCUS_DEVICE=cpu, or `custom_loop cpu`, forces the
// cpu). Nothing is read back to the host inside the loop: the loss stays on the device
// and is copied only when it is printed. The program checks what it claims: the test
// error must end below 1% of the targets' variance (what predicting the mean
// scores), else it exits with status 1. Compiled by nvcc when CUDA is enabled.
#include <locus/train.hpp>  // locus.hpp plus amp, nn, optim and train

#include <cstdint>
#include <cstdio>
#include <string>

namespace {

constexpr std::int64_t features = 4;
constexpr std::int64_t steps = 800;
constexpr double base_lr = 3e-3;

/// Inputs uniform in [-1, 1) and the target y = tanh(3 x0) exp(-x1^2) + x2 x3 / 2, both
/// made on D: element i depends only on (seed, i), so every device gets the same data.
template <class D>
std::pair<locus::tensor<float, D, 2>, locus::tensor<float, D, 2>> make_data(std::int64_t n, std::uint64_t seed) {
  // Feature-major, so that each feature is a contiguous row: a [n, 1] column view.
  locus::tensor<float, D, 2> xt = locus::rand<float, D>({features, n}, seed, -1.0, 1.0);
  auto col = [&](std::int64_t j) { return std::as_const(xt).slice(j, j + 1).reshape({n, 1}); };
  // The target is one fused pass over the four columns.
  locus::tensor<float, D, 2> y =
      locus::tanh(col(0) * 3.0f) * locus::exp(locus::neg(col(1) * col(1))) + col(2) * col(3) * 0.5f;
  // The model reads [n, features]: transpose is a view, clone() makes it a contiguous tensor.
  locus::tensor<float, D, 2> x = locus::transpose(xt.view()).clone();
  return {std::move(x), std::move(y)};
}

}  // namespace

int main(int argc, char** argv) {
  const auto choice = argc > 1 ? locus::parse_device_choice(argv[1]) : locus::device_choice::automatic;
  return locus::with_device(choice, [](auto device) -> int {
    using D = decltype(device);
    // fp32: the model's forward takes its compute dtype, so bf16_mixed would need the inputs
    // cast to bf16 first (locus::cast<locus::bf16>; the trainer does that itself), and
    // fp16_mixed a grad scaler.
    using P = locus::amp::fp32;
    std::printf("custom_loop on %s\n", std::string(D::name).c_str());

    auto [x_train, y_train] = make_data<D>(8192, /*seed=*/1);
    auto [x_test, y_test] = make_data<D>(2048, /*seed=*/2);

    // The model, its optimizer and its loss: one device and one policy, by type.
    locus::nn::sequential model(locus::nn::linear<D, P>(features, 64), locus::nn::tanh<D, P>(),
                                locus::nn::linear<D, P>(64, 64), locus::nn::tanh<D, P>(),
                                locus::nn::linear<D, P>(64, 1));
    model.reset_parameters(/*seed=*/7);  // PyTorch's nn.Linear initialisation, seeded
    locus::optim::adamw<D> opt(model.parameters(), {.lr = base_lr, .weight_decay = 0.0});
    locus::nn::mse::state<D, P> loss(locus::nn::mse{});
    const locus::optim::cosine_lr schedule{.total_steps = steps, .min_lr = 1e-4};

    const std::int64_t batch = 256, n = x_train.extent(0);
    for (std::int64_t step = 0; step < steps; ++step) {
      const std::int64_t b = (step * batch) % n;  // sequential batches: a view each, no copy
      const auto xb = std::as_const(x_train).slice(b, b + batch);
      const auto yb = std::as_const(y_train).slice(b, b + batch);

      opt.set_lr(schedule(step, base_lr));
      auto out = model.forward(xb);            // saves what backward needs
      auto l = loss.forward(out, yb);          // rank-0 loss on D; its gradient in loss.grad()
      model.backward(loss.grad());             // accumulates the parameters' gradients
      opt.step();                              // one fused pass over every parameter
      model.parameters().zero_grad();

      if (step % 200 == 0 || step == steps - 1)     // the only read-backs of the loop
        std::printf("step %4lld  train mse %.5f\n", static_cast<long long>(step),
                    static_cast<double>(locus::to<locus::cpu>(l).item()));
    }

    // Evaluation: the inference forward saves nothing (PyTorch's no_grad).
    auto pred = model.infer(std::as_const(x_test).view());
    const double test_mse = locus::to<locus::cpu>(locus::mean((pred - y_test) * (pred - y_test))).item();
    const double variance = locus::to<locus::cpu>(locus::var(y_test, locus::correction(0))).item();
    std::printf("test mse %.5f, target variance %.5f (ratio %.4f; predicting the mean scores 1)\n", test_mse,
                variance, test_mse / variance);
    if (!(test_mse < 0.01 * variance)) {
      std::printf("custom_loop: the test error did not fall below 1%% of the variance\n");
      return 1;
    }
    return 0;
  });
}
