// Host kernel microbenchmarks, each against its peer in the same run (ratios, not
// absolute times, are the figures that count on a shared machine):
//   * fused relu(a*x+b) over 2^26 floats  vs a hand-written OpenMP simd loop, and vs
//     three unfused passes (t = a*x; t = t+b; y = relu(t));
//   * typed a + b                         vs raw thrust::transform(omp::par) on the same buffers;
//   * sum over 2^26 floats                vs a hand-written OpenMP simd reduction
//                                            (and the absolute error of each);
//   * f32 -> bf16 / f16 cast of a tensor  (the F16C peer is in bench_convert);
//   * softmax over rows of 256x1024       vs a hand-written loop.
// Bytes/s count bytes read + written.
#include <benchmark/benchmark.h>

#include <locus/locus.hpp>

#include <thrust/functional.h>
#include <thrust/transform.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr locus::index_t big = locus::index_t{1} << 26;

struct inputs {
  locus::tensor<float, locus::cpu, 1> a = locus::randn<float, locus::cpu>({big}, 1);
  locus::tensor<float, locus::cpu, 1> x = locus::randn<float, locus::cpu>({big}, 2);
  locus::tensor<float, locus::cpu, 1> b = locus::randn<float, locus::cpu>({big}, 3);
  locus::tensor<float, locus::cpu, 1> y = locus::zeros<float, locus::cpu>({big});
  locus::tensor<float, locus::cpu, 1> t = locus::zeros<float, locus::cpu>({big});
};
inputs& in() {
  static inputs v;
  return v;
}

void BM_fused_relu_axpb_locus(benchmark::State& st) {
  auto& v = in();
  for (auto _ : st) {
    v.y = locus::relu(v.a * v.x + v.b);
    benchmark::DoNotOptimize(v.y.data_handle());
  }
  st.SetBytesProcessed(st.iterations() * big * 4 * 4);
}
void BM_fused_relu_axpb_omp_loop(benchmark::State& st) {
  auto& v = in();
  const float *a = v.a.data(), *x = v.x.data(), *b = v.b.data();
  float* y = v.y.data();
  for (auto _ : st) {
#pragma omp parallel for simd
    for (locus::index_t i = 0; i < big; ++i) {
      const float r = a[i] * x[i] + b[i];
      y[i] = r < 0.0f ? 0.0f : r;
    }
    benchmark::DoNotOptimize(y);
  }
  st.SetBytesProcessed(st.iterations() * big * 4 * 4);
}
void BM_unfused_relu_axpb_locus(benchmark::State& st) {
  auto& v = in();
  for (auto _ : st) {
    v.t = v.a * v.x;
    v.t = v.t + v.b;
    v.y = locus::relu(v.t);
    benchmark::DoNotOptimize(v.y.data_handle());
  }
  st.SetBytesProcessed(st.iterations() * big * 4 * 4);
}

void BM_add_locus(benchmark::State& st) {
  auto& v = in();
  for (auto _ : st) {
    v.y = v.a + v.b;
    benchmark::DoNotOptimize(v.y.data_handle());
  }
  st.SetBytesProcessed(st.iterations() * big * 4 * 3);
}
void BM_add_thrust(benchmark::State& st) {
  auto& v = in();
  for (auto _ : st) {
    thrust::transform(thrust::omp::par, v.a.data(), v.a.data() + big, v.b.data(), v.y.data(),
                      thrust::plus<float>());
    benchmark::DoNotOptimize(v.y.data_handle());
  }
  st.SetBytesProcessed(st.iterations() * big * 4 * 3);
}

double exact_sum() {
  static const double s = [] {
    double acc = 0;
    for (float f : in().a.span()) acc += f;
    return acc;
  }();
  return s;
}
void BM_sum_locus(benchmark::State& st) {
  auto& v = in();
  float r = 0;
  for (auto _ : st) {
    r = locus::sum(v.a).item();
    benchmark::DoNotOptimize(r);
  }
  st.counters["abs_error"] = std::abs(double(r) - exact_sum());
  st.SetBytesProcessed(st.iterations() * big * 4);
}
void BM_sum_omp_simd_loop(benchmark::State& st) {
  auto& v = in();
  const float* a = v.a.data();
  float r = 0;
  for (auto _ : st) {
    float s = 0;
#pragma omp parallel for simd reduction(+ : s)
    for (locus::index_t i = 0; i < big; ++i) s += a[i];
    r = s;
    benchmark::DoNotOptimize(r);
  }
  st.counters["abs_error"] = std::abs(double(r) - exact_sum());
  st.SetBytesProcessed(st.iterations() * big * 4);
}

void BM_cast_bf16_locus(benchmark::State& st) {
  auto& v = in();
  locus::tensor<locus::bf16, locus::cpu, 1> h = locus::cast<locus::bf16>(v.a);
  for (auto _ : st) {
    h = locus::cast<locus::bf16>(v.a);
    benchmark::DoNotOptimize(h.data_handle());
  }
  st.SetBytesProcessed(st.iterations() * big * 6);
}
void BM_cast_f16_locus(benchmark::State& st) {
  auto& v = in();
  locus::tensor<locus::f16, locus::cpu, 1> h = locus::cast<locus::f16>(v.a);
  for (auto _ : st) {
    h = locus::cast<locus::f16>(v.a);
    benchmark::DoNotOptimize(h.data_handle());
  }
  st.SetBytesProcessed(st.iterations() * big * 6);
}

void BM_softmax_locus(benchmark::State& st) {
  auto x = locus::randn<float, locus::cpu>({256, 1024}, 4);
  for (auto _ : st) {
    auto y = locus::softmax(x, 1);
    benchmark::DoNotOptimize(y.data_handle());
  }
  st.SetBytesProcessed(st.iterations() * 256 * 1024 * 8);
}
void BM_softmax_loop(benchmark::State& st) {
  auto x = locus::randn<float, locus::cpu>({256, 1024}, 4);
  std::vector<float> y(256 * 1024);
  const float* p = x.data();
  for (auto _ : st) {
#pragma omp parallel for
    for (int r = 0; r < 256; ++r) {
      const float* row = p + r * 1024;
      float* out = y.data() + r * 1024;
      float m = row[0];
      for (int j = 1; j < 1024; ++j) m = row[j] > m ? row[j] : m;
      float s = 0;
      for (int j = 0; j < 1024; ++j) s += (out[j] = std::exp(row[j] - m));
      const float inv = 1.0f / s;
      for (int j = 0; j < 1024; ++j) out[j] *= inv;
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.SetBytesProcessed(st.iterations() * 256 * 1024 * 8);
}

}  // namespace

BENCHMARK(BM_fused_relu_axpb_locus)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fused_relu_axpb_omp_loop)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_unfused_relu_axpb_locus)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_add_locus)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_add_thrust)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_sum_locus)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_sum_omp_simd_loop)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cast_bf16_locus)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cast_f16_locus)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_softmax_locus)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_softmax_loop)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
