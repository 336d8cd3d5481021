// Allocator internals: size classes, the host allocator's accounting, and
// thread-safety of the statistics.
#include <doctest/doctest.h>

#include <atomic>
#include <limits>
#include <thread>
#include <vector>

#include <locus/locus.hpp>

#include "host_devices.hpp"

TEST_CASE("size classes: 512-byte granules then at most 25% rounding") {
  using locus::detail::size_class;
  CHECK(size_class(1) == 512);
  CHECK(size_class(512) == 512);
  CHECK(size_class(513) == 1024);
  CHECK(size_class(1 << 20) == (1u << 20));
  for (std::size_t b : {std::size_t{1} << 20 | 1, std::size_t{3} << 21, std::size_t{123456789}}) {
    const auto c = size_class(b);
    CHECK(c >= b);
    CHECK(static_cast<double>(c) <= 1.25 * static_cast<double>(b) + 512);
    CHECK(size_class(c) == c);
  }
}

TEST_CASE("peak tracks the high-water mark and reset_peak_memory_stats starts again") {
  locus::reset_peak_memory_stats<locus::cpu>();
  const auto base = locus::memory_stats<locus::cpu>().allocated_bytes;
  {
    auto a = locus::empty<double, locus::cpu>({1 << 16});
    auto b = locus::empty<double, locus::cpu>({1 << 16});
  }
  const auto s = locus::memory_stats<locus::cpu>();
  CHECK(s.peak_allocated_bytes >= base + 2 * (8u << 16));
  locus::reset_peak_memory_stats<locus::cpu>();
  CHECK(locus::memory_stats<locus::cpu>().peak_allocated_bytes == base);
}

TEST_CASE("the cpu allocator counts each allocation rounded up to 64 bytes and caches nothing") {
  const auto before = locus::memory_stats<locus::cpu>();
  {
    auto a = locus::empty<float, locus::cpu>({1});     // 4 bytes: 64
    auto b = locus::empty<float, locus::cpu>({16});    // 64: 64
    auto c = locus::empty<float, locus::cpu>({17});    // 68: 128
    auto d = locus::empty<float, locus::cpu>({4000});  // 16000: 16000
    const auto s = locus::memory_stats<locus::cpu>();
    CHECK(s.allocated_bytes == before.allocated_bytes + 64 + 64 + 128 + 16000);
    CHECK(s.reserved_bytes == s.allocated_bytes);
    CHECK(s.allocations == before.allocations + 4);
    CHECK(s.cache_hits == 0);
  }
  const auto after = locus::memory_stats<locus::cpu>();
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.reserved_bytes == before.allocated_bytes);  // freed, not cached
}

TEST_CASE_TEMPLATE("allocators are safe to use from several threads", D, LOCUS_TEST_DEVICES) {
  const auto before = locus::memory_stats<D>().allocated_bytes;
  const auto before_cpu = locus::memory_stats<locus::cpu>().allocated_bytes;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < 200; ++i) {
        auto a = locus::empty<float, D>({64 + i});
        auto b = locus::empty<float, locus::cpu>({64 + i});
      }
    });
  for (auto& th : threads) th.join();
  CHECK(locus::memory_stats<D>().allocated_bytes == before);
  CHECK(locus::memory_stats<locus::cpu>().allocated_bytes == before_cpu);
}

TEST_CASE_TEMPLATE("statistics, peak resets and limits are safe while other threads allocate", D,
                   LOCUS_TEST_DEVICES) {
  // Concurrency coverage for ThreadSanitizer: one thread reads the statistics (in
  // bursts, so that reads fall between the allocating threads' updates), resets the
  // peak and sets the limit, while three threads allocate until it has done so often.
  const auto before = locus::memory_stats<D>().allocated_bytes;
  std::atomic<bool> done{false};
  std::atomic<int> rounds{0}, inconsistent{0};
  std::thread reader([&] {
    while (!done.load()) {
      for (int k = 0; k < 16; ++k) {
        const auto s = locus::memory_stats<D>();
        if (s.reserved_bytes < s.allocated_bytes || s.peak_allocated_bytes < s.allocated_bytes) ++inconsistent;
      }
      locus::reset_peak_memory_stats<D>();
      locus::set_memory_limit<D>(std::numeric_limits<std::size_t>::max());
      ++rounds;
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 200 || (rounds.load() < 50 && i < 200000); ++i) {
        auto a = locus::full<float, D>({32 + i % 200}, static_cast<float>(i));
        if (a(0) != static_cast<float>(i) || a(31 + i % 200) != static_cast<float>(i)) ++inconsistent;
      }
    });
  for (auto& th : threads) th.join();
  done = true;
  reader.join();
  CHECK(rounds.load() >= 1);
  CHECK(inconsistent.load() == 0);
  CHECK(locus::memory_stats<D>().allocated_bytes == before);
  CHECK(locus::memory_stats<D>().limit_bytes == std::numeric_limits<std::size_t>::max());
}

#if LOCUS_HAS_CUDA  // the pinned device exists only in builds with CUDA
TEST_CASE("pinned falls back to pageable memory without a driver and says so") {
  auto p = locus::ones<float, locus::pinned>({16});
  const auto env = locus::environment();
  CHECK(locus::memory_stats<locus::pinned>().fallback == !env.pinned_page_locked);
  if (!locus::cuda_available()) CHECK(locus::memory_stats<locus::pinned>().fallback);
}
#endif
