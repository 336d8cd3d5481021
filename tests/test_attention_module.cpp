// Host suite: nn::multi_head_attention (nn/attention.hpp). The forward against PyTorch's
// nn.MultiheadAttention equations written here as f64 index loops (projections, per
// head the masked softmax, the merge, the output projection), self- and
// cross-attention, both layouts, with and without biases and the causal mask; every
// parameter's and the input's gradient against central finite differences of that loop;
// the names, shapes and initialisation PyTorch gives; bf16 against f64; the rules (heads
// that do not divide the width, wrong widths, key/value mismatches), each before anything
// is recorded. The skip() case at the end compares with a file PyTorch writes (CTest
// "interop: nn.MultiheadAttention against PyTorch ...", tests/python/attention_torch.py).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <locus/locus.hpp>
#include <locus/nn/attention.hpp>
#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
#include <locus/io/safetensors.hpp>
#endif

namespace {

namespace ag = locus::ag;
namespace nn = locus::nn;
using locus::extents;
using locus::index_t;
using locus::cpu;

/// Self-attention (the module's x through `shift`, a parameter of x's shape that starts
/// at zero, so its gradient is the input's).
template <class D, class P>
struct self_net : nn::module<D, P> {
  nn::param<D, P, 3> shift;
  nn::multi_head_attention<D, P> attn;
  self_net(extents<3> s, index_t e, index_t h, nn::attention_layer_options o)
      : shift{this, "shift", s}, attn{this, "attn", e, h, o} {}
  auto forward(const typename self_net::template var<3>& x) { return attn(x + shift.on(x)); }
};

/// Cross-attention: the model's input is the query; key and value are parameters.
template <class D, class P>
struct cross_net : nn::module<D, P> {
  nn::param<D, P, 3> shift, key, val;
  nn::multi_head_attention<D, P> attn;
  cross_net(extents<3> q, extents<3> kv, index_t e, index_t h, nn::attention_layer_options o)
      : shift{this, "shift", q},
        key{this, "key", kv, nn::param_init::uniform(-1, 1)},
        val{this, "val", kv, nn::param_init::uniform(-1, 1)},
        attn{this, "attn", e, h, o} {}
  auto forward(const typename cross_net::template var<3>& x) { return attn(x + shift.on(x), key.on(x), val.on(x)); }
};

/// The layer alone.
template <class D, class P>
struct plain_net : nn::module<D, P> {
  nn::multi_head_attention<D, P> attn;
  plain_net(index_t e, index_t h, nn::attention_layer_options o) : attn{this, "attn", e, h, o} {}
  auto forward(const typename plain_net::template var<3>& x) { return attn(x); }
};

/// The layer with the sizes as template arguments.
template <class D, class P>
struct static_net : nn::module<D, P> {
  nn::multi_head_attention<D, P, 12, 4> attn{this, "attn", {.causal = true, .batch_first = true}};
  auto forward(const typename static_net::template var<3>& x) { return attn(x); }
};

/// PyTorch's multi-head attention by index loops in f64. x* [T, B, E] (or [B, T, E]).
struct mha_ref {
  index_t e, h;
  bool causal, batch_first;
  const double *w_in, *b_in, *w_out, *b_out;  // biases may be null
  // element (t, b, f) of a sequence of shape s
  [[nodiscard]] index_t at(const extents<3>& s, index_t t, index_t b, index_t f) const {
    return batch_first ? (b * s[1] + t) * e + f : (t * s[1] + b) * e + f;
  }
  std::vector<double> operator()(const double* q_in, extents<3> qs, const double* k_in, const double* v_in,
                                 extents<3> ks) const {
    const index_t bsz = batch_first ? qs[0] : qs[1], tq = batch_first ? qs[1] : qs[0];
    const index_t tk = batch_first ? ks[1] : ks[0], d = e / h;
    const auto proj = [&](const double* x, const extents<3>& s, index_t t, index_t b, index_t row) {
      double acc = b_in ? b_in[row] : 0.0;
      for (index_t f = 0; f < e; ++f) acc += w_in[row * e + f] * x[at(s, t, b, f)];
      return acc;
    };
    std::vector<double> merged(static_cast<std::size_t>(bsz * tq * e)), y(merged.size());
    for (index_t b = 0; b < bsz; ++b)
      for (index_t hh = 0; hh < h; ++hh) {
        std::vector<double> k(static_cast<std::size_t>(tk * d)), v(k.size());
        for (index_t j = 0; j < tk; ++j)
          for (index_t c = 0; c < d; ++c) {
            k[j * d + c] = proj(k_in, ks, j, b, e + hh * d + c);
            v[j * d + c] = proj(v_in, ks, j, b, 2 * e + hh * d + c);
          }
        for (index_t i = 0; i < tq; ++i) {
          std::vector<double> q(static_cast<std::size_t>(d)), s(static_cast<std::size_t>(tk));
          for (index_t c = 0; c < d; ++c) q[c] = proj(q_in, qs, i, b, hh * d + c);
          double mx = -INFINITY, z = 0;
          for (index_t j = 0; j < tk; ++j) {
            double dot = 0;
            for (index_t c = 0; c < d; ++c) dot += q[c] * k[j * d + c];
            s[j] = causal && j > i ? -INFINITY : dot / std::sqrt(static_cast<double>(d));
            mx = std::max(mx, s[j]);
          }
          for (auto& sj : s) z += (sj = std::exp(sj - mx));
          for (index_t c = 0; c < d; ++c) {
            double o = 0;
            for (index_t j = 0; j < tk; ++j) o += s[j] / z * v[j * d + c];
            merged[(b * tq + i) * e + hh * d + c] = o;
          }
        }
      }
    for (index_t b = 0; b < bsz; ++b)
      for (index_t i = 0; i < tq; ++i)
        for (index_t r = 0; r < e; ++r) {
          double acc = b_out ? b_out[r] : 0.0;
          for (index_t f = 0; f < e; ++f) acc += w_out[r * e + f] * merged[(b * tq + i) * e + f];
          y[batch_first ? (b * tq + i) * e + r : (i * bsz + b) * e + r] = acc;
        }
    return y;
  }
};

template <class T, std::size_t R>
locus::tensor<T, cpu, R> random_tensor(extents<R> s, std::uint32_t seed) {
  locus::tensor<T, cpu, R> t(s);
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  for (index_t i = 0; i < t.numel(); ++i) t.data_handle()[i] = static_cast<T>(u(g));
  return t;
}

/// The model's parameters drawn again from U(-0.5, 0.5) (biases too, so none is zero).
template <class M>
void randomise(M& m, std::uint32_t seed) {
  auto& st = m.parameters();
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(-0.5, 0.5);
  for (const auto& en : st.entries())
    if (en.name.rfind("shift", 0) != 0)
      for (index_t i = 0; i < en.numel; ++i) st.master().data_handle()[en.offset + i] = u(g);
  st.sync_compute();
}

/// The master values of the model's parameter `name`, or null when it has none.
template <class M>
const double* param_ptr(M& m, const std::string& name) {
  auto& st = m.parameters();
  for (const auto& en : st.entries())
    if (en.name == name) return st.master().data_handle() + en.offset;
  return nullptr;
}

/// The net's output by the reference, from its current parameters.
template <class M>
std::vector<double> reference_of(M& m, const locus::tensor<double, cpu, 3>& x, bool cross) {
  const auto ptr = [&](const std::string& n) { return param_ptr(m, n); };
  auto& a = m.net().attn;
  const mha_ref ref{a.width(),          a.heads(),           a.options().causal,   a.options().batch_first,
                    ptr("attn.in_proj_weight"), ptr("attn.in_proj_bias"), ptr("attn.out_proj.weight"),
                    ptr("attn.out_proj.bias")};
  std::vector<double> q(static_cast<std::size_t>(x.numel()));
  const double* s = ptr("shift");
  for (index_t i = 0; i < x.numel(); ++i) q[i] = x.data_handle()[i] + s[i];
  if (!cross) return ref(q.data(), x.shape(), q.data(), q.data(), x.shape());
  if constexpr (requires { m.net().key; })
    return ref(q.data(), x.shape(), ptr("key"), ptr("val"), m.net().key.shape());
  else
    return {};
}

/// Forward against the reference, then every gradient (each parameter, the input through
/// `shift`) against central finite differences of the reference's sum(y * gy).
template <class M>
void check_against_reference(M& m, const locus::tensor<double, cpu, 3>& x, bool cross) {
  randomise(m, 7);
  const auto y = m.forward(x.view());
  const auto want = reference_of(m, x, cross);
  REQUIRE(static_cast<std::size_t>(y.numel()) == want.size());
  for (index_t i = 0; i < y.numel(); ++i) REQUIRE(y.data_handle()[i] == doctest::Approx(want[i]).epsilon(1e-12));
  const auto gy = random_tensor<double, 3>(y.shape(), 11);
  auto& st = m.parameters();
  st.zero_grad();
  (void)m.forward(x.view());
  (void)m.backward(gy.view());
  const auto loss = [&] {
    const auto r = reference_of(m, x, cross);
    double l = 0;
    for (std::size_t i = 0; i < r.size(); ++i) l += r[i] * gy.data_handle()[i];
    return l;
  };
  for (const auto& en : st.entries()) {
    const index_t stride = std::max<index_t>(1, en.numel / 23);  // about 23 entries of each
    for (index_t i = 0; i < en.numel; i += stride) {
      double& w = st.master().data_handle()[en.offset + i];
      const double keep = w, step = 1e-6;
      w = keep + step;
      const double up = loss();
      w = keep - step;
      const double down = loss();
      w = keep;
      const double numeric = (up - down) / (2 * step), got = st.grad().data_handle()[en.offset + i];
      INFO(en.name << "[" << i << "]: backward " << got << ", finite differences " << numeric);
      CHECK(std::abs(got - numeric) <= 1e-7 * (1 + std::abs(numeric)));
    }
  }
}

}  // namespace

TEST_CASE("nn::multi_head_attention: PyTorch's names, shapes and initialisation, and sizes as template arguments") {
  using P = locus::amp::fp64;
  nn::model<self_net<cpu, P>> m(extents<3>{3, 2, 8}, 8, 2, nn::attention_layer_options{});
  m.reset_parameters(5);
  std::vector<std::string> names;
  auto& st = m.parameters();
  for (const auto& en : st.entries()) names.push_back(en.name);
  CHECK(names == std::vector<std::string>{"shift", "attn.in_proj_weight", "attn.out_proj.weight", "attn.in_proj_bias",
                                          "attn.out_proj.bias"});
  const auto& a = m.net().attn;
  CHECK(a.width() == 8);
  CHECK(a.heads() == 2);
  for (const auto& en : st.entries()) {
    const double* w = st.master().data_handle() + en.offset;
    double lo = 1e9, hi = -1e9;
    for (index_t i = 0; i < en.numel; ++i) lo = std::min(lo, w[i]), hi = std::max(hi, w[i]);
    INFO(en.name);
    if (en.name == "attn.in_proj_weight") {
      CHECK(en.numel == 3 * 8 * 8);
      const double bound = std::sqrt(6.0 / 32.0);  // Xavier-uniform of [24, 8]
      CHECK(lo >= -bound);
      CHECK(hi <= bound);
      CHECK(hi - lo > 1.6 * bound);  // spread over the range, not a constant
    } else if (en.name == "attn.out_proj.weight") {
      CHECK(en.numel == 64);
      CHECK(lo >= -1 / std::sqrt(8.0));
      CHECK(hi <= 1 / std::sqrt(8.0));
      CHECK(hi - lo > 1.6 / std::sqrt(8.0));
    } else if (en.name != "shift") {
      CHECK(lo == 0.0);  // both biases start at zero, as PyTorch's
      CHECK(hi == 0.0);
    }
  }
  nn::model<self_net<cpu, P>> nb(extents<3>{3, 2, 8}, 8, 2, nn::attention_layer_options{.bias = false});
  CHECK(nb.parameters().entries().size() == 3);
  CHECK_THROWS_AS((void)nb.net().attn.in_proj_bias(), locus::value_error);
  nn::model<static_net<cpu, P>> s;
  CHECK(s.net().attn.width() == 12);
  CHECK(s.net().attn.heads() == 4);
  CHECK(s.parameters().parameter_count() == 4 * 12 * 12 + 4 * 12);
}

TEST_CASE("nn::multi_head_attention: self-attention against f64 loops, every gradient against finite differences") {
  using P = locus::amp::fp64;
  const auto x_tb = random_tensor<double, 3>(extents<3>{5, 2, 12}, 1);  // [T, B, E]
  SUBCASE("time first, causal, 3 heads") {
    nn::model<self_net<cpu, P>> m(x_tb.shape(), 12, 3, nn::attention_layer_options{.causal = true});
    check_against_reference(m, x_tb, false);
  }
  SUBCASE("batch first, no mask, 4 heads") {
    const auto x = random_tensor<double, 3>(extents<3>{2, 6, 12}, 2);
    nn::model<self_net<cpu, P>> m(x.shape(), 12, 4, nn::attention_layer_options{.batch_first = true});
    check_against_reference(m, x, false);
  }
  SUBCASE("no biases, one head, causal, batch first") {
    const auto x = random_tensor<double, 3>(extents<3>{3, 4, 6}, 3);
    nn::model<self_net<cpu, P>> m(x.shape(), 6, 1,
                                  nn::attention_layer_options{.causal = true, .batch_first = true, .bias = false});
    check_against_reference(m, x, false);
  }
  SUBCASE("sizes as template arguments") {
    nn::model<static_net<cpu, P>> m;
    randomise(m, 9);
    const auto x = random_tensor<double, 3>(extents<3>{2, 5, 12}, 4);
    const auto y = m.forward(x.view());
    const auto ptr = [&](const std::string& n) { return param_ptr(m, n); };
    const mha_ref r{12, 4, true, true, ptr("attn.in_proj_weight"), ptr("attn.in_proj_bias"), ptr("attn.out_proj.weight"),
                    ptr("attn.out_proj.bias")};
    const auto want = r(x.data_handle(), x.shape(), x.data_handle(), x.data_handle(), x.shape());
    for (index_t i = 0; i < y.numel(); ++i) REQUIRE(y.data_handle()[i] == doctest::Approx(want[i]).epsilon(1e-12));
  }
}

TEST_CASE("nn::multi_head_attention: cross-attention (Tq != Tk) against f64 loops, every gradient against finite differences") {
  using P = locus::amp::fp64;
  SUBCASE("time first, 2 heads, 4 queries over 7 keys") {
    const auto x = random_tensor<double, 3>(extents<3>{4, 2, 8}, 5);
    nn::model<cross_net<cpu, P>> m(x.shape(), extents<3>{7, 2, 8}, 8, 2, nn::attention_layer_options{});
    check_against_reference(m, x, true);
  }
  SUBCASE("batch first, causal with more keys than queries") {
    const auto x = random_tensor<double, 3>(extents<3>{2, 3, 8}, 6);
    nn::model<cross_net<cpu, P>> m(x.shape(), extents<3>{2, 5, 8}, 8, 4,
                                   nn::attention_layer_options{.causal = true, .batch_first = true});
    check_against_reference(m, x, true);
  }
}

TEST_CASE("nn::multi_head_attention in bf16 and f32 against f64") {
  const auto x = random_tensor<double, 3>(extents<3>{2, 9, 16}, 8);
  nn::model<self_net<cpu, locus::amp::fp64>> ref(x.shape(), 16, 4, nn::attention_layer_options{.causal = true, .batch_first = true});
  randomise(ref, 3);
  const auto want = ref.forward(x.view());
  const auto run = [&](auto policy, double tol) {
    using Pol = decltype(policy);
    using C = typename Pol::compute;
    nn::model<self_net<cpu, Pol>> m(x.shape(), 16, 4, nn::attention_layer_options{.causal = true, .batch_first = true});
    auto& st = m.parameters();
    for (index_t i = 0; i < st.master().numel(); ++i)
      st.master().data_handle()[i] = static_cast<typename Pol::master>(ref.parameters().master().data_handle()[i]);
    st.sync_compute();
    locus::tensor<C, cpu, 3> xc(x.shape());
    for (index_t i = 0; i < x.numel(); ++i) xc.data_handle()[i] = static_cast<C>(x.data_handle()[i]);
    const auto y = m.forward(xc.view());
    double worst = 0;
    for (index_t i = 0; i < y.numel(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(y.data_handle()[i]) - want.data_handle()[i]));
    INFO("largest difference from f64 " << worst);
    CHECK(worst < tol);
    CHECK(worst > 0);  // really computed in the narrower dtype
  };
  run(locus::amp::fp32{}, 1e-5);
  run(locus::amp::bf16_mixed{}, 0.08);
}

TEST_CASE("nn::multi_head_attention: heads that do not divide the width, and inputs that do not fit, are refused") {
  using P = locus::amp::fp64;
  const auto built = [](index_t e, index_t h) {
    return [e, h] { nn::model<plain_net<cpu, P>> m(e, h, nn::attention_layer_options{}); };
  };
  CHECK_THROWS_WITH_AS(built(12, 5)(), doctest::Contains("5 heads do not divide the width 12"), locus::value_error);
  CHECK_THROWS_WITH_AS(built(0, 1)(), doctest::Contains("positive width"), locus::value_error);
  CHECK_THROWS_WITH_AS(built(8, -2)(), doctest::Contains("positive width"), locus::value_error);
  CHECK_THROWS_WITH_AS(built(512, 1)(), doctest::Contains("at most 256 per head"), locus::value_error);
  CHECK_NOTHROW(built(512, 2)());  // 256 features per head: the kernel's largest
  CHECK_THROWS_WITH_AS(built(std::int64_t{1} << 62, std::int64_t{1} << 61)(), doctest::Contains("too large"),
                       locus::value_error);

  // a wrong width, an empty sequence: shape_error naming the shape, nothing recorded
  nn::model<plain_net<cpu, P>> m(8, 2, nn::attention_layer_options{});
  const auto wide = random_tensor<double, 3>(extents<3>{3, 2, 9}, 1);
  nn::model<cross_net<cpu, P>> c(extents<3>{3, 2, 8}, extents<3>{4, 2, 8}, 8, 2, nn::attention_layer_options{});
  CHECK_THROWS_WITH_AS((void)m.forward(wide.view()), doctest::Contains("[3, 2, 9] is not [T, B, 8]"), locus::shape_error);
  const locus::tensor<double, cpu, 3> empty(extents<3>{0, 2, 8});
  CHECK_THROWS_AS((void)m.forward(empty.view()), locus::shape_error);
  // a key of another batch than the query
  nn::model<cross_net<cpu, P>> other(extents<3>{3, 2, 8}, extents<3>{4, 3, 8}, 8, 2, nn::attention_layer_options{});
  const auto q = random_tensor<double, 3>(extents<3>{3, 2, 8}, 2);
  CHECK_THROWS_WITH_AS((void)other.forward(q.view()), doctest::Contains("the batch of the query"), locus::shape_error);
  // the model still runs after the refusals
  const auto y = c.forward(q.view());
  CHECK(y.shape() == extents<3>{3, 2, 8});
}

TEST_CASE("nn::multi_head_attention equals PyTorch in f64: nn.MultiheadAttention weights by name, output, gradients" *
          doctest::skip()) {
#if !defined(LOCUS_HAS_JSON) || !LOCUS_HAS_JSON
  FAIL("reading the PyTorch file needs locus/io/safetensors.hpp, which needs nlohmann-json");
#else
  const char* env = std::getenv("LOCUS_ATTENTION_TORCH_FILE");
  if (env == nullptr || *env == '\0') FAIL("LOCUS_ATTENTION_TORCH_FILE is not set (tests/python/attention_torch.py FILE)");
  const auto a = locus::io::load<cpu>(std::filesystem::path(env));
  using P = locus::amp::fp64;
  for (const std::string c : {"mha_self", "mha_cross"}) {
    INFO(c);
    const auto x = a.template get<double, 3>(c + ".x");
    const auto gy = a.template get<double, 3>(c + ".gy");
    const auto check = [&](auto& m) {
      auto& st = m.parameters();
      for (const auto& en : st.entries()) {
        const auto w = a.template flat<double>(c + ".w." + en.name);  // a name PyTorch does not have: an error here
        REQUIRE(w.numel() == en.numel);
        for (index_t i = 0; i < en.numel; ++i) st.master().data_handle()[en.offset + i] = w.data_handle()[i];
      }
      st.sync_compute();
      st.zero_grad();
      const auto y = m.forward(x.view());
      (void)m.backward(gy.view());
      const auto compare = [&](const std::string& key, const double* got, index_t n) {
        const auto want = a.template flat<double>(key);
        REQUIRE(want.numel() == n);
        double worst = 0;
        for (index_t i = 0; i < n; ++i)
          worst = std::max(worst, std::abs(got[i] - want.data_handle()[i]) / (1 + std::abs(want.data_handle()[i])));
        INFO(key << ": largest difference from PyTorch " << worst);
        CHECK(worst < 1e-12);
      };
      compare(c + ".y", y.data_handle(), y.numel());
      for (const auto& en : st.entries()) compare(c + ".g." + en.name, st.grad().data_handle() + en.offset, en.numel);
    };
    if (c == "mha_self") {  // batch first, causal, 3 heads over width 12
      nn::model<self_net<cpu, P>> m(x.shape(), 12, 3, nn::attention_layer_options{.causal = true, .batch_first = true});
      check(m);
    } else {  // time first, 2 heads over width 8, key and value [7, B, 8]
      nn::model<cross_net<cpu, P>> m(x.shape(), extents<3>{7, x.shape()[1], 8}, 8, 2, nn::attention_layer_options{});
      check(m);
    }
  }
#endif
}
