// Host suite: LSTM and GRU (<locus/ag/recurrent.hpp>, <locus/nn/recurrent.hpp>). The
// fused layers against a direct f64 loop written here from PyTorch's equations (forward),
// and their gradients of every input (x, h0, c0, both weights, both biases) against
// central finite differences of that loop (which shares nothing with backward), over
// several steps, batches and a carried state. The modules: PyTorch's names, shapes and
// initial range, stacked layers equal to chained ops, batch_first equal to the
// transposed sequence, a carried state equal to one long sequence, and bf16/f32 against
// f64. Hostile input: an empty sequence or batch, widths that do not fit, states of
// another shape, a carried state of another batch; each refused before anything is
// recorded.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <locus/nn/recurrent.hpp>
#include <locus/train.hpp>

namespace {

namespace nn = locus::nn;
namespace ag = locus::ag;
using locus::cpu;
using locus::extents;
using locus::index_t;

double sig(double a) { return 1.0 / (1.0 + std::exp(-a)); }

struct rnn_sizes {
  index_t t, b, i, h;
};

/// Inputs of one layer, all f64 host tensors.
struct rnn_inputs {
  locus::tensor<double, cpu, 3> x;
  locus::tensor<double, cpu, 2> h0, c0, wih, whh;
  locus::tensor<double, cpu, 1> bih, bhh;
};

rnn_inputs make_inputs(const rnn_sizes& s, int gates, std::uint64_t seed) {
  rnn_inputs r;
  r.x = locus::randn<double, cpu>({s.t, s.b, s.i}, seed);
  r.h0 = locus::randn<double, cpu>({s.b, s.h}, seed + 1);
  r.c0 = locus::randn<double, cpu>({s.b, s.h}, seed + 2);
  r.wih = locus::randn<double, cpu>({gates * s.h, s.i}, seed + 3);
  r.whh = locus::randn<double, cpu>({gates * s.h, s.h}, seed + 4);
  r.bih = locus::randn<double, cpu>({gates * s.h}, seed + 5);
  r.bhh = locus::randn<double, cpu>({gates * s.h}, seed + 6);
  return r;
}

/// PyTorch's LSTM (G = 4) or GRU (G = 3) equations, step by step, in f64: y [T*B*H], then
/// the last h and (LSTM) c appended.
std::vector<double> reference(const rnn_inputs& in, const rnn_sizes& s, int gates, bool zero_state) {
  const index_t H = s.h, B = s.b, I = s.i;
  std::vector<double> h(B * H, 0.0), c(B * H, 0.0), out;
  if (!zero_state) {
    for (index_t k = 0; k < B * H; ++k) {
      h[k] = in.h0.data_handle()[k];
      c[k] = in.c0.data_handle()[k];
    }
  }
  const double* wih = in.wih.data_handle();
  const double* whh = in.whh.data_handle();
  for (index_t t = 0; t < s.t; ++t) {
    std::vector<double> hn(B * H), cn(B * H);
    for (index_t b = 0; b < B; ++b) {
      std::vector<double> gi(gates * H), gh(gates * H);
      for (index_t r = 0; r < gates * H; ++r) {
        double a = in.bih.data_handle()[r], q = in.bhh.data_handle()[r];
        for (index_t k = 0; k < I; ++k) a += wih[r * I + k] * in.x.data_handle()[(t * B + b) * I + k];
        for (index_t k = 0; k < H; ++k) q += whh[r * H + k] * h[b * H + k];
        gi[r] = a;
        gh[r] = q;
      }
      for (index_t j = 0; j < H; ++j) {
        if (gates == 4) {
          const double ig = sig(gi[j] + gh[j]), fg = sig(gi[H + j] + gh[H + j]);
          const double gg = std::tanh(gi[2 * H + j] + gh[2 * H + j]), og = sig(gi[3 * H + j] + gh[3 * H + j]);
          cn[b * H + j] = fg * c[b * H + j] + ig * gg;
          hn[b * H + j] = og * std::tanh(cn[b * H + j]);
        } else {
          const double rg = sig(gi[j] + gh[j]), zg = sig(gi[H + j] + gh[H + j]);
          const double ng = std::tanh(gi[2 * H + j] + rg * gh[2 * H + j]);
          hn[b * H + j] = (1 - zg) * ng + zg * h[b * H + j];
        }
      }
    }
    h = hn;
    c = cn;
    out.insert(out.end(), h.begin(), h.end());
  }
  out.insert(out.end(), h.begin(), h.end());
  if (gates == 4) out.insert(out.end(), c.begin(), c.end());
  return out;
}

double dot(const std::vector<double>& a, const std::vector<double>& w) {
  double s = 0;
  for (std::size_t k = 0; k < a.size(); ++k) s += a[k] * w[k];
  return s;
}

template <int G>
auto run_op(ag::tape<double, cpu>& t, const rnn_inputs& in, bool leaves, bool zero_state) {
  const auto mk3 = [&](const auto& v) { return leaves ? t.leaf(v) : t.constant(v); };
  struct vars {
    ag::var<double, cpu, 3> x;
    ag::var<double, cpu, 2> h0, c0, wih, whh;
    ag::var<double, cpu, 1> bih, bhh;
  } v{mk3(in.x), mk3(in.h0), mk3(in.c0), mk3(in.wih), mk3(in.whh), mk3(in.bih), mk3(in.bhh)};
  if constexpr (G == 4) {
    auto r = zero_state ? ag::lstm(v.x, v.wih, v.whh, v.bih, v.bhh) : ag::lstm(v.x, v.h0, v.c0, v.wih, v.whh, v.bih, v.bhh);
    return std::pair{v, r};
  } else {
    auto r = zero_state ? ag::gru(v.x, v.wih, v.whh, v.bih, v.bhh) : ag::gru(v.x, v.h0, v.wih, v.whh, v.bih, v.bhh);
    return std::pair{v, r};
  }
}

template <int G>
std::vector<double> outputs(const ag::var<double, cpu, 3>& y, const ag::var<double, cpu, 2>& h,
                            const ag::var<double, cpu, 2>* c) {
  std::vector<double> o(y.value().data_handle(), y.value().data_handle() + y.numel());
  o.insert(o.end(), h.value().data_handle(), h.value().data_handle() + h.numel());
  if (c) o.insert(o.end(), c->value().data_handle(), c->value().data_handle() + c->numel());
  return o;
}

template <int G>
void check_layer(const rnn_sizes& s, bool zero_state, std::uint64_t seed) {
  INFO("T " << s.t << " B " << s.b << " I " << s.i << " H " << s.h << (zero_state ? " zero state" : " given state"));
  rnn_inputs in = make_inputs(s, G, seed);
  const auto want = reference(in, s, G, zero_state);
  std::vector<double> w(want.size());
  {
    const auto r = locus::randn<double, cpu>({static_cast<index_t>(want.size())}, seed + 40);
    for (std::size_t k = 0; k < w.size(); ++k) w[k] = r.data_handle()[k];
  }
  ag::tape<double, cpu> t;
  auto [v, r] = run_op<G>(t, in, true, zero_state);
  const ag::var<double, cpu, 2>* cp = nullptr;
  if constexpr (G == 4) cp = &r.c;
  const auto got = outputs<G>(r.y, r.h, cp);
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t k = 0; k < got.size(); ++k) worst = std::max(worst, std::abs(got[k] - want[k]));
  CHECK(worst < 1e-13);
  // L = sum(y * wy) + sum(h * wh) [+ sum(c * wc)]
  const index_t ny = r.y.numel(), nh = r.h.numel();
  const auto wy = locus::from_host<cpu>(std::vector<double>(w.begin(), w.begin() + ny), {s.t, s.b, s.h});
  const auto wh = locus::from_host<cpu>(std::vector<double>(w.begin() + ny, w.begin() + ny + nh), {s.b, s.h});
  auto loss = ag::sum(r.y * t.constant(wy)) + ag::sum(r.h * t.constant(wh));
  locus::tensor<double, cpu, 2> wc;
  if constexpr (G == 4) {
    wc = locus::from_host<cpu>(std::vector<double>(w.begin() + ny + nh, w.end()), {s.b, s.h});
    loss = loss + ag::sum(r.c * t.constant(wc));
  }
  t.backward(loss);
  struct named {
    const char* name;
    double* p;
    index_t n;
    const double* g;
  };
  std::vector<named> all = {{"x", in.x.data_handle(), in.x.numel(), t.grad(v.x).data_handle()},
                            {"w_ih", in.wih.data_handle(), in.wih.numel(), t.grad(v.wih).data_handle()},
                            {"w_hh", in.whh.data_handle(), in.whh.numel(), t.grad(v.whh).data_handle()},
                            {"b_ih", in.bih.data_handle(), in.bih.numel(), t.grad(v.bih).data_handle()},
                            {"b_hh", in.bhh.data_handle(), in.bhh.numel(), t.grad(v.bhh).data_handle()}};
  if (!zero_state) {
    all.push_back({"h0", in.h0.data_handle(), in.h0.numel(), t.grad(v.h0).data_handle()});
    if (G == 4) all.push_back({"c0", in.c0.data_handle(), in.c0.numel(), t.grad(v.c0).data_handle()});
  }
  for (const auto& a : all) {
    for (index_t k = 0; k < a.n; ++k) {
      const double keep = a.p[k], e = 1e-6;
      a.p[k] = keep + e;
      const double up = dot(reference(in, s, G, zero_state), w);
      a.p[k] = keep - e;
      const double down = dot(reference(in, s, G, zero_state), w);
      a.p[k] = keep;
      const double numeric = (up - down) / (2 * e);
      INFO(a.name << "[" << k << "]: backward " << a.g[k] << ", finite differences " << numeric);
      CHECK(std::abs(a.g[k] - numeric) < 1e-7 * std::max(1.0, std::abs(numeric)));
    }
  }
}

}  // namespace

TEST_CASE("ag::lstm: forward against PyTorch's equations in f64, every gradient against finite differences") {
  check_layer<4>({1, 1, 1, 1}, false, 1);
  check_layer<4>({4, 2, 3, 5}, false, 2);
  check_layer<4>({6, 3, 2, 4}, true, 3);
  check_layer<4>({3, 1, 7, 2}, false, 4);
}

TEST_CASE("ag::gru: forward against PyTorch's equations in f64, every gradient against finite differences") {
  check_layer<3>({1, 1, 1, 1}, false, 11);
  check_layer<3>({4, 2, 3, 5}, false, 12);
  check_layer<3>({6, 3, 2, 4}, true, 13);
  check_layer<3>({3, 1, 7, 2}, false, 14);
}

namespace {

/// A stacked LSTM then a GRU over batch-first features, then a linear head: the model
/// tests/python/recurrent_torch.py writes in PyTorch.
template <class D, class P>
struct seq_net : nn::module<D, P> {
  static constexpr index_t I = 3, H = 5, H2 = 4, O = 2;
  nn::lstm<D, P> lstm{this, "lstm", I, H, {.layers = 2, .batch_first = true}};
  nn::gru<D, P> gru{this, "gru", H, H2, {.batch_first = true}};
  nn::layer<nn::linear<D, P>> head{this, "head", H2, O};
  auto forward(const typename seq_net::template var<3>& x) {  // [B, T, I] -> [B * T, O]
    const auto y = gru(lstm(x));
    return head(ag::reshape(y, extents<2>{x.shape()[0] * x.shape()[1], H2}));
  }
};

/// One layer of either kind as a model of its own (for the carried state).
template <class D, class P>
struct one_lstm : nn::module<D, P> {
  nn::lstm<D, P> rnn;
  explicit one_lstm(nn::rnn_options o) : rnn{this, "rnn", 2, 3, o} {}
  auto forward(const typename one_lstm::template var<3>& x) { return rnn(x); }
};
template <class D, class P>
struct one_gru : nn::module<D, P> {
  nn::gru<D, P> rnn;
  explicit one_gru(nn::rnn_options o) : rnn{this, "rnn", 2, 3, o} {}
  auto forward(const typename one_gru::template var<3>& x) { return rnn(x); }
};

}  // namespace

TEST_CASE("nn::lstm and nn::gru: PyTorch's names, shapes and initial range, and stacked layers equal chained ops") {
  using P = locus::amp::fp64;
  nn::model<seq_net<cpu, P>> m;
  m.reset_parameters(5);
  const auto& e = m.parameters().entries();
  const std::vector<std::pair<std::string, std::vector<index_t>>> want = {
      {"lstm.weight_ih_l0", {20, 3}}, {"lstm.weight_hh_l0", {20, 5}}, {"lstm.bias_ih_l0", {20}}, {"lstm.bias_hh_l0", {20}},
      {"lstm.weight_ih_l1", {20, 5}}, {"lstm.weight_hh_l1", {20, 5}}, {"lstm.bias_ih_l1", {20}}, {"lstm.bias_hh_l1", {20}},
      {"gru.weight_ih_l0", {12, 5}},  {"gru.weight_hh_l0", {12, 4}},  {"gru.bias_ih_l0", {12}},  {"gru.bias_hh_l0", {12}},
      {"head.weight", {2, 4}},        {"head.bias", {2}}};
  REQUIRE(e.size() == want.size());
  for (std::size_t k = 0; k < want.size(); ++k) {
    CHECK(e[k].name == want[k].first);
    CHECK(e[k].shape == want[k].second);
  }
  // U(-1/sqrt(H), 1/sqrt(H)): inside, and spread over most of it
  for (std::size_t k = 0; k < 12; ++k) {
    const double bound = 1.0 / std::sqrt(k < 8 ? 5.0 : 4.0);
    double lo = 1, hi = -1;
    for (index_t i = 0; i < e[k].numel; ++i) {
      const double v = m.parameters().master().data_handle()[e[k].offset + i];
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    INFO(e[k].name);
    CHECK(lo >= -bound);
    CHECK(hi <= bound);
    CHECK(hi - lo > bound);
  }
  // The model's output against ag::lstm/ag::gru chained by hand on the same parameters
  const index_t B = 2, T = 4;
  const auto x = locus::randn<double, cpu>({B, T, 3}, 9);
  const auto y = m.infer(x.view());
  REQUIRE(y.shape() == extents<2>{B * T, 2});
  ag::tape<double, cpu> t;
  auto& st = m.parameters();
  const auto p2 = [&](std::size_t k) {
    return t.constant(locus::unsafe_view<cpu>(static_cast<const double*>(st.master().data_handle() + e[k].offset),
                                              extents<2>{e[k].shape[0], e[k].shape[1]}));
  };
  const auto p1 = [&](std::size_t k) {
    return t.constant(locus::unsafe_view<cpu>(static_cast<const double*>(st.master().data_handle() + e[k].offset),
                                              extents<1>{e[k].shape[0]}));
  };
  auto s = ag::transpose(t.constant(x), 0, 1);  // [T, B, I]
  s = ag::lstm(s, p2(0), p2(1), p1(2), p1(3)).y;
  s = ag::lstm(s, p2(4), p2(5), p1(6), p1(7)).y;
  s = ag::gru(s, p2(8), p2(9), p1(10), p1(11)).y;
  const auto z = ag::linear(ag::reshape(ag::transpose(s, 0, 1), extents<2>{B * T, 4}), p2(12), p1(13));
  for (index_t i = 0; i < y.numel(); ++i) CHECK(y.data_handle()[i] == doctest::Approx(z.value().data_handle()[i]).epsilon(1e-14));
}

TEST_CASE("nn::lstm and nn::gru with carry_state: two halves give what one long sequence gives, and reset_state starts over") {
  using P = locus::amp::fp64;
  const auto check = [](auto& m, auto& full_model) {
    const index_t B = 3, T = 6;
    const auto x = locus::randn<double, cpu>({T, B, 2}, 21);
    const auto whole = full_model.infer(x.view());  // no carried state: zeros, all six steps
    const auto first = x.view().slice(0, 3).clone();
    const auto second = x.view().slice(3, 6).clone();
    CHECK_FALSE(m.net().rnn.has_state());
    const auto y1 = m.infer(first.view());
    CHECK(m.net().rnn.has_state());
    const auto y2 = m.infer(second.view());
    for (index_t i = 0; i < y1.numel(); ++i) CHECK(y1.data_handle()[i] == doctest::Approx(whole.data_handle()[i]).epsilon(1e-14));
    for (index_t i = 0; i < y2.numel(); ++i)
      CHECK(y2.data_handle()[i] == doctest::Approx(whole.data_handle()[y1.numel() + i]).epsilon(1e-14));
    // a batch of another size than the carried state: refused, the state kept
    const auto other = locus::randn<double, cpu>({2, 2, 2}, 22);
    CHECK_THROWS_AS((void)m.infer(other.view()), locus::shape_error);
    CHECK(m.net().rnn.has_state());
    m.net().rnn.reset_state();
    const auto again = m.infer(first.view());
    for (index_t i = 0; i < again.numel(); ++i) CHECK(again.data_handle()[i] == y1.data_handle()[i]);
    // training steps carry it too, and backward stops at the batch (truncated BPTT)
    m.net().rnn.reset_state();
    m.parameters().zero_grad();
    (void)m.forward(first.view());
    const auto ones = locus::ones<double, cpu>({3, B, 3});
    (void)m.backward(ones.view());
    const auto y2t = m.forward(second.view());
    for (index_t i = 0; i < y2t.numel(); ++i) CHECK(y2t.data_handle()[i] == doctest::Approx(y2.data_handle()[i]).epsilon(1e-14));
  };
  {
    nn::model<one_lstm<cpu, P>> m(nn::rnn_options{.carry_state = true}), full(nn::rnn_options{});
    m.reset_parameters(3);
    full.reset_parameters(3);
    check(m, full);
  }
  {
    nn::model<one_gru<cpu, P>> m(nn::rnn_options{.carry_state = true}), full(nn::rnn_options{});
    m.reset_parameters(4);
    full.reset_parameters(4);
    check(m, full);
  }
}

TEST_CASE("ag::lstm and ag::gru in bf16 and f32 against f64") {
  const rnn_sizes s{8, 3, 6, 16};
  const rnn_inputs in = make_inputs(s, 4, 31);
  const auto want = reference(in, s, 4, false);
  const auto in3 = make_inputs(s, 3, 32);
  const auto want3 = reference(in3, s, 3, false);
  const auto run = [&]<class T>(T, const rnn_inputs& i, int gates, double tol, const std::vector<double>& ref) {
    ag::tape<T, cpu> t;
    const auto c3 = [&](const auto& v) {
      locus::tensor<T, cpu, std::remove_cvref_t<decltype(v)>::rank> o(v.shape());
      o = locus::cast<T>(v);
      return o;
    };
    const auto x = c3(i.x);
    const auto h0 = c3(i.h0), c0 = c3(i.c0), wih = c3(i.wih), whh = c3(i.whh);
    const auto bih = c3(i.bih), bhh = c3(i.bhh);
    std::vector<double> got;
    const auto push = [&](const auto& v) {
      for (index_t k = 0; k < v.numel(); ++k) got.push_back(static_cast<double>(v.value().data_handle()[k]));
    };
    if (gates == 4) {
      const auto r = ag::lstm(t.constant(x), t.constant(h0), t.constant(c0), t.constant(wih), t.constant(whh),
                              t.constant(bih), t.constant(bhh));
      push(r.y);
      push(r.h);
      push(r.c);
    } else {
      const auto r = ag::gru(t.constant(x), t.constant(h0), t.constant(wih), t.constant(whh), t.constant(bih), t.constant(bhh));
      push(r.y);
      push(r.h);
    }
    double worst = 0;
    for (std::size_t k = 0; k < got.size(); ++k) worst = std::max(worst, std::abs(got[k] - ref[k]));
    CHECK(worst < tol);
  };
  run(float{}, in, 4, 1e-5, want);
  run(locus::bf16{}, in, 4, 0.08, want);
  run(float{}, in3, 3, 1e-5, want3);
  run(locus::bf16{}, in3, 3, 0.08, want3);
}

TEST_CASE("ag::lstm, ag::gru, nn::lstm: shapes that do not fit are shape_errors naming them, before anything is recorded") {
  ag::tape<double, cpu> t;
  const auto xt = locus::randn<double, cpu>({4, 2, 3}, 1);
  const auto h0t = locus::zeros<double, cpu>({2, 5});
  const auto wiht = locus::randn<double, cpu>({20, 3}, 2);
  const auto whht = locus::randn<double, cpu>({20, 5}, 3);
  const auto bt = locus::zeros<double, cpu>({20});
  const auto emptyt = locus::zeros<double, cpu>({0, 2, 3});
  const auto no_batcht = locus::zeros<double, cpu>({4, 0, 3});
  const auto widet = locus::zeros<double, cpu>({4, 2, 4});
  const auto h_badt = locus::zeros<double, cpu>({3, 5});
  const auto w_badt = locus::zeros<double, cpu>({19, 5});
  const auto b_badt = locus::zeros<double, cpu>({15});
  const auto x = t.constant(xt), empty = t.constant(emptyt), no_batch = t.constant(no_batcht), wide = t.constant(widet);
  const auto h0 = t.constant(h0t), wih = t.constant(wiht), whh = t.constant(whht), h_bad = t.constant(h_badt),
             w_bad = t.constant(w_badt);
  const auto b = t.constant(bt), b_bad = t.constant(b_badt);
  const auto values = t.values();
  const auto refused = [&](auto&& f, const char* part) {
    try {
      f();
      FAIL("not refused");
    } catch (const locus::shape_error& e) {
      const std::string m = e.what();
      INFO(m);
      CHECK(m.find(part) != std::string::npos);
      CHECK(m.find("w_hh [") != std::string::npos);
    }
    CHECK(t.values() == values);
  };
  refused([&] { (void)ag::lstm(empty, wih, whh, b, b); }, "sequence is empty");
  refused([&] { (void)ag::lstm(no_batch, wih, whh, b, b); }, "batch is empty");
  refused([&] { (void)ag::lstm(wide, wih, whh, b, b); }, "input's features");
  refused([&] { (void)ag::lstm(x, h_bad, h0, wih, whh, b, b); }, "h0 must be [B, H]");
  refused([&] { (void)ag::lstm(x, h0, h_bad, wih, whh, b, b); }, "c0 must be [B, H]");
  refused([&] { (void)ag::lstm(x, wih, w_bad, b, b); }, "w_hh must have 4");
  refused([&] { (void)ag::lstm(x, wih, whh, b_bad, b); }, "each bias");
  refused([&] { (void)ag::gru(x, wih, whh, b, b); }, "w_hh must have 3");
  // the module: input width and a given state of the wrong shape
  using P = locus::amp::fp64;
  nn::model<one_lstm<cpu, P>> m(nn::rnn_options{});
  const auto x3 = locus::randn<double, cpu>({4, 2, 3}, 3);
  try {
    (void)m.infer(x3.view());
    FAIL("not refused");
  } catch (const locus::shape_error& e) {
    CHECK(std::string(e.what()).find("nn::lstm 'rnn' takes 2 input features") != std::string::npos);
  }
  using bad_model = nn::model<one_lstm<cpu, P>>;
  CHECK_THROWS_AS(bad_model(nn::rnn_options{.layers = 0}), locus::value_error);
}

#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
#  include <cstdlib>
#  include <filesystem>

#  include <locus/io/safetensors.hpp>
#endif

// Not part of the host suite's run (doctest::skip(): it needs a file a Python script
// writes): the CTest "interop: nn.LSTM and nn.GRU against PyTorch (weights by name,
// outputs, gradients)" runs tests/python/recurrent_torch.py, then this case with --no-skip.
TEST_CASE("LSTM and GRU equal PyTorch in f64: nn.LSTM and nn.GRU weights load by name, outputs and every gradient" *
          doctest::skip()) {
#if !defined(LOCUS_HAS_JSON) || !LOCUS_HAS_JSON
  FAIL("reading the PyTorch file needs locus/io/safetensors.hpp, which needs nlohmann-json");
#else
  const char* env = std::getenv("LOCUS_RECURRENT_TORCH_FILE");
  if (env == nullptr || *env == '\0')
    FAIL("LOCUS_RECURRENT_TORCH_FILE is not set (tests/python/recurrent_torch.py FILE writes it)");
  const std::filesystem::path file = env;
  if (!std::filesystem::exists(file)) FAIL("LOCUS_RECURRENT_TORCH_FILE names " << file << ", which does not exist");
  const auto a = locus::io::load<cpu>(file);
  const auto compare = [&](const std::string& key, const double* got, index_t count) {
    const auto want = a.template flat<double>(key);
    REQUIRE_MESSAGE(want.numel() == count, key << ": PyTorch has " << want.numel() << " elements, locus " << count);
    double worst = 0;
    for (index_t i = 0; i < count; ++i)
      worst = std::max(worst, std::abs(got[i] - want.data_handle()[i]) / (1.0 + std::abs(want.data_handle()[i])));
    INFO(key << ": largest difference from PyTorch " << worst);
    CHECK(worst < 1e-12);
  };
  {  // the modules, batch first, from a zero state: weights by state_dict name
    using P = locus::amp::fp64;
    nn::model<seq_net<cpu, P>> m;
    auto& st = m.parameters();
    for (const auto& e : st.entries()) {
      const auto w = a.template flat<double>("w." + e.name);  // a name PyTorch does not have: an error here
      REQUIRE_MESSAGE(w.numel() == e.numel, e.name << ": PyTorch has " << w.numel() << " elements, locus " << e.numel);
      for (index_t i = 0; i < e.numel; ++i) st.master().data_handle()[e.offset + i] = w.data_handle()[i];
    }
    st.sync_compute();
    const auto x = a.template get<double, 3>("x");
    const auto gy = a.template get<double, 2>("gy");
    st.zero_grad();
    const auto y = m.forward(x.view());
    compare("y", y.data_handle(), y.numel());
    (void)m.backward(gy.view());
    for (const auto& e : st.entries()) compare("g." + e.name, st.grad().data_handle() + e.offset, e.numel);
  }
  // ag::lstm / ag::gru from a given state, time first: two stacked LSTM layers and a GRU
  const auto sx = a.template get<double, 3>("s.x");
  const auto h0 = a.template get<double, 3>("s.h0");
  const auto c0 = a.template get<double, 3>("s.c0");
  for (const std::string kind : {"lstm", "gru"}) {
    INFO(kind);
    const std::string p = "s." + kind + ".";
    const index_t layers = kind == "lstm" ? 2 : 1;
    std::vector<locus::tensor<double, cpu, 2>> w2;
    std::vector<locus::tensor<double, cpu, 1>> w1;
    for (index_t l = 0; l < layers; ++l) {
      const std::string s = "_l" + std::to_string(l);
      w2.push_back(a.template get<double, 2>(p + "weight_ih" + s).clone());
      w2.push_back(a.template get<double, 2>(p + "weight_hh" + s).clone());
      w1.push_back(a.template get<double, 1>(p + "bias_ih" + s).clone());
      w1.push_back(a.template get<double, 1>(p + "bias_hh" + s).clone());
    }
    ag::tape<double, cpu> t;
    const auto x = t.leaf(sx);
    const auto lh = t.leaf(h0), lc = t.leaf(c0);
    std::vector<ag::var<double, cpu, 2>> v2;
    std::vector<ag::var<double, cpu, 1>> v1;
    for (const auto& w : w2) v2.push_back(t.leaf(w));
    for (const auto& w : w1) v1.push_back(t.leaf(w));
    const auto state = [&](const ag::var<double, cpu, 3>& s, index_t l) {
      return ag::reshape(ag::slice(s, 0, l, l + 1), extents<2>{s.shape()[1], s.shape()[2]});
    };
    const auto wy = a.template get<double, 3>(p + "wy");
    const auto wh = a.template get<double, 3>(p + "wh");
    ag::var<double, cpu, 3> y = x;
    std::vector<ag::var<double, cpu, 2>> hs, cs;
    for (index_t l = 0; l < layers; ++l) {
      const std::size_t k = static_cast<std::size_t>(2 * l);
      if (kind == "lstm") {
        const auto r = ag::lstm(y, state(lh, l), state(lc, l), v2[k], v2[k + 1], v1[k], v1[k + 1]);
        y = r.y;
        hs.push_back(r.h);
        cs.push_back(r.c);
      } else {
        const auto r = ag::gru(y, state(lh, l), v2[k], v2[k + 1], v1[k], v1[k + 1]);
        y = r.y;
        hs.push_back(r.h);
      }
    }
    const auto stack = [&](const std::vector<ag::var<double, cpu, 2>>& v) {
      std::vector<ag::var<double, cpu, 3>> r;
      for (const auto& e : v) r.push_back(ag::reshape(e, extents<3>{1, e.shape()[0], e.shape()[1]}));
      return ag::concat(0, r);
    };
    const auto h = stack(hs);
    auto loss = ag::sum(y * t.constant(wy)) + ag::sum(h * t.constant(wh));
    locus::tensor<double, cpu, 3> wc;
    ag::var<double, cpu, 3> c;
    if (kind == "lstm") {
      wc = a.template get<double, 3>(p + "wc").clone();
      c = stack(cs);
      loss = loss + ag::sum(c * t.constant(wc));
    }
    t.backward(loss);
    compare(p + "y", y.value().data_handle(), y.numel());
    compare(p + "h", h.value().data_handle(), h.numel());
    compare(p + "gx", t.grad(x).data_handle(), x.numel());
    // the GRU starts from h0's first layer only: its gradient is that layer's
    compare(p + "gh0", t.grad(lh).data_handle(), layers * h0.shape()[1] * h0.shape()[2]);
    if (kind == "lstm") {
      compare(p + "c", c.value().data_handle(), c.numel());
      compare(p + "gc0", t.grad(lc).data_handle(), lc.numel());
    }
    for (index_t l = 0; l < layers; ++l) {
      const std::string s = "_l" + std::to_string(l);
      const std::size_t k = static_cast<std::size_t>(2 * l);
      compare(p + "g.weight_ih" + s, t.grad(v2[k]).data_handle(), v2[k].numel());
      compare(p + "g.weight_hh" + s, t.grad(v2[k + 1]).data_handle(), v2[k + 1].numel());
      compare(p + "g.bias_ih" + s, t.grad(v1[k]).data_handle(), v1[k].numel());
      compare(p + "g.bias_hh" + s, t.grad(v1[k + 1]).data_handle(), v1[k + 1].numel());
    }
  }
#endif
}

namespace {
template <class D, class P>
struct carried_block : nn::module<D, P> {
  nn::lstm<D, P> rnn{this, "rnn", 2, 3, {.carry_state = true}};
  auto forward(const typename carried_block::template var<3>& x) { return rnn(x); }
};
template <class D, class P>
struct checkpointed_carry : nn::module<D, P> {
  nn::child<carried_block<D, P>> blk{this, "blk"};
  auto forward(const typename checkpointed_carry::template var<3>& x) { return nn::checkpoint(blk, x); }
};
}  // namespace

TEST_CASE("recurrent layers, from an outside review: strided b_hh, shape queries, checkpoints, huge hidden sizes") {
  using P = locus::amp::fp64;
  SUBCASE("a strided or broadcast b_hh is refused; a strided b_ih gives the contiguous result") {
    ag::tape<double, cpu> t;
    const auto x = locus::randn<double, cpu>({3, 2, 2}, 1);
    const auto wih = locus::randn<double, cpu>({12, 2}, 2);
    const auto whh = locus::randn<double, cpu>({12, 3}, 3);
    const auto b = locus::randn<double, cpu>({12}, 4);
    std::vector<double> spaced(24, 100.0);
    for (index_t i = 0; i < 12; ++i) spaced[static_cast<std::size_t>(2 * i)] = b.data_handle()[i];
    const auto bs = locus::unsafe_view<cpu>(static_cast<const double*>(spaced.data()), extents<1>{12}, extents<1>{2});
    const double one = 0.5;
    const auto b0 = locus::unsafe_view<cpu>(&one, extents<1>{12}, extents<1>{0});
    CHECK_THROWS_AS((void)ag::lstm(t.constant(x), t.constant(wih), t.constant(whh), t.constant(b), t.constant(bs)),
                    locus::shape_error);
    CHECK_THROWS_AS((void)ag::lstm(t.constant(x), t.constant(wih), t.constant(whh), t.constant(b), t.constant(b0)),
                    locus::shape_error);
    const auto wg = locus::randn<double, cpu>({9, 2}, 5), whg = locus::randn<double, cpu>({9, 3}, 6);
    const auto bgs = locus::unsafe_view<cpu>(static_cast<const double*>(spaced.data()), extents<1>{9}, extents<1>{2});
    const auto bg = locus::randn<double, cpu>({9}, 7);
    CHECK_THROWS_AS((void)ag::gru(t.constant(x), t.constant(wg), t.constant(whg), t.constant(bg), t.constant(bgs)),
                    locus::shape_error);
    const auto strided_ih = ag::lstm(t.constant(x), t.constant(wih), t.constant(whh), t.constant(bs), t.constant(b));
    const auto plain = ag::lstm(t.constant(x), t.constant(wih), t.constant(whh), t.constant(b), t.constant(b));
    for (index_t i = 0; i < plain.y.numel(); ++i)
      CHECK(strided_ih.y.value().data_handle()[i] == plain.y.value().data_handle()[i]);
  }
  SUBCASE("output_shape and layer_shapes neither read nor advance a carried state") {
    nn::model<one_lstm<cpu, P>> m(nn::rnn_options{.carry_state = true});
    CHECK(m.output_shape({4, 1, 2}) == std::vector<index_t>{4, 1, 3});
    CHECK_FALSE(m.net().rnn.has_state());
    const auto x = locus::randn<double, cpu>({4, 3, 2}, 8);
    (void)m.infer(x.view());
    REQUIRE(m.net().rnn.has_state());
    const auto kept = m.net().rnn.state_h().clone();
    CHECK(m.output_shape({4, 1, 2}) == std::vector<index_t>{4, 1, 3});  // another batch than the state's
    CHECK(m.layer_shapes({4, 3, 2}).size() >= 1);
    const auto after = m.net().rnn.state_h();
    REQUIRE(after.shape() == kept.shape());
    for (index_t i = 0; i < kept.numel(); ++i) CHECK(after.data_handle()[i] == kept.data_handle()[i]);
    // and the next call goes on from that state as if no query had run
    nn::model<one_lstm<cpu, P>> same(nn::rnn_options{.carry_state = true});
    for (index_t i = 0; i < m.parameters().master().numel(); ++i)
      same.parameters().master().data_handle()[i] = m.parameters().master().data_handle()[i];
    same.parameters().sync_compute();
    (void)same.infer(x.view());
    const auto y1 = m.infer(x.view()), y2 = same.infer(x.view());
    for (index_t i = 0; i < y1.numel(); ++i) CHECK(y1.data_handle()[i] == y2.data_handle()[i]);
  }
  SUBCASE("carry_state inside nn::checkpoint is an autograd_error, not wrong gradients") {
    nn::model<checkpointed_carry<cpu, P>> m;
    const auto x = locus::randn<double, cpu>({3, 2, 2}, 9);
    CHECK_THROWS_WITH_AS((void)m.forward(x.view()), doctest::Contains("inside nn::checkpoint"), locus::autograd_error);
    CHECK_FALSE(m.net().blk->rnn.has_state());
    (void)m.infer(x.view());  // inference keeps nothing for backward: allowed
    CHECK(m.net().blk->rnn.has_state());
  }
  SUBCASE("a hidden size whose gate count overflows is a shape_error, not a wrapped product") {
    ag::tape<double, cpu> t;
    const locus::tensor<double, cpu, 3> x(extents<3>{1, 1, 1});
    const locus::tensor<double, cpu, 2> wih(extents<2>{0, 1}), whh(extents<2>{0, index_t{1} << 62});
    const locus::tensor<double, cpu, 1> b(extents<1>{0});
    CHECK_THROWS_WITH_AS(
        (void)ag::lstm(t.constant(x), t.constant(wih), t.constant(whh), t.constant(b), t.constant(b)),
        doctest::Contains("too large"), locus::shape_error);
    const locus::tensor<double, cpu, 2> whg(extents<2>{0, std::numeric_limits<index_t>::max() / 3 + 1});
    CHECK_THROWS_WITH_AS(
        (void)ag::gru(t.constant(x), t.constant(wih), t.constant(whg), t.constant(b), t.constant(b)),
        doctest::Contains("too large"), locus::shape_error);
  }
}
