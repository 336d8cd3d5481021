// Convolutional layers on the host: conv2d against a direct f64 convolution written
// here, finite-difference gradient checks in f64 for every layer (conv2d with stride,
// padding, dilation and groups, both host paths; pooling; batch norm; flatten), the host
// path against the device-generic path, batch norm's statistics against a double
// reference, mixed precision against fp32, rank and channel errors, and a CNN trained
// through the trainer on Fashion-MNIST images.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include <locus/data/loader.hpp>
#include <locus/data/transforms.hpp>
#include <locus/train.hpp>

namespace {

using locus::extents;
using locus::index_t;
namespace nn = locus::nn;
using D = locus::cpu;
using P64 = locus::amp::fp64;
using P32 = locus::amp::fp32;

/// Deterministic values in (-1, 1) that differ from element to element (no ties for max).
double value_at(index_t i, double salt) { return std::sin(0.7 * static_cast<double>(i) + salt) * 0.9 + 0.01 * std::cos(3.1 * i); }

template <class T, std::size_t R>
locus::tensor<T, D, R> filled(const extents<R>& s, double salt) {
  locus::tensor<T, D, R> t(s);
  for (index_t i = 0; i < t.numel(); ++i) t.data_handle()[i] = static_cast<T>(value_at(i, salt));
  return t;
}

/// The conv2d of PyTorch's definition, in f64 loops: y[n, k, oh, ow] = b[k] + sum over
/// c in k's group, ky, kx of w[k, c, ky, kx] x[n, g * cg + c, oh * s - p + ky * d, ...].
std::vector<double> conv_reference(const double* x, const double* w, const double* b, index_t n, index_t c, index_t h,
                                   index_t wd, index_t k, index_t ks, index_t s, index_t p, index_t d, index_t groups,
                                   index_t& ho, index_t& wo) {
  ho = (h + 2 * p - d * (ks - 1) - 1) / s + 1;
  wo = (wd + 2 * p - d * (ks - 1) - 1) / s + 1;
  const index_t cg = c / groups, kg = k / groups;
  std::vector<double> y(static_cast<std::size_t>(n * k * ho * wo));
  for (index_t in = 0; in < n; ++in)
    for (index_t ik = 0; ik < k; ++ik)
      for (index_t oh = 0; oh < ho; ++oh)
        for (index_t ow = 0; ow < wo; ++ow) {
          double acc = b ? b[ik] : 0.0;
          const index_t g = ik / kg;
          for (index_t ic = 0; ic < cg; ++ic)
            for (index_t ky = 0; ky < ks; ++ky)
              for (index_t kx = 0; kx < ks; ++kx) {
                const index_t ih = oh * s - p + ky * d, iw = ow * s - p + kx * d;
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                acc += w[((ik * cg + ic) * ks + ky) * ks + kx] * x[((in * c + g * cg + ic) * h + ih) * wd + iw];
              }
          y[static_cast<std::size_t>(((in * k + ik) * ho + oh) * wo + ow)] = acc;
        }
  return y;
}

struct generic_path {
  explicit generic_path(bool on) { nn::detail::conv_generic_path() = on; }
  ~generic_path() { nn::detail::conv_generic_path() = false; }
};

/// L = sum(y * r) for a fixed r: checks dL/dx and dL/dparameters from backward against
/// central differences (h = 1e-5, f64), at every element (or every `stride`-th).
template <class Model>
void gradient_check(Model& m, locus::tensor<double, D, Model::input_rank>& x, double tol = 1e-6, index_t every = 1) {
  auto y0 = m.forward(std::as_const(x).view());
  using YT = locus::tensor<double, D, Model::output_rank>;
  YT r(y0.shape());
  for (index_t i = 0; i < r.numel(); ++i) r.data_handle()[i] = value_at(i, 2.5);
  m.parameters().zero_grad();
  const auto gx_view = m.backward(std::as_const(r).view(), true);
  std::vector<double> gx(gx_view.data_handle(), gx_view.data_handle() + gx_view.numel());
  const auto g = m.parameters().grad();
  std::vector<double> gp(g.data_handle(), g.data_handle() + g.numel());
  const auto loss = [&] {
    const auto y = m.forward(std::as_const(x).view());
    double s = 0.0;
    for (index_t i = 0; i < y.numel(); ++i) s += y.data_handle()[i] * r.data_handle()[i];
    return s;
  };
  const double h = 1e-5;  // central differences: truncation ~h^2, rounding ~eps * |L| / h
  int bad = 0;
  for (index_t i = 0; i < x.numel(); i += every) {
    double& v = x.data_handle()[i];
    const double keep = v;
    v = keep + h;
    const double lp = loss();
    v = keep - h;
    const double lm = loss();
    v = keep;
    const double fd = (lp - lm) / (2 * h);
    if (std::abs(fd - gx[static_cast<std::size_t>(i)]) > tol * (1.0 + std::abs(fd)) && bad++ < 5)
      FAIL_CHECK("dL/dx[" << i << "]: backward " << gx[static_cast<std::size_t>(i)] << ", finite difference " << fd);
  }
  auto master = m.parameters().master();
  for (const auto& e : m.parameters().entries()) {
    for (index_t j = 0; j < e.numel; j += every) {
      double& v = master.data_handle()[e.offset + j];
      const double keep = v;
      v = keep + h;
      const double lp = loss();
      v = keep - h;
      const double lm = loss();
      v = keep;
      const double fd = (lp - lm) / (2 * h);
      const double an = gp[static_cast<std::size_t>(e.offset + j)];
      if (std::abs(fd - an) > tol * (1.0 + std::abs(fd)) && bad++ < 5)
        FAIL_CHECK(e.name << "[" << j << "]: backward " << an << ", finite difference " << fd);
    }
  }
  CHECK(bad == 0);
}

struct conv_case {
  index_t n, c, h, w, k, ks, stride, pad, dil, groups;
  bool bias;
};

const conv_case conv_cases[] = {
    {2, 3, 7, 6, 4, 3, 1, 0, 1, 1, true},   // plain
    {2, 3, 7, 7, 4, 3, 1, 1, 1, 1, true},   // same padding
    {3, 2, 9, 8, 3, 3, 2, 1, 1, 1, true},   // stride 2
    {2, 2, 9, 9, 2, 3, 1, 2, 2, 1, false},  // dilation 2, no bias
    {2, 4, 6, 6, 6, 3, 1, 1, 1, 2, true},   // groups 2
    {1, 4, 5, 5, 4, 1, 1, 0, 1, 4, true},   // depthwise 1x1
    {2, 3, 5, 4, 2, 5, 3, 2, 1, 1, true},   // kernel 5, stride 3, non-square input
};

}  // namespace

TEST_CASE("conv2d: forward equals a direct f64 convolution, on the host path and the device-generic path") {
  for (const bool generic : {false, true}) {
    generic_path gp(generic);
    for (const auto& cc : conv_cases) {
      CAPTURE(generic);
      CAPTURE(cc.stride);
      CAPTURE(cc.pad);
      CAPTURE(cc.dil);
      CAPTURE(cc.groups);
      nn::sequential m(nn::conv2d<D, P64>(cc.c, cc.k, cc.ks,
                                          {.stride = cc.stride, .padding = cc.pad, .dilation = cc.dil,
                                           .groups = cc.groups, .bias = cc.bias}));
      m.reset_parameters(7);
      auto x = filled<double, 4>({cc.n, cc.c, cc.h, cc.w}, 0.3);
      const auto& conv = m.get<0>();
      const double* w = conv.weight().data_handle();
      const double* b = cc.bias ? m.parameters().master().data_handle() + m.parameters().entries()[1].offset : nullptr;
      index_t ho = 0, wo = 0;
      const auto ref = conv_reference(x.data_handle(), w, b, cc.n, cc.c, cc.h, cc.w, cc.k, cc.ks, cc.stride, cc.pad,
                                      cc.dil, cc.groups, ho, wo);
      const auto y = m.forward(std::as_const(x).view());
      REQUIRE(y.shape() == extents<4>{cc.n, cc.k, ho, wo});
      const auto yi = m.infer(std::as_const(x).view());
      double worst = 0.0;
      for (index_t i = 0; i < y.numel(); ++i) {
        worst = std::max(worst, std::abs(y.data_handle()[i] - ref[static_cast<std::size_t>(i)]));
        CHECK(yi.data_handle()[i] == y.data_handle()[i]);
      }
      CHECK(worst < 1e-12);
    }
  }
}

TEST_CASE("conv2d: gradients equal finite differences in f64 (stride, padding, dilation, groups, both paths)") {
  for (const bool generic : {false, true}) {
    generic_path gp(generic);
    for (const auto& cc : conv_cases) {
      CAPTURE(generic);
      CAPTURE(cc.ks);
      CAPTURE(cc.stride);
      CAPTURE(cc.pad);
      CAPTURE(cc.dil);
      CAPTURE(cc.groups);
      nn::sequential m(nn::conv2d<D, P64>(cc.c, cc.k, cc.ks,
                                          {.stride = cc.stride, .padding = cc.pad, .dilation = cc.dil,
                                           .groups = cc.groups, .bias = cc.bias}));
      m.reset_parameters(11);
      auto x = filled<double, 4>({cc.n, cc.c, cc.h, cc.w}, 0.9);
      gradient_check(m, x);
    }
  }
}

TEST_CASE("conv2d: the host path and the device-generic path agree in f32 and bf16, gradients accumulate") {
  nn::sequential a(nn::conv2d<D, P32>(3, 8, 3, {.stride = 1, .padding = 1, .groups = 1}), nn::relu<D, P32>());
  a.reset_parameters(3);
  auto x = filled<float, 4>({5, 3, 10, 9}, 0.1);
  auto r = filled<float, 4>({5, 8, 10, 9}, 1.3);
  const auto run = [&](bool generic, int times) {
    generic_path gp(generic);
    a.parameters().zero_grad();
    std::vector<float> y, gx;
    for (int t = 0; t < times; ++t) {
      const auto yv = a.forward(std::as_const(x).view());
      y.assign(yv.data_handle(), yv.data_handle() + yv.numel());
      const auto g = a.backward(std::as_const(r).view(), true);
      gx.assign(g.data_handle(), g.data_handle() + g.numel());
    }
    const auto gp_ = a.parameters().grad();
    std::vector<float> grads(gp_.data_handle(), gp_.data_handle() + gp_.numel());
    return std::tuple{y, gx, grads};
  };
  const auto [y1, gx1, g1] = run(false, 1);
  const auto [y2, gx2, g2] = run(true, 1);
  const auto [y3, gx3, g3] = run(false, 2);
  for (std::size_t i = 0; i < y1.size(); ++i) CHECK(std::abs(y1[i] - y2[i]) <= 1e-5f * (1 + std::abs(y1[i])));
  for (std::size_t i = 0; i < gx1.size(); ++i) CHECK(std::abs(gx1[i] - gx2[i]) <= 1e-5f * (1 + std::abs(gx1[i])));
  for (std::size_t i = 0; i < g1.size(); ++i) {
    CHECK(std::abs(g1[i] - g2[i]) <= 1e-4f * (1 + std::abs(g1[i])));
    CHECK(std::abs(2 * g1[i] - g3[i]) <= 1e-4f * (1 + std::abs(g3[i])));  // two backwards add up
  }

  // bf16: the same weights, rounded; outputs within bf16's precision of f32's
  using PB = locus::amp::bf16_mixed;
  nn::sequential b(nn::conv2d<D, PB>(3, 8, 3, {.padding = 1}), nn::relu<D, PB>());
  b.reset_parameters(3);
  auto xb = filled<locus::bf16, 4>({5, 3, 10, 9}, 0.1);
  for (const bool generic : {false, true}) {
    generic_path gp(generic);
    const auto yb = b.forward(std::as_const(xb).view());
    double worst = 0.0;
    for (index_t i = 0; i < yb.numel(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(static_cast<float>(yb.data_handle()[i])) - y1[static_cast<std::size_t>(i)]));
    CHECK(worst < 0.05);
    b.parameters().zero_grad();
    auto rb = filled<locus::bf16, 4>({5, 8, 10, 9}, 1.3);
    (void)b.backward(std::as_const(rb).view(), true);
    const auto gb = b.parameters().grad();
    double gworst = 0.0, gscale = 0.0;
    for (index_t i = 0; i < gb.numel(); ++i) {
      gworst = std::max(gworst, static_cast<double>(std::abs(gb.data_handle()[i] - g1[static_cast<std::size_t>(i)])));
      gscale = std::max(gscale, static_cast<double>(std::abs(g1[static_cast<std::size_t>(i)])));
    }
    CHECK(gworst < 0.02 * gscale);
  }
}

TEST_CASE("pooling: gradients equal finite differences in f64, max pooling propagates NaN") {
  SUBCASE("max_pool2d") {
   for (const bool generic : {false, true}) {
    generic_path gp(generic);
    CAPTURE(generic);
    nn::sequential m(nn::max_pool2d<D, P64>(2));
    auto x = filled<double, 4>({2, 3, 6, 7}, 0.2);
    gradient_check(m, x);
    nn::sequential o(nn::max_pool2d<D, P64>(3, {.stride = 2, .padding = 1}));  // overlapping, padded
    auto x2 = filled<double, 4>({2, 2, 7, 6}, 0.4);
    gradient_check(o, x2);
    CHECK(o.output_shape({2, 2, 7, 6}) == std::vector<index_t>{2, 2, 4, 3});
   }
  }
  SUBCASE("avg_pool2d") {
   for (const bool generic : {false, true}) {
    generic_path gp(generic);
    CAPTURE(generic);
    nn::sequential m(nn::avg_pool2d<D, P64>(2));
    auto x = filled<double, 4>({2, 3, 6, 7}, 0.2);
    gradient_check(m, x);
    nn::sequential o(nn::avg_pool2d<D, P64>(3, {.stride = 2, .padding = 1}));
    auto x2 = filled<double, 4>({2, 2, 7, 6}, 0.4);
    gradient_check(o, x2);
    nn::sequential q(nn::avg_pool2d<D, P64>(3, {.stride = 2, .padding = 1, .count_include_pad = false}));
    gradient_check(q, x2);
    // the divisors at a corner: with the padding counted 9, without it 4
    locus::tensor<double, D, 4> ones(extents<4>{1, 1, 3, 3});
    for (index_t i = 0; i < 9; ++i) ones.data_handle()[i] = 1.0;
    const auto with = o.infer(std::as_const(ones).view());
    const auto without = q.infer(std::as_const(ones).view());
    CHECK(with(0, 0, 0, 0) == doctest::Approx(4.0 / 9.0));
    CHECK(without(0, 0, 0, 0) == doctest::Approx(1.0));
   }
  }
  SUBCASE("adaptive_avg_pool2d") {
   for (const bool generic : {false, true}) {
    generic_path gp(generic);
    CAPTURE(generic);
    nn::sequential m(nn::adaptive_avg_pool2d<D, P64>(3, 2));  // windows that overlap: 7 -> 3
    auto x = filled<double, 4>({2, 2, 7, 5}, 0.6);
    gradient_check(m, x);
    nn::sequential g(nn::adaptive_avg_pool2d<D, P64>(1));  // global average
    const auto y = g.infer(std::as_const(x).view());
    double s = 0.0;
    for (index_t i = 0; i < 35; ++i) s += x.data_handle()[i];
    CHECK(y(0, 0, 0, 0) == doctest::Approx(s / 35.0).epsilon(1e-14));
   }
  }
  SUBCASE("NaN") {
    nn::sequential m(nn::max_pool2d<D, P32>(2));
    auto x = filled<float, 4>({1, 1, 4, 4}, 0.0);
    x(0, 0, 1, 1) = std::numeric_limits<float>::quiet_NaN();
    const auto y = m.infer(std::as_const(x).view());
    CHECK(std::isnan(y(0, 0, 0, 0)));
    CHECK(!std::isnan(y(0, 0, 0, 1)));
  }
}

TEST_CASE("batch_norm2d: statistics, running statistics and inference output against a double reference, gradients") {
  const index_t n = 3, c = 2, h = 4, w = 5;
  nn::sequential m(nn::batch_norm2d<D, P64>(c, {.momentum = 0.25}));
  auto x = filled<double, 4>({n, c, h, w}, 0.8);
  for (index_t i = 0; i < x.numel(); ++i) x.data_handle()[i] = x.data_handle()[i] * 3.0 + 1.5;  // mean 1.5-ish
  // weight and bias other than 1 and 0
  auto master = m.parameters().master();
  master.data_handle()[m.parameters().entries()[0].offset + 1] = 1.7;
  master.data_handle()[m.parameters().entries()[1].offset + 0] = -0.4;
  const auto y = m.forward(std::as_const(x).view());
  const auto& bn = m.get<0>();
  for (index_t ch = 0; ch < c; ++ch) {
    double s = 0.0, q = 0.0;
    for (index_t b = 0; b < n; ++b)
      for (index_t j = 0; j < h * w; ++j) s += x.data_handle()[(b * c + ch) * h * w + j];
    const double count = static_cast<double>(n * h * w), mean = s / count;
    for (index_t b = 0; b < n; ++b)
      for (index_t j = 0; j < h * w; ++j) q += std::pow(x.data_handle()[(b * c + ch) * h * w + j] - mean, 2);
    const double var = q / count;
    const double gamma = ch == 1 ? 1.7 : 1.0, beta = ch == 0 ? -0.4 : 0.0;
    for (index_t b = 0; b < n; ++b)
      for (index_t j = 0; j < h * w; ++j) {
        const index_t i = (b * c + ch) * h * w + j;
        CHECK(y.data_handle()[i] == doctest::Approx((x.data_handle()[i] - mean) / std::sqrt(var + 1e-5) * gamma + beta).epsilon(1e-12));
      }
    CHECK(bn.running_mean()(ch) == doctest::Approx(0.25 * mean).epsilon(1e-12));
    CHECK(bn.running_var()(ch) == doctest::Approx(0.75 + 0.25 * q / (count - 1.0)).epsilon(1e-12));
    // inference: the running statistics
    const auto yi = m.infer(std::as_const(x).view());
    const double rm = 0.25 * mean, rv = 0.75 + 0.25 * q / (count - 1.0);
    const index_t i0 = ch * h * w;
    CHECK(yi.data_handle()[i0] == doctest::Approx((x.data_handle()[i0] - rm) / std::sqrt(rv + 1e-5) * gamma + beta).epsilon(1e-12));
  }
  int tracked = 0;
  m.for_each_buffer([&](const std::string& name, const auto& v) {
    if (name == "0.num_batches_tracked") tracked = static_cast<int>(v.data_handle()[0]);
  });
  CHECK(tracked == 1);
  gradient_check(m, x, 1e-6);
  // not affine
  nn::sequential plain(nn::batch_norm2d<D, P64>(c, {.affine = false}));
  CHECK(plain.parameters().count() == 0);
  gradient_check(plain, x, 1e-6);
}

TEST_CASE("a small CNN: gradients of the whole model equal finite differences, flatten is a view") {
  nn::sequential m(nn::conv2d<D, P64>(2, 3, 3, {.padding = 1}), nn::batch_norm2d<D, P64>(3), nn::tanh<D, P64>(),
                   nn::max_pool2d<D, P64>(2), nn::conv2d<D, P64>(3, 4, 2, {.stride = 1}), nn::sigmoid<D, P64>(),
                   nn::flatten<D, P64>(), nn::linear<D, P64>(4 * 2 * 2, 3));
  m.reset_parameters(5);
  auto x = filled<double, 4>({3, 2, 6, 6}, 1.1);
  gradient_check(m, x, 1e-6);
  CHECK(m.output_shape({3, 2, 6, 6}) == std::vector<index_t>{3, 3});
  static_assert(decltype(m)::input_rank == 4 && decltype(m)::output_rank == 2);
}

TEST_CASE("CNN layers: bad arguments and shapes are errors that name the layer") {
  using E = locus::shape_error;
  using Conv = nn::conv2d<D, P32>;
  using MaxPool = nn::max_pool2d<D, P32>;
  using Adaptive = nn::adaptive_avg_pool2d<D, P32>;
  using BatchNorm = nn::batch_norm2d<D, P32>;
  using Relu = nn::relu<D, P32>;
  using Flatten = nn::flatten<D, P32>;
  using Linear = nn::linear<D, P32>;
  CHECK_THROWS_WITH_AS(Conv(3, 8, 3, {.stride = 0}), "locus: conv2d(3, 8, 3, stride=0): stride must be at least 1, got 0", E);
  CHECK_THROWS_WITH_AS(Conv(3, 8, 3, {.groups = 2}),
                       "locus: conv2d(3, 8, 3, groups=2): groups (2) must divide both the input channels (3) and the output channels (8)", E);
  CHECK_THROWS_AS(Conv(0, 8, 3), E);
  CHECK_THROWS_AS(Conv(3, 8, 0), E);
  CHECK_THROWS_AS(Conv(3, 8, 3, {.padding = -1}), E);
  CHECK_THROWS_AS(MaxPool(2, {.stride = 0}), E);
  CHECK_THROWS_WITH_AS(MaxPool(2, {.padding = 2}),
                       "locus: max_pool2d(2, padding=2): padding must be in [0, kernel_size / 2], got 2", E);
  CHECK_THROWS_AS(Adaptive(0), E);
  CHECK_THROWS_AS(BatchNorm(4, {.momentum = 2.0}), locus::value_error);

  // channels that do not match, found when the model is built
  CHECK_THROWS_WITH_AS(nn::sequential(Conv(1, 8, 3), Relu(), Conv(4, 8, 3)),
                       "locus: sequential layer 2: conv2d(4, 8, 3) takes 4 channels, but its input has 8 (the output of the layer before it)", E);
  CHECK_THROWS_WITH_AS(nn::sequential(Conv(1, 8, 3), BatchNorm(6)),
                       "locus: sequential layer 1: batch_norm2d(6) takes 6 channels, but its input has 8 (the output of the layer before it)", E);
  // after a flatten the width is known at the first batch (or from output_shape)
  nn::sequential m(Conv(1, 2, 3), Flatten(), Linear(10, 3));
  CHECK_THROWS_WITH_AS((void)m.output_shape({1, 1, 5, 5}),
                       "locus: sequential layer 2: linear(10, 3) takes 10 features, but its input has 18", E);
  auto x = filled<float, 4>({1, 1, 5, 5}, 0.0);
  CHECK_THROWS_AS((void)m.forward(std::as_const(x).view()), E);
  // the input's channels, and a kernel larger than the padded input
  nn::sequential c(Conv(3, 2, 5, {.padding = 1}));
  auto x1 = filled<float, 4>({1, 1, 8, 8}, 0.0);
  CHECK_THROWS_WITH_AS((void)c.forward(std::as_const(x1).view()),
                       "locus: conv2d(3, 2, 5, padding=1) takes 3 channels, but its input [1, 1, 8, 8] has 1", E);
  auto x2 = filled<float, 4>({1, 3, 2, 2}, 0.0);
  CHECK_THROWS_WITH_AS((void)c.infer(std::as_const(x2).view()),
                       "locus: conv2d(3, 2, 5, padding=1): the kernel (5 wide with dilation) is larger than the padded input [1, 3, 2, 2] (padding 1)", E);
  // batch norm over one value per channel in training
  nn::sequential bn(BatchNorm(3));
  auto x3 = filled<float, 4>({1, 3, 1, 1}, 0.0);
  CHECK_THROWS_AS((void)bn.forward(std::as_const(x3).view()), E);
  CHECK_NOTHROW((void)bn.infer(std::as_const(x3).view()));
  // empty batch: an empty output
  auto x4 = filled<float, 4>({0, 3, 8, 8}, 0.0);
  CHECK(c.infer(std::as_const(x4).view()).shape() == extents<4>{0, 2, 6, 6});
}

TEST_CASE("a CNN trains on Fashion-MNIST images through the trainer and data::images") {
  namespace fs = std::filesystem;
  const fs::path dir = std::getenv("LOCUS_FASHION_MNIST_DIR") ? std::getenv("LOCUS_FASHION_MNIST_DIR") : "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir / "train-images-idx3-ubyte.gz") && !fs::exists(dir / "train-images-idx3-ubyte")) {
    MESSAGE("Fashion-MNIST not found in " << dir << ": skipped");
    return;
  }
  auto train = locus::data::idx_dataset::from_directory(dir, "train");
  auto test = locus::data::idx_dataset::from_directory(dir, "t10k");
  nn::sequential m(nn::conv2d<D, P32>(1, 8, 3, {.padding = 1}), nn::batch_norm2d<D, P32>(8), nn::relu<D, P32>(),
                   nn::max_pool2d<D, P32>(2), nn::conv2d<D, P32>(8, 16, 3, {.padding = 1}), nn::relu<D, P32>(),
                   nn::max_pool2d<D, P32>(2), nn::flatten<D, P32>(), nn::linear<D, P32>(16 * 7 * 7, 10));
  m.reset_parameters(1);
  locus::optim::adamw<D> opt(m.parameters(), {.lr = 2e-3});
  locus::train::trainer t(m, opt, nn::cross_entropy{});
  locus::data::loader<D> rows(train, {.batch_size = 64, .shuffle = true, .seed = 3});
  auto batches = locus::data::images(rows, 1, 28, 28);
  // 100 batches only (a CI-sized run)
  index_t seen = 0;
  double first = 0.0, last = 0.0;
  for (auto& b : batches) {
    t.step(b.x, b.y);
    if (++seen % 20 == 0) {
      const double l = t.report().loss;
      if (seen == 20) first = l;
      last = l;
    }
    if (seen == 100) break;
  }
  CHECK(last < first);
  locus::data::loader<D> test_rows(test, {.batch_size = 500});
  auto test_batches = locus::data::images(test_rows, 1, 28, 28);
  const auto r = t.evaluate(test_batches);
  MESSAGE("CNN after 100 batches of 64: test accuracy " << r.accuracy);
  CHECK(r.accuracy > 0.70);
  CHECK_THROWS_AS(locus::data::images(rows, 1, 28, 27), locus::shape_error);
}

namespace {
/// 96 synthetic 1 x 8 x 8 images, three classes (which quarter holds the bright blob).
struct blobs {
  [[nodiscard]] index_t size() const { return 96; }
  [[nodiscard]] index_t features() const { return 64; }
  std::int64_t load(index_t i, std::span<float> x) const {
    const std::int64_t label = i % 3;
    for (index_t p = 0; p < 64; ++p) {
      const index_t r = p / 8, c = p % 8;
      const bool in = label == 0 ? (r < 4 && c < 4) : label == 1 ? (r >= 4 && c < 4) : (c >= 4);
      x[static_cast<std::size_t>(p)] = static_cast<float>((in ? 0.8 : 0.1) + 0.2 * value_at(i * 64 + p, 0.5));
    }
    return label;
  }
};

auto blob_cnn(std::uint64_t seed) {
  nn::sequential m(nn::conv2d<D, P32>(1, 4, 3, {.padding = 1}), nn::batch_norm2d<D, P32>(4), nn::relu<D, P32>(),
                   nn::max_pool2d<D, P32>(2), nn::dropout<D, P32>(0.1f, 9), nn::flatten<D, P32>(),
                   nn::linear<D, P32>(4 * 4 * 4, 3));
  m.reset_parameters(seed);
  return m;
}

std::filesystem::path temp_file(const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() / ("locus-conv-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p;
}

template <class Model>
std::vector<float> all_state(const Model& m) {
  const auto w = m.parameters().master();
  std::vector<float> out(w.data_handle(), w.data_handle() + w.numel());
  m.for_each_buffer([&](const std::string&, const auto& v) {
    for (index_t i = 0; i < v.numel(); ++i) out.push_back(static_cast<float>(v.data_handle()[i]));
  });
  return out;
}
}  // namespace

TEST_CASE("CNN checkpoints: resume equals no stop bit for bit (batch norm's running statistics included), nn::save/load") {
  const blobs data;
  locus::data::loader<D, blobs> rows(data, {.batch_size = 16, .shuffle = true, .seed = 5});
  auto batches = locus::data::images(rows, 1, 8, 8);
  const auto file = temp_file("resume") / "ck.safetensors";

  auto a = blob_cnn(3);
  locus::optim::adamw<D> oa(a.parameters(), {.lr = 1e-2});
  locus::train::trainer ta(a, oa, nn::cross_entropy{});
  for (std::int64_t e = 0; e < 3; ++e) (void)ta.train_epoch(batches, {.epoch = e});

  auto b = blob_cnn(3);
  {
    locus::optim::adamw<D> ob(b.parameters(), {.lr = 1e-2});
    locus::train::trainer tb(b, ob, nn::cross_entropy{});
    (void)tb.train_epoch(batches, {.epoch = 0});
    locus::train::save_checkpoint(file, tb, 1);
  }
  auto c = blob_cnn(99);  // other weights, fresh statistics
  locus::optim::adamw<D> oc(c.parameters(), {.lr = 1e-2});
  locus::train::trainer tc(c, oc, nn::cross_entropy{});
  REQUIRE(locus::train::resume(file, tc) == 1);
  for (std::int64_t e = 1; e < 3; ++e) (void)tc.train_epoch(batches, {.epoch = e});
  CHECK(all_state(a) == all_state(c));
  const auto arch = locus::io::load<locus::cpu>(file);
  CHECK(arch.contains("1.running_mean"));
  CHECK(arch.info("1.num_batches_tracked").shape.empty());
  CHECK(arch.info("0.weight").shape == std::vector<index_t>{4, 1, 3, 3});

  // the model alone: weights and running statistics, inference equal bit for bit
  const auto mfile = file.parent_path() / "model.safetensors";
  nn::save(mfile, a);
  auto d = blob_cnn(1234);
  nn::load(mfile, d);
  CHECK(all_state(d) == all_state(a));
  locus::tensor<float, D, 4> x(extents<4>{4, 1, 8, 8});
  for (index_t i = 0; i < x.numel(); ++i) x.data_handle()[i] = static_cast<float>(value_at(i, 0.2));
  const auto ya = a.infer(std::as_const(x).view());
  const auto yd = d.infer(std::as_const(x).view());
  for (index_t i = 0; i < ya.numel(); ++i) CHECK(ya.data_handle()[i] == yd.data_handle()[i]);

  // a file without the running statistics (an MLP's) is a shape_error naming them
  nn::sequential mlp(nn::linear<D, P32>(64, 3));
  const auto other = file.parent_path() / "mlp.safetensors";
  nn::save(other, mlp);
  const auto before = all_state(d);
  try {
    nn::load(other, d);
    FAIL("loaded another model's file");
  } catch (const locus::shape_error& e) {
    const std::string what = e.what();
    CHECK(what.find("1.running_mean: model F32 [4], file has no such tensor") != std::string::npos);
  }
  CHECK(all_state(d) == before);
  std::filesystem::remove_all(file.parent_path());
}


TEST_CASE("augmentation: random_crop, horizontal_flip and normalize are counter-based and compose") {
  namespace data = locus::data;
  const data::random_crop crop{.channels = 2, .height = 5, .width = 4, .padding = 1};
  std::vector<float> base(2 * 5 * 4);
  for (std::size_t i = 0; i < base.size(); ++i) base[i] = static_cast<float>(i + 1);
  // a shift by (dy, dx) against the definition, with the fill outside
  for (index_t dy = -1; dy <= 1; ++dy)
    for (index_t dx = -1; dx <= 1; ++dx) {
      auto x = base;
      crop.apply_shift(x, dy, dx);
      for (index_t c = 0; c < 2; ++c)
        for (index_t y = 0; y < 5; ++y)
          for (index_t xx = 0; xx < 4; ++xx) {
            const index_t sy = y + dy, sx = xx + dx;
            const float want = sy >= 0 && sy < 5 && sx >= 0 && sx < 4 ? base[static_cast<std::size_t>((c * 5 + sy) * 4 + sx)] : 0.0f;
            CHECK(x[static_cast<std::size_t>((c * 5 + y) * 4 + xx)] == want);
          }
    }
  // the same key gives the same crop; over many samples every offset occurs
  std::set<std::vector<float>> seen;
  for (index_t i = 0; i < 200; ++i) {
    auto a = base, b = base;
    crop(a, {7, 3, i});
    crop(b, {7, 3, i});
    CHECK(a == b);
    seen.insert(a);
  }
  CHECK(seen.size() == 9);
  // flips: the same key, the same decision; about half flipped; a flip mirrors each row
  const data::horizontal_flip flip{.channels = 2, .height = 5, .width = 4};
  int flipped = 0;
  for (index_t i = 0; i < 1000; ++i) {
    auto a = base;
    flip(a, {1, 0, i});
    if (a != base) {
      ++flipped;
      CHECK(a[0] == base[3]);
      CHECK(a[3] == base[0]);
      CHECK(a[5] == base[6]);
    }
  }
  CHECK(flipped > 430);
  CHECK(flipped < 570);
  // another epoch draws other numbers
  int differ = 0;
  for (index_t i = 0; i < 100; ++i) {
    auto a = base, b = base;
    crop(a, {7, 0, i});
    crop(b, {7, 1, i});
    differ += a != b;
  }
  CHECK(differ > 50);
  // normalize and a composition; sizes that do not match are a shape_error
  const data::normalize norm{.mean = {1.0f, 2.0f}, .std = {2.0f, 4.0f}};
  auto n = base;
  norm(n, {});
  CHECK(n[0] == doctest::Approx(0.0));
  CHECK(n[20] == doctest::Approx((21.0 - 2.0) / 4.0));
  const auto all = data::compose(crop, flip, norm);
  auto c1 = base, c2 = base;
  all(c1, {5, 2, 9});
  crop(c2, {5, 2, 9});
  flip(c2, {5, 2, 9});
  norm(c2, {5, 2, 9});
  CHECK(c1 == c2);
  std::vector<float> small(10);
  CHECK_THROWS_AS(crop(small, {}), locus::shape_error);
  CHECK_THROWS_AS(flip(small, {}), locus::shape_error);
  CHECK_THROWS_AS(data::normalize({.mean = {0.f, 0.f, 0.f}, .std = {1.f, 1.f, 1.f}})(small, {}), locus::shape_error);
}

TEST_CASE("augmentation in the loader: the same batches whatever the prefetch depth, evaluation loaders untouched") {
  const blobs data;
  const auto aug = locus::data::compose(locus::data::random_crop{.channels = 1, .height = 8, .width = 8, .padding = 2},
                                        locus::data::horizontal_flip{.channels = 1, .height = 8, .width = 8});
  const auto collect = [&](int prefetch, std::uint64_t epoch, bool with) {
    locus::data::loader<D, blobs> l(data, {.batch_size = 10, .shuffle = true, .seed = 4, .prefetch = prefetch,
                                           .transform = with ? aug : locus::data::sample_transform{}});
    l.set_epoch(epoch);
    std::vector<float> out;
    for (auto& b : l) out.insert(out.end(), b.x.data_handle(), b.x.data_handle() + b.x.numel());
    return out;
  };
  const auto a = collect(1, 2, true), b = collect(4, 2, true), c = collect(2, 3, true), plain = collect(2, 2, false);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(a != plain);
  // what the loader did equals the transform applied to the plain sample
  locus::data::loader<D, blobs> l(data, {.batch_size = 96, .shuffle = true, .seed = 4});
  l.set_epoch(2);
  const auto order = l.indices();
  std::vector<float> s(64);
  (void)data.load(order[5], s);
  aug(s, {4, 2, order[5]});
  for (index_t j = 0; j < 64; ++j) CHECK(a[static_cast<std::size_t>(5 * 64 + j)] == s[static_cast<std::size_t>(j)]);
}

TEST_CASE("pooling: the host loops equal the per-index kernels bit for bit (f32, bf16, overlapping, padded)") {
  const auto both = [](auto make, auto x) {
    using X = decltype(x);
    std::vector<double> out[2];
    for (const bool generic : {false, true}) {
      generic_path gp(generic);
      nn::sequential m(make());
      const auto y = m.forward(std::as_const(x).view());
      X gy(y.shape());
      for (index_t i = 0; i < gy.numel(); ++i) gy.data_handle()[i] = static_cast<typename X::value_type>(value_at(i, 0.7));
      const auto gx = m.backward(std::as_const(gy).view(), true);
      const auto yi = m.infer(std::as_const(x).view());
      for (index_t i = 0; i < y.numel(); ++i) out[generic].push_back(static_cast<double>(y.data_handle()[i]));
      for (index_t i = 0; i < gx.numel(); ++i) out[generic].push_back(static_cast<double>(gx.data_handle()[i]));
      for (index_t i = 0; i < yi.numel(); ++i) out[generic].push_back(static_cast<double>(yi.data_handle()[i]));
    }
    CHECK(out[0] == out[1]);
  };
  using PB = locus::amp::bf16_mixed;
  both([] { return nn::max_pool2d<D, P32>(2); }, filled<float, 4>({3, 2, 8, 7}, 0.1));
  both([] { return nn::max_pool2d<D, P32>(3, {.stride = 2, .padding = 1}); }, filled<float, 4>({2, 3, 9, 8}, 0.2));
  both([] { return nn::max_pool2d<D, PB>(3, {.stride = 1, .padding = 1}); }, filled<locus::bf16, 4>({2, 3, 6, 5}, 0.3));
  both([] { return nn::avg_pool2d<D, P32>(2); }, filled<float, 4>({3, 2, 8, 7}, 0.4));
  both([] { return nn::avg_pool2d<D, P32>(3, {.stride = 2, .padding = 1}); }, filled<float, 4>({2, 3, 9, 8}, 0.5));
  both([] { return nn::avg_pool2d<D, PB>(3, {.stride = 1, .padding = 1, .count_include_pad = false}); },
       filled<locus::bf16, 4>({2, 3, 6, 5}, 0.6));
}

TEST_CASE("batch_norm2d followed by relu runs fused: the same bits as unfused, gradients equal finite differences") {
  const auto make = [] {
    nn::sequential m(nn::conv2d<D, P32>(2, 3, 3, {.padding = 1}), nn::batch_norm2d<D, P32>(3), nn::relu<D, P32>(),
                     nn::flatten<D, P32>(), nn::linear<D, P32>(3 * 5 * 5, 2));
    m.reset_parameters(21);
    return m;
  };
  auto fused = make();
  auto plain = make();
  int calls = 0;
  plain.get<2>().add_forward_hook([&](const auto&, const auto&) { ++calls; });  // a hook turns fusion off
  auto x = filled<float, 4>({4, 2, 5, 5}, 0.3);
  auto gy = filled<float, 2>({4, 2}, 0.8);
  const auto run = [&](auto& m) {
    std::vector<float> out;
    const auto y = m.forward(std::as_const(x).view());
    out.insert(out.end(), y.data_handle(), y.data_handle() + y.numel());
    m.parameters().zero_grad();
    const auto gx = m.backward(std::as_const(gy).view(), true);
    out.insert(out.end(), gx.data_handle(), gx.data_handle() + gx.numel());
    const auto g = m.parameters().grad();
    out.insert(out.end(), g.data_handle(), g.data_handle() + g.numel());
    const auto yi = m.infer(std::as_const(x).view());
    out.insert(out.end(), yi.data_handle(), yi.data_handle() + yi.numel());
    return out;
  };
  const auto a = run(fused), b = run(plain);
  CHECK(calls == 2);  // forward and infer ran the unfused relu
  CHECK(fused.get<2>().fused());
  CHECK(!plain.get<2>().fused());
  CHECK(a == b);
  nn::sequential m64(nn::batch_norm2d<D, P64>(3), nn::relu<D, P64>(), nn::flatten<D, P64>(), nn::linear<D, P64>(3 * 4 * 4, 2));
  m64.reset_parameters(2);
  auto x64 = filled<double, 4>({3, 3, 4, 4}, 0.4);
  gradient_check(m64, x64, 1e-6);
}

TEST_CASE("conv2d's host path over several chunks of samples and threads: against the generic path and finite differences") {
  struct chunk_guard {
    explicit chunk_guard(index_t c) { nn::detail::conv_host_chunk() = c; }
    ~chunk_guard() { nn::detail::conv_host_chunk() = 1; }
  } chunks(4);  // samples side by side, four per task
  for (const auto& shape : {extents<4>{25, 3, 10, 10}, extents<4>{5, 3, 32, 32}, extents<4>{13, 4, 7, 9}}) {
    CAPTURE(shape[0]);
    nn::sequential m(nn::conv2d<D, P32>(shape[1], 6, 3, {.padding = 1, .groups = shape[1] == 4 ? 2 : 1}));
    m.reset_parameters(8);
    auto x = filled<float, 4>(shape, 0.45);
    auto gy = filled<float, 4>({shape[0], 6, shape[2], shape[3]}, 0.15);
    std::vector<float> res[2];
    for (const bool generic : {false, true}) {
      generic_path gp(generic);
      const auto y = m.forward(std::as_const(x).view());
      res[generic].assign(y.data_handle(), y.data_handle() + y.numel());
      m.parameters().zero_grad();
      const auto gx = m.backward(std::as_const(gy).view(), true);
      res[generic].insert(res[generic].end(), gx.data_handle(), gx.data_handle() + gx.numel());
      const auto g = m.parameters().grad();
      res[generic].insert(res[generic].end(), g.data_handle(), g.data_handle() + g.numel());
    }
    double worst = 0.0;
    for (std::size_t i = 0; i < res[0].size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(res[0][i] - res[1][i]) / (1.0f + std::abs(res[1][i]))));
    CHECK(worst < 1e-4);
  }
  nn::sequential m(nn::conv2d<D, P64>(1, 2, 3, {.stride = 1, .padding = 1}));
  m.reset_parameters(4);
  auto x = filled<double, 4>({7, 1, 32, 32}, 0.25);  // chunks of 4 and 3
  gradient_check(m, x, 1e-6, 37);
}

TEST_CASE("layer_norm over the last axis of rank-2 and rank-3 inputs: a double reference and finite differences") {
  nn::sequential m2(nn::linear<D, P64>(5, 6), nn::layer_norm<D, P64>(6), nn::tanh<D, P64>(), nn::linear<D, P64>(6, 3));
  m2.reset_parameters(6);
  auto master = m2.parameters().master();
  const auto& e = m2.parameters().entries();
  for (index_t j = 0; j < 6; ++j) {  // weight and bias other than 1 and 0
    master.data_handle()[e[2].offset + j] = 1.0 + 0.1 * static_cast<double>(j);
    master.data_handle()[e[3].offset + j] = 0.05 * static_cast<double>(j) - 0.1;
  }
  auto x2 = filled<double, 2>({4, 5}, 0.2);
  gradient_check(m2, x2, 1e-6);
  // rank 3 [batch, tokens, features], the layer on its own (a model of layers that take
  // any rank takes rank 2)
  nn::layer_norm<D, P64> ln(4);
  nn::parameter_store<D, P64> store;
  ln.declare(store, "0.");
  store.allocate();
  ln.bind(store);
  ln.reset_parameters(0);
  auto x3 = filled<double, 3>({2, 3, 4}, 0.9);
  for (index_t i = 0; i < x3.numel(); ++i) x3.data_handle()[i] = x3.data_handle()[i] * 5.0 + 100.0;  // a large mean
  const auto y = ln.infer(std::as_const(x3).view());
  const auto yt = ln.forward(std::as_const(x3).view());
  for (index_t i = 0; i < y.numel(); ++i) CHECK(yt.data_handle()[i] == y.data_handle()[i]);
  locus::tensor<double, D, 3> g3(x3.shape());
  for (index_t i = 0; i < g3.numel(); ++i) g3.data_handle()[i] = value_at(i, 0.1);
  store.zero_grad();
  const auto gx3 = ln.backward(std::as_const(g3).view(), true);
  // the rows are independent: row r's input gradient equals a rank-2 model's on that row
  nn::sequential row(nn::layer_norm<D, P64>(4));
  for (index_t r = 0; r < 6; ++r) {
    locus::tensor<double, D, 2> xr(extents<2>{1, 4}), gr(extents<2>{1, 4});
    for (index_t j = 0; j < 4; ++j) {
      xr(0, j) = x3.data_handle()[r * 4 + j];
      gr(0, j) = g3.data_handle()[r * 4 + j];
    }
    (void)row.forward(std::as_const(xr).view());
    const auto g = row.backward(std::as_const(gr).view(), true);
    for (index_t j = 0; j < 4; ++j) CHECK(gx3.data_handle()[r * 4 + j] == doctest::Approx(g(0, j)).epsilon(1e-12));
  }
  for (index_t r = 0; r < 6; ++r) {
    double s = 0.0, q = 0.0;
    for (index_t j = 0; j < 4; ++j) s += x3.data_handle()[r * 4 + j];
    const double mean = s / 4.0;
    for (index_t j = 0; j < 4; ++j) q += std::pow(x3.data_handle()[r * 4 + j] - mean, 2);
    for (index_t j = 0; j < 4; ++j)
      CHECK(y.data_handle()[r * 4 + j] == doctest::Approx((x3.data_handle()[r * 4 + j] - mean) / std::sqrt(q / 4.0 + 1e-5)).epsilon(1e-10));
  }
  nn::sequential m3b(nn::linear<D, P64>(4, 4), nn::layer_norm<D, P64>(4));
  (void)m3b;
  CHECK_THROWS_AS(nn::sequential(nn::linear<D, P32>(4, 5), nn::layer_norm<D, P32>(4)), locus::shape_error);
}

#include <thread>

TEST_CASE("review: infer on a shared const CNN from several threads (and inside a user's OpenMP loop) is exact") {
  auto m = blob_cnn(4);
  const auto& cm = m;
  locus::tensor<float, D, 4> x(extents<4>{6, 1, 8, 8});
  for (index_t i = 0; i < x.numel(); ++i) x.data_handle()[i] = static_cast<float>(value_at(i, 0.3));
  const auto ref = cm.infer(std::as_const(x).view());
  std::vector<int> bad(4, 0);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int r = 0; r < 20; ++r) {
        const auto y = cm.infer(std::as_const(x).view());
        for (index_t i = 0; i < y.numel(); ++i) bad[static_cast<std::size_t>(t)] += y.data_handle()[i] != ref.data_handle()[i];
      }
    });
  for (auto& t : ts) t.join();
  CHECK(bad == std::vector<int>(4, 0));
  int omp_bad = 0;
#if defined(_OPENMP)
#pragma omp parallel for reduction(+ : omp_bad) num_threads(2)
#endif
  for (int r = 0; r < 8; ++r) {
    const auto y = cm.infer(std::as_const(x).view());
    for (index_t i = 0; i < y.numel(); ++i) omp_bad += y.data_handle()[i] != ref.data_handle()[i];
  }
  CHECK(omp_bad == 0);
}

TEST_CASE("review: edge cases of the CNN layers are errors or PyTorch's answers") {
  using E = locus::shape_error;
  // max pooling keeps the maximum's position in 32 bits: larger planes are refused
  nn::sequential big(nn::max_pool2d<D, P32>(2));
  CHECK_THROWS_AS((void)big.output_shape({1, 1, 46341, 46341}), E);
  CHECK_NOTHROW((void)big.output_shape({1, 1, 46340, 46340}));
  // empty planes are refused; an empty batch is an empty output, batch norm included
  nn::sequential pool(nn::max_pool2d<D, P32>(2, {.padding = 1}));
  auto empty_plane = filled<float, 4>({1, 1, 0, 0}, 0.0);
  CHECK_THROWS_AS((void)pool.infer(std::as_const(empty_plane).view()), E);
  nn::sequential conv(nn::conv2d<D, P32>(1, 1, 1, {.padding = 1}));
  CHECK_THROWS_AS((void)conv.infer(std::as_const(empty_plane).view()), E);
  nn::sequential bn(nn::batch_norm2d<D, P32>(2));
  auto none = filled<float, 4>({0, 2, 3, 3}, 0.0);
  CHECK(bn.forward(std::as_const(none).view()).numel() == 0);
  CHECK(bn.get<0>().running_var()(0) == 1.0f);  // unchanged
  CHECK_THROWS_AS((void)bn.output_shape({-1, 2, 3, 3}), E);
  // a strided view into an element-wise layer is refused, not read in the wrong order
  nn::sequential act(nn::relu<D, P32>{});
  auto m2 = filled<float, 2>({3, 4}, 0.1);
  CHECK_THROWS_AS((void)act.infer(locus::transpose(std::as_const(m2))), E);
  // layer_norm after a convolution normalises the last axis (the width), as PyTorch's
  nn::sequential ln(nn::conv2d<D, P32>(2, 4, 3, {.padding = 1}), nn::layer_norm<D, P32>(6));
  auto img = filled<float, 4>({2, 2, 6, 6}, 0.2);
  CHECK(ln.infer(std::as_const(img).view()).shape() == extents<4>{2, 4, 6, 6});
  nn::sequential ln_bad(nn::conv2d<D, P32>(2, 4, 3, {.padding = 1}), nn::layer_norm<D, P32>(4));
  CHECK_THROWS_AS((void)ln_bad.infer(std::as_const(img).view()), E);
  // transform stream numbers
  {
    std::vector<float> sample(64);
    const locus::data::random_crop wide{.channels = 1, .height = 8, .width = 8, .stream = 1u << 16};
    CHECK_THROWS_AS(wide(sample, {}), locus::value_error);
  }
  int same = 0;
  for (index_t i = 0; i < 100; ++i) {
    std::vector<float> a(64), b(64);
    for (std::size_t j = 0; j < 64; ++j) a[j] = b[j] = static_cast<float>(j);
    locus::data::random_crop{.channels = 1, .height = 8, .width = 8, .stream = 257}(a, {1, 0, i});
    locus::data::random_crop{.channels = 1, .height = 8, .width = 8, .stream = 1}(b, {1, 1, i});
    same += a == b;
  }
  CHECK(same < 50);
}

TEST_CASE("review: fused batch norm + relu keeps NaN as the unfused pair does, statistics with an outlier first value") {
  const auto make = [] {
    nn::sequential m(nn::batch_norm2d<D, P32>(2), nn::relu<D, P32>(), nn::flatten<D, P32>());
    return m;
  };
  auto fused = make();
  auto plain = make();
  plain.get<1>().add_forward_hook([](const auto&, const auto&) {});
  auto x = filled<float, 4>({2, 2, 2, 2}, 0.1);
  x.data_handle()[0] = std::numeric_limits<float>::quiet_NaN();
  const auto a = fused.infer(std::as_const(x).view());
  const auto b = plain.infer(std::as_const(x).view());
  const auto at = fused.forward(std::as_const(x).view());
  std::vector<float> ta(at.data_handle(), at.data_handle() + at.numel());
  const auto bt = plain.forward(std::as_const(x).view());
  for (index_t i = 0; i < a.numel(); ++i) {
    CHECK(std::isnan(a.data_handle()[i]) == std::isnan(b.data_handle()[i]));
    CHECK(std::isnan(ta[static_cast<std::size_t>(i)]) == std::isnan(bt.data_handle()[i]));
  }
  CHECK(std::isnan(a.data_handle()[0]));
  CHECK(std::isnan(fused.get<0>().running_var()(0)));  // NaN stays NaN (PyTorch's too)

  // a channel whose first value is far from the rest: f32 statistics still within 1e-5
  nn::sequential s(nn::batch_norm2d<D, P32>(1, {.momentum = 1.0}));
  auto xo = filled<float, 4>({8, 1, 16, 16}, 0.5);
  xo.data_handle()[0] = 1000.0f;
  (void)s.forward(std::as_const(xo).view());
  double sum = 0.0, q = 0.0;
  for (index_t i = 0; i < xo.numel(); ++i) sum += xo.data_handle()[i];
  const double mean = sum / static_cast<double>(xo.numel());
  for (index_t i = 0; i < xo.numel(); ++i) q += std::pow(xo.data_handle()[i] - mean, 2);
  const double unbiased = q / static_cast<double>(xo.numel() - 1);
  CHECK(std::abs(s.get<0>().running_var()(0) - unbiased) / unbiased < 1e-5);
  CHECK(std::abs(s.get<0>().running_mean()(0) - mean) / std::abs(mean) < 1e-5);
}

TEST_CASE("review: an empty batch is refused by the trainer, a conv backward of no samples writes zero gradients") {
  auto m = blob_cnn(2);
  locus::optim::adamw<D> opt(m.parameters(), {.lr = 1e-2});
  locus::train::trainer t(m, opt, nn::cross_entropy{});
  auto x = filled<float, 4>({4, 1, 8, 8}, 0.1);
  locus::tensor<std::int64_t, D, 1> y(extents<1>{4});
  for (index_t i = 0; i < 4; ++i) y(i) = i % 3;
  t.step(x, y);
  const auto before = all_state(m);
  auto x0 = filled<float, 4>({0, 1, 8, 8}, 0.1);
  locus::tensor<std::int64_t, D, 1> y0(extents<1>{0});
  CHECK_THROWS_AS(t.step(x0, y0), locus::shape_error);
  CHECK(all_state(m) == before);
  for (const bool generic : {false, true}) {
    generic_path gp(generic);
    nn::sequential c(nn::conv2d<D, P32>(1, 2, 3));
    auto xs = filled<float, 4>({2, 1, 5, 5}, 0.3);
    auto gs = filled<float, 4>({2, 2, 3, 3}, 0.2);
    (void)c.forward(std::as_const(xs).view());
    (void)c.backward(std::as_const(gs).view(), true);  // a gradient in the buffer
    c.parameters().discard_grad();
    auto xe = filled<float, 4>({0, 1, 5, 5}, 0.3);
    auto ge = filled<float, 4>({0, 2, 3, 3}, 0.2);
    (void)c.forward(std::as_const(xe).view());
    (void)c.backward(std::as_const(ge).view(), true);
    const auto g = c.parameters().grad();
    for (index_t i = 0; i < g.numel(); ++i) CHECK(g.data_handle()[i] == 0.0f);
  }
}

TEST_CASE("review: hostile buffers in a model file are io_error and change nothing") {
  const auto dir = temp_file("hostile");
  std::filesystem::create_directories(dir);
  auto m = blob_cnn(5);
  // a file of m's weights and buffers, with one buffer replaced
  const auto write_with = [&](const std::string& name, const auto& replacement) {
    locus::io::writer w;
    const auto& store = m.parameters();
    for (const auto& e : store.entries())
      nn::detail::with_shape<const float, D>(store.master().data_handle(), e, [&](const auto& v) { w.add(e.name, v); });
    std::as_const(m).for_each_buffer([&](const std::string& n, const auto& v) {
      if (n == name) w.add(n, replacement);
      else w.add(n, v);
    });
    const auto p = dir / (name + std::to_string(replacement.numel()) + ".safetensors");
    w.save(p);
    return p;
  };
  locus::tensor<std::int64_t, D, 0> negative(extents<0>{});
  negative.data_handle()[0] = -5;
  locus::tensor<float, D, 1> var(extents<1>{4});
  for (index_t i = 0; i < 4; ++i) var(i) = i == 2 ? -1.0f : 1.0f;
  locus::tensor<double, D, 1> f64(extents<1>{4});
  for (index_t i = 0; i < 4; ++i) f64(i) = 0.0;
  auto target = blob_cnn(6);
  const auto before = all_state(target);
  CHECK_THROWS_WITH_AS(nn::load(write_with("1.num_batches_tracked", negative), target),
                       doctest::Contains("buffer '1.num_batches_tracked' is negative"), locus::io_error);
  CHECK_THROWS_WITH_AS(nn::load(write_with("1.running_var", var), target),
                       doctest::Contains("buffer '1.running_var' holds a negative variance"), locus::io_error);
  CHECK_THROWS_WITH_AS(nn::load(write_with("1.running_mean", f64), target),
                       doctest::Contains("buffer '1.running_mean' is F64, but this model's is F32"), locus::io_error);
  CHECK(all_state(target) == before);
  // a good file loads
  nn::load(write_with("1.running_mean", m.get<1>().running_mean()), target);
  CHECK(all_state(target) == all_state(m));
  std::filesystem::remove_all(dir);
}
