// CUDA copy microbenchmarks, 256 MiB each, timed with CUDA events on the current stream
// (manual time: the GPU's time for the copy, not the host's):
//   * device to device: locus::copy(cuda -> cuda) against raw cudaMemcpyAsync; the
//     throughput counts bytes read + bytes written (the usual device-copy figure);
//   * host to device from pinned memory: locus::copy(pinned -> cuda), which blocks,
//     and locus::copy_async with both buffers moved in and taken back each time
//     (std::move(p).get_with_source(): the reuse pattern the ownership rules ask for),
//     against raw cudaMemcpyAsync; the throughput counts the bytes transferred.
//   * loader overlap: data::loader<cuda> stages batches in pinned memory and copies them
//     on a side stream while the current stream computes; BM_loader_h2d_overlap reports
//     the fraction of the H2D copy time hidden behind compute in that training-like loop.
// Without a usable CUDA device every case reports "no CUDA device" and is skipped.
// Each locus path is checked once (the bytes arrive) before it is timed.
#include <benchmark/benchmark.h>

#include "cuda_bench.hpp"

#include <locus/data/loader.hpp>
#include <locus/locus.hpp>

#include <chrono>
#include <span>

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

constexpr std::size_t bytes = std::size_t{256} << 20;  // 256 MiB
constexpr locus::index_t n_idx = static_cast<locus::index_t>(bytes / sizeof(float));

using locus_bench::event_timer;
using locus_bench::guarded;
using locus_bench::need_device;

/// True when the first, a middle and the last 4 KiB of a and b (device memory) agree.
bool spot_equal(const float* a_dev, const float* b_dev) {
  constexpr std::size_t chunk = 1024;
  const std::size_t n = bytes / sizeof(float);
  std::vector<float> ha(chunk), hb(chunk);
  for (std::size_t off : {std::size_t{0}, n / 2, n - chunk}) {
    LOCUS_CUDA_CHECK(cudaMemcpy(ha.data(), a_dev + off, chunk * sizeof(float), cudaMemcpyDeviceToHost));
    LOCUS_CUDA_CHECK(cudaMemcpy(hb.data(), b_dev + off, chunk * sizeof(float), cudaMemcpyDeviceToHost));
    if (std::memcmp(ha.data(), hb.data(), chunk * sizeof(float)) != 0) return false;
  }
  return true;
}

// ---- device to device ----------------------------------------------------------------------

void BM_cuda_d2d_locus_copy(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    auto src = locus::rand<float, locus::cuda>({n_idx}, /*seed=*/7);
    auto dst = locus::empty<float, locus::cuda>({n_idx});
    locus::copy(src, dst);
    LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
    if (!spot_equal(src.data_handle(), dst.data_handle())) {
      st.SkipWithError("locus::copy (cuda -> cuda) copied wrong bytes");
      return;
    }
    event_timer t;
    for (auto _ : st) {
      t.start();
      locus::copy(src, dst);
      st.SetIterationTime(t.stop());
    }
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 2 * bytes);
    st.SetLabel("bytes = read + written");
  });
}

void BM_cuda_d2d_cudaMemcpyAsync(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    auto src = locus::rand<float, locus::cuda>({n_idx}, /*seed=*/7);
    auto dst = locus::empty<float, locus::cuda>({n_idx});
    const cudaStream_t s = locus::detail::current_stream();
    event_timer t;
    for (auto _ : st) {
      t.start();
      LOCUS_CUDA_CHECK(cudaMemcpyAsync(dst.data_handle(), src.data_handle(), bytes,
                                       cudaMemcpyDeviceToDevice, s));
      st.SetIterationTime(t.stop());
    }
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 2 * bytes);
    st.SetLabel("bytes = read + written");
  });
}

// ---- host (pinned) to device ---------------------------------------------------------------

locus::tensor<float, locus::pinned, 1> pinned_source() {
  auto h = locus::rand<float, locus::cpu>({n_idx}, /*seed=*/11);
  return locus::to<locus::pinned>(h);
}

void BM_cuda_h2d_pinned_locus_copy(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    auto src = pinned_source();
    auto dst = locus::empty<float, locus::cuda>({n_idx});
    locus::copy(src, dst);
    std::vector<float> back(1024);
    LOCUS_CUDA_CHECK(cudaMemcpy(back.data(), dst.data_handle() + n_idx / 2, 1024 * sizeof(float),
                                cudaMemcpyDeviceToHost));
    if (std::memcmp(back.data(), src.data() + n_idx / 2, 1024 * sizeof(float)) != 0) {
      st.SkipWithError("locus::copy (pinned -> cuda) copied wrong bytes");
      return;
    }
    event_timer t;
    for (auto _ : st) {
      t.start();
      locus::copy(src, dst);  // blocking
      st.SetIterationTime(t.stop());
    }
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * bytes);
    st.SetLabel(locus::memory_stats<locus::pinned>().fallback ? "pinned=fallback (pageable)"
                                                              : "bytes = transferred");
  });
}

void BM_cuda_h2d_pinned_locus_copy_async(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    auto src = pinned_source();
    auto dst = locus::empty<float, locus::cuda>({n_idx});
    const float* src_memory = src.data_handle();
    std::vector<float> expect(1024);
    std::memcpy(expect.data(), src.data() + n_idx / 2, 1024 * sizeof(float));
    {
      auto [d, h] = std::move(locus::copy_async(std::move(src), std::move(dst))).get_with_source();
      dst = std::move(d);
      src = std::move(h);
    }
    std::vector<float> back(1024);
    LOCUS_CUDA_CHECK(cudaMemcpy(back.data(), dst.data_handle() + n_idx / 2, 1024 * sizeof(float),
                                cudaMemcpyDeviceToHost));
    if (src.data_handle() != src_memory || std::memcmp(back.data(), expect.data(), 1024 * sizeof(float)) != 0) {
      st.SkipWithError("locus::copy_async (pinned -> cuda) copied wrong bytes or lost its source");
      return;
    }
    event_timer t;
    for (auto _ : st) {
      t.start();
      auto [d, h] = std::move(locus::copy_async(std::move(src), std::move(dst))).get_with_source();  // waits
      st.SetIterationTime(t.stop());
      dst = std::move(d);
      src = std::move(h);
    }
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * bytes);
    st.SetLabel("bytes = transferred; buffers moved in and back");
  });
}

void BM_cuda_h2d_pinned_cudaMemcpyAsync(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    auto src = pinned_source();
    auto dst = locus::empty<float, locus::cuda>({n_idx});
    const cudaStream_t s = locus::detail::current_stream();
    event_timer t;
    for (auto _ : st) {
      t.start();
      LOCUS_CUDA_CHECK(cudaMemcpyAsync(dst.data_handle(), src.data(), bytes,
                                       cudaMemcpyHostToDevice, s));
      st.SetIterationTime(t.stop());
    }
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * bytes);
    st.SetLabel("bytes = transferred");
  });
}


// ---- the loader: how much of the H2D copy hides behind compute ----------------------------

/// Samples that are rows of one host array: the loader's gather is one memcpy per row,
/// so the loop is bound by the copy and the compute, not by decoding.
struct rows_source {
  const float* data;
  locus::index_t n, f;
  [[nodiscard]] locus::index_t size() const { return n; }
  [[nodiscard]] locus::index_t features() const { return f; }
  std::int64_t load(locus::index_t i, std::span<float> x) const {
    std::memcpy(x.data(), data + i * f, static_cast<std::size_t>(f) * sizeof(float));
    return i % 10;
  }
};

/// Per batch [4096, 784] (12.8 MB): the copy alone (pinned -> cuda), the compute alone
/// (eight [4096, 784] x [784, 2048] GEMMs on the current stream), and the loop that
/// iterates data::loader<cuda> (prefetch 2) and computes on each batch. The fraction
/// hidden is (copy + compute - loop) / copy, clamped to [0, 1]: 1 when the side-stream
/// copies overlap compute completely, 0 when they serialise.
void BM_loader_h2d_overlap(benchmark::State& state) {
  guarded(state, [](benchmark::State& st) {
    constexpr locus::index_t batch = 4096, f = 784, batches = 24, gemms = 8;
    std::vector<float> host(static_cast<std::size_t>(batch * batches * f));
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 251) / 251.0f;
    const rows_source src{host.data(), batch * batches, f};
    auto w = locus::rand<float, locus::cuda>({f, 2048}, 3, -0.05, 0.05);
    auto y = locus::empty<float, locus::cuda>({batch, 2048});
    auto compute = [&](const locus::tensor<float, locus::cuda, 2>& x) {
      for (locus::index_t k = 0; k < gemms; ++k) locus::matmul_into(y, x, w);
    };
    event_timer t;

    // the copy alone
    auto staged = locus::from_host<locus::pinned>(std::span<const float>(host.data(), static_cast<std::size_t>(batch * f)),
                                                  {batch, f});
    auto x = locus::empty<float, locus::cuda>({batch, f});
    locus::copy(staged, x);
    t.start();
    for (int r = 0; r < 10; ++r) locus::copy(staged, x);
    const double copy_s = t.stop() / 10;
    // the compute alone
    compute(x);
    t.start();
    for (int r = 0; r < 10; ++r) compute(x);
    const double compute_s = t.stop() / 10;

    locus::data::loader<locus::cuda, rows_source> loader(src, {.batch_size = batch, .prefetch = 2});
    for (auto& b : loader) compute(b.x);  // warm-up: pinned buffers, streams, GEMM plans
    double loop_s = 0, hidden = 0;
    for (auto _ : st) {
      LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
      const auto t0 = std::chrono::steady_clock::now();
      for (auto& b : loader) compute(b.x);
      LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      st.SetIterationTime(dt);
      loop_s = dt / batches;
      hidden = (copy_s + compute_s - loop_s) / copy_s;
      hidden = hidden < 0 ? 0 : (hidden > 1 ? 1 : hidden);
    }
    st.counters["copy_ms"] = copy_s * 1e3;
    st.counters["compute_ms"] = compute_s * 1e3;
    st.counters["loop_ms_per_batch"] = loop_s * 1e3;
    st.counters["h2d_hidden_fraction"] = hidden;
    st.SetLabel("hidden = (copy + compute - loop) / copy per batch");
  });
}

}  // namespace

BENCHMARK(BM_cuda_d2d_locus_copy)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_d2d_cudaMemcpyAsync)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_h2d_pinned_locus_copy)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_h2d_pinned_locus_copy_async)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_h2d_pinned_cudaMemcpyAsync)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_loader_h2d_overlap)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("copy_bytes", std::to_string(bytes));
  locus_bench::add_cuda_device_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
