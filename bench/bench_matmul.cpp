// Host GEMM microbenchmarks, f32, square n x n x n for n = 512, 1024, 2048:
//   * locus::matmul_into(c, a, b): the library path on existing buffers (type rules,
//     shape checks, layout mapping, then cblas_sgemm when the build has BLAS);
//   * locus::matmul(a, b): the same, allocating its result each time;
//   * cblas_sgemm called directly on the same buffers: the ceiling (BLAS builds only);
//   * locus::detail::gemm_fallback: the blocked GEMM builds without BLAS use.
// Throughput is FLOP/s = 2 n^3 per iteration (counter "FLOP/s"). Each variant's result is
// checked once against the first one's before it is timed.
//
// The floor of an MLP training step (bench/run's "floor" rows, issue 19):
//   * BM_mlp_step_gemms/B/M: only the GEMMs of one training step of model M (0:
//     784-256-128-10, the bench model; 1: 784-512-256-10, the main job's) at batch B,
//     through cblas_sgemm with the step's exact shapes and transposes: every layer's
//     forward Y = X W^T, every dW = dY^T X, and dX = dY W for every layer but the first;
//   * BM_stream_triad: a[i] = b[i] + s * c[i] over three 64 MiB f32 arrays (outside any
//     cache), OpenMP, counter "bytes/s" = 12 bytes per element: the memory bandwidth
//     the optimizer's 28 bytes a parameter a step are priced at.
#include <benchmark/benchmark.h>

#include <locus/locus.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using locus::index_t;

struct operands {
  locus::tensor<float, locus::cpu, 2> a, b, c;
};

/// Normally distributed inputs (never zeros), made once per size.
operands& inputs(index_t n) {
  static operands ops[3];
  operands& o = ops[n == 512 ? 0 : n == 1024 ? 1 : 2];
  if (o.a.numel() != n * n) {
    o.a = locus::randn<float, locus::cpu>({n, n}, 11);
    o.b = locus::randn<float, locus::cpu>({n, n}, 12);
    o.c = locus::empty<float, locus::cpu>({n, n});
  }
  return o;
}

/// The reference result of a size, computed once (BLAS when there is one).
const locus::tensor<float, locus::cpu, 2>& reference(index_t n) {
  static locus::tensor<float, locus::cpu, 2> refs[3];
  auto& r = refs[n == 512 ? 0 : n == 1024 ? 1 : 2];
  if (r.numel() != n * n) r = locus::matmul(inputs(n).a, inputs(n).b);
  return r;
}

bool matches_reference(const float* c, index_t n) {
  const float* r = reference(n).data();
  double worst = 0, scale = 0;
  for (index_t i = 0; i < n * n; ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(c[i] - r[i])));
    scale = std::max(scale, static_cast<double>(std::abs(r[i])));
  }
  return worst <= 1e-5 * scale;
}

void set_flops(benchmark::State& state, index_t n) {
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(n) * n * n,
                                                benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::OneK::kIs1000);
}

std::string host_path() { return std::string("path=") + locus::name_of(locus::current_host_gemm()); }

void BM_locus_matmul_into(benchmark::State& state) {
  const index_t n = state.range(0);
  auto& o = inputs(n);
  locus::matmul_into(o.c, o.a, o.b);
  if (!matches_reference(o.c.data(), n)) {
    state.SkipWithError("locus::matmul_into disagrees with the reference");
    return;
  }
  for (auto _ : state) {
    locus::matmul_into(o.c, o.a, o.b);
    benchmark::DoNotOptimize(o.c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, n);
  state.SetLabel(host_path());
}

void BM_locus_matmul(benchmark::State& state) {
  const index_t n = state.range(0);
  auto& o = inputs(n);
  const auto checked = locus::matmul(o.a, o.b);
  if (!matches_reference(checked.data(), n)) {
    state.SkipWithError("locus::matmul disagrees with the reference");
    return;
  }
  for (auto _ : state) {
    auto c = locus::matmul(o.a, o.b);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, n);
  state.SetLabel(host_path());
}

void BM_cblas_sgemm(benchmark::State& state) {
#if LOCUS_HAS_BLAS
  const index_t n = state.range(0);
  auto& o = inputs(n);
  const int in = static_cast<int>(n);
  const auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, in, in, in, 1.0f, o.a.data(), in,
                o.b.data(), in, 0.0f, o.c.data(), in);
  };
  gemm();
  if (!matches_reference(o.c.data(), n)) {
    state.SkipWithError("cblas_sgemm disagrees with the reference");
    return;
  }
  for (auto _ : state) {
    gemm();
    benchmark::DoNotOptimize(o.c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, n);
#else
  state.SkipWithError("locus built without BLAS (LOCUS_HAS_BLAS=0): no cblas_sgemm to compare with");
#endif
}

void BM_gemm_fallback(benchmark::State& state) {
  const index_t n = state.range(0);
  auto& o = inputs(n);
  const auto gemm = [&] {
    locus::detail::gemm_fallback<float>(n, n, n, o.a.data(), n, 1, o.b.data(), n, 1, o.c.data(), n);
  };
  gemm();
  if (!matches_reference(o.c.data(), n)) {
    state.SkipWithError("gemm_fallback disagrees with the reference");
    return;
  }
  for (auto _ : state) {
    gemm();
    benchmark::DoNotOptimize(o.c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, n);
}

/// Layer widths of the two MLPs bench_train and the main job train.
std::vector<index_t> mlp_widths(std::int64_t model) {
  return model == 0 ? std::vector<index_t>{784, 256, 128, 10} : std::vector<index_t>{784, 512, 256, 10};
}

void BM_mlp_step_gemms(benchmark::State& state) {
#if LOCUS_HAS_BLAS
  const index_t batch = state.range(0);
  const auto w = mlp_widths(state.range(1));
  const std::size_t layers = w.size() - 1;
  // Activations (and their gradients) per layer boundary, weights and dW per layer.
  std::vector<locus::tensor<float, locus::cpu, 2>> act, grad, weight, dweight;
  for (std::size_t l = 0; l <= layers; ++l) {
    act.push_back(locus::randn<float, locus::cpu>({batch, w[l]}, 100 + l));
    grad.push_back(locus::randn<float, locus::cpu>({batch, w[l]}, 200 + l));
  }
  double flop = 0;
  for (std::size_t l = 0; l < layers; ++l) {
    weight.push_back(locus::randn<float, locus::cpu>({w[l + 1], w[l]}, 300 + l));
    dweight.push_back(locus::empty<float, locus::cpu>({w[l + 1], w[l]}));
    flop += 2.0 * 2.0 * static_cast<double>(batch) * w[l] * w[l + 1];  // forward + dW
    if (l > 0) flop += 2.0 * static_cast<double>(batch) * w[l] * w[l + 1];  // dX
  }
  const int b = static_cast<int>(batch);
  for (auto _ : state) {
    for (std::size_t l = 0; l < layers; ++l) {  // forward: act[l+1] = act[l] W^T
      const int in = static_cast<int>(w[l]), out = static_cast<int>(w[l + 1]);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, out, in, 1.0f, act[l].data(), in, weight[l].data(),
                  in, 0.0f, act[l + 1].data(), out);
    }
    for (std::size_t l = layers; l-- > 0;) {  // backward
      const int in = static_cast<int>(w[l]), out = static_cast<int>(w[l + 1]);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, b, 1.0f, grad[l + 1].data(), out,
                  act[l].data(), in, 0.0f, dweight[l].data(), in);
      if (l > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, in, out, 1.0f, grad[l + 1].data(), out,
                    weight[l].data(), in, 0.0f, grad[l].data(), in);
    }
    benchmark::ClobberMemory();
  }
  std::int64_t params = 0;
  for (std::size_t l = 0; l < layers; ++l) params += w[l] * w[l + 1] + w[l + 1];
  state.counters["FLOP/s"] =
      benchmark::Counter(flop, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::OneK::kIs1000);
  state.counters["params"] = static_cast<double>(params);
  state.counters["batch"] = static_cast<double>(batch);
#else
  state.SkipWithError("locus built without BLAS (LOCUS_HAS_BLAS=0): no GEMM floor to measure");
#endif
}

void BM_stream_triad(benchmark::State& state) {
  const index_t n = index_t{1} << 24;  // 64 MiB per array
  static auto a = locus::zeros<float, locus::cpu>({n});
  static auto b = locus::ones<float, locus::cpu>({n});
  static auto c = locus::full<float, locus::cpu>({n}, 2.0f);
  float* pa = a.data();
  const float* pb = b.data();
  const float* pc = c.data();
  for (auto _ : state) {
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) pa[i] = pb[i] + 0.5f * pc[i];
    benchmark::ClobberMemory();
  }
  if (pa[n - 1] != 2.0f) state.SkipWithError("triad computed a wrong value");
  state.counters["bytes/s"] = benchmark::Counter(12.0 * static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::OneK::kIs1024);
}

}  // namespace

BENCHMARK(BM_mlp_step_gemms)
    ->ArgsProduct({{32, 128, 512}, {0, 1}})
    ->ArgNames({"batch", "model"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_stream_triad)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_locus_matmul_into)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cblas_sgemm)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_locus_matmul)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gemm_fallback)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("locus_host_gemm", locus::name_of(locus::current_host_gemm()));
  benchmark::AddCustomContext("flops", "2 n^3 per iteration");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
