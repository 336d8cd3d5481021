// Non-finite storms: NaN, +inf or -inf fed into every input position of a training step
// in turn (docs/reliability.md). Under fp16_mixed the grad scaler skips that step (the
// weights, the optimizer's state and step count stay bit for bit as before), backs the
// scale off, and the next clean step trains; under fp32 the trainer stops with
// train::non_finite_error naming the micro-step and the parameter, the weights those
// before the bad step. Inside an accumulation window, a bad micro-batch spoils the whole
// optimizer step, in either position.
#include <doctest/doctest.h>

#include <locus/train.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace nn = locus::nn;
using D = locus::cpu;
using locus::index_t;

constexpr index_t kBatch = 4, kIn = 6;

template <class P>
auto make_model() {
  nn::sequential m(nn::linear<D, P>(kIn, 8), nn::relu<D, P>(), nn::linear<D, P>(8, 3));
  m.reset_parameters(17);
  return m;
}

template <class Store>
std::vector<std::uint32_t> bits_of(const Store& s) {
  const auto v = s.master();
  std::vector<std::uint32_t> out(static_cast<std::size_t>(v.numel()));
  std::memcpy(out.data(), v.data_handle(), out.size() * sizeof(float));
  return out;
}

locus::tensor<float, D, 2> clean_batch(std::uint64_t seed) { return locus::randn<float, D>({kBatch, kIn}, seed); }
locus::tensor<std::int64_t, D, 1> labels() {
  auto y = locus::zeros<std::int64_t, D>({kBatch});
  for (index_t i = 0; i < kBatch; ++i) y(i) = i % 3;
  return y;
}

const float kValues[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity()};

}  // namespace

TEST_CASE("storms: under fp16_mixed a NaN or inf at any input position skips the step, weights and optimizer "
          "state untouched, and the next clean step trains") {
  using P = locus::amp::fp16_mixed;
  const auto y = labels();
  int positions = 0;
  for (const float v : kValues) {
    for (index_t pos = 0; pos < kBatch * kIn; ++pos) {
      CAPTURE(v);
      CAPTURE(pos);
      auto m = make_model<P>();
      locus::optim::adamw<D> opt(m.parameters(), {.lr = 1e-2});
      locus::amp::grad_scaler<D> scaler({.init_scale = 1024, .growth_interval = 1000});
      locus::train::trainer t(m, opt, nn::cross_entropy{}, scaler);
      t.step(clean_batch(1), y);
      const auto before = bits_of(std::as_const(m).parameters());
      const auto steps_before = locus::to<locus::cpu>(opt.step_tensor())(0);
      auto bad = clean_batch(2);
      bad(pos / kIn, pos % kIn) = v;
      t.step(bad, y);
      CHECK(scaler.skipped_steps() == 1);
      CHECK(scaler.scale() == 512.0f);  // backed off once
      CHECK(bits_of(std::as_const(m).parameters()) == before);
      CHECK(locus::to<locus::cpu>(opt.step_tensor())(0) == steps_before);
      t.step(clean_batch(3), y);  // recovers
      CHECK(scaler.skipped_steps() == 1);
      CHECK(bits_of(std::as_const(m).parameters()) != before);
      CHECK(std::isfinite(t.report().loss) == false);  // the window held the bad loss: reported, not hidden
      ++positions;
    }
  }
  MESSAGE("fp16_mixed: " << positions << " storm positions");
}

TEST_CASE("storms: under fp32 a NaN or inf at any input position stops training with the step and the parameter, "
          "the weights are those before the bad step") {
  using P = locus::amp::fp32;
  const auto y = labels();
  int positions = 0;
  for (const float v : kValues) {
    for (index_t pos = 0; pos < kBatch * kIn; ++pos) {
      CAPTURE(v);
      CAPTURE(pos);
      auto m = make_model<P>();
      locus::optim::adamw<D> opt(m.parameters(), {.lr = 1e-2});
      locus::train::trainer t(m, opt, nn::cross_entropy{});
      t.step(clean_batch(1), y);
      const auto before = bits_of(std::as_const(m).parameters());
      auto bad = clean_batch(2);
      bad(pos / kIn, pos % kIn) = v;
      bool stopped = false;
      try {
        t.step(bad, y);
      } catch (const locus::train::non_finite_error& e) {
        stopped = true;
        CHECK(e.step() == 1);
        const std::string p = e.parameter();
        CHECK((p == "2.weight" || p == "2.bias" || p == "0.weight" || p == "0.bias"));
        CHECK(std::string(e.what()).find(p) != std::string::npos);
      }
      CHECK(stopped);
      CHECK(bits_of(std::as_const(m).parameters()) == before);
      ++positions;
    }
  }
  MESSAGE("fp32: " << positions << " storm positions");
}

TEST_CASE("storms: a bad micro-batch in either position of an accumulation window skips the whole step") {
  using P = locus::amp::fp16_mixed;
  const auto y = labels();
  for (const int bad_micro : {0, 1}) {
    CAPTURE(bad_micro);
    auto m = make_model<P>();
    locus::optim::sgd<D> opt(m.parameters(), {.lr = 0.1});
    locus::amp::grad_scaler<D> scaler({.init_scale = 1024});
    locus::train::trainer t(m, opt, nn::cross_entropy{}, scaler, {.accumulate = 2});
    t.step(clean_batch(1), y);
    t.step(clean_batch(2), y);  // one clean optimizer step
    const auto before = bits_of(std::as_const(m).parameters());
    for (int micro = 0; micro < 2; ++micro) {
      auto x = clean_batch(10 + static_cast<std::uint64_t>(micro));
      if (micro == bad_micro) x(1, 2) = std::numeric_limits<float>::quiet_NaN();
      t.step(x, y);
    }
    CHECK(scaler.skipped_steps() == 1);
    CHECK(bits_of(std::as_const(m).parameters()) == before);
    t.step(clean_batch(20), y);
    t.step(clean_batch(21), y);
    CHECK(bits_of(std::as_const(m).parameters()) != before);
  }
}
