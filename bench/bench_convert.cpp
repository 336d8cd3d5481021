// Host microbenchmarks, 2^24 elements each:
//   * f32 -> f16 and f32 -> bf16 bulk conversion through locus::detail::convert_n (run-time
//     dispatch: F16C for f16, AVX2 for bf16, else the portable loop), against a
//     hand-written F16C loop (the f16 ceiling; no x86 instruction converts to bf16, so it
//     is the bf16 bar too) and the portable bf16 loop;
//   * host transfers of 64 MiB: locus::to<locus::pinned> (new tensor, from the caching
//     allocator) and locus::copy into an existing pinned tensor, against std::memcpy.
// Throughput counts bytes read + bytes written (SetBytesProcessed). Every variant's
// output is checked against convert_n's once (bit for bit) before it is timed.
#include <benchmark/benchmark.h>

#include <locus/locus.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#  define BENCH_HAS_F16C_LOOP 1
#  include <immintrin.h>
#else
#  define BENCH_HAS_F16C_LOOP 0
#endif

namespace {

constexpr std::size_t n_elems = std::size_t{1} << 24;
constexpr locus::index_t n_idx = static_cast<locus::index_t>(n_elems);

/// The input: normally distributed floats (never zeros), made once.
const locus::tensor<float, locus::cpu, 1>& input() {
  static const auto x = locus::randn<float, locus::cpu>({n_idx}, /*seed=*/2024);
  return x;
}

#if BENCH_HAS_F16C_LOOP
/// The hand-written baseline: eight floats per _mm256_cvtps_ph, round to nearest even.
__attribute__((target("avx,f16c"), noinline)) void f16c_loop(const float* src,
                                                              std::uint16_t* dst, std::size_t n) {
  const std::size_t full = n - n % 8;
  for (std::size_t i = 0; i < full; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (std::size_t i = full; i < n; ++i) {
    const locus::f16 h(src[i]);
    std::memcpy(dst + i, &h, sizeof h);
  }
}
#endif

template <class H>
bool same_bits(const H* a, const H* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(H)) == 0;
}

void set_throughput(benchmark::State& state, std::size_t bytes_per_iteration) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(bytes_per_iteration));
}

// ---- conversions -------------------------------------------------------------------------

void BM_convert_n_f32_to_f16(benchmark::State& state) {
  const float* src = input().data();
  std::vector<locus::f16> dst(n_elems);  // written once here: no page faults when timed
  locus::detail::convert_n(src, dst.data(), n_elems);
  for (auto _ : state) {
    locus::detail::convert_n(src, dst.data(), n_elems);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_throughput(state, n_elems * (sizeof(float) + sizeof(locus::f16)));
  state.SetLabel(locus::detail::has_f16c() ? "path=f16c" : "path=portable");
}

void BM_f16c_loop_f32_to_f16(benchmark::State& state) {
#if BENCH_HAS_F16C_LOOP
  if (!locus::detail::has_f16c()) {
    state.SkipWithError("this CPU has no F16C");
    return;
  }
  const float* src = input().data();
  std::vector<std::uint16_t> dst(n_elems);
  std::vector<locus::f16> ref(n_elems);
  f16c_loop(src, dst.data(), n_elems);
  locus::detail::convert_n(src, ref.data(), n_elems);
  if (std::memcmp(dst.data(), ref.data(), n_elems * 2) != 0) {
    state.SkipWithError("hand-written F16C loop and convert_n disagree");
    return;
  }
  for (auto _ : state) {
    f16c_loop(src, dst.data(), n_elems);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_throughput(state, n_elems * (sizeof(float) + 2));
#else
  state.SkipWithError("not an x86-64 GCC/clang build");
#endif
}

void BM_convert_n_f32_to_bf16(benchmark::State& state) {
  const float* src = input().data();
  std::vector<locus::bf16> dst(n_elems);
  locus::detail::convert_n(src, dst.data(), n_elems);
  for (auto _ : state) {
    locus::detail::convert_n(src, dst.data(), n_elems);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_throughput(state, n_elems * (sizeof(float) + sizeof(locus::bf16)));
  state.SetLabel(locus::detail::has_avx2() ? "path=avx2" : "path=portable");
}

void BM_portable_f32_to_bf16(benchmark::State& state) {
  const float* src = input().data();
  std::vector<locus::bf16> dst(n_elems), ref(n_elems);
  locus::detail::convert_n_portable(src, dst.data(), n_elems);
  locus::detail::convert_n(src, ref.data(), n_elems);
  if (!same_bits(dst.data(), ref.data(), n_elems)) {
    state.SkipWithError("portable bf16 loop and convert_n disagree");
    return;
  }
  for (auto _ : state) {
    locus::detail::convert_n_portable(src, dst.data(), n_elems);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_throughput(state, n_elems * (sizeof(float) + sizeof(locus::bf16)));
}

// ---- host transfers ------------------------------------------------------------------------

constexpr std::size_t transfer_bytes = n_elems * sizeof(float);

void BM_memcpy_host(benchmark::State& state) {
  const float* src = input().data();
  std::vector<float> dst(n_elems);
  std::memcpy(dst.data(), src, transfer_bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src, transfer_bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_throughput(state, 2 * transfer_bytes);
}

#if LOCUS_HAS_CUDA
std::string pinned_label() {
  return locus::memory_stats<locus::pinned>().fallback
             ? "pinned=fallback (no driver: pageable host memory)"
             : "pinned=page-locked";
}

void BM_to_pinned(benchmark::State& state) {
  const auto& src = input();
  {
    auto warm = locus::to<locus::pinned>(src);  // the block is then cached
    if (std::memcmp(warm.data(), src.data(), transfer_bytes) != 0) {
      state.SkipWithError("to<pinned> copied wrong bytes");
      return;
    }
  }
  for (auto _ : state) {
    auto p = locus::to<locus::pinned>(src);
    benchmark::DoNotOptimize(p.data());
    benchmark::ClobberMemory();
  }
  set_throughput(state, 2 * transfer_bytes);
  state.SetLabel(pinned_label());
}

void BM_copy_cpu_to_pinned(benchmark::State& state) {
  const auto& src = input();
  auto dst = locus::empty<float, locus::pinned>({n_idx});
  locus::copy(src, dst);
  for (auto _ : state) {
    locus::copy(src, dst);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_throughput(state, 2 * transfer_bytes);
  state.SetLabel(pinned_label());
}
#else
void BM_to_pinned(benchmark::State& state) { state.SkipWithError("locus built without CUDA: no pinned device"); }
void BM_copy_cpu_to_pinned(benchmark::State& state) { state.SkipWithError("locus built without CUDA: no pinned device"); }
#endif

}  // namespace

BENCHMARK(BM_convert_n_f32_to_f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_f16c_loop_f32_to_f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_convert_n_f32_to_bf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_portable_f32_to_bf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_memcpy_host)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_to_pinned)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_copy_cpu_to_pinned)->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("elements", std::to_string(n_elems));
  benchmark::AddCustomContext("bytes_processed", "bytes read + bytes written");
  benchmark::AddCustomContext("locus_f16c", locus::detail::has_f16c() ? "yes" : "no");
  benchmark::AddCustomContext("locus_avx2", locus::detail::has_avx2() ? "yes" : "no");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
