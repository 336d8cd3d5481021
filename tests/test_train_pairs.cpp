// Host suite: training pairs that cannot work. An optimizer bound to another model's
// parameters (the trainer would train neither), a policy computing in f16 that says it
// needs no loss scaling, and a hand-written loop stepping an f16 model without a grad
// scaler. The compile-time halves are tests/compile_fail/train_*_without_scaler.cpp.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <locus/train.hpp>

namespace {

namespace nn = locus::nn;
using P32 = locus::amp::fp32;
using F16 = locus::amp::fp16_mixed;

/// compute = f16, but says it needs no scaling: the flag cannot lift the rule.
struct f16_unscaled_policy {
  using compute = locus::f16;
  using master = float;
  static constexpr bool requires_loss_scaling = false;
  static constexpr std::string_view name = "f16-home-made";
};
/// compute = bf16, and asks for scaling: the flag adds the rule.
struct bf16_scaled_policy {
  using compute = locus::bf16;
  using master = float;
  static constexpr bool requires_loss_scaling = true;
  static constexpr std::string_view name = "bf16-scaled";
};

static_assert(locus::amp::needs_loss_scaling<F16>);
static_assert(locus::amp::needs_loss_scaling<f16_unscaled_policy>);
static_assert(locus::amp::needs_loss_scaling<bf16_scaled_policy>);
static_assert(!locus::amp::needs_loss_scaling<P32>);
static_assert(!locus::amp::needs_loss_scaling<locus::amp::bf16_mixed>);
static_assert(!locus::amp::needs_loss_scaling<locus::amp::fp64>);

template <class Model>
std::vector<float> masters(Model& m) {
  const auto v = std::as_const(m.parameters()).master();
  return {v.data_handle(), v.data_handle() + v.numel()};
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const locus::error& e) {
    return e.what();
  }
  FAIL("expected locus::error");
  return {};
}

}  // namespace

TEST_CASE("training pairs: a trainer refuses an optimizer built over another model's parameters") {
  nn::sequential a(nn::linear<locus::cpu, P32>(4, 3));
  nn::sequential b(nn::linear<locus::cpu, P32>(4, 3));  // the same shape: sizes alone would not tell
  nn::sequential c(nn::linear<locus::cpu, P32>(8, 2), nn::relu<locus::cpu, P32>(), nn::linear<locus::cpu, P32>(2, 3));
  a.reset_parameters(1);
  b.reset_parameters(2);
  c.reset_parameters(3);
  const auto a0 = masters(a), b0 = masters(b);
  locus::optim::adamw<locus::cpu> opt_b(b.parameters());
  locus::optim::sgd<locus::cpu> opt_c(c.parameters());
  using T = locus::train::trainer<decltype(a), locus::optim::adamw<locus::cpu>, nn::cross_entropy>;
  const auto m = error_of([&] { T t(a, opt_b, nn::cross_entropy{}); });
  CHECK(m.find("locus: the trainer's optimizer was built over another model's parameters") != std::string::npos);
  CHECK(m.find("opt(model.parameters())") != std::string::npos);
  using U = locus::train::trainer<decltype(a), locus::optim::sgd<locus::cpu>, nn::cross_entropy>;
  const auto m2 = error_of([&] { U u(a, opt_c, nn::cross_entropy{}); });
  CHECK(m2.find("(" + std::to_string(c.parameters().size()) + " elements at") != std::string::npos);
  CHECK(m2.find("not this trainer's model's (" + std::to_string(a.parameters().size()) + " elements") != std::string::npos);
  // With a grad scaler too.
  locus::amp::grad_scaler<locus::cpu> scaler;
  using S = locus::train::trainer<decltype(a), locus::optim::adamw<locus::cpu>, nn::cross_entropy,
                                  locus::amp::grad_scaler<locus::cpu>>;
  CHECK_THROWS_AS(S(a, opt_b, nn::cross_entropy{}, scaler), locus::error);
  CHECK(masters(a) == a0);
  CHECK(masters(b) == b0);

  // The optimizer of this model: builds and trains it (and only it).
  locus::optim::sgd<locus::cpu> opt_a(a.parameters(), {.lr = 0.5});
  locus::train::trainer t(a, opt_a, nn::cross_entropy{});
  t.step(locus::ones<float, locus::cpu>({2, 4}), locus::zeros<std::int64_t, locus::cpu>({2}));
  CHECK(masters(a) != a0);
  CHECK(masters(b) == b0);
  // A moved model keeps its buffers: the optimizer still belongs to it.
  auto moved = std::move(a);
  locus::train::trainer t2(moved, opt_a, nn::cross_entropy{});
  CHECK(t2.optimizer_steps() == 0);
}

TEST_CASE_TEMPLATE("training pairs: opt.step() without a guard on a model that needs loss scaling throws and changes nothing",
                   P, F16, f16_unscaled_policy, bf16_scaled_policy) {
  nn::sequential m(nn::linear<locus::cpu, P>(2, 2));
  auto& store = m.parameters();
  // weights 1, gradients 0.5: sgd with lr 0.25 steps every weight to 1 - 0.125 = 0.875
  locus::copy(locus::full<float, locus::cpu>({store.size()}, 1.0f), store.master());
  store.sync_compute();
  locus::optim::sgd<locus::cpu> opt(store, {.lr = 0.25});
  locus::optim::adamw<locus::cpu> adam(store, {.lr = 0.25});
  locus::copy(locus::full<float, locus::cpu>({store.size()}, 0.5f), store.grad());
  const auto before = masters(m);
  for (auto* step : {+[](locus::optim::sgd<locus::cpu>& o, locus::optim::adamw<locus::cpu>&) { o.step(); },
                     +[](locus::optim::sgd<locus::cpu>& o, locus::optim::adamw<locus::cpu>&) { o.step(nullptr); },
                     +[](locus::optim::sgd<locus::cpu>&, locus::optim::adamw<locus::cpu>& a) { a.step(); }}) {
    const auto msg = error_of([&] { step(opt, adam); });
    CHECK(msg.find("locus: optimizer step without loss scaling on a model whose policy needs it") != std::string::npos);
    CHECK(msg.find("opt.step(scaler.state())") != std::string::npos);
    CHECK(msg.find("opt.step(locus::optim::unscaled)") != std::string::npos);
  }
  CHECK(masters(m) == before);
  CHECK(opt.steps() == 0);
  CHECK(adam.steps() == 0);

  // The explicit opt-out steps as plain SGD does.
  opt.step(locus::optim::unscaled);
  CHECK(opt.steps() == 1);
  for (float w : masters(m)) CHECK(w == 0.875f);
  // and the compute copy follows (0.875 is exact in f16 and bf16)
  const auto wc = locus::to<locus::cpu>(m.template get<0>().weight());
  CHECK(static_cast<float>(wc(0, 1)) == 0.875f);

  // With a scaler's state: the intended loop.
  locus::amp::grad_scaler<locus::cpu> scaler({.init_scale = 4.0f});
  locus::copy(locus::full<float, locus::cpu>({store.size()}, 2.0f), store.grad());  // 0.5, scaled by 4
  scaler.unscale(store);
  opt.step(scaler.state());
  scaler.update();
  CHECK(opt.steps() == 2);
  for (float w : masters(m)) CHECK(w == 0.75f);
}

TEST_CASE("training pairs: policies that need no scaling step without a guard as before") {
  for (int k = 0; k < 2; ++k) {
    auto run = [&]<class P>() {
      nn::sequential m(nn::linear<locus::cpu, P>(2, 2));
      auto& store = m.parameters();
      locus::copy(locus::full<float, locus::cpu>({store.size()}, 1.0f), store.master());
      locus::optim::sgd<locus::cpu> opt(store, {.lr = 0.25});
      locus::copy(locus::full<float, locus::cpu>({store.size()}, 0.5f), store.grad());
      opt.step();
      opt.step(locus::optim::unscaled);  // the tag is accepted everywhere
      CHECK(opt.steps() == 2);
      for (float w : masters(m)) CHECK(w == 0.75f);
    };
    if (k == 0) run.template operator()<P32>();
    else run.template operator()<locus::amp::bf16_mixed>();
  }
}

TEST_CASE("training pairs: a home-made f16 policy trains with a grad scaler as fp16_mixed does") {
  nn::sequential m(nn::linear<locus::cpu, f16_unscaled_policy>(4, 3));
  m.reset_parameters(5);
  locus::optim::adamw<locus::cpu> opt(m.parameters(), {.lr = 0.01});
  locus::amp::grad_scaler<locus::cpu> scaler({.init_scale = 256.0f});
  locus::train::trainer t(m, opt, nn::cross_entropy{}, scaler);
  const auto before = masters(m);
  t.step(locus::rand<float, locus::cpu>({8, 4}, 1), locus::zeros<std::int64_t, locus::cpu>({8}));
  CHECK(opt.steps() == 1);
  CHECK(masters(m) != before);
}
