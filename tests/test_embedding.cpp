// Host suite: token-id inputs and embeddings (<locus/nn/embedding.hpp>). A module whose
// forward takes ids (ag::ids) is an nn::model the trainer trains on integer batches;
// nn::embedding and nn::positional_embedding against f64 central finite differences of
// the inference forward (which shares nothing with backward), and an embedding trained
// by the trainer against the same model written as a one-hot input times a linear layer
// (a GEMM instead of a gather and a scatter: an independent path). Hostile input: ids
// out of range or negative, integer extremes, empty sequences, sequences longer than
// the context, ids of an earlier step; each refused before anything changes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <locus/data/text.hpp>
#include <locus/nn/embedding.hpp>
#include <locus/train.hpp>

namespace {

namespace nn = locus::nn;
namespace ag = locus::ag;
using locus::cpu;
using locus::index_t;

/// ids [B, T] -> wte -> + wpe -> [B*T, E] -> tanh(fc) -> tied projection onto wte -> [B*T, V].
template <class D, class P>
struct tiny_lm : nn::module<D, P> {
  static constexpr index_t V = 7, E = 5, ctx = 6;
  nn::embedding<D, P> wte{this, "wte", V, E};
  nn::positional_embedding<D, P> wpe{this, "wpe", ctx, E, nn::param_init::normal(0.0, 0.5)};
  nn::layer<nn::linear<D, P>> fc{this, "fc", E, E};
  auto forward(const typename tiny_lm::template ids<2>& x) {
    const auto s = x.shape();
    const auto h = ag::reshape(wpe(wte(x)), locus::extents<2>{s[0] * s[1], E});
    return ag::linear(ag::tanh(fc(h)), wte.weight().on(x));
  }
};

template <class M>
double weighted(M& m, const locus::tensor<std::int64_t, cpu, 2>& ids, const locus::tensor<double, cpu, 2>& gy) {
  const auto y = m.infer(ids.view());
  double s = 0;
  for (index_t i = 0; i < y.numel(); ++i) s += y.data_handle()[i] * gy.data_handle()[i];
  return s;
}

locus::tensor<std::int64_t, cpu, 2> id_batch(std::vector<std::int64_t> v, index_t b, index_t t) {
  return locus::from_host<cpu>(v, {b, t});
}

}  // namespace

TEST_CASE("nn::embedding: a forward over token ids, the tied projection and learned positions match f64 finite differences") {
  using P = locus::amp::fp64;
  nn::model<tiny_lm<cpu, P>> m;
  m.reset_parameters(11);
  static_assert(std::is_same_v<decltype(m)::input_type, std::int64_t>);
  static_assert(decltype(m)::input_rank == 2);
  const auto& e = m.parameters().entries();
  REQUIRE(e.size() == 4);
  CHECK(e[0].name == "wte.weight");
  CHECK(e[1].name == "wpe.weight");
  CHECK(e[2].name == "fc.weight");
  CHECK(e[3].name == "fc.bias");
  // ids repeat (row 3 twice, row 0 three times): the table's gradient adds them
  const auto ids = id_batch({3, 0, 6, 3, 0, 1, 0, 2}, 2, 4);
  const auto gy = locus::randn<double, cpu>({8, 7}, 5);
  m.parameters().zero_grad();
  const auto y = m.forward(ids.view());
  CHECK(y.shape() == locus::extents<2>{8, 7});
  (void)m.backward(gy.view());
  auto& st = m.parameters();
  const auto grad = st.grad();
  std::size_t checked = 0;
  for (const auto& en : st.entries()) {
    for (index_t i = 0; i < en.numel; ++i) {
      double* w = st.master().data_handle() + en.offset + i;
      const double keep = *w, h = 1e-6;
      *w = keep + h;
      const double up = weighted(m, ids, gy);
      *w = keep - h;
      const double down = weighted(m, ids, gy);
      *w = keep;
      const double numeric = (up - down) / (2 * h);
      const double a = grad.data_handle()[en.offset + i];
      INFO(en.name << " element " << i << ": backward " << a << ", finite differences " << numeric);
      CHECK(std::abs(a - numeric) <= 1e-6 * std::max(1.0, std::abs(numeric)));
      ++checked;
    }
  }
  CHECK(checked == 7 * 5 + 6 * 5 + 5 * 5 + 5);
  // the rows of wpe past the sequence (positions 4 and 5) get no gradient
  for (index_t i = 4 * 5; i < 6 * 5; ++i) CHECK(grad.data_handle()[e[1].offset + i] == 0.0);
  // a shorter sequence uses fewer positions; its forward is the same computation cropped
  const auto ids3 = id_batch({3, 0, 6, 0, 1, 0}, 2, 3);
  const auto y3 = m.infer(ids3.view());
  const auto y4 = m.infer(ids.view());
  for (index_t r = 0; r < 3; ++r)
    for (index_t j = 0; j < 7; ++j) CHECK(y3(r, j) == doctest::Approx(y4(r, j)).epsilon(1e-14));
}

TEST_CASE("nn::embedding: initialisation as PyTorch's nn.Embedding, int32 ids, and the same seed draws the same table") {
  using P = locus::amp::fp32;
  nn::model<tiny_lm<cpu, P>> m;
  auto& net = m.net();
  CHECK(net.wte.vocabulary() == 7);
  CHECK(net.wte.dim() == 5);
  CHECK(net.wpe.context() == 6);
  // N(0, 1): over 35 draws the mean is within 4 standard errors of 0 and the spread near 1
  double sum = 0, sq = 0;
  const auto w = net.wte.weight().master();
  for (index_t i = 0; i < 7; ++i)
    for (index_t j = 0; j < 5; ++j) {
      sum += w(i, j);
      sq += double(w(i, j)) * w(i, j);
    }
  const double mean = sum / 35, var = sq / 35 - mean * mean;
  CHECK(std::abs(mean) < 4.0 / std::sqrt(35.0));
  CHECK(var > 0.4);
  CHECK(var < 2.0);
  const float w00 = w(0, 0);
  m.reset_parameters(0);
  CHECK(net.wte.weight().master()(0, 0) == w00);
  m.reset_parameters(1);
  CHECK(net.wte.weight().master()(0, 0) != w00);
  // the lookup returns the rows themselves, for int32 ids too
  ag::tape<float, cpu> t;
  const auto i32 = locus::from_host<cpu>(std::vector<std::int32_t>{6, 0, 6}, {3});
  const auto rows = net.wte(t.ids(i32));
  const auto table = net.wte.weight().master();
  CHECK(rows.shape() == locus::extents<2>{3, 5});
  for (index_t j = 0; j < 5; ++j) {
    CHECK(rows.value()(0, j) == table(6, j));
    CHECK(rows.value()(1, j) == table(0, j));
    CHECK(rows.value()(2, j) == table(6, j));
  }
}

namespace {
/// The same classifier two ways: ids [B] -> embedding [V, E] -> linear(E, K) ...
template <class D, class P>
struct by_ids : nn::module<D, P> {
  nn::embedding<D, P> emb{this, "emb", 6, 4};
  nn::layer<nn::linear<D, P>> fc{this, "fc", 4, 3};
  auto forward(const typename by_ids::template ids<1>& x) { return fc(emb(x)); }
};
/// ... and one-hot rows [B, V] -> linear(V, E, no bias) -> linear(E, K).
template <class D, class P>
struct by_one_hot : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> emb{this, "emb", 6, 4, nn::bias::without};
  nn::layer<nn::linear<D, P>> fc{this, "fc", 4, 3};
  auto forward(const typename by_one_hot::template var<2>& x) { return fc(emb(x)); }
};
}  // namespace

TEST_CASE("nn::embedding trained by the trainer on int64 and int32 id batches equals a one-hot input times a linear layer") {
  // (fp32: optimizers train f32 master weights. The one-hot product is exact; the two
  // table gradients may add a repeated id's rows in another order: rounding only.)
  using P = locus::amp::fp32;
  const std::vector<std::int64_t> id_values{0, 5, 2, 2, 4, 1, 5, 3, 0, 2};
  const std::vector<std::int64_t> label_values{1, 0, 2, 2, 1, 0, 0, 2, 1, 1};
  const index_t B = 10;
  for (const bool int32_batch : {false, true}) {
    CAPTURE(int32_batch);
    nn::model<by_ids<cpu, P>> a;
    nn::model<by_one_hot<cpu, P>> b;
    a.reset_parameters(7);
    // b's first weight [E, V] is a's table [V, E] transposed; fc the same
    auto wa = a.parameters().master();
    auto wb = b.parameters().master();
    const auto& ea = a.parameters().entries();
    const auto& eb = b.parameters().entries();
    REQUIRE(ea[0].name == "emb.weight");
    REQUIRE(eb[0].name == "emb.weight");
    for (index_t v = 0; v < 6; ++v)
      for (index_t k = 0; k < 4; ++k) wb.data_handle()[eb[0].offset + k * 6 + v] = wa.data_handle()[ea[0].offset + v * 4 + k];
    for (std::size_t p = 1; p < 3; ++p)  // fc's weight and bias (the store may pad between entries)
      for (index_t i = 0; i < ea[p].numel; ++i) wb.data_handle()[eb[p].offset + i] = wa.data_handle()[ea[p].offset + i];
    b.parameters().sync_compute();
    locus::optim::sgd<cpu> oa(a.parameters(), {.lr = 0.3});
    locus::optim::sgd<cpu> ob(b.parameters(), {.lr = 0.3});
    locus::train::trainer ta(a, oa, nn::cross_entropy{});
    locus::train::trainer tb(b, ob, nn::cross_entropy{});
    const auto labels = locus::from_host<cpu>(label_values, {B});
    const auto ids64 = locus::from_host<cpu>(id_values, {B});
    std::vector<std::int32_t> v32(id_values.begin(), id_values.end());
    const auto ids32 = locus::from_host<cpu>(v32, {B});
    auto one_hot = locus::zeros<float, cpu>({B, 6});
    for (index_t i = 0; i < B; ++i) one_hot(i, id_values[static_cast<std::size_t>(i)]) = 1.0f;
    for (int s = 0; s < 8; ++s) {
      if (int32_batch) ta.step(ids32, labels);  // converted to the forward's int64
      else ta.step(ids64, labels);
      tb.step(one_hot, labels);
    }
    CHECK(ta.report().loss == doctest::Approx(tb.report().loss).epsilon(1e-5));
    wa = a.parameters().master();
    wb = b.parameters().master();
    float worst = 0, moved = 0;
    for (index_t v = 0; v < 6; ++v)
      for (index_t k = 0; k < 4; ++k) {
        const float x = wa.data_handle()[ea[0].offset + v * 4 + k], y = wb.data_handle()[eb[0].offset + k * 6 + v];
        worst = std::max(worst, std::abs(x - y));
      }
    for (std::size_t p = 1; p < 3; ++p)
      for (index_t i = 0; i < ea[p].numel; ++i)
        worst = std::max(worst, std::abs(wa.data_handle()[ea[p].offset + i] - wb.data_handle()[eb[p].offset + i]));
    a.reset_parameters(7);  // how far training moved the table (row 0 is used)
    for (index_t k = 0; k < 4; ++k)
      moved = std::max(moved, std::abs(a.parameters().master().data_handle()[ea[0].offset + k] -
                                       wb.data_handle()[eb[0].offset + k * 6]));
    CHECK(worst < 1e-5f);
    CHECK(moved > 1e-3f);
  }
}

TEST_CASE("nn::embedding: ids out of range, negative or at the integer extremes are a value_error before anything changes") {
  using P = locus::amp::fp32;
  nn::model<tiny_lm<cpu, P>> m;
  locus::optim::adamw<cpu> opt(m.parameters());
  locus::train::trainer t(m, opt, nn::cross_entropy{});
  const auto before = locus::to<cpu>(m.parameters().master());
  const auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const locus::value_error& e) {
      return e.what();
    }
    return "no value_error";
  };
  const auto labels = locus::zeros<std::int64_t, cpu>({8});
  for (const std::int64_t bad : {std::int64_t{7}, std::int64_t{-1}, std::numeric_limits<std::int64_t>::max(),
                                 std::numeric_limits<std::int64_t>::min()}) {
    CAPTURE(bad);
    const auto ids = id_batch({1, 2, 3, bad, 0, 0, 0, 0}, 2, 4);
    const auto text = message([&] { t.step(ids, labels.reshape(locus::extents<1>{8})); });
    CHECK(text.find("nn::embedding 'wte'") != std::string::npos);
    CHECK(text.find("token id " + std::to_string(bad) + " at position 3") != std::string::npos);
    CHECK(text.find("vocabulary of 7") != std::string::npos);
    CHECK(t.micro_steps() == 0);
    CHECK(m.tape().values() <= 1);  // nothing recorded past the input
  }
  // int32 extremes convert to int64 and are refused the same way
  const auto i32 = locus::from_host<cpu>(std::vector<std::int32_t>{0, 1, std::numeric_limits<std::int32_t>::min(), 2}, {1, 4});
  CHECK(message([&] { t.step(i32, locus::zeros<std::int64_t, cpu>({4})); }).find("token id -2147483648") != std::string::npos);
  const auto after = locus::to<cpu>(m.parameters().master());
  for (index_t i = 0; i < before.numel(); ++i) REQUIRE(after.data_handle()[i] == before.data_handle()[i]);
  // a schedule's lr is put back after a refused step
  {
    nn::model<tiny_lm<cpu, P>> m2;
    locus::optim::adamw<cpu> opt2(m2.parameters(), {.lr = 0.01});
    locus::train::options o;
    o.schedule = [](std::int64_t s, double base) { return base / double(1 + s); };
    locus::train::trainer t2(m2, opt2, nn::cross_entropy{}, o);
    const auto ok = id_batch({1, 2, 3, 4, 5, 6, 0, 1}, 2, 4);
    t2.step(ok, labels);
    t2.step(ok, labels);
    const double lr = opt2.lr();
    const auto bad = id_batch({1, 2, 3, 9, 0, 0, 0, 0}, 2, 4);
    CHECK_THROWS_AS(t2.step(bad, labels), locus::value_error);
    CHECK(opt2.lr() == lr);
    CHECK(t2.optimizer_steps() == 2);
  }
  // the good batch still trains afterwards
  const auto good = id_batch({1, 2, 3, 4, 5, 6, 0, 1}, 2, 4);
  t.step(good, labels);
  CHECK(t.micro_steps() == 1);
}

TEST_CASE("nn::embedding: empty sequences, sequences longer than the context and ids of an earlier step are refused") {
  using P = locus::amp::fp32;
  nn::model<tiny_lm<cpu, P>> m;
  locus::optim::adamw<cpu> opt(m.parameters());
  locus::train::trainer t(m, opt, nn::cross_entropy{});
  const auto shape_message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const locus::shape_error& e) {
      return e.what();
    }
    return "no shape_error";
  };
  const locus::tensor<std::int64_t, cpu, 2> empty({3, 0});
  const locus::tensor<std::int64_t, cpu, 1> no_labels({0});
  CHECK(shape_message([&] { t.step(empty, no_labels); }).find("empty sequences (shape [3, 0])") != std::string::npos);
  const auto long_ids = locus::zeros<std::int64_t, cpu>({1, 7});
  const auto text = shape_message([&] { t.step(long_ids, locus::zeros<std::int64_t, cpu>({7})); });
  CHECK(text.find("nn::positional_embedding 'wpe': a sequence of 7 positions is longer than its context of 6") !=
        std::string::npos);
  CHECK(t.micro_steps() == 0);
  // inference refuses the same
  CHECK(shape_message([&] { (void)m.infer(long_ids.view()); }).find("context of 6") != std::string::npos);
  // ids of a reset tape
  ag::tape<float, cpu> tape;
  const auto ids = locus::zeros<std::int64_t, cpu>({2, 2});
  const auto old = tape.ids(ids);
  tape.reset();
  const auto table = locus::zeros<float, cpu>({3, 2});
  CHECK_THROWS_AS((void)ag::gather_rows(tape.leaf(table), old), locus::autograd_error);
}

namespace {
template <class D, class P>
struct no_vocabulary : nn::module<D, P> {
  nn::embedding<D, P> wte{this, "wte", 0, 4};
  auto forward(const typename no_vocabulary::template ids<1>& x) { return wte(x); }
};
template <class D, class P>
struct no_context : nn::module<D, P> {
  nn::embedding<D, P> wte{this, "wte", 5, 4};
  nn::positional_embedding<D, P> wpe{this, "wpe", 0, 4};
  auto forward(const typename no_context::template ids<2>& x) { return wpe(wte(x)); }
};
}  // namespace

TEST_CASE("nn::embedding: a vocabulary or context length of zero is refused when the model is built") {
  using P = locus::amp::fp32;
  using M1 = nn::model<no_vocabulary<cpu, P>>;
  using M2 = nn::model<no_context<cpu, P>>;
  const auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const locus::value_error& e) {
      return e.what();
    }
    return "no value_error";
  };
  CHECK(message([] { M1 m; }).find("nn::embedding 'wte' needs a positive vocabulary size, got 0") != std::string::npos);
  CHECK(message([] { M2 m; }).find("nn::positional_embedding 'wpe' needs a positive context length, got 0") !=
        std::string::npos);
}

TEST_CASE("nn::embedding: the training loss and evaluate() average per token over batches of two lengths") {
  using P = locus::amp::fp32;
  nn::model<tiny_lm<cpu, P>> m;
  locus::optim::sgd<cpu> opt(m.parameters(), {.lr = 0.0});  // the weights stay: both see the same model
  locus::train::trainer t(m, opt, nn::cross_entropy{});
  std::vector<locus::data::text_batch> batches;
  batches.push_back({id_batch({1}, 1, 1), locus::from_host<cpu>(std::vector<std::int64_t>{2}, {1})});
  batches.push_back({id_batch({3, 4, 5, 6, 0, 1}, 1, 6), locus::from_host<cpu>(std::vector<std::int64_t>{4, 5, 6, 0, 1, 2}, {6})});
  (void)t.report();
  for (const auto& b : batches) t.step(b.x, b.y);
  const auto trained = t.report();
  const auto evaluated = t.evaluate(batches);
  CHECK(trained.samples == 7);  // tokens
  CHECK(trained.loss == doctest::Approx(evaluated.loss).epsilon(1e-5));
}

TEST_CASE("nn::embedding: ids refilled between forward and backward do not reach backward (it uses the ids it checked)") {
  // An outside review: backward read the caller's ids again, so a buffer refilled with
  // an id out of range before backward (a loader's next batch) wrote outside the table.
  using P = locus::amp::fp64;
  nn::model<tiny_lm<cpu, P>> m;
  m.reset_parameters(2);
  auto ids = id_batch({3, 0, 6, 3, 0, 1, 0, 2}, 2, 4);
  const auto same = id_batch({3, 0, 6, 3, 0, 1, 0, 2}, 2, 4);
  const auto gy = locus::randn<double, cpu>({8, 7}, 9);
  // the reference: the gradient with the ids left alone
  m.parameters().zero_grad();
  (void)m.forward(same.view());
  (void)m.backward(gy.view());
  const auto g = m.parameters().grad();
  const std::vector<double> want(g.data_handle(), g.data_handle() + g.numel());
  m.parameters().zero_grad();
  (void)m.forward(ids.view());
  ids.data_handle()[1] = std::int64_t{1} << 40;  // refilled: far outside the vocabulary of 7
  ids.data_handle()[5] = -3;
  (void)m.backward(gy.view());
  const auto got = m.parameters().grad();
  for (index_t i = 0; i < got.numel(); ++i) CHECK(got.data_handle()[i] == want[static_cast<std::size_t>(i)]);
}
