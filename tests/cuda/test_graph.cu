// CUDA suite, issue 13's graph mode: 50 steps of the trainer with cuda_graph = true give
// the same losses, bit for bit, as 50 ordinary steps from the same seed (bf16_mixed
// without a scaler, fp16_mixed with one, accumulation over 2 micro-batches, a schedule,
// and a partial batch that drops and recaptures the graphs; accumulation over 3, where
// the micro-batch branch would be captured before the update branch warmed up; an epoch
// fed by a loader<cuda>, whose batches have pending blocks while the step captures); the
// graphs are captured (one per branch) and hold no host nodes. An unfused step
// (check_finite = false without a scaler) is refused.
// The bit-for-bit comparisons assume both runs get cuBLASLt's full workspace (the plan
// cache keys on its size, and an out-of-memory workspace picks another algorithm):
// enough_memory() requires 1 GiB free first, so the 32 MiB request cannot fail in either.
// Skipped, with the reason, without a GPU (tests/cuda/main.cu).
#include <doctest/doctest.h>

#include <cstring>
#include <span>
#include <vector>

#include <locus/locus.hpp>
#include <locus/data/loader.hpp>
#include <locus/train.hpp>

namespace {
using locus::index_t;
namespace nn = locus::nn;

/// Both runs of a comparison must get the same cuBLASLt workspace (see the header).
void require_enough_memory() {
  std::size_t free_b = 0, total_b = 0;
  REQUIRE(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
  REQUIRE_MESSAGE(free_b > (std::size_t{1} << 30), "needs 1 GiB free for equal cuBLASLt workspaces; free: ", free_b);
}

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
  require_enough_memory();
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
    if (graph && accumulate > 1) CHECK(t.captured_graph(0) != nullptr);
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


TEST_CASE("graph mode: accumulation over 3 (every branch warms up before the first capture), 50 steps bit for bit") {
  // With accumulate = 3 the micro-batch branch comes round twice before the update
  // branch's first step: captured then, the update branch's eager warm-up would allocate
  // from the pool that holds the micro-batch graph's temporaries.
  const auto data = batches(50, full_rows);
  const auto plain = train<locus::amp::bf16_mixed, false>(false, data, 3);
  const auto graph = train<locus::amp::bf16_mixed, false>(true, data, 3);
  REQUIRE(plain.first.size() == 50);
  CHECK(plain.first == graph.first);
  CHECK(plain.second == graph.second);
  const auto scaled_plain = train<locus::amp::fp16_mixed, true>(false, data, 3);
  const auto scaled_graph = train<locus::amp::fp16_mixed, true>(true, data, 3);
  CHECK(scaled_plain.first == scaled_graph.first);
  CHECK(scaled_plain.second == scaled_graph.second);
}

TEST_CASE("graph mode: an unfused step (check_finite = false, no scaler) is refused at construction") {
  auto m = mlp<locus::amp::fp32>(1);
  locus::optim::adamw<locus::cuda> opt(m.parameters());
  bool refused = false;
  try {
    locus::train::trainer t(m, opt, nn::cross_entropy{}, {.cuda_graph = true, .check_finite = false});
  } catch (const locus::value_error& e) {
    refused = true;
    CHECK(std::string(e.what()).find("check_finite = false") != std::string::npos);
  }
  CHECK(refused);
  // The fused request builds and steps.
  locus::train::trainer t(m, opt, nn::cross_entropy{}, {.cuda_graph = true});
  const auto data = batches(3, full_rows);
  for (const auto& b : data) t.step(b.x, b.y);
  CHECK(t.optimizer_steps() == 3);
  CHECK(t.captured_graph(1) != nullptr);
}

namespace {
/// 64 features in [-1, 1), a label per sample: the same for every run.
struct graph_source {
  index_t n = 320;
  index_t size() const { return n; }
  index_t features() const { return 64; }
  std::int64_t load(index_t i, std::span<float> x) const {
    for (std::size_t k = 0; k < x.size(); ++k)
      x[k] = static_cast<float>((i * 131 + static_cast<index_t>(k) * 17) % 200) / 100.0f - 1.0f;
    return (i * 7) % 10;
  }
};

std::pair<std::vector<double>, std::vector<float>> train_from_loader(bool graph, int accumulate) {
  require_enough_memory();
  auto m = mlp<locus::amp::bf16_mixed>(7);
  locus::optim::adamw<locus::cuda> opt(m.parameters(), {.lr = 3e-3});
  locus::train::options o{.accumulate = accumulate, .cuda_graph = graph};
  o.schedule = locus::optim::cosine_lr{.total_steps = 30, .min_lr = 1e-4};
  locus::train::trainer t(m, opt, nn::cross_entropy{}, o);
  graph_source src;
  // Batches of 48, the last of 32 (320 % 48): the graphs are dropped and captured again each epoch.
  locus::data::loader<locus::cuda, graph_source> l(src, {.batch_size = 48, .shuffle = true, .seed = 5, .prefetch = 3});
  std::vector<double> losses;
  for (int e = 0; e < 3; ++e) losses.push_back(t.train_epoch(l, {.epoch = e}).loss);
  if (graph) CHECK(t.captured_graph(1) != nullptr);
  const auto w = locus::to<locus::cpu>(std::as_const(m.parameters()).master());
  std::vector<float> wv(static_cast<std::size_t>(w.numel()));
  std::memcpy(wv.data(), w.data_handle(), wv.size() * sizeof(float));
  return {losses, wv};
}
}  // namespace

TEST_CASE("graph mode: train_epoch over a loader<cuda> (pending batch blocks while capturing) equals the ordinary run") {
  for (int accumulate : {1, 3}) {
    CAPTURE(accumulate);
    const auto plain = train_from_loader(false, accumulate);
    const auto graph = train_from_loader(true, accumulate);
    REQUIRE(plain.first.size() == 3);
    CHECK(plain.first == graph.first);
    CHECK(plain.second == graph.second);
    CHECK(plain.first.back() < plain.first.front());
  }
}
