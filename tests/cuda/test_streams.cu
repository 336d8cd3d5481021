// CUDA suite: memory and host reads across streams and devices (issue 13).
//   (a) cross-stream reuse: blocks produced on a side stream, used and freed on another,
//       reallocated at once, with a long kernel keeping the user busy; compared with a
//       host reference (fails with an allocator that hands a freed block to the next
//       allocation while another stream still reads it);
//   (b) host reads of data written under another stream guard, behind a long kernel,
//       from this thread and from another (fails when to<cpu> waits only for the
//       reader's current stream);
//   (c) two devices: per-device current streams, guards, host reads, the loader and
//       environment() without new contexts (skipped, with a message, on one GPU);
//   (d) eight threads making and destroying streams while computing and reading back.
// Without a GPU the runner reports every case skipped (tests/cuda/main.cu).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "cuda/spin.cuh"
#include <locus/locus.hpp>
#include <locus/data/loader.hpp>
#include <locus/transfer/async.hpp>
#include <locus/transfer/stream.hpp>

namespace {

using locus_test::spin;  // tests/cuda/spin.cuh

/// Whether checks on elapsed time or on "still running" are meaningful: not under
/// compute-sanitizer or another injected tool (CUDA_INJECTION64_PATH), which serialises
/// and slows every launch, nor when LOCUS_TEST_NO_TIMING is set (MPS, a shared GPU).
/// The ordering checks (what a read sees) run everywhere.
bool timing_checks() {
  return std::getenv("CUDA_INJECTION64_PATH") == nullptr && std::getenv("LOCUS_TEST_NO_TIMING") == nullptr;
}

/// Element i of pattern k: exact in float, different for every (k, i) in the tests.
float pattern_value(int k, locus::index_t i) { return static_cast<float>(k * 4096 + (i % 4093)); }

locus::tensor<float, locus::pinned, 1> pinned_pattern(int k, locus::index_t n) {
  auto t = locus::empty<float, locus::pinned>({n});
  for (locus::index_t i = 0; i < n; ++i) t.data_handle()[i] = pattern_value(k, i);
  return t;
}

}  // namespace

// ---- (a) cross-stream reuse ----------------------------------------------------------------

TEST_CASE("a block used on another stream (record_stream) is not reused before that stream is done") {
  constexpr int rounds = 24;
  constexpr locus::index_t n = 1 << 18;
  locus::stream side, compute;
  std::vector<locus::tensor<float, locus::cuda, 1>> results;
  results.reserve(rounds);
  for (int k = 0; k < rounds; ++k) {
    locus::tensor<float, locus::cuda, 1> a;
    {
      // Produced on the side stream: the block belongs to `side`.
      locus::stream_guard g(side);
      a = std::move(locus::to_async<locus::cuda>(pinned_pattern(k, n))).get();
    }
    {
      // Consumed on the compute stream behind a long kernel: the read of `a` runs
      // long after the host has freed it and side has reallocated the same size.
      locus::stream_guard g(compute);
      locus::record_stream(a, compute);
      spin(compute.native_handle(), k == 0 ? 100 : 5);
      locus::tensor<float, locus::cuda, 1> out = a * 2.0f + 1.0f;
      results.push_back(std::move(out));
    }
    // `a` is freed here; the next round's to_async under `side` asks for the same size.
  }
  compute.synchronize();
  for (int k = 0; k < rounds; ++k) {
    const auto h = locus::to<locus::cpu>(results[static_cast<std::size_t>(k)]);
    int wrong = 0;
    for (locus::index_t i = 0; i < n; ++i)
      wrong += h(i) != 2.0f * pattern_value(k, i) + 1.0f ? 1 : 0;
    CHECK_MESSAGE(wrong == 0, "round ", k, ": ", wrong, " elements read after their block was reused");
  }
}

TEST_CASE("copy_async records its cuda source on its stream: freeing it early is safe") {
  constexpr locus::index_t n = 1 << 18;
  locus::stream side;
  for (int k = 0; k < 8; ++k) {
    // A source made on the legacy stream, copied to pinned on the side stream behind
    // a long kernel, then freed at once and its size reallocated and overwritten on
    // the legacy stream. Without the record, the copy would read the new values.
    std::optional<locus::pending<locus::tensor<float, locus::pinned, 1>>> p;
    {
      auto src = locus::to<locus::cuda>(pinned_pattern(k, n));
      locus::stream_guard g(side);
      spin(side.native_handle(), 30);
      p.emplace(locus::to_async<locus::pinned>(src));
    }  // src freed (its block belongs to the legacy stream)
    auto overwrite = locus::full<float, locus::cuda>({n}, -1.0f);
    const auto h = std::move(*p).get();
    int wrong = 0;
    for (locus::index_t i = 0; i < n; ++i) wrong += h(i) != pattern_value(k, i) ? 1 : 0;
    CHECK_MESSAGE(wrong == 0, "round ", k, ": the copy read ", wrong, " overwritten elements");
    CHECK(locus::to<locus::cpu>(overwrite)(n - 1) == -1.0f);
  }
}

TEST_CASE("stress: produce on one stream, consume and free on another, reallocate, many sizes") {
  // Many rounds, three sizes, two consumer streams, no host waits in between; every
  // result is compared with the host reference at the end.
  locus::stream producer, c1, c2;
  const locus::index_t sizes[] = {1000, 1 << 16, 300000};
  std::vector<std::pair<int, locus::tensor<float, locus::cuda, 1>>> results;
  for (int k = 0; k < 60; ++k) {
    const locus::index_t n = sizes[k % 3];
    locus::event made;
    locus::tensor<float, locus::cuda, 1> a;
    {
      locus::stream_guard g(producer);
      a = std::move(locus::to_async<locus::cuda>(pinned_pattern(k, n))).get();
      made.record(producer);
    }
    locus::stream& c = k % 2 ? c1 : c2;
    c.wait(made);
    locus::stream_guard g(c);
    locus::record_stream(a, c);
    spin(c.native_handle(), 2 + k % 3);  // every consumer lags its producer
    locus::tensor<float, locus::cuda, 1> out = a - 3.0f;
    results.emplace_back(k, std::move(out));
  }
  for (auto& [k, t] : results) {
    const auto h = locus::to<locus::cpu>(t);
    int wrong = 0;
    for (locus::index_t i = 0; i < h.numel(); ++i) wrong += h(i) != pattern_value(k, i) - 3.0f ? 1 : 0;
    CHECK_MESSAGE(wrong == 0, "round ", k, ": ", wrong, " wrong elements");
  }
}

TEST_CASE("record_stream on pinned memory: a staging buffer freed while a copy reads it is not reused") {
  constexpr locus::index_t n = 1 << 20;
  locus::stream side;
  for (int k = 0; k < 4; ++k) {
    auto dst = locus::zeros<float, locus::cuda>({n});
    LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
    {
      auto staged = pinned_pattern(k, n);
      // A raw copy on `side` behind a long kernel: only record_stream tells the
      // allocator that the DMA engine still reads `staged` after the host frees it.
      spin(side.native_handle(), 100);
      LOCUS_CUDA_CHECK(cudaMemcpyAsync(dst.data_handle(), staged.data_handle(), static_cast<std::size_t>(n) * sizeof(float),
                                       cudaMemcpyHostToDevice, side.native_handle()));
      locus::record_stream(dst, side);
      locus::record_stream(staged, side);
    }  // staged freed while the copy waits behind the kernel
    // The same size again, overwritten by the host at once: with the block reused, the
    // pending copy would read these values.
    auto next = locus::empty<float, locus::pinned>({n});
    for (locus::index_t i = 0; i < n; ++i) next.data_handle()[i] = -1.0f;
    side.synchronize();
    const auto h = locus::to<locus::cpu>(dst);
    int wrong = 0;
    for (locus::index_t i = 0; i < n; ++i) wrong += h(i) != pattern_value(k, i) ? 1 : 0;
    CHECK_MESSAGE(wrong == 0, "round ", k, ": the copy read ", wrong, " elements of a reused pinned block");
  }
}

// ---- (b) host reads wait for the right work ------------------------------------------------

TEST_CASE("to<cpu> on the main thread sees data written under another stream guard") {
  constexpr locus::index_t n = 1 << 20;
  locus::stream side;
  // Allocated under the guard and written there, behind a long kernel.
  locus::tensor<float, locus::cuda, 1> t;
  {
    locus::stream_guard g(side);
    spin(side.native_handle(), 300);
    t = locus::full<float, locus::cuda>({n}, 7.0f);
  }
  if (timing_checks()) CHECK_FALSE(side.query());  // still running: a read that waits for nothing is stale
  const auto h = locus::to<locus::cpu>(t);  // no guard: the legacy stream
  int wrong = 0;
  for (locus::index_t i = 0; i < n; ++i) wrong += h(i) != 7.0f ? 1 : 0;
  CHECK(wrong == 0);

  // Allocated on the legacy stream, written under the guard (copy() on the side stream).
  auto u = locus::zeros<float, locus::cuda>({n});
  auto eights = locus::full<float, locus::cuda>({n}, 8.0f);
  LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
  {
    locus::stream_guard g(side);
    locus::record_stream(u, side);
    locus::record_stream(eights, side);
    spin(side.native_handle(), 300);
    locus::copy(eights, u);
  }
  const auto hu = locus::to<locus::cpu>(u);
  CHECK(hu(0) == 8.0f);
  CHECK(hu(n / 2) == 8.0f);
  CHECK(hu(n - 1) == 8.0f);
}

TEST_CASE("to<cpu> sees data written under a guard on another thread, read under a third stream") {
  constexpr locus::index_t n = 1 << 20;
  locus::stream worker_stream, reader_stream;
  locus::tensor<float, locus::cuda, 1> t = locus::zeros<float, locus::cuda>({n});
  LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
  std::thread([&] {
    locus::stream_guard g(worker_stream);
    locus::record_stream(t, worker_stream);
    spin(worker_stream.native_handle(), 300);
    locus::tensor<float, locus::cuda, 1> five = locus::full<float, locus::cuda>({n}, 5.0f);
    locus::copy(five, t);
  }).join();  // the host thread is done; the GPU work is not
  if (timing_checks()) CHECK_FALSE(worker_stream.query());
  locus::stream_guard g(reader_stream);
  const auto h = locus::to<locus::cpu>(t);
  CHECK(h(0) == 5.0f);
  CHECK(h(n - 1) == 5.0f);
}

TEST_CASE("a blocking copy from the host waits for another stream that still reads the memory") {
  constexpr locus::index_t n = 1 << 20;
  locus::stream side;
  auto t = locus::full<float, locus::cuda>({n}, 1.0f);
  LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
  locus::tensor<float, locus::cuda, 1> snapshot;
  {
    locus::stream_guard g(side);
    locus::record_stream(t, side);
    spin(side.native_handle(), 300);
    snapshot = locus::tensor<float, locus::cuda, 1>(locus::extents<1>{n});
    locus::copy(t, snapshot);  // reads t after the long kernel
  }
  std::vector<float> twos(static_cast<std::size_t>(n), 2.0f);
  locus::copy(locus::from_host<locus::cpu>(std::span<const float>(twos), locus::extents<1>{n}), t);  // host -> cuda
  const auto h = locus::to<locus::cpu>(snapshot);
  CHECK(h(0) == 1.0f);  // the snapshot was taken before the host's write
  CHECK(h(n - 1) == 1.0f);
  CHECK(locus::to<locus::cpu>(t)(n - 1) == 2.0f);
}

// ---- the loader: the consumer's stream waits, not the host ---------------------------------

namespace {
struct numbered_source {
  locus::index_t n = 64, f = 1000;
  locus::index_t size() const { return n; }
  locus::index_t features() const { return f; }
  std::int64_t load(locus::index_t i, std::span<float> x) const {
    for (std::size_t k = 0; k < x.size(); ++k) x[k] = static_cast<float>(i * 10000 + static_cast<locus::index_t>(k));
    return i;
  }
};
}  // namespace

TEST_CASE("loader on cuda hands batches out without waiting on the host for their copies") {
  numbered_source src;
  locus::stream compute;
  locus::stream_guard g(compute);
  locus::data::loader<locus::cuda, numbered_source> l(src, {.batch_size = 8, .prefetch = 3});
  {
    // Warm up what the timed part would otherwise pay for once: the producer thread's
    // first pinned and device allocations of a batch's size (cudaHostAlloc, cudaMalloc).
    for (auto& b : l) (void)b;
    compute.synchronize();
  }
  spin(compute.native_handle(), 1000);  // the consumer's stream is busy
  // Every batch is allocated behind the busy kernel, so its copy runs after it; the old
  // loader blocked the host in begin() and ++ until the copies were done (>= 1000 ms).
  const auto t0 = std::chrono::steady_clock::now();
  auto it = l.begin();
  ++it;
  ++it;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (timing_checks()) CHECK_MESSAGE(ms < 700.0, "advancing took ", ms, " ms: the host waited for the copies");
  // What the consumer reads (on its stream, after the wait) is the complete batch 2.
  auto& [x, y] = *it;
  const auto hx = locus::to<locus::cpu>(x);
  const auto hy = locus::to<locus::cpu>(y);
  for (locus::index_t r = 0; r < 8; ++r) {
    CHECK(hy(r) == 16 + r);
    CHECK(hx(r, 0) == static_cast<float>((16 + r) * 10000));
    CHECK(hx(r, 999) == static_cast<float>((16 + r) * 10000 + 999));
  }
  int rest = 0;
  for (++it; !(it == l.end()); ++it) ++rest;
  CHECK(rest == 5);
}

TEST_CASE("the default stream is an explicit handle: a loader begun on it works from its producer thread") {
  numbered_source src{.n = 40, .f = 3};
  locus::data::loader<locus::cuda, numbered_source> l(src, {.batch_size = 8});
  CHECK(locus::detail::current_stream() == cudaStreamLegacy);
  int batches = 0;
  for (auto& [x, y] : l) {
    const auto hy = locus::to<locus::cpu>(y);
    CHECK(hy(0) == batches * 8);
    ++batches;
    (void)x;
  }
  CHECK(batches == 5);
}

// ---- (c) two devices -------------------------------------------------------------------------

TEST_CASE("two devices: per-device streams, guards, host reads, the loader, no new contexts") {
  int count = 0;
  LOCUS_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count < 2) {
    MESSAGE("SKIPPED: this case needs two GPUs, this machine has ", count);
    return;
  }
  const auto drv = locus::detail::load_cu_driver();
  REQUIRE(drv.complete());
  const bool had_context_1 = locus::detail::primary_context_active(drv, 1);
  const auto env = locus::environment();
  CHECK(env.device_count == count);
  CHECK(locus::detail::primary_context_active(drv, 1) == had_context_1);  // none created
  for (const auto& d : env.devices) CHECK(d.free_memory_known == locus::detail::primary_context_active(drv, d.index));

  LOCUS_CUDA_CHECK(cudaSetDevice(0));
  locus::stream s0;
  LOCUS_CUDA_CHECK(cudaSetDevice(1));
  locus::stream s1;
  CHECK(s0.device() == 0);
  CHECK(s1.device() == 1);
  {
    // A guard on device 1's stream from device 0: device 1 becomes current, and only
    // its current stream changes.
    LOCUS_CUDA_CHECK(cudaSetDevice(0));
    locus::stream_guard g0(s0);
    CHECK(locus::detail::current_stream() == s0.native_handle());
    {
      locus::stream_guard g1(s1);
      CHECK(locus::detail::current_device() == 1);
      CHECK(locus::detail::current_stream() == s1.native_handle());
      CHECK(locus::detail::current_stream_for(0) == s0.native_handle());
      spin(s1.native_handle(), 300);
      auto t = locus::full<float, locus::cuda>({1 << 20}, 3.0f);  // on device 1, under s1
      cudaPointerAttributes a{};
      LOCUS_CUDA_CHECK(cudaPointerGetAttributes(&a, t.data_handle()));
      CHECK(a.device == 1);
      LOCUS_CUDA_CHECK(cudaSetDevice(0));  // read it with device 0 current
      const auto h = locus::to<locus::cpu>(t);
      CHECK(h(0) == 3.0f);
      CHECK(h((1 << 20) - 1) == 3.0f);
      CHECK(locus::detail::current_device() == 0);  // the read restored it
      LOCUS_CUDA_CHECK(cudaSetDevice(1));
    }
    CHECK(locus::detail::current_device() == 0);
    CHECK(locus::detail::current_stream() == s0.native_handle());
    LOCUS_CUDA_CHECK(cudaSetDevice(1));
    CHECK(locus::detail::current_stream() == cudaStreamLegacy);  // device 1's slot was restored
    LOCUS_CUDA_CHECK(cudaSetDevice(0));
  }
  // A loader made on device 1 allocates there and produces there, even when begun
  // with device 0 current.
  numbered_source src{.n = 24, .f = 5};
  LOCUS_CUDA_CHECK(cudaSetDevice(1));
  locus::data::loader<locus::cuda, numbered_source> l(src, {.batch_size = 8});
  LOCUS_CUDA_CHECK(cudaSetDevice(0));
  int b = 0;
  for (auto& [x, y] : l) {
    cudaPointerAttributes a{};
    LOCUS_CUDA_CHECK(cudaPointerGetAttributes(&a, x.data_handle()));
    CHECK(a.device == 1);
    CHECK(locus::to<locus::cpu>(y)(0) == 8 * b);
    ++b;
  }
  CHECK(b == 3);

  // The consumer's wait for a batch's copy lands on device 1's stream even when device 0
  // is current at ++: the default stream's handle (cudaStreamLegacy) names the current
  // device's legacy stream, so a wait issued with device 0 current would order nothing
  // on device 1. Device 1 is kept busy first, so the copies (behind it) of the large
  // batches and the consumer's kernel (behind it too) start together: without the wait
  // the kernel reads a batch that is still arriving.
  numbered_source big{.n = 1024, .f = 1 << 16};  // batches of 128 MiB
  LOCUS_CUDA_CHECK(cudaSetDevice(1));
  locus::data::loader<locus::cuda, numbered_source> lb(big, {.batch_size = 512});
  spin(cudaStreamLegacy, 300);  // device 1's legacy stream: the loader's consumer stream
  LOCUS_CUDA_CHECK(cudaSetDevice(0));
  int nb = 0;
  for (auto& [x, y] : lb) {
    LOCUS_CUDA_CHECK(cudaSetDevice(1));
    locus::tensor<float, locus::cuda, 2> copy_of = x + 0.0f;  // a kernel on device 1's legacy stream
    LOCUS_CUDA_CHECK(cudaSetDevice(0));
    const auto h = locus::to<locus::cpu>(copy_of);
    const auto hy = locus::to<locus::cpu>(y);
    long wrong = 0;
    for (locus::index_t r = 0; r < 512; ++r) {
      const locus::index_t i = nb * 512 + r;
      wrong += hy(r) != i ? 1 : 0;
      for (locus::index_t k = 0; k < big.f; k += 61)
        wrong += h(r, k) != static_cast<float>(i * 10000 + k) ? 1 : 0;
      wrong += h(r, big.f - 1) != static_cast<float>(i * 10000 + big.f - 1) ? 1 : 0;
    }
    CHECK_MESSAGE(wrong == 0, "batch ", nb, ": ", wrong, " elements read before their copy arrived");
    ++nb;
  }
  CHECK(nb == 2);
  LOCUS_CUDA_CHECK(cudaSetDevice(0));
}

// ---- (d) concurrency: streams made and destroyed on many threads at once ------------------
// Eight threads each make a stream, compute under its guard and read the result back
// (a host read waits for every locus stream of the device, so it walks the stream list
// while other threads add and remove theirs), then destroy the stream, 40 times over,
// with the caching allocator shared by all. Every value is checked against integer
// arithmetic, and no byte is left allocated.
TEST_CASE("concurrency: threads making and destroying streams, allocating, computing and reading back at once") {
  LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
  const auto base = locus::memory_stats<locus::cuda>().allocated_bytes;
  constexpr int threads = 8, rounds = 40;
  std::atomic<long> wrong{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w)
    pool.emplace_back([&, w] {
      try {
        for (int r = 0; r < rounds; ++r) {
          const locus::index_t n = 1000 + 517 * ((w * rounds + r) % 13);
          locus::stream s;
          locus::stream_guard g(s);
          const auto a = locus::arange<float, locus::cuda>(0, n);
          const locus::tensor<float, locus::cuda, 1> b = a * 2.0f + static_cast<float>(w);
          const auto i64 = locus::arange<std::int64_t, locus::cuda>(0, n);
          const auto h = locus::to<locus::cpu>(b);
          const std::int64_t total = locus::to<locus::cpu>(locus::sum(i64)).item();
          for (locus::index_t i = 0; i < n; ++i)
            if (h(i) != static_cast<float>(2 * i + w)) wrong.fetch_add(1);
          if (total != n * (n - 1) / 2) wrong.fetch_add(1);
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "thread %d: %s\n", w, e.what());
        failures.fetch_add(1);
      }
    });
  for (auto& t : pool) t.join();
  CHECK(failures.load() == 0);
  CHECK(wrong.load() == 0);
  LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(locus::memory_stats<locus::cuda>().allocated_bytes == base);
}
