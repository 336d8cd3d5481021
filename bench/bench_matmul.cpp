// Host GEMM microbenchmarks, f32, square n x n x n for n = 512, 1024, 2048:
//   * locus::matmul_into(c, a, b): the library path on existing buffers (type rules,
//     shape checks, layout mapping, then cblas_sgemm when the build has BLAS);
//   * locus::matmul(a, b): the same, allocating its result each time;
//   * cblas_sgemm called directly on the same buffers: the ceiling (BLAS builds only);
//   * locus::detail::gemm_fallback: the blocked GEMM builds without BLAS use.
// Throughput is FLOP/s = 2 n^3 per iteration (counter "FLOP/s"). Each variant's result is
// checked once against the first one's before it is timed.
#include <benchmark/benchmark.h>

#include <locus/locus.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

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

const char* host_path() { return locus::detail::has_blas ? "path=blas" : "path=fallback (no BLAS)"; }

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

}  // namespace

BENCHMARK(BM_locus_matmul_into)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cblas_sgemm)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_locus_matmul)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gemm_fallback)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("locus_host_gemm", locus::detail::has_blas ? "blas" : "fallback");
  benchmark::AddCustomContext("flops", "2 n^3 per iteration");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
