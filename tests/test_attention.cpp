// Host suite: ag::scaled_dot_product_attention (ag/attention.hpp), and ag::rms_norm and
// ag::layer_norm (ag/norm.hpp) at the end. Forwards against a
// direct f64 computation here (the T x T scores, the masked softmax, the weighted sum,
// by index loops); every gradient against central finite differences in f64 of the
// forward alone, with and without the causal mask, Tq != Tk, several head counts and key
// counts past the kernels' key block; q, k and v as one value; bf16 and f32 against
// f64; NaN rows; the run-time rules (each leaving the tape as it was); no allocation in
// inference; the extra memory of forward and backward at 512, 2048 and 8192 positions.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <locus/ag/attention.hpp>
#include <locus/locus.hpp>
#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
#include <locus/io/safetensors.hpp>
#endif

namespace {

namespace ag = locus::ag;
using locus::extents;
using locus::index_t;
using D = locus::cpu;

template <class T>
locus::tensor<T, D, 4> random4(extents<4> s, std::uint32_t seed, double amp = 1.0) {
  locus::tensor<T, D, 4> t(s);
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(-amp, amp);
  for (index_t i = 0; i < t.numel(); ++i) t.data_handle()[i] = static_cast<T>(u(g));
  return t;
}

/// o = softmax(q k^T * scale + mask) v by index loops in f64.
std::vector<double> reference(const double* q, const double* k, const double* v, extents<4> qs, index_t tk,
                              index_t ev, bool causal, double scale) {
  const index_t bh = qs[0] * qs[1], tq = qs[2], e = qs[3];
  std::vector<double> o(static_cast<std::size_t>(bh * tq * ev), 0.0);
  for (index_t b = 0; b < bh; ++b)
    for (index_t i = 0; i < tq; ++i) {
      std::vector<double> s(static_cast<std::size_t>(tk));
      double m = -INFINITY;
      for (index_t j = 0; j < tk; ++j) {
        double dot = 0;
        for (index_t d = 0; d < e; ++d) dot += q[(b * tq + i) * e + d] * k[(b * tk + j) * e + d];
        s[j] = causal && j > i ? -INFINITY : dot * scale;
        m = std::max(m, s[j]);
      }
      double sum = 0;
      for (index_t j = 0; j < tk; ++j) sum += std::exp(s[j] - m);
      for (index_t j = 0; j < tk; ++j) {
        const double p = std::exp(s[j] - m) / sum;
        for (index_t d = 0; d < ev; ++d) o[(b * tq + i) * ev + d] += p * v[(b * tk + j) * ev + d];
      }
    }
  return o;
}

struct case_t {
  index_t b, h, tq, tk, e, ev;
  bool causal;
  double scale;
};

std::string name_of(const case_t& c) {
  return "B " + std::to_string(c.b) + " H " + std::to_string(c.h) + " Tq " + std::to_string(c.tq) + " Tk " +
         std::to_string(c.tk) + " E " + std::to_string(c.e) + " Ev " + std::to_string(c.ev) +
         (c.causal ? " causal" : "") + (c.scale > 0 ? " scale " + std::to_string(c.scale) : "");
}

/// sum(sdpa(q, k, v) * w): a scalar whose gradient reaches every output element with its
/// own weight.
template <class T>
ag::var<T, D, 0> weighted(ag::tape<T, D>& t, const ag::var<T, D, 4>& q, const ag::var<T, D, 4>& k,
                          const ag::var<T, D, 4>& v, const locus::tensor<T, D, 4>& w, const case_t& c) {
  const auto o = ag::scaled_dot_product_attention(q, k, v, {.causal = c.causal, .scale = c.scale});
  return ag::sum(o * t.constant(w));
}

}  // namespace

TEST_CASE("scaled_dot_product_attention: forward against the direct f64 computation") {
  const case_t cases[] = {
      {2, 3, 5, 5, 4, 3, false, 0},  {2, 3, 5, 5, 4, 3, true, 0},   {1, 2, 3, 7, 8, 8, true, 0},
      {1, 2, 7, 3, 8, 5, true, 0},   {1, 1, 70, 70, 6, 6, false, 0}, {1, 1, 70, 70, 6, 6, true, 0},
      {3, 1, 1, 33, 16, 2, false, 0.7}, {1, 4, 65, 64, 32, 32, true, 0}, {1, 1, 4, 4, 256, 256, false, 0},
  };
  for (const auto& c : cases) {
    INFO(name_of(c));
    const auto q = random4<double>({c.b, c.h, c.tq, c.e}, 1);
    const auto k = random4<double>({c.b, c.h, c.tk, c.e}, 2);
    const auto v = random4<double>({c.b, c.h, c.tk, c.ev}, 3);
    ag::tape<double, D> t;
    const auto o = ag::scaled_dot_product_attention(t.constant(q), t.constant(k), t.constant(v),
                                                    {.causal = c.causal, .scale = c.scale});
    CHECK(o.shape() == extents<4>{c.b, c.h, c.tq, c.ev});
    const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.e));
    const auto want = reference(q.data_handle(), k.data_handle(), v.data_handle(), q.shape(), c.tk, c.ev, c.causal, scale);
    double worst = 0;
    for (index_t i = 0; i < o.numel(); ++i) worst = std::max(worst, std::abs(o.value().data_handle()[i] - want[i]));
    CHECK(worst < 1e-13);
  }
}

TEST_CASE("scaled_dot_product_attention: large scores stay finite (online softmax, max-shifted)") {
  // Scores of a few thousand: exp overflows without the running maximum.
  const case_t c{1, 2, 40, 40, 8, 4, true, 0};
  const auto q = random4<double>({1, 2, 40, 8}, 4, 60.0);
  const auto k = random4<double>({1, 2, 40, 8}, 5, 60.0);
  const auto v = random4<double>({1, 2, 40, 4}, 6);
  ag::tape<double, D> t;
  const auto o = ag::scaled_dot_product_attention(t.constant(q), t.constant(k), t.constant(v), {.causal = true});
  const auto want = reference(q.data_handle(), k.data_handle(), v.data_handle(), q.shape(), 40, 4, true,
                              1.0 / std::sqrt(8.0));
  for (index_t i = 0; i < o.numel(); ++i) {
    REQUIRE(std::isfinite(o.value().data_handle()[i]));
    CHECK(std::abs(o.value().data_handle()[i] - want[i]) < 1e-12);
  }
  (void)c;
}

TEST_CASE("scaled_dot_product_attention: gradients of q, k and v against finite differences in f64") {
  const case_t cases[] = {
      {1, 1, 4, 4, 3, 2, false, 0}, {1, 2, 4, 4, 3, 2, true, 0},  {2, 1, 3, 6, 2, 3, true, 0},
      {1, 1, 6, 3, 2, 2, true, 0},  {1, 3, 5, 5, 4, 4, true, 1.3}, {1, 1, 3, 37, 2, 2, false, 0},
      {1, 1, 37, 37, 2, 1, true, 0},
  };
  for (const auto& c : cases) {
    INFO(name_of(c));
    auto q = random4<double>({c.b, c.h, c.tq, c.e}, 11);
    auto k = random4<double>({c.b, c.h, c.tk, c.e}, 12);
    auto v = random4<double>({c.b, c.h, c.tk, c.ev}, 13);
    const auto w = random4<double>({c.b, c.h, c.tq, c.ev}, 14);
    ag::tape<double, D> t;
    const auto lq = t.leaf(q), lk = t.leaf(k), lv = t.leaf(v);
    t.backward(weighted(t, lq, lk, lv, w, c));
    const auto value_at = [&] {
      ag::tape<double, D> u;
      return weighted(u, u.constant(q), u.constant(k), u.constant(v), w, c).value().data_handle()[0];
    };
    locus::tensor<double, D, 4>* ins[] = {&q, &k, &v};
    const ag::var<double, D, 4>* leaves[] = {&lq, &lk, &lv};
    for (int a = 0; a < 3; ++a) {
      const auto g = t.grad(*leaves[a]);
      double* p = ins[a]->data_handle();
      for (index_t i = 0; i < ins[a]->numel(); ++i) {
        const double keep = p[i], h = 1e-6;
        p[i] = keep + h;
        const double up = value_at();
        p[i] = keep - h;
        const double down = value_at();
        p[i] = keep;
        const double numeric = (up - down) / (2 * h);
        INFO("input " << "qkv"[a] << " element " << i << ": backward " << g.data_handle()[i] << ", finite differences "
                      << numeric);
        CHECK(std::abs(g.data_handle()[i] - numeric) < 1e-7 * std::max(1.0, std::abs(numeric)));
      }
    }
  }
}

TEST_CASE("scaled_dot_product_attention: one value as q, k and v, and as k and v (the contributions add)") {
  for (int mode = 0; mode < 2; ++mode) {
    CAPTURE(mode);
    const case_t c{1, 2, 5, 5, 3, 3, mode == 1, 0};
    auto x = random4<double>({1, 2, 5, 3}, 21);
    auto q = random4<double>({1, 2, 5, 3}, 22);
    const auto w = random4<double>({1, 2, 5, 3}, 23);
    const auto f = [&](ag::tape<double, D>& t, const ag::var<double, D, 4>& lx, const ag::var<double, D, 4>& lq) {
      return mode == 0 ? weighted(t, lx, lx, lx, w, c) : weighted(t, lq, lx, lx, w, c);
    };
    ag::tape<double, D> t;
    const auto lx = t.leaf(x), lq = t.leaf(q);
    t.backward(f(t, lx, lq));
    const auto g = t.grad(lx);
    double* p = x.data_handle();
    for (index_t i = 0; i < x.numel(); ++i) {
      const double keep = p[i], h = 1e-6;
      const auto at = [&] {
        ag::tape<double, D> u;
        return f(u, u.constant(x), u.constant(q)).value().data_handle()[0];
      };
      p[i] = keep + h;
      const double up = at();
      p[i] = keep - h;
      const double down = at();
      p[i] = keep;
      const double numeric = (up - down) / (2 * h);
      INFO("element " << i);
      CHECK(std::abs(g.data_handle()[i] - numeric) < 1e-7 * std::max(1.0, std::abs(numeric)));
    }
  }
}

TEST_CASE("scaled_dot_product_attention: bf16 and f32 against f64, and the same bits on every run") {
  const auto q = random4<double>({2, 2, 48, 16}, 31), k = random4<double>({2, 2, 48, 16}, 32),
             v = random4<double>({2, 2, 48, 16}, 33);
  const auto want = reference(q.data_handle(), k.data_handle(), v.data_handle(), q.shape(), 48, 16, true, 0.25);
  const auto run = [&]<class T>(T, double tol) {
    locus::tensor<T, D, 4> qt(q.shape()), kt(k.shape()), vt(v.shape());
    qt = locus::cast<T>(q);
    kt = locus::cast<T>(k);
    vt = locus::cast<T>(v);
    std::vector<float> first;
    for (int rep = 0; rep < 2; ++rep) {
      ag::tape<T, D> t;
      const auto lq = t.leaf(qt), lk = t.leaf(kt), lv = t.leaf(vt);
      const auto o = ag::scaled_dot_product_attention(lq, lk, lv, {.causal = true});
      t.backward(ag::sum(o));
      double worst = 0;
      for (index_t i = 0; i < o.numel(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(o.value().data_handle()[i]) - want[i]));
      CHECK(worst < tol);
      std::vector<float> bits;
      for (const auto* var : {&lq, &lk, &lv}) {
        const auto g = t.grad(*var);
        for (index_t i = 0; i < g.numel(); ++i) bits.push_back(static_cast<float>(g.data_handle()[i]));
      }
      if (rep == 0) first = bits;
      else CHECK(bits == first);
    }
  };
  run(float{}, 1e-5);
  run(locus::bf16{}, 3e-2);
}

TEST_CASE("scaled_dot_product_attention: a NaN in one query row reaches only that row") {
  auto q = random4<double>({1, 1, 6, 4}, 41);
  const auto k = random4<double>({1, 1, 6, 4}, 42), v = random4<double>({1, 1, 6, 4}, 43);
  q.data_handle()[2 * 4 + 1] = std::numeric_limits<double>::quiet_NaN();
  ag::tape<double, D> t;
  const auto o = ag::scaled_dot_product_attention(t.constant(q), t.constant(k), t.constant(v));
  for (index_t i = 0; i < 6; ++i)
    for (index_t d = 0; d < 4; ++d) CHECK(std::isnan(o.value().data_handle()[i * 4 + d]) == (i == 2));
}

TEST_CASE("scaled_dot_product_attention: shapes that do not fit are shape_errors naming all three, the tape unchanged") {
  ag::tape<float, D> t;
  const auto ok = locus::zeros<float, D>({1, 2, 4, 8});
  const auto x = t.leaf(ok);
  const std::size_t values = t.values(), ops = t.operations();
  const auto bad = [&](extents<4> ks, extents<4> vs, const std::string& part) {
    const locus::tensor<float, D, 4> kt(ks), vt(vs);
    const auto k = t.constant(kt), v = t.constant(vt);
    const std::size_t before = t.values();
    CHECK_THROWS_WITH_AS(ag::scaled_dot_product_attention(x, k, v),
                         doctest::Contains(("q [1, 2, 4, 8], k " + locus::detail::shape_string(ks) + " and v " +
                                            locus::detail::shape_string(vs) + ": " + part)
                                               .c_str()),
                         locus::shape_error);
    CHECK(t.values() == before);
    CHECK(t.operations() == ops);
  };
  bad({1, 3, 4, 8}, {1, 3, 4, 8}, "the batch and head extents");
  bad({2, 2, 4, 8}, {2, 2, 4, 8}, "the batch and head extents");
  bad({1, 2, 4, 8}, {1, 2, 5, 8}, "k and v must have the same length");
  bad({1, 2, 4, 7}, {1, 2, 4, 8}, "q and k must have the same head dimension");
  bad({1, 2, 0, 8}, {1, 2, 0, 8}, "the key sequence is empty");
  bad({1, 2, 4, 8}, {1, 2, 4, 257}, "the head dimensions must be in [1, 256]");
  bad({1, 2, 4, 8}, {1, 2, 4, 0}, "the head dimensions must be in [1, 256]");
  for (double s : {-1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    const std::size_t before = t.values();
    CHECK_THROWS_AS(ag::scaled_dot_product_attention(x, x, x, {.scale = s}), locus::value_error);
    CHECK(t.values() == before);
  }
  CHECK(t.values() >= values);
  // An empty query sequence is fine: an empty result.
  const auto empty_q = locus::zeros<float, D>({1, 2, 0, 8});
  const auto o = ag::scaled_dot_product_attention(t.constant(empty_q), x, x, {.causal = true});
  CHECK(o.shape() == extents<4>{1, 2, 0, 8});
}

TEST_CASE("scaled_dot_product_attention: inference keeps nothing and allocates nothing in steady state") {
  const auto q = random4<float>({2, 4, 64, 16}, 51), k = random4<float>({2, 4, 64, 16}, 52),
             v = random4<float>({2, 4, 64, 16}, 53);
  ag::tape<float, D> t;
  std::size_t allocations = 0;
  for (int step = 0; step < 3; ++step) {
    t.reset();
    const auto before = locus::memory_stats<D>().allocations;
    const auto o = ag::scaled_dot_product_attention(t.constant(q), t.constant(k), t.constant(v), {.causal = true});
    CHECK(t.operations() == 0);  // no gradient wanted: no node
    CHECK_FALSE(o.requires_grad());
    allocations = locus::memory_stats<D>().allocations - before;
  }
  CHECK(allocations == 0);
}

TEST_CASE("scaled_dot_product_attention: the extra memory of forward and backward grows linearly in length") {
  // Beyond the inputs, the output and the three gradients (all B*H*T*E), forward and
  // backward keep two numbers per query row: a T x T matrix at T = 8192 would be 256 MiB.
  const index_t e = 8;
  std::vector<double> extra;
  for (index_t n : {index_t{512}, index_t{2048}, index_t{8192}}) {
    const auto q = random4<float>({1, 1, n, e}, 61), k = random4<float>({1, 1, n, e}, 62),
               v = random4<float>({1, 1, n, e}, 63);
    ag::tape<float, D> t;
    const auto base = locus::memory_stats<D>().allocated_bytes;
    locus::reset_peak_memory_stats<D>();
    {
      const auto lq = t.leaf(q), lk = t.leaf(k), lv = t.leaf(v);
      const auto o = ag::scaled_dot_product_attention(lq, lk, lv, {.causal = true});
      t.backward(ag::sum(o));
      CHECK(std::isfinite(t.grad(lq).data_handle()[n * e - 1]));
    }
    const double peak = static_cast<double>(locus::memory_stats<D>().peak_allocated_bytes - base);
    const double tensors = 5.0 * static_cast<double>(n * e * sizeof(float));  // o, its gradient, dq, dk, dv
    extra.push_back(peak - tensors);
    MESSAGE("T = " << n << ": peak " << peak << " bytes, beyond the T x E tensors " << peak - tensors);
    CHECK(peak - tensors <= 4.0 * static_cast<double>(n) * sizeof(float) + 4096);
  }
  CHECK(extra[2] <= 4.5 * extra[1]);  // 4x the length: about 4x the memory, not 16x
}

// Not part of the host suite's run (doctest::skip(): it needs a file a Python script
// writes): the CTest "interop: scaled dot-product attention against PyTorch (forward and
// backward)" runs tests/python/attention_torch.py, then this case with --no-skip.
TEST_CASE("Attention equals PyTorch in f64: scaled_dot_product_attention, rms_norm, layer_norm, forward and backward" *
          doctest::skip()) {
#if !defined(LOCUS_HAS_JSON) || !LOCUS_HAS_JSON
  FAIL("reading the PyTorch file needs locus/io/safetensors.hpp, which needs nlohmann-json");
#else
  const char* env = std::getenv("LOCUS_ATTENTION_TORCH_FILE");
  if (env == nullptr || *env == '\0')
    FAIL("LOCUS_ATTENTION_TORCH_FILE is not set (tests/python/attention_torch.py FILE writes it)");
  const std::filesystem::path file = env;
  if (!std::filesystem::exists(file)) FAIL("LOCUS_ATTENTION_TORCH_FILE names " << file << ", which does not exist");
  const auto a = locus::io::load<D>(file);
  struct named {
    const char* name;
    bool causal;
    double scale;
  };
  // The cases of tests/python/attention_torch.py, with their options.
  const named cases[] = {{"plain", false, 0},          {"causal", true, 0},   {"causal_long_keys", true, 0},
                         {"causal_short_keys", true, 0}, {"scaled", false, 0.3}, {"one_head_64", true, 0}};
  for (const auto& c : cases) {
    SUBCASE(c.name) {
      const std::string n = c.name;
      REQUIRE_MESSAGE(a.contains(n + ".q"), "the file has no case " << n);
      const auto q = a.template get<double, 4>(n + ".q");
      const auto k = a.template get<double, 4>(n + ".k");
      const auto v = a.template get<double, 4>(n + ".v");
      const auto gy = a.template get<double, 4>(n + ".gy");
      ag::tape<double, D> t;
      const auto lq = t.leaf(q), lk = t.leaf(k), lv = t.leaf(v);
      const auto y = ag::scaled_dot_product_attention(lq, lk, lv, {.causal = c.causal, .scale = c.scale});
      t.backward(ag::sum(y * t.constant(gy)));
      const auto compare = [&](const std::string& key, const double* got, index_t count) {
        const auto want = a.template flat<double>(n + "." + key);
        REQUIRE(want.numel() == count);
        const double* w = want.data_handle();
        double worst = 0;
        for (index_t i = 0; i < count; ++i) worst = std::max(worst, std::abs(got[i] - w[i]) / (1.0 + std::abs(w[i])));
        INFO(n << "." << key << ": largest difference from PyTorch " << worst);
        CHECK(worst < 1e-12);
      };
      compare("y", y.value().data_handle(), y.numel());
      compare("gq", t.grad(lq).data_handle(), q.numel());
      compare("gk", t.grad(lk).data_handle(), k.numel());
      compare("gv", t.grad(lv).data_handle(), v.numel());
    }
  }
  SUBCASE("rms_norm") {
    const auto x = a.template get<double, 3>("rms_norm.x");
    const auto w = a.template get<double, 1>("rms_norm.w");
    const auto gy = a.template get<double, 3>("rms_norm.gy");
    ag::tape<double, D> t;
    const auto lx = t.leaf(x);
    const auto lw = t.leaf(w);
    const auto y = ag::rms_norm(lx, lw, 1e-5);
    t.backward(ag::sum(y * t.constant(gy)));
    const std::pair<const char*, const double*> got[] = {
        {"y", y.value().data_handle()}, {"gx", t.grad(lx).data_handle()}, {"gw", t.grad(lw).data_handle()}};
    for (const auto& [key, p] : got) {
      const auto want = a.template flat<double>(std::string("rms_norm.") + key);
      double worst = 0;
      for (index_t i = 0; i < want.numel(); ++i)
        worst = std::max(worst, std::abs(p[i] - want.data_handle()[i]) / (1.0 + std::abs(want.data_handle()[i])));
      INFO("rms_norm." << key << ": largest difference from PyTorch " << worst);
      CHECK(worst < 1e-12);
    }
  }
  SUBCASE("layer_norm") {
    const auto x = a.template get<double, 3>("layer_norm.x");
    const auto w = a.template get<double, 1>("layer_norm.w");
    const auto b = a.template get<double, 1>("layer_norm.b");
    const auto gy = a.template get<double, 3>("layer_norm.gy");
    ag::tape<double, D> t;
    const auto lx = t.leaf(x);
    const auto lw = t.leaf(w);
    const auto lb = t.leaf(b);
    const auto y = ag::layer_norm(lx, lw, lb, 1e-5);
    t.backward(ag::sum(y * t.constant(gy)));
    const std::pair<const char*, const double*> got[] = {{"y", y.value().data_handle()},
                                                         {"gx", t.grad(lx).data_handle()},
                                                         {"gw", t.grad(lw).data_handle()},
                                                         {"gb", t.grad(lb).data_handle()}};
    for (const auto& [key, p] : got) {
      const auto want = a.template flat<double>(std::string("layer_norm.") + key);
      double worst = 0;
      for (index_t i = 0; i < want.numel(); ++i)
        worst = std::max(worst, std::abs(p[i] - want.data_handle()[i]) / (1.0 + std::abs(want.data_handle()[i])));
      INFO("layer_norm." << key << ": largest difference from PyTorch " << worst);
      CHECK(worst < 1e-12);
    }
  }
#endif
}

// ---- ag::rms_norm (ag/norm.hpp) ------------------------------------------------------------

TEST_CASE("rms_norm: forward against f64 loops, gradients of x and the gain against finite differences") {
  for (const index_t cols : {index_t{1}, index_t{5}, index_t{33}}) {
    CAPTURE(cols);
    locus::tensor<double, D, 3> x({2, 3, cols});
    locus::tensor<double, D, 1> w({cols});
    std::mt19937 g(7);
    std::uniform_real_distribution<double> u(-2.0, 2.0);
    for (index_t i = 0; i < x.numel(); ++i) x.data_handle()[i] = u(g);
    for (index_t i = 0; i < cols; ++i) w.data_handle()[i] = u(g);
    locus::tensor<double, D, 3> gy({2, 3, cols});
    for (index_t i = 0; i < gy.numel(); ++i) gy.data_handle()[i] = u(g);
    const double eps = 1e-5;
    for (const bool gain : {false, true}) {
      CAPTURE(gain);
      const auto f = [&](ag::tape<double, D>& t, const ag::var<double, D, 3>& lx, const ag::var<double, D, 1>& lw) {
        const auto y = gain ? ag::rms_norm(lx, lw, eps) : ag::rms_norm(lx, eps);
        return ag::sum(y * t.constant(gy));
      };
      ag::tape<double, D> t;
      const auto lx = t.leaf(x);
      const auto lw = t.leaf(w);
      const auto y = gain ? ag::rms_norm(lx, lw, eps) : ag::rms_norm(lx, eps);
      for (index_t r = 0; r < 6; ++r) {
        double ss = 0;
        for (index_t j = 0; j < cols; ++j) ss += x.data_handle()[r * cols + j] * x.data_handle()[r * cols + j];
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
        for (index_t j = 0; j < cols; ++j) {
          const double want = x.data_handle()[r * cols + j] * inv * (gain ? w.data_handle()[j] : 1.0);
          CHECK(std::abs(y.value().data_handle()[r * cols + j] - want) < 1e-14);
        }
      }
      t.backward(ag::sum(y * t.constant(gy)));
      const auto check = [&](const double* analytic, double* p, index_t n, const char* what) {
        for (index_t i = 0; i < n; ++i) {
          const double keep = p[i], h = 1e-6;
          const auto at = [&] {
            ag::tape<double, D> v;
            return f(v, v.constant(x), v.constant(w)).value().data_handle()[0];
          };
          p[i] = keep + h;
          const double up = at();
          p[i] = keep - h;
          const double down = at();
          p[i] = keep;
          const double numeric = (up - down) / (2 * h);
          INFO(what << " element " << i << ": backward " << analytic[i] << ", numeric " << numeric);
          CHECK(std::abs(analytic[i] - numeric) < 1e-7 * std::max(1.0, std::abs(numeric)));
        }
      };
      check(t.grad(lx).data_handle(), x.data_handle(), x.numel(), "x");
      if (gain) check(t.grad(lw).data_handle(), w.data_handle(), cols, "gain");
    }
  }
}

TEST_CASE("rms_norm: a gain of the wrong length and a bad eps are refused before anything is recorded") {
  ag::tape<float, D> t;
  const auto x = locus::ones<float, D>({4, 8});
  const auto w7 = locus::ones<float, D>({7});
  const auto lx = t.leaf(x);
  const auto lw = t.leaf(w7);
  const std::size_t values = t.values(), ops = t.operations();
  CHECK_THROWS_WITH_AS(ag::rms_norm(lx, lw, 1e-6),
                       "locus: ag::rms_norm of x [4, 8] with a gain [7]: the gain must have the last extent of x, [8]",
                       locus::shape_error);
  for (double eps : {-1e-6, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()})
    CHECK_THROWS_AS(ag::rms_norm(lx, eps), locus::value_error);
  CHECK(t.values() == values);
  CHECK(t.operations() == ops);
  // A row of zeros with eps 0 is 0/0: NaN, as PyTorch gives; with eps > 0 it stays 0.
  const auto z = locus::zeros<float, D>({1, 4});
  CHECK(std::isnan(ag::rms_norm(t.constant(z), 0.0).value().data_handle()[0]));
  CHECK(ag::rms_norm(t.constant(z), 1e-6).value().data_handle()[0] == 0.0f);
}

// ---- ag::layer_norm (ag/norm.hpp) ----------------------------------------------------------

TEST_CASE("layer_norm: forward against f64 loops, gradients of x, gain and bias against finite differences") {
  for (const index_t cols : {index_t{2}, index_t{7}, index_t{40}}) {
    CAPTURE(cols);
    std::mt19937 g(9);
    std::uniform_real_distribution<double> u(-2.0, 2.0);
    locus::tensor<double, D, 2> x({5, cols}), gy({5, cols});
    locus::tensor<double, D, 1> w({cols}), b({cols});
    for (index_t i = 0; i < x.numel(); ++i) x.data_handle()[i] = u(g) + 3.0;  // off centre
    for (index_t i = 0; i < gy.numel(); ++i) gy.data_handle()[i] = u(g);
    for (index_t i = 0; i < cols; ++i) {
      w.data_handle()[i] = u(g);
      b.data_handle()[i] = u(g);
    }
    const double eps = 1e-5;
    for (const bool affine : {false, true}) {
      CAPTURE(affine);
      const auto f = [&](ag::tape<double, D>& t, const ag::var<double, D, 2>& lx, const ag::var<double, D, 1>& lw,
                         const ag::var<double, D, 1>& lb) {
        const auto y = affine ? ag::layer_norm(lx, lw, lb, eps) : ag::layer_norm(lx, eps);
        return ag::sum(y * t.constant(gy));
      };
      ag::tape<double, D> t;
      const auto lx = t.leaf(x);
      const auto lw = t.leaf(w);
      const auto lb = t.leaf(b);
      const auto y = affine ? ag::layer_norm(lx, lw, lb, eps) : ag::layer_norm(lx, eps);
      for (index_t r = 0; r < 5; ++r) {
        double m = 0, v = 0;
        for (index_t j = 0; j < cols; ++j) m += x(r, j) / static_cast<double>(cols);
        for (index_t j = 0; j < cols; ++j) v += (x(r, j) - m) * (x(r, j) - m) / static_cast<double>(cols);
        for (index_t j = 0; j < cols; ++j) {
          const double xh = (x(r, j) - m) / std::sqrt(v + eps);
          const double want = affine ? xh * w(j) + b(j) : xh;
          CHECK(std::abs(y.value()(r, j) - want) < 1e-13);
        }
      }
      t.backward(ag::sum(y * t.constant(gy)));
      const auto check = [&](const double* analytic, double* p, index_t n, const char* what) {
        for (index_t i = 0; i < n; ++i) {
          const double keep = p[i], h = 1e-6;
          const auto at = [&] {
            ag::tape<double, D> v;
            return f(v, v.constant(x), v.constant(w), v.constant(b)).value().data_handle()[0];
          };
          p[i] = keep + h;
          const double up = at();
          p[i] = keep - h;
          const double down = at();
          p[i] = keep;
          const double numeric = (up - down) / (2 * h);
          INFO(what << " element " << i << ": backward " << analytic[i] << ", numeric " << numeric);
          CHECK(std::abs(analytic[i] - numeric) < 1e-7 * std::max(1.0, std::abs(numeric)));
        }
      };
      check(t.grad(lx).data_handle(), x.data_handle(), x.numel(), "x");
      if (affine) {
        check(t.grad(lw).data_handle(), w.data_handle(), cols, "gain");
        check(t.grad(lb).data_handle(), b.data_handle(), cols, "bias");
      }
    }
  }
}

TEST_CASE("layer_norm: a gain or bias of the wrong length and a bad eps are refused, the tape unchanged") {
  ag::tape<float, D> t;
  const auto x = locus::ones<float, D>({3, 6});
  const auto w6 = locus::ones<float, D>({6});
  const auto w5 = locus::ones<float, D>({5});
  const auto lx = t.leaf(x);
  const auto l6 = t.leaf(w6);
  const auto l5 = t.leaf(w5);
  const std::size_t values = t.values(), ops = t.operations();
  CHECK_THROWS_WITH_AS(ag::layer_norm(lx, l5, l6, 1e-5),
                       "locus: ag::layer_norm of x [3, 6] with a gain [5]: it must have the last extent of x, [6]",
                       locus::shape_error);
  CHECK_THROWS_WITH_AS(ag::layer_norm(lx, l6, l5, 1e-5),
                       "locus: ag::layer_norm of x [3, 6] with a bias [5]: it must have the last extent of x, [6]",
                       locus::shape_error);
  CHECK_THROWS_AS(ag::layer_norm(lx, -1.0), locus::value_error);
  CHECK(t.values() == values);
  CHECK(t.operations() == ops);
  // A constant row normalises to 0 with eps > 0 (not NaN).
  const auto y = ag::layer_norm(lx, 1e-5);
  CHECK(y.value()(0, 0) == 0.0f);
}
