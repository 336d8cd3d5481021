// The main job's ResNet module (examples/resnet.hpp) against the same network written in
// PyTorch (tests/python/resnet_torch.py), both ways:
//   - PyTorch's weights (its state_dict, f64, batch norm's statistics randomised) load
//     into locus with nn::load; one training forward and backward of the mean
//     cross-entropy must give PyTorch's logits, loss, every parameter's gradient and
//     batch norm's updated running statistics, and the eval-mode logits after it;
//   - a locus ResNet trained in f32 for a few steps is written with nn::save, with some
//     inputs and locus's logits for them; the script's `check` loads the file into the
//     PyTorch model (strict) and must get those logits.
// The directory is named by LOCUS_RESNET_TORCH_DIR (the CTest "interop: the ResNet module
// against PyTorch ..." runs the script, this case, then the script's check).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <string>
#include <vector>

#include <locus/train.hpp>
#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
#include <locus/io/safetensors.hpp>
#endif

#include "../examples/resnet.hpp"

#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
namespace {

using locus::index_t;
namespace nn = locus::nn;
using D = locus::cpu;

// Both sides in f64 with other summation orders (im2col + BLAS against oneDNN, two-pass
// batch statistics): a few ulps of the sums; 1e-9 relative catches any wrong tap,
// statistic or skip path (they are off by far more).
constexpr double kTol = 1e-9;

void compare(const locus::io::archive<D>& a, const std::string& key, const double* got, index_t n) {
  if (!a.contains(key)) {
    FAIL_CHECK("the PyTorch file has no tensor " << key);
    return;
  }
  const auto want = a.template flat<double>(key);
  if (want.numel() != n) {
    FAIL_CHECK(key << ": PyTorch has " << want.numel() << " elements, locus " << n);
    return;
  }
  index_t bad = 0, worst_i = 0;
  double worst = -1;
  for (index_t i = 0; i < n; ++i) {
    const double d = std::abs(got[i] - want(i)), allowed = kTol + kTol * std::abs(want(i));
    const double r = std::isnan(d) ? HUGE_VAL : d / allowed;
    if (!(d <= allowed)) ++bad;
    if (r > worst) {
      worst = r;
      worst_i = i;
    }
  }
  CHECK_MESSAGE(bad == 0, std::setprecision(17) << key << ": " << bad << " of " << n
                                                << " elements differ from PyTorch by more than 1e-9 (1 + |PyTorch|); "
                                                   "worst at "
                                                << worst_i << ": locus " << got[worst_i] << ", PyTorch "
                                                << want(worst_i));
}

using net64 = locus_examples::resnet<D, locus::amp::fp64>;
using net32 = locus_examples::resnet<D, locus::amp::fp32>;
constexpr index_t kClasses = 10, kWidth = 4;
constexpr std::array<int, 3> kBlocks{2, 1, 1};

}  // namespace
#endif

TEST_CASE("The ResNet module equals PyTorch in f64 and its checkpoint loads into PyTorch" * doctest::skip()) {
#if !defined(LOCUS_HAS_JSON) || !LOCUS_HAS_JSON
  FAIL("reading the PyTorch files needs locus/io/safetensors.hpp, which needs nlohmann-json");
#else
  const char* env = std::getenv("LOCUS_RESNET_TORCH_DIR");
  if (env == nullptr || *env == '\0')
    FAIL("LOCUS_RESNET_TORCH_DIR is not set (tests/python/resnet_torch.py write DIR writes it; the CTest "
         "\"interop: the ResNet module against PyTorch ...\" runs both)");
  const std::filesystem::path dir = env;

  SUBCASE("PyTorch's weights: forward, loss, gradients, running statistics, eval logits") {
    nn::model<net64> m(kClasses, kWidth, kBlocks);
    nn::load(dir / "weights.safetensors", m);  // strict: every name, shape and buffer
    const auto ref = locus::io::load<D>(dir / "reference.safetensors");
    const auto x = ref.template get<double, 4>("x");
    const auto y = ref.template get<std::int64_t, 1>("y");

    const auto logits = m.forward(x);
    const index_t n = logits.shape()[0], k = logits.shape()[1];
    compare(ref, "logits", logits.data_handle(), logits.numel());
    // the mean cross-entropy and its gradient, in f64 here
    double loss = 0;
    locus::tensor<double, D, 2> g({n, k});
    for (index_t i = 0; i < n; ++i) {
      double mx = -HUGE_VAL, s = 0;
      for (index_t j = 0; j < k; ++j) mx = std::max(mx, logits(i, j));
      for (index_t j = 0; j < k; ++j) s += std::exp(logits(i, j) - mx);
      loss += (std::log(s) + mx - logits(i, y(i))) / static_cast<double>(n);
      for (index_t j = 0; j < k; ++j)
        g(i, j) = (std::exp(logits(i, j) - mx) / s - (j == y(i) ? 1.0 : 0.0)) / static_cast<double>(n);
    }
    compare(ref, "loss", &loss, 1);
    m.parameters().zero_grad();
    (void)m.backward(g.view());
    const auto grad = m.parameters().grad();
    for (const auto& e : m.parameters().entries()) compare(ref, "grad." + e.name, grad.data_handle() + e.offset, e.numel);
    m.for_each_buffer([&](const std::string& name, auto v) {
      using V = decltype(v);
      if constexpr (std::is_same_v<typename V::value_type, const double> ||
                    std::is_same_v<typename V::value_type, double>) {
        compare(ref, "after." + name, v.data_handle(), v.numel());
      } else {
        const auto want = ref.template flat<std::int64_t>("after." + name);
        const std::int64_t got = *v.data_handle();
        CHECK_MESSAGE(got == want(0), name << ": locus counts " << got << " batches, PyTorch " << want(0));
      }
    });
    const auto eval = m.infer(x);
    compare(ref, "logits_eval", eval.data_handle(), eval.numel());
  }

  SUBCASE("a locus-trained f32 ResNet, for PyTorch to load") {
    nn::model<net32> m(kClasses, kWidth, kBlocks);
    m.reset_parameters(7);
    locus::optim::adamw<D> opt(m.parameters(), {.lr = 3e-3});
    locus::train::trainer t(m, opt, nn::cross_entropy{});
    const auto x = locus::randn<float, D>({16, 1, 10, 10}, 11);
    locus::tensor<std::int64_t, D, 1> y({16});
    for (index_t i = 0; i < 16; ++i) y(i) = (i * 7) % kClasses;
    for (int s = 0; s < 20; ++s) t.step(x, y);
    nn::save(dir / "locus_trained.safetensors", m);
    const auto logits = m.infer(x);
    locus::io::writer w;
    w.add("x", x.view());
    w.add("logits", logits.view());
    w.save(dir / "locus_io.safetensors");
    CHECK(std::filesystem::exists(dir / "locus_trained.safetensors"));
  }
#endif
}
