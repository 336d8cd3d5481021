// What the CUDA microbenchmarks (bench_cuda_copy.cu, bench_cuda_kernels.cu) share: an
// event timer on locus's current stream, and the skip for machines without a GPU.
#pragma once

#include <benchmark/benchmark.h>

#include <locus/locus.hpp>

#include <exception>
#include <string>

namespace locus_bench {

/// Times work on the current stream with a pair of events (the GPU's time).
class event_timer {
 public:
  event_timer() {
    LOCUS_CUDA_CHECK(cudaEventCreate(&start_));
    LOCUS_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~event_timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  event_timer(const event_timer&) = delete;
  event_timer& operator=(const event_timer&) = delete;
  void start() { LOCUS_CUDA_CHECK(cudaEventRecord(start_, locus::detail::current_stream())); }
  /// Seconds since start().
  double stop() {
    LOCUS_CUDA_CHECK(cudaEventRecord(stop_, locus::detail::current_stream()));
    LOCUS_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    LOCUS_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return static_cast<double>(ms) / 1e3;
  }

 private:
  cudaEvent_t start_{}, stop_{};
};

/// False (and the case skipped with "no CUDA device") without a usable GPU.
inline bool need_device(benchmark::State& state) {
  if (locus::cuda_available()) return true;
  state.SkipWithError("no CUDA device");
  return false;
}

/// Runs body(state) and turns a locus or CUDA error into a skipped case with its text.
template <class F>
void guarded(benchmark::State& state, F&& body) {
  if (!need_device(state)) return;
  try {
    body(state);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

/// The GPU's name and compute capability (or why there is none) in the JSON context.
inline void add_cuda_device_context() {
  if (locus::cuda_available()) {
    int dev = 0;
    cudaDeviceProp p{};
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess)
      benchmark::AddCustomContext("cuda_device", std::string(p.name) + " (sm_" + std::to_string(p.major) +
                                                     std::to_string(p.minor) + ")");
  } else {
    benchmark::AddCustomContext("cuda_device", "none: " + locus::environment().cuda_status);
  }
}

}  // namespace locus_bench
