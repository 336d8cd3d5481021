// The host's fast paths against their plain forms and double-precision references:
// AdamW's vectorised update (backend/host_simd.hpp) at every length around the vector
// width and the OpenMP threshold, with scaled gradients, compute copies, NaN, infinity
// and hostile (negative) second moments; AdamW through the public optimizer on a model
// large enough to take the parallel path; the relu's host blocks and batch norm's host
// lanes against their element-wise forms, bit for bit.
#include <doctest/doctest.h>

#include <locus/ag/shapes.hpp>
#include <locus/train.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

namespace {

using locus::index_t;

struct adamw_case {
  std::vector<float> p, g, m, v;
};

adamw_case random_case(index_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 2.0f);
  adamw_case c;
  for (index_t i = 0; i < n; ++i) {
    c.p.push_back(nd(rng));
    c.g.push_back(nd(rng) * 3.0f);
    c.m.push_back(nd(rng) * 0.1f);
    c.v.push_back(ud(rng) * 0.01f);
  }
  return c;
}

bool same_bits(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }
bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || same_bits(a, b); }

struct hyper {
  float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f, bias1 = 0.1f, rsqrt_bias2 = 22.366272f;  // 1 / sqrt(0.001999)
  float clip = 0.0f;  // clip_grad_value's bound (0: off)
};

/// The host update's bodies: what adamw_host_n chooses, the compiled width's loop, and
/// (on x86-64 when this CPU has AVX-512F) the run-time AVX-512F loop.
enum class path { dispatched, base, avx512 };
std::vector<path> paths() {
  std::vector<path> out{path::dispatched, path::base};
#if LOCUS_SIMD_AVX512_DISPATCH
  if (__builtin_cpu_supports("avx512f")) out.push_back(path::avx512);
#endif
  return out;
}
template <class C, class... Args>
void run_path(path w, Args... args) {
  switch (w) {
    case path::dispatched: return locus::detail::adamw_host_n<C>(args...);
    case path::base: return locus::detail::adamw_host_n_base<C>(args...);
    case path::avx512:
#if LOCUS_SIMD_AVX512_DISPATCH
      return locus::detail::adamw_host_n_avx512<C>(args...);
#else
      FAIL("no AVX-512F body in this build");
#endif
  }
}

/// Runs each body of adamw_host_n on a copy of c and checks every element against the
/// scalar update (bit for bit) and a double-precision evaluation of the same formula
/// (relative 1e-5).
template <class C>
void check_one_path(path w, const adamw_case& c, float inv, bool scaled, bool with_copy, const hyper& h);
template <class C>
void check_against_scalar(const adamw_case& c, float inv, bool scaled, bool with_copy, const hyper& h) {
  for (const path w : paths()) {
    CAPTURE(static_cast<int>(w));
    check_one_path<C>(w, c, inv, scaled, with_copy, h);
  }
}
template <class C>
void check_one_path(path w, const adamw_case& c, float inv, bool scaled, bool with_copy, const hyper& h) {
  const auto n = static_cast<index_t>(c.p.size());
  std::vector<float> p = c.p, m = c.m, v = c.v;
  std::vector<C> pc(with_copy ? c.p.size() : 0);
  C* pcp = with_copy ? pc.data() : nullptr;
  if constexpr (!std::is_same_v<C, float>) REQUIRE(with_copy);
  run_path<C>(w, n, p.data(), static_cast<const float*>(c.g.data()), m.data(), v.data(), pcp, inv, scaled, h.clip, h.lr, h.b1,
              h.b2, h.eps, h.wd, h.bias1, h.rsqrt_bias2);
  int wrong_bits = 0, wrong_ref = 0;
  for (index_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    float gi = scaled ? c.g[k] * inv : c.g[k];
    if (h.clip > 0) gi = std::clamp(gi, -h.clip, h.clip);  // std::clamp: the same comparisons for NaN-free values
    if (std::isnan(c.g[k])) gi = c.g[k] * inv;             // and a NaN stays NaN
    float mi = c.m[k], vi = c.v[k];
    const float pi =
        locus::detail::adamw_kernel<C>::update(c.p[k], gi, mi, vi, h.lr, h.b1, h.b2, h.eps, h.wd, h.bias1, h.rsqrt_bias2);
    if (!same_value(p[k], pi) || !same_value(m[k], mi) || !same_value(v[k], vi)) ++wrong_bits;
    if (with_copy && !same_value(static_cast<float>(pc[k]), static_cast<float>(C(pi)))) ++wrong_bits;
    // the reference in double
    double gd = scaled ? static_cast<double>(c.g[k]) * inv : c.g[k];
    if (h.clip > 0 && !std::isnan(gd)) gd = std::clamp(gd, -static_cast<double>(h.clip), static_cast<double>(h.clip));
    double pd = c.p[k];
    pd -= static_cast<double>(h.lr) * h.wd * pd;
    const double md = h.b1 * static_cast<double>(c.m[k]) + (1.0 - h.b1) * gd;
    const double vd = h.b2 * static_cast<double>(c.v[k]) + (1.0 - h.b2) * gd * gd;
    pd -= h.lr * (md / h.bias1) / (std::sqrt(vd / 0.001999) + h.eps);  // the textbook form
    if (std::isfinite(pd) && std::abs(p[k] - pd) > 1e-5 * std::abs(pd) + 1e-7) ++wrong_ref;
  }
  CHECK(wrong_bits == 0);
  CHECK(wrong_ref == 0);
}

}  // namespace

TEST_CASE("AdamW's vectorised host update gives every element the scalar update's bits") {
  const index_t w = locus::detail::simd::width;
  const index_t big = locus::detail::host_parallel_threshold + 3 * w + 1;  // parallel, with a tail
  // around the compiled width and AVX-512F's 16 lanes
  for (index_t n : {index_t{0}, index_t{1}, w - 1, w, w + 1, 2 * w + 3, index_t{15}, index_t{16}, index_t{17},
                    index_t{35}, index_t{1000}, big, big + 12}) {
    if (n < 0) continue;
    CAPTURE(n);
    const adamw_case c = random_case(n, 7 + static_cast<std::uint32_t>(n));
    check_against_scalar<float>(c, 1.0f, false, false, {});
    check_against_scalar<float>(c, 1.0f / 1024.0f, true, true, {.lr = 3e-2f, .wd = 0.1f});
    check_against_scalar<locus::bf16>(c, 1.0f, false, true, {});
    check_against_scalar<locus::f16>(c, 0.5f, true, true, {.b1 = 0.8f, .b2 = 0.95f});
    // clip_grad_value: after the unscale, every gradient limited to [-clip, clip]
    check_against_scalar<float>(c, 1.0f, false, false, {.clip = 0.75f});
    check_against_scalar<float>(c, 1.0f / 1024.0f, true, true, {.clip = 1e-3f});
    check_against_scalar<locus::bf16>(c, 2.0f, true, true, {.clip = 4.0f});
  }
}

TEST_CASE("AdamW's vectorised host update: NaN, infinity and negative moments in any lane are the scalar's") {
  const index_t w = locus::detail::simd::width;
  const index_t n = 4 * w + 3;
  adamw_case c = random_case(n, 99);
  const float inf = std::numeric_limits<float>::infinity();
  c.g[1] = std::numeric_limits<float>::quiet_NaN();
  c.g[static_cast<std::size_t>(w)] = inf;
  c.g[static_cast<std::size_t>(w + 1)] = -inf;
  c.v[static_cast<std::size_t>(2 * w)] = -1.0f;  // a hostile state: sqrt of a negative
  c.p[static_cast<std::size_t>(2 * w + 1)] = std::numeric_limits<float>::max();
  c.g[static_cast<std::size_t>(2 * w + 2)] = std::numeric_limits<float>::denorm_min();
  c.g[static_cast<std::size_t>(n - 1)] = std::numeric_limits<float>::quiet_NaN();  // in the scalar tail
  check_against_scalar<float>(c, 1.0f, false, false, {});
  check_against_scalar<locus::bf16>(c, 2.0f, true, true, {});
  check_against_scalar<float>(c, 1.0f, false, false, {.clip = 0.5f});  // NaN stays NaN, +-inf become +-0.5
  // the vector lanes never call sqrtf: a negative moment there leaves errno alone
  for (const path which : paths()) {
    std::vector<float> p = c.p, m = c.m, v = c.v;
    errno = 0;
    run_path<float>(which, 4 * w, p.data(), static_cast<const float*>(c.g.data()), m.data(), v.data(),
                    static_cast<float*>(nullptr), 1.0f, false, 0.0f, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.1f, 0.002f);
    if (w > 1) CHECK(errno == 0);
    CHECK(std::isnan(p[static_cast<std::size_t>(2 * w)]));
  }
}

TEST_CASE("AdamW's and SGD's moments never stay subnormal: a zero gradient's moment decays to 0 on every path") {
  // Without the flush a moment with g = 0 decays by beta1 = 0.9 into the subnormal range
  // and then stays at 2^-149 (0.9 * 2^-149 rounds back to it), costing an x86 microcode
  // assist on every later step.
  const float dmin = std::numeric_limits<float>::denorm_min(), fmin = std::numeric_limits<float>::min();
  {
    float m = 0.9f * dmin;  // the rounding that keeps an unflushed moment stuck
    CHECK(same_bits(m, dmin));
    m = 1e-30f;
    for (int s = 0; s < 2000; ++s) m = 0.9f * m + 0.1f * 0.0f;
    CHECK(std::fpclassify(m) == FP_SUBNORMAL);  // stuck (at k * 2^-149 with 0.1 k < 1/2)
  }
  const index_t w = locus::detail::simd::width;
  const index_t n = 6 * w + 5;  // vector lanes and the scalar tail
  adamw_case c = random_case(n, 123);
  for (index_t i = 0; i < n; i += 2) {
    const auto k = static_cast<std::size_t>(i);
    c.g[k] = 0.0f;
    c.m[k] = i % 4 == 0 ? dmin : -fmin / 3.0f;  // subnormal moments of both signs
    c.v[k] = i % 3 == 0 ? dmin * 7.0f : 1e-39f;
  }
  c.m[1] = 4.0f * fmin;  // normal after the decay: kept
  c.g[1] = 0.0f;
  c.v[1] = fmin / 0.999f * 1.0001f;
  check_against_scalar<float>(c, 1.0f, false, false, {});  // every body: the scalar update's bits
  for (const path which : paths()) {
    CAPTURE(static_cast<int>(which));
    std::vector<float> p = c.p, m = c.m, v = c.v;
    run_path<float>(which, n, p.data(), static_cast<const float*>(c.g.data()), m.data(), v.data(),
                    static_cast<float*>(nullptr), 1.0f, false, 0.0f, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.1f, 22.366272f);
    int subnormal = 0, moved = 0;
    for (index_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      subnormal += std::fpclassify(m[k]) == FP_SUBNORMAL || std::fpclassify(v[k]) == FP_SUBNORMAL ? 1 : 0;
      if (i % 2 == 0) moved += same_bits(p[k], c.p[k]) ? 0 : 1;  // g = 0, m flushed, no decay: p unchanged
    }
    CHECK(subnormal == 0);
    CHECK(moved == 0);
    CHECK(same_bits(m[1], 0.9f * (4.0f * fmin)));  // a normal moment decays as before
  }
  // SGD's momentum buffer: a subnormal buffer with g = 0 is flushed, so the weight stays
  float p1[3] = {0.5f, -0.25f, 1e-20f}, g1[3] = {0.0f, 0.0f, 0.0f}, b1[3] = {dmin, -4.0f * dmin, fmin * 4.0f};
  const locus::detail::update_scalars sc{0, 0, 1.0f, 1.0f};
  const locus::detail::sgd_kernel<float> k{p1, g1, b1, nullptr, &sc, 0.1f, 0.9f, 0.0f, 0.0f, false};
  for (index_t i = 0; i < 3; ++i) k(i);
  CHECK(same_bits(b1[0], 0.0f));
  CHECK(same_bits(b1[1], 0.0f));
  CHECK(same_bits(b1[2], 0.9f * (fmin * 4.0f)));  // normal: kept
  CHECK(same_bits(p1[0], 0.5f));
  CHECK(same_bits(p1[1], -0.25f));
}

TEST_CASE("AdamW on a model past the parallel threshold equals a double-precision reference") {
  namespace nn = locus::nn;
  nn::sequential model(nn::linear<locus::cpu, locus::amp::fp32>(301, 117));  // 35,334 parameters: parallel
  auto& store = model.parameters();
  REQUIRE(store.size() > locus::detail::host_parallel_threshold);
  const locus::optim::adamw_options o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1};
  locus::optim::adamw<locus::cpu> opt(store, o);
  std::vector<double> p;
  const auto initial = locus::to<locus::cpu>(std::as_const(store).master());
  for (const float x : initial.span()) p.push_back(x);
  std::vector<double> mm(p.size(), 0.0), vv(p.size(), 0.0);
  for (int t = 1; t <= 3; ++t) {
    auto g = locus::randn<float, locus::cpu>({store.size()}, 600 + static_cast<std::uint64_t>(t));
    locus::copy(g, store.grad());
    opt.step();
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double gi = g(static_cast<index_t>(i));
      p[i] -= o.lr * o.weight_decay * p[i];
      mm[i] = o.beta1 * mm[i] + (1 - o.beta1) * gi;
      vv[i] = o.beta2 * vv[i] + (1 - o.beta2) * gi * gi;
      const double mh = mm[i] / (1 - std::pow(o.beta1, t)), vh = vv[i] / (1 - std::pow(o.beta2, t));
      p[i] -= o.lr * mh / (std::sqrt(vh) + o.eps);
    }
  }
  const auto got = locus::to<locus::cpu>(std::as_const(store).master());
  int wrong = 0;
  for (std::size_t i = 0; i < p.size(); ++i)
    if (std::abs(got.span()[i] - p[i]) > 1e-5 * std::abs(p[i]) + 1e-7) ++wrong;
  CHECK(wrong == 0);
}

// The GEMM epilogue's row-wise host form (bias, activation) past the parallel threshold,
// into a fresh tensor and into rows of a larger buffer, against double precision.
TEST_CASE("linear's host epilogue on a large output equals a double-precision reference") {
  const index_t n = 611, k = 23, m = 130;  // 79,430 outputs: the epilogue runs in parallel
  REQUIRE(n * m > locus::detail::host_parallel_threshold);
  auto x = locus::randn<float, locus::cpu>({n, k}, 901);
  auto w = locus::randn<float, locus::cpu>({m, k}, 902);
  auto b = locus::randn<float, locus::cpu>({m}, 903);
  const auto reference = [&](locus::activation act, bool bias) {
    std::vector<double> out(static_cast<std::size_t>(n * m));
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < m; ++j) {
        double s = bias ? b(j) : 0.0;
        for (index_t p = 0; p < k; ++p) s += static_cast<double>(x(i, p)) * w(j, p);
        switch (act) {
          case locus::activation::none: break;
          case locus::activation::relu: s = s > 0 ? s : 0; break;
          case locus::activation::gelu: s = 0.5 * s * (1 + std::erf(s / std::sqrt(2.0))); break;
          case locus::activation::gelu_tanh:
            s = 0.5 * s * (1 + std::tanh(std::sqrt(2.0 / 3.141592653589793) * (s + 0.044715 * s * s * s)));
            break;
        }
        out[static_cast<std::size_t>(i * m + j)] = s;
      }
    return out;
  };
  const auto worst = [&](const auto& y, const std::vector<double>& ref) {
    double e = 0;
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < m; ++j)
        e = std::max(e, std::abs(y(i, j) - ref[static_cast<std::size_t>(i * m + j)]) /
                            (1.0 + std::abs(ref[static_cast<std::size_t>(i * m + j)])));
    return e;
  };
  for (auto act : {locus::activation::none, locus::activation::relu, locus::activation::gelu,
                   locus::activation::gelu_tanh}) {
    CAPTURE(static_cast<int>(act));
    const auto with_bias = reference(act, true), without = reference(act, false);
    auto y = locus::linear(x, w, b, act);
    CHECK(worst(y, with_bias) < 1e-5);
    auto y0 = locus::linear(x, w, act);
    CHECK(worst(y0, without) < 1e-5);
    // into rows [3, 3 + n) of a larger buffer: the rows around them are untouched
    auto big = locus::full<float, locus::cpu>({n + 5, m}, -7.0f);
    auto inside = big.slice(3, 3 + n);
    locus::linear_into(inside, x, w, b, act);
    CHECK(worst(inside, with_bias) < 1e-5);
    int changed = 0;
    for (index_t j = 0; j < m; ++j)
      for (index_t i : {index_t{0}, index_t{1}, index_t{2}, n + 3, n + 4}) changed += big(i, j) != -7.0f;
    CHECK(changed == 0);
  }
  // NaN in the input stays NaN through ReLU (max(NaN, 0) would hide it)
  x(5, 0) = std::numeric_limits<float>::quiet_NaN();
  auto yn = locus::linear(x, w, b, locus::activation::relu);
  int nan_row = 0;
  for (index_t j = 0; j < m; ++j) nan_row += std::isnan(yn(5, j));
  CHECK(nan_row == m);
}

// The gradient check's vectorised pass (a sum of x - x) against std::isfinite, with one
// bad value at each kind of position (a vector lane, the scalar tail, both sides of an
// OpenMP block boundary), overflow from the unscale, and the stored unscaled values.
TEST_CASE("the host's all-finite pass finds every non-finite value wherever it is") {
  const index_t w = locus::detail::simd::width;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (index_t n : {index_t{1}, w + 1, index_t{8191}, index_t{8192}, index_t{8193},
                    locus::detail::host_parallel_threshold + 5}) {
    CAPTURE(n);
    std::mt19937 rng(static_cast<std::uint32_t>(n));
    std::normal_distribution<float> nd(0.0f, 100.0f);
    std::vector<float> g(static_cast<std::size_t>(n));
    for (float& x : g) x = nd(rng);
    g[0] = std::numeric_limits<float>::max();  // large but finite
    if (n > 1) g[1] = -std::numeric_limits<float>::denorm_min();
    CHECK(locus::detail::host_all_finite<false>(n, g.data(), 1.0f, false));
    for (index_t at : {index_t{0}, n / 2, n - 1, index_t{8191}, index_t{8192}}) {
      if (at >= n) continue;
      for (float bad : {inf, -inf, nan}) {
        CAPTURE(at);
        CAPTURE(bad);
        std::vector<float> h = g;
        h[static_cast<std::size_t>(at)] = bad;
        CHECK_FALSE(locus::detail::host_all_finite<false>(n, h.data(), 1.0f, false));
        CHECK_FALSE(locus::detail::host_all_finite<false>(n, h.data(), 0.5f, true));
      }
    }
    // unscaling can overflow: max * 2 is inf
    CHECK_FALSE(locus::detail::host_all_finite<false>(n, g.data(), 2.0f, true));
    // Store writes g * inv, element for element, and says whether all of it is finite
    std::vector<float> s = g;
    CHECK(locus::detail::host_all_finite<true>(n, s.data(), 0.25f, true));
    int wrong = 0;
    for (std::size_t i = 0; i < g.size(); ++i) wrong += !same_bits(s[i], g[i] * 0.25f);
    CHECK(wrong == 0);
  }
  CHECK(locus::detail::host_all_finite<false>(0, nullptr, 1.0f, false));
}

// One long output row (a batch of one): the epilogue splits its columns among threads.
TEST_CASE("linear's host epilogue on a single long row equals a double-precision reference") {
  const index_t k = 7, m = 50001;
  auto x = locus::randn<float, locus::cpu>({1, k}, 911);
  auto w = locus::randn<float, locus::cpu>({m, k}, 912);
  auto b = locus::randn<float, locus::cpu>({m}, 913);
  auto y = locus::linear(x, w, b, locus::activation::relu);
  int wrong = 0;
  for (index_t j = 0; j < m; ++j) {
    double s = b(j);
    for (index_t p = 0; p < k; ++p) s += static_cast<double>(x(0, p)) * w(j, p);
    s = s > 0 ? s : 0;
    wrong += std::abs(y(0, j) - s) > 1e-5 * (1 + std::abs(s));
  }
  CHECK(wrong == 0);
}

// ---- activations' host blocks and batch norm's host lanes ------------------------------
// launch_n runs a kernel with block(lo, hi) as blocks of consecutive calls (the relu's
// kind decided once per block, explicit lanes of eight in its backward), and batch
// norm's plane sums take lanes of eight on the host (nn/conv_kernels.hpp): each must give
// every element the bits of the per-element form, at lengths around the lane count, the
// block size and the parallel threshold, with NaN, infinities and signed zeros.

namespace {

template <class T>
std::vector<T> hostile_values(index_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 2.0);
  std::vector<T> v(static_cast<std::size_t>(n));
  const T special[] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                       -std::numeric_limits<T>::infinity(), T(-0.0), T(0.0), std::numeric_limits<T>::denorm_min()};
  for (index_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<T>(nd(rng));
  for (index_t i = 0; i < n; i += 37) v[static_cast<std::size_t>(i)] = special[(i / 37) % 6];
  return v;
}

template <class T>
bool same_bits(T a, T b) {
  if constexpr (sizeof(T) == 4) return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
  else return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

template <class T>
void check_relu_blocks(index_t n) {
  using locus::detail::act_kind;
  const auto x = hostile_values<T>(n, static_cast<std::uint32_t>(n));
  const auto gy = hostile_values<T>(n, static_cast<std::uint32_t>(n) + 1);
  std::vector<T> y(x.size()), y_ref(x.size()), gx(x.size()), gx_ref(x.size());
  const locus::detail::act_forward_kernel<T> f{x.data(), y.data(), act_kind::relu};
  locus::detail::launch_n<locus::cpu>(n, f);
  const locus::detail::act_forward_kernel<T> fr{x.data(), y_ref.data(), act_kind::relu};
  for (index_t i = 0; i < n; ++i) fr(i);
  const locus::detail::act_backward_kernel<T> b{gy.data(), nullptr, y.data(), gx.data(), act_kind::relu};
  locus::detail::launch_n<locus::cpu>(n, b);
  const locus::detail::act_backward_kernel<T> br{gy.data(), nullptr, y.data(), gx_ref.data(), act_kind::relu};
  for (index_t i = 0; i < n; ++i) br(i);
  index_t bad_y = 0, bad_g = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    bad_y += same_bits(y[i], y_ref[i]) ? 0 : 1;
    bad_g += same_bits(gx[i], gx_ref[i]) ? 0 : 1;
  }
  CHECK(bad_y == 0);
  CHECK(bad_g == 0);
}

/// Batch norm's training statistics and output, the documented algorithm in the
/// element-wise form (sum_pairs): the reference for the host lanes.
template <class T>
void bn_train_reference(const std::vector<T>& x, std::vector<T>& y, std::vector<T>& mean, std::vector<T>& invstd,
                        index_t n, index_t c, index_t hw, double eps, bool relu) {
  using locus::detail::sum_pairs;
  for (index_t ch = 0; ch < c; ++ch) {
    T k0, unused;
    sum_pairs<T>(hw, [&](index_t j, T& u, T& v) { u = x[static_cast<std::size_t>(ch * hw + j)]; v = T(0); }, k0, unused);
    const T k = k0 / static_cast<T>(hw);
    double s1 = 0, s2 = 0;
    for (index_t b = 0; b < n; ++b) {
      const T* p = x.data() + (b * c + ch) * hw;
      T r1, r2;
      sum_pairs<T>(hw, [&](index_t j, T& u, T& v) {
        const T d = p[j] - k;
        u = d;
        v = d * d;
      }, r1, r2);
      s1 += static_cast<double>(r1);
      s2 += static_cast<double>(r2);
    }
    const double count = static_cast<double>(n * hw), md = s1 / count, m = static_cast<double>(k) + md;
    double var = s2 / count - md * md;
    var = var < 0.0 ? 0.0 : var;
    const double is = 1.0 / std::sqrt(var + eps);
    const T scale = static_cast<T>(is), shift = static_cast<T>(0.0 - m * is);
    for (index_t b = 0; b < n; ++b)
      for (index_t j = 0; j < hw; ++j) {
        const std::size_t i = static_cast<std::size_t>((b * c + ch) * hw + j);
        const T v = x[i] * scale + shift;
        y[i] = relu ? (v < T(0) ? T(0) : v) : v;
      }
    mean[static_cast<std::size_t>(ch)] = static_cast<T>(m);
    invstd[static_cast<std::size_t>(ch)] = static_cast<T>(is);
  }
}

template <class T>
void check_bn_lanes(index_t n, index_t c, index_t hw, bool relu) {
  const index_t total = n * c * hw;
  std::mt19937 rng(static_cast<std::uint32_t>(total + relu));
  std::normal_distribution<double> nd(3.0, 2.0);  // a mean away from zero: the shift matters
  std::vector<T> x(static_cast<std::size_t>(total)), gy(x.size());
  for (auto& v : x) v = static_cast<T>(nd(rng));
  for (auto& v : gy) v = static_cast<T>(nd(rng) - 3.0);
  std::vector<T> y(x.size()), y_ref(x.size()), mean(static_cast<std::size_t>(c)), invstd(mean.size()),
      mean_ref(mean.size()), invstd_ref(mean.size());
  const locus::detail::batch_norm_train_kernel<T, T> k{x.data(), y.data(), nullptr, nullptr, mean.data(),
                                                       invstd.data(), nullptr, nullptr, n, c, hw, 1e-5, 0.1, relu};
  for (index_t ch = 0; ch < c; ++ch) k(ch);
  bn_train_reference(x, y_ref, mean_ref, invstd_ref, n, c, hw, 1e-5, relu);
  index_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) bad += same_bits(y[i], y_ref[i]) ? 0 : 1;
  for (std::size_t i = 0; i < mean.size(); ++i)
    bad += same_bits(mean[i], mean_ref[i]) && same_bits(invstd[i], invstd_ref[i]) ? 0 : 1;
  CHECK(bad == 0);

  // backward: the relu's zeros mask the gradient, a NaN there included
  if (relu)
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!(y[i] > T(0)) && i % 3 == 0) gy[i] = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> gx(x.size()), gx_ref(x.size());
  std::vector<T> dg(static_cast<std::size_t>(c)), db(dg.size()), dg_ref(dg.size()), db_ref(dg.size());
  std::vector<T> gamma(dg.size(), T(1.5));
  const locus::detail::batch_norm_backward_kernel<T, T> kb{x.data(), gy.data(), gx.data(), gamma.data(),
                                                           mean.data(), invstd.data(), dg.data(), db.data(), true,
                                                           true, n, c, hw, relu ? y.data() : nullptr};
  for (index_t ch = 0; ch < c; ++ch) kb(ch);
  using locus::detail::sum_pairs;
  for (index_t ch = 0; ch < c; ++ch) {
    const T mu = mean[static_cast<std::size_t>(ch)], is = invstd[static_cast<std::size_t>(ch)];
    double sdy = 0, sdyx = 0;
    for (index_t b = 0; b < n; ++b) {
      const std::size_t o = static_cast<std::size_t>((b * c + ch) * hw);
      T r1, r2;
      sum_pairs<T>(hw, [&](index_t j, T& u, T& v) {
        const std::size_t i = o + static_cast<std::size_t>(j);
        const T dy = !relu || y[i] > T(0) ? gy[i] : T(0);
        u = dy;
        v = dy * (x[i] - mu);
      }, r1, r2);
      sdy += static_cast<double>(r1);
      sdyx += static_cast<double>(r2) * static_cast<double>(is);
    }
    dg_ref[static_cast<std::size_t>(ch)] = static_cast<T>(sdyx);
    db_ref[static_cast<std::size_t>(ch)] = static_cast<T>(sdy);
    const double count = static_cast<double>(n * hw), gm = 1.5, dis = static_cast<double>(is);
    const T a = static_cast<T>(gm * dis), bb = static_cast<T>(-gm * dis * dis * (sdyx / count)),
            c0 = static_cast<T>(-gm * dis * (sdy / count));
    for (index_t b = 0; b < n; ++b)
      for (index_t j = 0; j < hw; ++j) {
        const std::size_t i = static_cast<std::size_t>((b * c + ch) * hw + j);
        const T dy = !relu || y[i] > T(0) ? gy[i] : T(0);
        gx_ref[i] = a * dy + bb * (x[i] - mu) + c0;
      }
  }
  index_t bad_b = 0, nonfinite = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    bad_b += same_bits(gx[i], gx_ref[i]) ? 0 : 1;
    nonfinite += std::isfinite(static_cast<double>(gx[i])) ? 0 : 1;
  }
  for (std::size_t i = 0; i < dg.size(); ++i) bad_b += same_bits(dg[i], dg_ref[i]) && same_bits(db[i], db_ref[i]) ? 0 : 1;
  CHECK(bad_b == 0);
  CHECK(nonfinite == 0);  // the masked NaNs reach nothing
}

}  // namespace

TEST_CASE("relu's host blocks give every element the per-element kernel's bits (lengths around 8, blocks, threshold)") {
  for (const index_t n : {index_t{1}, index_t{7}, index_t{8}, index_t{9}, index_t{8191}, index_t{8193},
                          index_t{32767}, index_t{32768}, index_t{3 * 8192 + 5 + 32768}}) {
    CAPTURE(n);
    check_relu_blocks<float>(n);
    check_relu_blocks<double>(n);
  }
}

TEST_CASE("batch norm's host lanes give the element-wise sums' bits, with and without the fused relu") {
  for (const index_t hw : {index_t{1}, index_t{7}, index_t{8}, index_t{9}, index_t{17}, index_t{196}, index_t{785}})
    for (const bool relu : {false, true}) {
      CAPTURE(hw);
      CAPTURE(relu);
      check_bn_lanes<float>(5, 3, hw, relu);
      check_bn_lanes<double>(4, 2, hw, relu);
    }
}

namespace {
/// The generic host block of a f32 sum (ops/reduce.hpp, host_reduce), written out: the
/// reference the AVX-512 body must equal bit for bit.
double generic_block_sum(const float* x, index_t n) {
  double lanes[16] = {};
  index_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += static_cast<double>(x[i + l]);
  for (; i < n; ++i) lanes[0] += static_cast<double>(x[i]);
  for (int w = 8; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  return lanes[0];
}
bool same_bits_d(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}
}  // namespace

// locus::sum of contiguous f32 runs each 2048-element block through an AVX-512F body
// where the CPU has one: it must give the generic block's bits (every length and
// alignment around the sixteen lanes, huge and tiny magnitudes, NaN, infinities), and the
// whole sum must equal the blocks' sums added in order, as the generic path adds them.
TEST_CASE("sum's AVX-512 block gives the generic block's bits, and a whole f32 sum is the ordered sum of its blocks") {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(2048 + 64);
  // Magnitudes from 2^-40 to 2^40 of both signs: double sums of them round, and cancel,
  // differently in another order (sums of floats of similar size are exact in f64, so
  // they could not tell one order from another).
  std::uniform_int_distribution<int> ex(-40, 40);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(nd(rng), ex(rng));
#if LOCUS_SIMD_AVX512_DISPATCH
  if (!__builtin_cpu_supports("avx512f")) {
    MESSAGE("SKIPPED the AVX-512 body: this CPU has no AVX-512F");
  } else {
    int wrong = 0;
    for (index_t off = 0; off < 17; ++off)
      for (index_t n : {index_t(0), index_t(1), index_t(15), index_t(16), index_t(17), index_t(31), index_t(33),
                        index_t(255), index_t(2047), index_t(2048)}) {
        if (!same_bits_d(locus::detail::simd512::sum_block_f64(x.data() + off, n), generic_block_sum(x.data() + off, n)))
          ++wrong;
      }
    CHECK(wrong == 0);
    std::vector<float> y = x;
    y[40] = std::numeric_limits<float>::infinity();
    CHECK(std::isinf(locus::detail::simd512::sum_block_f64(y.data(), 2048)));
    y[41] = -std::numeric_limits<float>::infinity();
    CHECK(std::isnan(locus::detail::simd512::sum_block_f64(y.data(), 2048)));
    y[41] = std::numeric_limits<float>::quiet_NaN();
    CHECK(std::isnan(locus::detail::simd512::sum_block_f64(y.data(), 2048)));
  }
#else
  MESSAGE("SKIPPED the AVX-512 body: not in this build (not x86-64, or compiled for AVX-512 already)");
#endif
  // Through the public sum, whichever body runs: 100 blocks and a partial one.
  const index_t n = 100 * 2048 + 777;
  auto t = locus::empty<float, locus::cpu>({n});
  std::normal_distribution<float> big(0.0f, 1e4f);
  for (index_t i = 0; i < n; ++i) t.data()[i] = big(rng);
  double total = 0.0;
  for (index_t lo = 0; lo < n; lo += 2048) total += generic_block_sum(t.data() + lo, std::min<index_t>(2048, n - lo));
  CHECK(std::bit_cast<std::uint32_t>(locus::sum(t).item()) == std::bit_cast<std::uint32_t>(static_cast<float>(total)));
  CHECK(std::bit_cast<std::uint32_t>(locus::sum(t.view()).item()) == std::bit_cast<std::uint32_t>(static_cast<float>(total)));
  // A mean takes the same path.
  CHECK(std::bit_cast<std::uint32_t>(locus::mean(t).item()) ==
        std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<float>(total) / static_cast<double>(n))));
}

TEST_CASE("strided assignments on the host (transposes, views) put every element where its index says, across blocks") {
  // The host evaluates a strided assignment in blocks of consecutive elements with the
  // index stepped like an odometer (no division per element). Against an element-by-
  // element loop over the indices: ranks 1 to 4, extents that do not divide the block,
  // sizes below and above the parallel threshold, a transposed source and a strided
  // destination, and an expression (a + b) over both.
  const auto check = [](auto tag, const auto& shape, std::size_t a, std::size_t b) {
    constexpr std::size_t R = decltype(tag)::value;
    locus::extents<R> s{};
    for (std::size_t k = 0; k < R; ++k) s[k] = shape[k];
    const auto x = locus::randn<double, locus::cpu>(s, 3);
    auto ts = s;
    std::swap(ts[a], ts[b]);
    locus::tensor<double, locus::cpu, R> y(ts);
    const auto xt = locus::ag::detail::swap_axes(x.view(), a, b);  // a view of x, axes a and b exchanged
    locus::detail::assign_expr(y.view(), locus::detail::to_expr(xt));  // a plain strided copy (ag's path)
    // y[i...] == x[i with a, b exchanged]
    const index_t n = y.numel();
    std::array<index_t, R> idx{};
    std::size_t bad = 0;
    for (index_t lin = 0; lin < n; ++lin) {
      index_t r = lin;
      for (std::size_t k = R; k-- > 0;) {
        idx[k] = r % ts[k];
        r /= ts[k];
      }
      auto src = idx;
      std::swap(src[a], src[b]);
      index_t so = 0, dof = 0;
      for (std::size_t k = 0; k < R; ++k) {
        so += src[k] * x.strides()[k];
        dof += idx[k] * y.strides()[k];
      }
      bad += y.data_handle()[dof] != x.data_handle()[so];
    }
    CHECK(bad == 0);
    // into a strided destination: the transposed view of a fresh tensor, with an expression
    locus::tensor<double, locus::cpu, R> z(s);
    auto zt = locus::ag::detail::swap_axes(z.view(), a, b);
    zt = y + y;
    std::size_t bad2 = 0;
    for (index_t i = 0; i < n; ++i) bad2 += z.data_handle()[i] != 2 * x.data_handle()[i];
    CHECK(bad2 == 0);
  };
  using r2 = std::integral_constant<std::size_t, 2>;
  using r3 = std::integral_constant<std::size_t, 3>;
  using r4 = std::integral_constant<std::size_t, 4>;
  check(r2{}, std::array<index_t, 2>{3, 5}, 0, 1);
  check(r2{}, std::array<index_t, 2>{301, 257}, 0, 1);     // 77357 elements: parallel, blocks of 8192
  check(r3{}, std::array<index_t, 3>{7, 1, 9}, 0, 2);
  check(r3{}, std::array<index_t, 3>{33, 65, 31}, 1, 2);   // past the threshold
  check(r4{}, std::array<index_t, 4>{2, 3, 4, 5}, 1, 2);
  check(r4{}, std::array<index_t, 4>{32, 64, 4, 24}, 1, 2);  // the GPT's per-head layout
  check(r4{}, std::array<index_t, 4>{5, 7, 11, 13}, 0, 3);
}
