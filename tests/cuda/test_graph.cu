// CUDA suite, issue 13's graph mode: 50 steps of the trainer with cuda_graph = true give
// the same losses, bit for bit, as 50 ordinary steps from the same seed (bf16_mixed
// without a scaler, fp16_mixed with one, accumulation over 2 micro-batches, a schedule,
// and a partial batch that drops and recaptures the graphs); the graphs are captured
// (one per branch) and hold no host nodes.
// Skipped, with the reason, without a GPU (tests/cuda/main.cu).
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include <locus/locus.hpp>
#include <locus/train.hpp>

namespace {
using locus::index_t;
namespace nn = locus::nn;

template <class P>
auto mlp(std::uint64_t seed) {
  nn::sequential m(nn::linear<locus::cuda, P>(64, 48), nn::relu<locus::cuda, P>(), nn::linear<locus::cuda, P>(48, 32),
                   nn::relu<locus::cuda, P>(), nn::linear<locus::cuda, P>(32, 10));
  m.reset_parameters(seed);
  return m;
}

struct batch {
  locus::tensor<float, locus::cuda, 2> x;
  locus::tensor<std::int64_t, locus::cuda, 1> y;
};

/// Deterministic batches (the same for both runs): step s has `rows(s)` rows.
std::vector<batch> batches(int n, index_t (*rows)(int)) {
  std::vector<batch> out;
  for (int s = 0; s < n; ++s) {
    const index_t r = rows(s);
    auto xh = locus::randn<float, locus::cpu>({r, 64}, 1000 + static_cast<std::uint64_t>(s));
    auto yh = locus::zeros<std::int64_t, locus::cpu>({r});
    for (index_t i = 0; i < r; ++i) yh(i) = (i * 7 + s) % 10;
    out.push_back({locus::to<locus::cuda>(xh), locus::to<locus::cuda>(yh)});
  }
  return out;
}

/// The loss of every report (one per step) and the final master weights.
template <class P, bool Scaled>
std::pair<std::vector<double>, std::vector<float>> train(bool graph, const std::vector<batch>& data, int accumulate) {
  auto m = mlp<P>(42);
  locus::optim::adamw<locus::cuda> opt(m.parameters(), {.lr = 3e-3});
  locus::train::options o{.accumulate = accumulate, .cuda_graph = graph};
  o.schedule = locus::optim::cosine_lr{.total_steps = 40, .min_lr = 1e-4};
  std::vector<double> losses;
  auto run = [&](auto& t) {
    for (const auto& b : data) {
      t.step(b.x, b.y);
      losses.push_back(t.report().loss);
    }
    t.flush();
  };
  if constexpr (Scaled) {
    locus::amp::grad_scaler<locus::cuda> scaler({.init_scale = 1024.0f, .growth_interval = 5});
    locus::train::trainer t(m, opt, nn::cross_entropy{}, scaler, o);
    run(t);
    if (graph) {
      CHECK(t.captured_graph(1) != nullptr);
      if (accumulate > 1) CHECK(t.captured_graph(0) != nullptr);
    }
  } else {
    locus::train::trainer t(m, opt, nn::cross_entropy{}, o);
    run(t);
    if (graph) {
      REQUIRE(t.captured_graph(1) != nullptr);
      size_t nodes = 0;
      REQUIRE(cudaGraphGetNodes(t.captured_graph(1), nullptr, &nodes) == cudaSuccess);
      std::vector<cudaGraphNode_t> all(nodes);
      REQUIRE(cudaGraphGetNodes(t.captured_graph(1), all.data(), &nodes) == cudaSuccess);
      int kernels = 0;
      for (auto n : all) {
        cudaGraphNodeType k{};
        REQUIRE(cudaGraphNodeGetType(n, &k) == cudaSuccess);
        CHECK(k != cudaGraphNodeTypeHost);  // no host callbacks, no host reads
        kernels += k == cudaGraphNodeTypeKernel;
      }
      MESSAGE("update-branch graph: ", nodes, " nodes, ", kernels, " kernels");
      CHECK(kernels >= 6);  // 3 forward GEMMs at least, the loss, the optimizer's two passes
    }
  }
  const auto w = locus::to<locus::cpu>(std::as_const(m.parameters()).master());
  std::vector<float> wv(static_cast<std::size_t>(w.numel()));
  std::memcpy(wv.data(), w.data_handle(), wv.size() * sizeof(float));
  return {losses, wv};
}

index_t full_rows(int) { return 32; }
index_t with_partial(int s) { return s == 20 ? 17 : 32; }
}  // namespace

TEST_CASE("graph mode: 50 steps replay the ordinary step's losses bit for bit (bf16_mixed, no scaler)") {
  const auto data = batches(50, full_rows);
  const auto plain = train<locus::amp::bf16_mixed, false>(false, data, 1);
  const auto graph = train<locus::amp::bf16_mixed, false>(true, data, 1);
  REQUIRE(plain.first.size() == 50);
  CHECK(plain.first == graph.first);  // exact
  CHECK(plain.second == graph.second);
  CHECK(plain.first.back() < plain.first.front());  // it trains
}

TEST_CASE("graph mode: fp16_mixed with a grad scaler, accumulation over 2 and a partial batch, bit for bit") {
  const auto data = batches(50, with_partial);
  const auto plain = train<locus::amp::fp16_mixed, true>(false, data, 2);
  const auto graph = train<locus::amp::fp16_mixed, true>(true, data, 2);
  CHECK(plain.first == graph.first);
  CHECK(plain.second == graph.second);
}

TEST_CASE("graph mode: a model with dropout is refused at construction") {
  nn::sequential m(nn::linear<locus::cuda, locus::amp::fp32>(4, 4), nn::dropout<locus::cuda, locus::amp::fp32>(0.5f));
  locus::optim::adamw<locus::cuda> opt(m.parameters());
  CHECK_THROWS_AS(locus::train::trainer(m, opt, nn::cross_entropy{}, {.cuda_graph = true}), locus::value_error);
}

