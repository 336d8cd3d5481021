// Host suite: parameter groups (optim::param_group, optim::no_decay_group): each
// parameter's weight decay in AdamW and SGD, on the plain step and on the fused step the
// trainer runs, against double-precision references of torch.optim.AdamW's and
// torch.optim.SGD's formulas with per-parameter decay; the transformer recipe's group
// (rank-1 parameters and embedding tables); bad groups; checkpoints that record the
// groups and refuse a resume with other ones before anything changes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <locus/nn/embedding.hpp>
#include <locus/train.hpp>

namespace {

namespace nn = locus::nn;
namespace ag = locus::ag;
namespace optim = locus::optim;
using locus::cpu;
using locus::index_t;

template <class D, class P>
struct lm : nn::module<D, P> {
  nn::embedding<D, P> wte{this, "wte", 9, 8};
  nn::positional_embedding<D, P> wpe{this, "wpe", 5, 8, nn::param_init::normal(0.0, 0.02)};
  nn::layer<nn::layer_norm<D, P>> ln{this, "ln", 8};
  nn::layer<nn::linear<D, P>> fc{this, "fc", 8, 9};
  auto forward(const typename lm::template ids<2>& x) {
    const auto s = x.shape();
    return fc(ln(ag::reshape(wpe(wte(x)), locus::extents<2>{s[0] * s[1], 8})));
  }
};
using model_t = nn::model<lm<cpu, locus::amp::fp32>>;

std::vector<double> decay_per_element(const model_t& m, const std::vector<double>& per_param) {
  std::vector<double> wd(static_cast<std::size_t>(m.parameters().size()), -1.0);
  const auto& e = m.parameters().entries();
  for (std::size_t p = 0; p < e.size(); ++p)
    for (index_t i = 0; i < e[p].numel; ++i) wd[static_cast<std::size_t>(e[p].offset + i)] = per_param[p];
  return wd;
}

/// Three steps of opt on fixed random gradients (step(): the plain path; fused: the
/// trainer's two-launch step), against f64 AdamW with decay wd[i] for element i.
template <class Step>
void check_adamw(model_t& m, const optim::adamw_options& o, const std::vector<double>& wd, Step&& step) {
  auto& store = m.parameters();
  const auto initial = locus::to<cpu>(std::as_const(store).master());
  std::vector<double> p(initial.span().begin(), initial.span().end()), mm(p.size(), 0.0), vv(p.size(), 0.0);
  for (int t = 1; t <= 3; ++t) {
    auto g = locus::randn<float, cpu>({store.size()}, 70 + static_cast<std::uint64_t>(t));
    locus::copy(g, store.grad());
    step();
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (wd[i] < 0) continue;  // padding between parameters
      const double gi = g(static_cast<index_t>(i));
      p[i] -= o.lr * wd[i] * p[i];
      mm[i] = o.beta1 * mm[i] + (1 - o.beta1) * gi;
      vv[i] = o.beta2 * vv[i] + (1 - o.beta2) * gi * gi;
      const double mh = mm[i] / (1 - std::pow(o.beta1, t)), vh = vv[i] / (1 - std::pow(o.beta2, t));
      p[i] -= o.lr * mh / (std::sqrt(vh) + o.eps);
    }
  }
  const auto got = locus::to<cpu>(std::as_const(store).master());
  int wrong = 0;
  for (std::size_t i = 0; i < p.size(); ++i)
    if (wd[i] >= 0 && std::abs(got.span()[i] - p[i]) > 1e-5 * std::abs(p[i]) + 1e-7) ++wrong;
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("parameter groups: no_decay_group holds the rank-1 parameters and the embedding tables") {
  model_t m;
  const auto g = optim::no_decay_group(m.parameters());
  CHECK(g.weight_decay == 0.0);
  CHECK(g.names == std::vector<std::string>{"wte.weight", "wpe.weight", "ln.weight", "ln.bias", "fc.bias"});
  const auto& e = m.parameters().entries();
  CHECK(e[0].embedding);
  CHECK(e[1].embedding);
  CHECK_FALSE(e[4].embedding);  // fc.weight: a rank-2 weight that decays
}

TEST_CASE("parameter groups: AdamW's weight decay per parameter on the plain and the fused step equals f64 AdamW") {
  const optim::adamw_options o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1};
  // entries: wte.weight, wpe.weight, ln.weight, ln.bias, fc.weight, fc.bias
  const std::vector<double> recipe{0.0, 0.0, 0.0, 0.0, 0.1, 0.0};
  {
    model_t m;
    optim::adamw<cpu> opt(m.parameters(), o, {optim::no_decay_group(m.parameters())});
    for (std::size_t i = 0; i < recipe.size(); ++i) CHECK(opt.weight_decay_of(i) == recipe[i]);
    check_adamw(m, o, decay_per_element(m, recipe), [&] { opt.step(); });
  }
  {
    // three groups, one of them larger than the default, and the fused step
    model_t m;
    optim::adamw<cpu> opt(m.parameters(), o, {{{"fc.weight"}, 0.5}, {{"wte.weight", "ln.bias"}, 0.0}});
    const std::vector<double> wd{0.0, 0.1, 0.1, 0.0, 0.5, 0.1};
    locus::detail::step_state st{};
    st.scale = 1.0f;
    optim::detail::fused_args<float> a;
    a.st = &st;
    check_adamw(m, o, decay_per_element(m, wd), [&] { opt.fused_step(a); });
    CHECK(opt.steps() == 3);
  }
}

TEST_CASE("parameter groups: SGD's L2 weight decay per parameter (with momentum) equals f64 SGD") {
  const optim::sgd_options o{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01};
  for (const bool fused : {false, true}) {
    CAPTURE(fused);
    model_t m;
    optim::sgd<cpu> opt(m.parameters(), o, {optim::no_decay_group(m.parameters()), {{"fc.weight"}, 0.2}});
    const auto wd = decay_per_element(m, {0.0, 0.0, 0.0, 0.0, 0.2, 0.0});
    auto& store = m.parameters();
    const auto initial = locus::to<cpu>(std::as_const(store).master());
    std::vector<double> p(initial.span().begin(), initial.span().end()), buf(p.size(), 0.0);
    locus::detail::step_state st{};
    st.scale = 1.0f;
    optim::detail::fused_args<float> a;
    a.st = &st;
    for (int t = 1; t <= 3; ++t) {
      auto g = locus::randn<float, cpu>({store.size()}, 90 + static_cast<std::uint64_t>(t));
      locus::copy(g, store.grad());
      if (fused) opt.fused_step(a);
      else opt.step();
      for (std::size_t i = 0; i < p.size(); ++i) {
        if (wd[i] < 0) continue;
        const double d = g(static_cast<index_t>(i)) + wd[i] * p[i];
        buf[i] = t == 1 ? d : o.momentum * buf[i] + d;
        p[i] -= o.lr * buf[i];
      }
    }
    const auto got = locus::to<cpu>(std::as_const(store).master());
    int wrong = 0;
    for (std::size_t i = 0; i < p.size(); ++i)
      if (wd[i] >= 0 && std::abs(got.span()[i] - p[i]) > 1e-5 * std::abs(p[i]) + 1e-7) ++wrong;
    CHECK(wrong == 0);
  }
}

TEST_CASE("parameter groups: an unknown name, a parameter in two groups and a bad decay are refused") {
  model_t m;
  auto& s = m.parameters();
  CHECK_THROWS_AS(optim::adamw<cpu>(s, {}, {{{"fc.wieght"}, 0.0}}), locus::index_error);
  try {
    optim::adamw<cpu> opt(s, {}, {{{"fc.bias"}, 0.0}, {{"ln.bias", "fc.bias"}, 0.0}});
    FAIL("a parameter in two groups was taken");
  } catch (const locus::value_error& e) {
    CHECK(std::string(e.what()).find("parameter 'fc.bias' is in parameter groups 0 and 1") != std::string::npos);
  }
  try {
    optim::adamw<cpu> opt(s, {}, {{{"fc.bias", "fc.bias"}, 0.0}});
    FAIL("a name listed twice was taken");
  } catch (const locus::value_error& e) {
    CHECK(std::string(e.what()).find("'fc.bias' is listed twice in parameter group 0") != std::string::npos);
  }
  try {
    optim::sgd<cpu> opt(s, {}, {{{"fc.bias"}, 0.0}, {{"ln.bias"}, -1.0}});
    FAIL("a negative decay was taken");
  } catch (const locus::value_error& e) {
    CHECK(std::string(e.what()).find("parameter group 1 has weight_decay = -1") != std::string::npos);
  }
  CHECK_THROWS_AS(optim::sgd<cpu>(s, {}, {{{"fc.bias"}, -1.0}}), locus::value_error);
  CHECK_THROWS_AS(optim::sgd<cpu>(s, {}, {{{"fc.bias"}, std::nan("")}}), locus::value_error);
}

TEST_CASE("parameter groups: a checkpoint records them, and a resume with other groups is refused before anything changes") {
  const auto dir = std::filesystem::temp_directory_path() / "locus-test-param-groups";
  std::filesystem::remove_all(dir);
  const auto path = dir / "ckpt.safetensors";
  const auto ids = locus::from_host<cpu>(std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  const auto next = locus::from_host<cpu>(std::vector<std::int64_t>{2, 3, 4, 5, 6, 7, 8, 0}, {8});
  {
    model_t m;
    optim::adamw<cpu> opt(m.parameters(), {.weight_decay = 0.1}, {optim::no_decay_group(m.parameters())});
    locus::train::trainer t(m, opt, nn::cross_entropy{});
    for (int s = 0; s < 3; ++s) t.step(ids, next);
    locus::train::save_checkpoint(path, t, 1);
  }
  {
    model_t m;
    optim::adamw<cpu> opt(m.parameters(), {.weight_decay = 0.1});  // every parameter decays
    locus::train::trainer t(m, opt, nn::cross_entropy{});
    const auto before = locus::to<cpu>(std::as_const(m.parameters()).master());
    try {
      (void)locus::train::resume(path, t);
      FAIL("a resume with other parameter groups was taken");
    } catch (const locus::value_error& e) {
      const std::string w = e.what();
      CHECK(w.find("weight decay per parameter") != std::string::npos);
      CHECK(w.find("'wte.weight': saved 0, now 0.1") != std::string::npos);
    }
    const auto after = locus::to<cpu>(std::as_const(m.parameters()).master());
    for (index_t i = 0; i < before.numel(); ++i) REQUIRE(after.span()[i] == before.span()[i]);
    CHECK(opt.steps() == 0);
  }
  {
    model_t m;
    optim::adamw<cpu> opt(m.parameters(), {.weight_decay = 0.1}, {optim::no_decay_group(m.parameters())});
    locus::train::trainer t(m, opt, nn::cross_entropy{});
    CHECK(locus::train::resume(path, t) == 1);
    CHECK(opt.steps() == 3);
  }
  {
    // the same decays written another way (the option 0, a group of the decaying weight)
    model_t m;
    optim::adamw<cpu> opt(m.parameters(), {.weight_decay = 0.0}, {{{"fc.weight"}, 0.1}});
    locus::train::trainer t(m, opt, nn::cross_entropy{});
    CHECK(locus::train::resume(path, t) == 1);
  }
  std::filesystem::remove_all(dir);
}
