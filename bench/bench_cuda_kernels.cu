// CUDA kernel microbenchmarks for the GPU targets of issue 3, each beside its peer in the
// same run (bench/gpu-check prints the ratios and the targets under its table):
//   * bandwidth, 2^26 f32 (256 MiB per array):
//       BM_d2d_copy                cudaMemcpyAsync device -> device: the reference
//                                  bandwidth (bytes = read + written = 2 x 4 B x 2^26);
//       BM_fused_relu_axpb_cuda    locus y = relu(a * x + b) (4 arrays x 4 B x 2^26),
//                                  target >= 0.85 x the copy's bytes/s;
//       BM_fused_relu_axpb_cuda_kernel  a hand-written float4 kernel doing the same, for
//                                  what the hardware gives an elementwise pass;
//       BM_sum_cuda                locus::sum (4 B x 2^26 read), target >= 0.85 x the copy;
//       BM_sum_cub                 cub::DeviceReduce::Sum on the raw pointer (f32
//                                  accumulation; locus accumulates in f64);
//       BM_add_cuda                typed a + b (3 x 4 B x 2^26), beside
//       BM_add_thrust_cuda         raw thrust::transform on the same buffers;
//   * bf16 GEMM, row-major [n, n] x [n, n], f32 accumulation (CUBLAS_COMPUTE_32F):
//       BM_matmul_bf16_N_locus            locus::matmul_into, bf16 output (as PyTorch's
//                                         bf16 @ bf16), N = 8192 (the target) and 4096;
//       BM_matmul_bf16_N_cublaslt         cublasLtMatmul called directly: same layouts,
//                                         types and compute type, the heuristic's first
//                                         algorithm, a workspace of the size locus uses
//                                         (32 MiB on sm_90+, else 4 MiB), descriptors and
//                                         algorithm made once outside the timed loop;
//       BM_matmul_bf16_8192_f32out_locus / _cublaslt  the same with an f32 output;
//     FLOP/s = 2 n^3 per call (counter "FLOP/s"); target: locus >= 0.9 x cuBLASLt.
//   * training kernels (issue 13), bytes/s each beside BM_d2d_copy (and, for the
//     main job's small shapes, BM_d2d_copy_256KiB: a copy of 128 x 512 f32, which is
//     launch-bound as they are):
//       BM_bias_grad_relu_128x512_cuda, BM_bias_grad_relu_128x256_cuda
//                                  the tiled bias + relu gradient of the MLP's hidden
//                                  layers (bytes = gy and y read, dz written);
//       BM_bias_grad_none_128x10_cuda  its output layer (bytes = gy read);
//       BM_softmax_128x10_cuda, BM_softmax_4096x50257_cuda
//                                  locus::softmax along the last axis (warp per row,
//                                  block per row; bytes = read + written);
//       BM_cross_entropy_128x10_cuda, BM_cross_entropy_4096x50257_cuda
//                                  the fused loss and gradient (bytes = logits read +
//                                  gradient written; the labels and the mean are noise).
// Timing: CUDA events on locus's current stream bracket a batch of back-to-back calls (so
// the host's launch overhead overlaps the GPU's work, as in a real pipeline and in the
// PyTorch peers, which time many calls between two synchronizes); the time reported per
// iteration is the batch's time / calls (manual time), the same way for every peer. Each
// case runs a fixed number of iterations after a warm-up, so the whole binary takes a
// few seconds whatever --benchmark_min_time says.
// Each locus result is checked (against a host reference, or against cuBLASLt) before it
// is timed. Without a usable CUDA device every case reports "no CUDA device" and is skipped.
#include <benchmark/benchmark.h>

#include "cuda_bench.hpp"

#include <locus/locus.hpp>
#include <locus/nn/kernels.hpp>
#include <locus/nn/loss.hpp>

#include <cub/device/device_reduce.cuh>
#include <cublasLt.h>
#include <thrust/execution_policy.h>
#include <thrust/functional.h>
#include <thrust/transform.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr locus::index_t big = locus::index_t{1} << 26;
constexpr std::int64_t f32_bytes = std::int64_t{4} * big;  // one 2^26 f32 array
constexpr int bw_calls = 10;                             // calls per timed batch
constexpr int bw_iterations = 50;                        // batches per case

using locus_bench::event_timer;
using locus_bench::guarded;
using locus_bench::need_device;

/// The timed loop every case shares: `warmup` calls, then per iteration one batch of
/// `calls` calls between two events; the iteration's time is the batch's / calls.
template <class F>
void time_batches(benchmark::State& st, int calls, F&& f, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) f();
  LOCUS_CUDA_CHECK(cudaStreamSynchronize(locus::detail::current_stream()));
  event_timer t;
  for (auto _ : st) {
    t.start();
    for (int c = 0; c < calls; ++c) f();
    st.SetIterationTime(t.stop() / calls);
  }
  LOCUS_CUDA_CHECK(cudaGetLastError());
}

std::string batch_label(int calls) { return std::to_string(calls) + " calls per event-timed batch"; }

// ---- inputs ---------------------------------------------------------------------------------

/// The 2^26-element f32 operands, made once (on first use, so only with a device).
struct vectors {
  locus::tensor<float, locus::cuda, 1> a = locus::randn<float, locus::cuda>({big}, 1);
  locus::tensor<float, locus::cuda, 1> x = locus::randn<float, locus::cuda>({big}, 2);
  locus::tensor<float, locus::cuda, 1> b = locus::randn<float, locus::cuda>({big}, 3);
  locus::tensor<float, locus::cuda, 1> y = locus::zeros<float, locus::cuda>({big});
  std::vector<float> host_a, host_x, host_b;  // host copies for the checks
  double exact_sum_a = 0;                     // sum of a in double

  vectors() {
    host_a = to_host(a);
    host_x = to_host(x);
    host_b = to_host(b);
    for (float f : host_a) exact_sum_a += f;
  }
  static std::vector<float> to_host(const locus::tensor<float, locus::cuda, 1>& t) {
    std::vector<float> h(static_cast<std::size_t>(big));
    LOCUS_CUDA_CHECK(cudaMemcpy(h.data(), t.data_handle(), h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
};
vectors& vec() {
  static vectors v;
  return v;
}

/// Elements [off, off + 4096) of a device array, for spot checks.
std::vector<float> slice(const float* dev, std::size_t off, std::size_t count = 4096) {
  std::vector<float> h(count);
  LOCUS_CUDA_CHECK(cudaMemcpy(h.data(), dev + off, count * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}
constexpr std::size_t spot_offsets[] = {0, static_cast<std::size_t>(big) / 2 + 123,
                                        static_cast<std::size_t>(big) - 4096};

/// What element i should be, and the magnitude of the terms that made it.
struct expected {
  float value, scale;
};

/// y[i] agrees with ref(i) at the spots: both sides do the same float operations, but
/// either may contract a * x + b to an fma, so each may be off by an ulp of its terms.
template <class Ref>
bool spot_check(const float* y_dev, Ref ref) {
  for (std::size_t off : spot_offsets) {
    const std::vector<float> h = slice(y_dev, off);
    for (std::size_t i = 0; i < h.size(); ++i) {
      const expected e = ref(off + i);
      if (!(std::abs(h[i] - e.value) <= 1e-6f * (1.0f + e.scale))) return false;
    }
  }
  return true;
}

// ---- the reference bandwidth: device-to-device copy ----------------------------------------

void BM_d2d_copy(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    auto& v = vec();
    const cudaStream_t s = locus::detail::current_stream();
    time_batches(st, bw_calls, [&] {
      LOCUS_CUDA_CHECK(cudaMemcpyAsync(v.y.data_handle(), v.a.data_handle(), f32_bytes,
                                       cudaMemcpyDeviceToDevice, s));
    });
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 2 * f32_bytes);
    st.SetLabel("cudaMemcpyAsync; bytes = read + written; " + batch_label(bw_calls));
  });
}

// ---- fused elementwise -----------------------------------------------------------------------

expected relu_axpb(float a, float x, float b) {
  const float r = a * x + b;
  return {r < 0.0f ? 0.0f : r, std::abs(a * x) + std::abs(b)};
}

void BM_fused_relu_axpb_cuda(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    auto& v = vec();
    v.y = locus::relu(v.a * v.x + v.b);
    LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
    if (!spot_check(v.y.data_handle(),
                    [&](std::size_t i) { return relu_axpb(v.host_a[i], v.host_x[i], v.host_b[i]); })) {
      st.SkipWithError("locus relu(a * x + b) on cuda gave wrong values");
      return;
    }
    time_batches(st, bw_calls, [&] { v.y = locus::relu(v.a * v.x + v.b); });
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 4 * f32_bytes);
    st.SetLabel("locus; bytes = 3 read + 1 written; " + batch_label(bw_calls));
  });
}

/// y = relu(a * x + b), four elements per thread and step (n is a multiple of 4).
__global__ void relu_axpb_kernel(const float4* __restrict__ a, const float4* __restrict__ x,
                                 const float4* __restrict__ b, float4* __restrict__ y, std::int64_t n4) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
    const float4 av = a[i], xv = x[i], bv = b[i];
    float4 r;
    r.x = fmaxf(av.x * xv.x + bv.x, 0.0f);
    r.y = fmaxf(av.y * xv.y + bv.y, 0.0f);
    r.z = fmaxf(av.z * xv.z + bv.z, 0.0f);
    r.w = fmaxf(av.w * xv.w + bv.w, 0.0f);
    y[i] = r;
  }
}

void BM_fused_relu_axpb_cuda_kernel(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    auto& v = vec();
    const cudaStream_t s = locus::detail::current_stream();
    int dev = 0, sms = 0;
    LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
    LOCUS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const std::int64_t n4 = big / 4;
    const int threads = 256;
    const int blocks = static_cast<int>(std::min<std::int64_t>((n4 + threads - 1) / threads, std::int64_t{sms} * 16));
    auto run = [&] {
      relu_axpb_kernel<<<blocks, threads, 0, s>>>(
          reinterpret_cast<const float4*>(v.a.data_handle()), reinterpret_cast<const float4*>(v.x.data_handle()),
          reinterpret_cast<const float4*>(v.b.data_handle()), reinterpret_cast<float4*>(v.y.data_handle()), n4);
    };
    run();
    LOCUS_CUDA_CHECK(cudaGetLastError());
    LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
    if (!spot_check(v.y.data_handle(),
                    [&](std::size_t i) { return relu_axpb(v.host_a[i], v.host_x[i], v.host_b[i]); })) {
      st.SkipWithError("the hand-written relu(a * x + b) kernel gave wrong values");
      return;
    }
    time_batches(st, bw_calls, run);
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 4 * f32_bytes);
    st.SetLabel("hand-written float4 kernel; bytes = 3 read + 1 written; " + batch_label(bw_calls));
  });
}

// ---- reductions ------------------------------------------------------------------------------

void BM_sum_cuda(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    auto& v = vec();
    const float r = locus::to<locus::cpu>(locus::sum(v.a)).item();
    const double err = std::abs(static_cast<double>(r) - v.exact_sum_a);
    // f64 accumulation: the one rounding is the f32 result's.
    if (!(err <= 1e-6 * (1.0 + std::abs(v.exact_sum_a)))) {
      st.SkipWithError(("locus::sum on cuda is off by " + std::to_string(err)).c_str());
      return;
    }
    time_batches(st, bw_calls, [&] {
      auto s = locus::sum(v.a);
      benchmark::DoNotOptimize(s.data_handle());
    });
    st.counters["abs_error"] = err;
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * f32_bytes);
    st.SetLabel("locus; bytes = read; " + batch_label(bw_calls));
  });
}

void BM_sum_cub(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    auto& v = vec();
    const cudaStream_t s = locus::detail::current_stream();
    float* out = nullptr;
    void* tmp = nullptr;
    std::size_t tmp_bytes = 0;
    LOCUS_CUDA_CHECK(cub::DeviceReduce::Sum(nullptr, tmp_bytes, v.a.data_handle(), out, big, s));
    LOCUS_CUDA_CHECK(cudaMalloc(&out, sizeof(float)));
    LOCUS_CUDA_CHECK(cudaMalloc(&tmp, tmp_bytes > 0 ? tmp_bytes : 1));
    try {
      auto run = [&] {
        LOCUS_CUDA_CHECK(cub::DeviceReduce::Sum(tmp, tmp_bytes, v.a.data_handle(), out, big, s));
      };
      run();
      float r = 0;
      LOCUS_CUDA_CHECK(cudaMemcpyAsync(&r, out, sizeof r, cudaMemcpyDeviceToHost, s));
      LOCUS_CUDA_CHECK(cudaStreamSynchronize(s));
      time_batches(st, bw_calls, run);
      st.counters["abs_error"] = std::abs(static_cast<double>(r) - v.exact_sum_a);
      st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * f32_bytes);
      st.SetLabel("raw cub::DeviceReduce::Sum, f32 accumulation; bytes = read; " + batch_label(bw_calls));
    } catch (...) {
      cudaFree(out);
      cudaFree(tmp);
      throw;
    }
    cudaFree(out);
    cudaFree(tmp);
  });
}

// ---- typed a + b against raw thrust::transform -----------------------------------------------

void BM_add_cuda(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    auto& v = vec();
    v.y = v.a + v.b;
    LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
    if (!spot_check(v.y.data_handle(), [&](std::size_t i) {
          return expected{v.host_a[i] + v.host_b[i], std::abs(v.host_a[i]) + std::abs(v.host_b[i])};
        })) {
      st.SkipWithError("locus a + b on cuda gave wrong values");
      return;
    }
    time_batches(st, bw_calls, [&] { v.y = v.a + v.b; });
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 3 * f32_bytes);
    st.SetLabel("locus; bytes = 2 read + 1 written; " + batch_label(bw_calls));
  });
}

void BM_add_thrust_cuda(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    auto& v = vec();
    const cudaStream_t s = locus::detail::current_stream();
    time_batches(st, bw_calls, [&] {
      thrust::transform(thrust::cuda::par_nosync.on(s), v.a.data_handle(), v.a.data_handle() + big,
                        v.b.data_handle(), v.y.data_handle(), thrust::plus<float>());
    });
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 3 * f32_bytes);
    st.SetLabel("raw thrust::transform; bytes = 2 read + 1 written; " + batch_label(bw_calls));
  });
}

// ---- bf16 GEMM: locus::matmul_into against cublasLtMatmul -------------------------------------

/// cuBLASLt status -> exception (no locus macro: the peer is a direct cuBLASLt caller).
void lt_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": " + cublasLtGetStatusString(s));
}

/// The operands of one size, made once per size.
struct gemm_inputs {
  locus::tensor<locus::bf16, locus::cuda, 2> a, b;
  explicit gemm_inputs(locus::index_t n)
      : a(locus::rand<locus::bf16, locus::cuda>({n, n}, 21, -1.0, 1.0)),
        b(locus::rand<locus::bf16, locus::cuda>({n, n}, 22, -1.0, 1.0)) {}
};
gemm_inputs& gemm_in(locus::index_t n) {
  static std::map<locus::index_t, std::unique_ptr<gemm_inputs>> m;
  auto& p = m[n];
  if (!p) p = std::make_unique<gemm_inputs>(n);
  return *p;
}

/// The workspace locus gives cuBLASLt (backend/cuda/cublaslt.hpp): 32 MiB on sm_90 and
/// later, 4 MiB before. Computed here again, not read from locus, so the peer stands alone.
std::size_t lt_workspace_bytes() {
  int dev = 0, major = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  LOCUS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 9 ? (std::size_t{32} << 20) : (std::size_t{4} << 20);
}

/// A direct cuBLASLt GEMM: row-major C[n, n] = A B with bf16 A and B, output type Out,
/// CUBLAS_COMPUTE_32F with f32 scale. Row-major meets column-major as locus does it
/// (C^T = B^T A^T: B is cuBLASLt's first operand, A its second, no transposes). Handle,
/// descriptors, workspace and the heuristic's first algorithm are made in the
/// constructor; run() is one cublasLtMatmul on the current stream.
template <class Out>
class direct_lt_gemm {
 public:
  direct_lt_gemm(const locus::bf16* a, const locus::bf16* b, Out* c, locus::index_t n)
      : a_(a), b_(b), c_(c) {
    const auto n64 = static_cast<std::uint64_t>(n);
    constexpr cudaDataType_t out_type = std::is_same_v<Out, float> ? CUDA_R_32F : CUDA_R_16BF;
    ws_bytes_ = lt_workspace_bytes();
    LOCUS_CUDA_CHECK(cudaMalloc(&ws_, ws_bytes_));
    lt_check(cublasLtCreate(&handle_), "cublasLtCreate");
    lt_check(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t op = CUBLAS_OP_N;
    lt_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op), "TRANSA");
    lt_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op, sizeof op), "TRANSB");
    const auto ld = static_cast<std::int64_t>(n);
    lt_check(cublasLtMatrixLayoutCreate(&la_, CUDA_R_16BF, n64, n64, ld), "layout (B)");
    lt_check(cublasLtMatrixLayoutCreate(&lb_, CUDA_R_16BF, n64, n64, ld), "layout (A)");
    lt_check(cublasLtMatrixLayoutCreate(&lc_, out_type, n64, n64, ld), "layout (C)");
    cublasLtMatmulPreference_t pref = nullptr;
    lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t wsb = ws_bytes_;
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &wsb, sizeof wsb);
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulAlgoGetHeuristic(handle_, desc_, la_, lb_, lc_, lc_, pref, 1, &result, &count);
    cublasLtMatmulPreferenceDestroy(pref);
    lt_check(s, "cublasLtMatmulAlgoGetHeuristic");
    if (count == 0) throw std::runtime_error("cuBLASLt's heuristic found no algorithm");
    algo_ = result.algo;
  }
  ~direct_lt_gemm() {
    if (lc_) cublasLtMatrixLayoutDestroy(lc_);
    if (lb_) cublasLtMatrixLayoutDestroy(lb_);
    if (la_) cublasLtMatrixLayoutDestroy(la_);
    if (desc_) cublasLtMatmulDescDestroy(desc_);
    if (handle_) cublasLtDestroy(handle_);
    if (ws_) cudaFree(ws_);
  }
  direct_lt_gemm(const direct_lt_gemm&) = delete;
  direct_lt_gemm& operator=(const direct_lt_gemm&) = delete;

  void run() {
    const float alpha = 1.0f, beta = 0.0f;
    lt_check(cublasLtMatmul(handle_, desc_, &alpha, b_, la_, a_, lb_, &beta, c_, lc_, c_, lc_, &algo_, ws_,
                            ws_bytes_, locus::detail::current_stream()),
             "cublasLtMatmul");
  }
  [[nodiscard]] std::size_t workspace_bytes() const { return ws_bytes_; }

 private:
  const locus::bf16* a_;
  const locus::bf16* b_;
  Out* c_;
  void* ws_ = nullptr;
  std::size_t ws_bytes_ = 0;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lc_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
};

template <class Out>
float to_float(Out v) {
  return static_cast<float>(v);
}

/// Elements of a device matrix at a few spots (first rows, middle, last rows), as floats.
template <class Out>
std::vector<float> gemm_spots(const Out* dev, locus::index_t n) {
  const auto total = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  const std::size_t chunk = 4096;
  std::vector<float> out;
  for (std::size_t off : {std::size_t{0}, total / 2 + 17, total - chunk}) {
    std::vector<Out> h(chunk);
    LOCUS_CUDA_CHECK(cudaMemcpy(h.data(), dev + off, chunk * sizeof(Out), cudaMemcpyDeviceToHost));
    for (const Out& v : h) out.push_back(to_float(v));
  }
  return out;
}

int gemm_calls(locus::index_t n) { return n >= 8192 ? 3 : 10; }
std::string gemm_label(const char* who, locus::index_t n, std::size_t ws_bytes, const char* out) {
  return std::string(who) + ", bf16 x bf16 -> " + out + ", CUBLAS_COMPUTE_32F, workspace " +
         std::to_string(ws_bytes >> 20) + " MiB; " + batch_label(gemm_calls(n));
}

template <class Out>
const char* out_name() {
  return std::is_same_v<Out, float> ? "f32" : "bf16";
}

template <class Out>
void BM_matmul_bf16_locus(benchmark::State& state, locus::index_t n) {
  guarded(state, [n](benchmark::State& st) {
    auto& in = gemm_in(n);
    auto c = locus::empty<Out, locus::cuda>({n, n});
    locus::matmul_into(c, in.a, in.b);
    {  // checked against the direct cuBLASLt call before it is timed
      auto ref = locus::empty<Out, locus::cuda>({n, n});
      direct_lt_gemm<Out> lt(in.a.data_handle(), in.b.data_handle(), ref.data_handle(), n);
      lt.run();
      LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = gemm_spots(c.data_handle(), n), want = gemm_spots(ref.data_handle(), n);
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (!(std::abs(got[i] - want[i]) <= 1e-2f * std::max(1.0f, std::abs(want[i])))) {
          const std::string msg = "locus::matmul_into (bf16) disagrees with cuBLASLt at spot " +
                                  std::to_string(i) + ": " + std::to_string(got[i]) + " vs " +
                                  std::to_string(want[i]);
          st.SkipWithError(msg.c_str());
          return;
        }
      }
    }
    time_batches(st, gemm_calls(n), [&] { locus::matmul_into(c, in.a, in.b); });
    const double nd = static_cast<double>(n);
    st.counters["FLOP/s"] = benchmark::Counter(2.0 * nd * nd * nd, benchmark::Counter::kIsIterationInvariantRate);
    st.SetLabel(gemm_label("locus::matmul_into", n, lt_workspace_bytes(), out_name<Out>()));
  });
}

template <class Out>
void BM_matmul_bf16_cublaslt(benchmark::State& state, locus::index_t n) {
  guarded(state, [n](benchmark::State& st) {
    auto& in = gemm_in(n);
    auto c = locus::empty<Out, locus::cuda>({n, n});
    direct_lt_gemm<Out> lt(in.a.data_handle(), in.b.data_handle(), c.data_handle(), n);
    time_batches(st, gemm_calls(n), [&] { lt.run(); });
    const double nd = static_cast<double>(n);
    st.counters["FLOP/s"] = benchmark::Counter(2.0 * nd * nd * nd, benchmark::Counter::kIsIterationInvariantRate);
    st.SetLabel(gemm_label("cublasLtMatmul direct, heuristic algo", n, lt.workspace_bytes(), out_name<Out>()));
  });
}


// ---- training kernels (issue 13) ---------------------------------------------------------

void BM_d2d_copy_256KiB(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    constexpr std::int64_t bytes = 128 * 512 * 4;
    auto a = locus::zeros<float, locus::cuda>({128 * 512});
    auto b = locus::zeros<float, locus::cuda>({128 * 512});
    const cudaStream_t s = locus::detail::current_stream();
    time_batches(st, 100, [&] {
      LOCUS_CUDA_CHECK(cudaMemcpyAsync(b.data_handle(), a.data_handle(), bytes, cudaMemcpyDeviceToDevice, s));
    });
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 2 * bytes);
    st.SetLabel("cudaMemcpyAsync of 128 x 512 f32; bytes = read + written; " + batch_label(100));
  });
}

/// The bias (and relu) gradient of a [rows, cols] layer output, checked against the host.
void BM_bias_grad(benchmark::State& state, locus::index_t rows, locus::index_t cols, bool relu) {
  guarded(state, [=](benchmark::State& st) {
    namespace ld = locus::detail;
    const auto kind = relu ? ld::act_kind::relu : ld::act_kind::none;
    auto gy = locus::randn<float, locus::cuda>({rows, cols}, 11);
    auto y = locus::eval(locus::relu(locus::randn<float, locus::cuda>({rows, cols}, 12)));
    auto dz = locus::zeros<float, locus::cuda>({rows, cols});
    auto db = locus::zeros<float, locus::cuda>({cols});
    auto kernel = [&](float* dbp) {
      return ld::bias_act_grad_kernel<float, float>{gy.data_handle(), nullptr, relu ? y.data_handle() : nullptr,
                                                    relu ? dz.data_handle() : nullptr, dbp, rows, cols, kind};
    };
    {  // checked against the host path first
      ld::run_bias_act_grad<locus::cuda>(kernel(db.data_handle()));
      auto hgy = locus::to<locus::cpu>(gy), hy = locus::to<locus::cpu>(y);
      auto hdz = locus::zeros<float, locus::cpu>({rows, cols});
      auto hdb = locus::zeros<float, locus::cpu>({cols});
      ld::run_bias_act_grad<locus::cpu>(ld::bias_act_grad_kernel<float, float>{
          hgy.data_handle(), nullptr, relu ? hy.data_handle() : nullptr, relu ? hdz.data_handle() : nullptr,
          hdb.data_handle(), rows, cols, kind});
      auto gdb = locus::to<locus::cpu>(db);
      for (locus::index_t j = 0; j < cols; ++j) {
        if (!(std::abs(gdb.data_handle()[j] - hdb.data_handle()[j]) <= 1e-4f * (1.0f + std::abs(hdb.data_handle()[j])))) {
          st.SkipWithError(("bias gradient on cuda disagrees with the host at column " + std::to_string(j)).c_str());
          return;
        }
      }
    }
    time_batches(st, 100, [&] { ld::run_bias_act_grad<locus::cuda>(kernel(db.data_handle())); });
    const std::int64_t elems = rows * cols;
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 4 * (relu ? 3 * elems : elems));
    st.SetLabel(std::string("tiled column reduction; bytes = ") + (relu ? "gy + y read, dz written; " : "gy read; ") +
                batch_label(100));
  });
}

/// locus::softmax along the last axis of [rows, cols] f32, checked against the host.
void BM_softmax(benchmark::State& state, locus::index_t rows, locus::index_t cols) {
  guarded(state, [=](benchmark::State& st) {
    auto x = locus::randn<float, locus::cuda>({rows, cols}, 21, 0.0, 4.0);
    {
      auto got = locus::to<locus::cpu>(locus::softmax(x, 1));
      const locus::index_t check_rows = rows < 8 ? rows : 8;  // the host reference of 8 rows
      auto hx = locus::to<locus::cpu>(x);
      for (locus::index_t r = 0; r < check_rows; ++r) {
        const float* row = hx.data_handle() + r * cols;
        double m = -INFINITY, s = 0;
        for (locus::index_t j = 0; j < cols; ++j) m = std::max(m, double(row[j]));
        for (locus::index_t j = 0; j < cols; ++j) s += std::exp(double(row[j]) - m);
        for (locus::index_t j = 0; j < cols; ++j) {
          const double want = std::exp(double(row[j]) - m) / s, g = got.data_handle()[r * cols + j];
          if (!(std::abs(g - want) <= 1e-5 * want + 1e-30)) {
            st.SkipWithError("locus::softmax on cuda disagrees with a double reference");
            return;
          }
        }
      }
    }
    const int calls = rows * cols > (1 << 20) ? 10 : 100;
    time_batches(st, calls, [&] {
      auto y = locus::softmax(x, 1);
      benchmark::DoNotOptimize(y.data_handle());
    });
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 2 * 4 * rows * cols);
    st.SetLabel(std::string(cols <= 1024 ? "warp per row" : "block per row") +
                "; bytes = read + written (the row is read twice: max and sum, then write); " + batch_label(calls));
  });
}

/// Fused cross-entropy loss and gradient of [rows, cols] f32 logits, checked against the host.
void BM_cross_entropy(benchmark::State& state, locus::index_t rows, locus::index_t cols) {
  guarded(state, [=](benchmark::State& st) {
    auto x = locus::randn<float, locus::cuda>({rows, cols}, 31, 0.0, 4.0);
    std::vector<std::int64_t> lab(static_cast<std::size_t>(rows));
    for (locus::index_t i = 0; i < rows; ++i) lab[static_cast<std::size_t>(i)] = (i * 7919) % cols;
    auto y = locus::from_host<locus::cuda>(lab, {rows});
    locus::nn::cross_entropy_state<locus::cuda, locus::amp::fp32> ce(locus::nn::cross_entropy{});
    {
      const float got = locus::to<locus::cpu>(ce.forward(std::as_const(x).view(), std::as_const(y).view())).item();
      auto hx = locus::to<locus::cpu>(x);
      double want = 0;
      for (locus::index_t r = 0; r < rows; ++r) {
        const float* row = hx.data_handle() + r * cols;
        double m = -INFINITY, s = 0;
        for (locus::index_t j = 0; j < cols; ++j) m = std::max(m, double(row[j]));
        for (locus::index_t j = 0; j < cols; ++j) s += std::exp(double(row[j]) - m);
        want += -(double(row[lab[static_cast<std::size_t>(r)]]) - m - std::log(s));
      }
      want /= double(rows);
      if (!(std::abs(got - want) <= 1e-5 * (1.0 + std::abs(want)))) {
        st.SkipWithError(("cross_entropy on cuda: loss " + std::to_string(got) + ", want " + std::to_string(want)).c_str());
        return;
      }
    }
    const int calls = rows * cols > (1 << 20) ? 10 : 100;
    time_batches(st, calls, [&] {
      auto l = ce.forward(std::as_const(x).view(), std::as_const(y).view());
      benchmark::DoNotOptimize(l.data_handle());
    });
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 2 * 4 * rows * cols);
    st.SetLabel(std::string(cols <= 1024 ? "warp per row" : "block per row") +
                "; bytes = logits read + gradient written (plus the mean of the row losses); " + batch_label(calls));
  });
}

}  // namespace

BENCHMARK(BM_d2d_copy)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(bw_iterations);
BENCHMARK(BM_fused_relu_axpb_cuda)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(bw_iterations);
BENCHMARK(BM_fused_relu_axpb_cuda_kernel)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(bw_iterations);
BENCHMARK(BM_sum_cuda)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(bw_iterations);
BENCHMARK(BM_sum_cub)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(bw_iterations);
BENCHMARK(BM_add_cuda)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(bw_iterations);
BENCHMARK(BM_add_thrust_cuda)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(bw_iterations);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // The GEMM cases, registered here for their exact names (peer beside peer).
  struct gemm_case {
    const char* name;
    void (*fn)(benchmark::State&, locus::index_t);
    locus::index_t n;
  };
  const gemm_case gemms[] = {
      {"BM_matmul_bf16_8192_cublaslt", BM_matmul_bf16_cublaslt<locus::bf16>, 8192},
      {"BM_matmul_bf16_8192_locus", BM_matmul_bf16_locus<locus::bf16>, 8192},
      {"BM_matmul_bf16_8192_f32out_cublaslt", BM_matmul_bf16_cublaslt<float>, 8192},
      {"BM_matmul_bf16_8192_f32out_locus", BM_matmul_bf16_locus<float>, 8192},
      {"BM_matmul_bf16_4096_cublaslt", BM_matmul_bf16_cublaslt<locus::bf16>, 4096},
      {"BM_matmul_bf16_4096_locus", BM_matmul_bf16_locus<locus::bf16>, 4096},
  };
  benchmark::RegisterBenchmark("BM_d2d_copy_256KiB", BM_d2d_copy_256KiB)
      ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(bw_iterations);
  struct bias_case {
    const char* name;
    locus::index_t rows, cols;
    bool relu;
  };
  for (const bias_case& b : {bias_case{"BM_bias_grad_relu_128x512_cuda", 128, 512, true},
                             bias_case{"BM_bias_grad_relu_128x256_cuda", 128, 256, true},
                             bias_case{"BM_bias_grad_none_128x10_cuda", 128, 10, false}}) {
    benchmark::RegisterBenchmark(b.name, BM_bias_grad, b.rows, b.cols, b.relu)
        ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(bw_iterations);
  }
  struct row_case {
    const char* name;
    void (*fn)(benchmark::State&, locus::index_t, locus::index_t);
    locus::index_t rows, cols;
  };
  for (const row_case& r : {row_case{"BM_softmax_128x10_cuda", BM_softmax, 128, 10},
                            row_case{"BM_softmax_4096x50257_cuda", BM_softmax, 4096, 50257},
                            row_case{"BM_cross_entropy_128x10_cuda", BM_cross_entropy, 128, 10},
                            row_case{"BM_cross_entropy_4096x50257_cuda", BM_cross_entropy, 4096, 50257}}) {
    benchmark::RegisterBenchmark(r.name, r.fn, r.rows, r.cols)
        ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(r.rows * r.cols > (1 << 20) ? 20 : bw_iterations);
  }
  for (const gemm_case& g : gemms) {
    benchmark::RegisterBenchmark(g.name, g.fn, g.n)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(g.n >= 8192 ? 20 : 30);
  }
  benchmark::AddCustomContext("elements", std::to_string(big));
  locus_bench::add_cuda_device_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
