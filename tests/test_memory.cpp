// Allocator internals: size classes, the host allocator's accounting, and
// thread-safety of the statistics.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
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

TEST_CASE("memory_summary names each device of the build and the cpu allocator's own figures") {
  auto t = locus::empty<float, locus::cpu>({1 << 18});  // 1 MiB live
  const auto s = locus::memory_stats<locus::cpu>();
  const std::string text = locus::memory_summary();
  char want[128];
  std::snprintf(want, sizeof want, "  cpu      allocated %.1f MiB, reserved %.1f MiB, peak %.1f MiB,",
                static_cast<double>(s.allocated_bytes) / 1048576.0, static_cast<double>(s.reserved_bytes) / 1048576.0,
                static_cast<double>(s.peak_allocated_bytes) / 1048576.0);
  CHECK(text.rfind("memory:\n", 0) == 0);
  CHECK(text.find(want) != std::string::npos);
#if LOCUS_HAS_CUDA
  CHECK(text.find("  pinned   allocated ") != std::string::npos);
  CHECK((text.find("  cuda:0   allocated ") != std::string::npos || text.find("  cuda     no GPU visible") != std::string::npos));
#else
  CHECK(text.find("pinned") == std::string::npos);
#endif
}

TEST_CASE("the cpu allocator counts each allocation rounded up to 64 bytes and caches nothing below 64 KiB") {
  const auto before = locus::memory_stats<locus::cpu>();
  {
    auto a = locus::empty<float, locus::cpu>({1});     // 4 bytes: 64
    auto b = locus::empty<float, locus::cpu>({16});    // 64: 64
    auto c = locus::empty<float, locus::cpu>({17});    // 68: 128
    auto d = locus::empty<float, locus::cpu>({4000});  // 16000: 16000
    const auto s = locus::memory_stats<locus::cpu>();
    CHECK(s.allocated_bytes == before.allocated_bytes + 64 + 64 + 128 + 16000);
    CHECK(s.reserved_bytes - s.allocated_bytes == before.reserved_bytes - before.allocated_bytes);
    CHECK(s.allocations == before.allocations + 4);
    CHECK(s.cache_hits == before.cache_hits);
  }
  const auto after = locus::memory_stats<locus::cpu>();
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.reserved_bytes == before.reserved_bytes);  // freed, not cached
}

namespace {
// Restores the cpu cache's limit and empties it, whatever a test did.
struct cpu_cache_reset {
  std::size_t limit = locus::cpu_cache_limit();
  cpu_cache_reset() { locus::empty_cache<locus::cpu>(); }
  ~cpu_cache_reset() {
    locus::set_cpu_cache_limit(limit);
    locus::empty_cache<locus::cpu>();
  }
};
}  // namespace

TEST_CASE("the cpu allocator keeps freed blocks of 64 KiB and more for the next request of the same size") {
  cpu_cache_reset reset;
  auto& a = locus::detail::allocator_for<locus::cpu>();
  locus::set_cpu_cache_limit(std::size_t{1} << 30);
  const auto base = a.stats();
  const std::size_t big = std::size_t{1} << 20;
  // Make the process's peak at least a few blocks, so that the cache may hold them.
  { auto w = locus::empty<float, locus::cpu>({static_cast<std::int64_t>(4 * big / sizeof(float))}); }
  locus::empty_cache<locus::cpu>();
  const auto s0 = a.stats();
  CHECK(s0.reserved_bytes == s0.allocated_bytes);

  void* p = a.allocate(big);
  std::memset(p, 0x5a, big);
  a.deallocate(p);
  auto s1 = a.stats();
  CHECK(s1.allocated_bytes == base.allocated_bytes);
  CHECK(s1.reserved_bytes == s1.allocated_bytes + big);  // kept

  void* q = a.allocate(big - 10);  // rounds up to the same 64-byte size: the kept block
  CHECK(q == p);
  auto s2 = a.stats();
  CHECK(s2.cache_hits == s1.cache_hits + 1);
  CHECK(s2.allocations == s1.allocations + 1);  // every request counts, hits too
  CHECK(s2.reserved_bytes == s2.allocated_bytes);
  CHECK(s2.allocated_bytes == base.allocated_bytes + big);

  void* r = a.allocate(big + 64);  // another size: a new block
  CHECK(r != p);
  CHECK(a.stats().cache_hits == s2.cache_hits);
  a.deallocate(q);
  a.deallocate(r);
  CHECK(a.stats().reserved_bytes == base.allocated_bytes + 2 * big + 64);
  locus::empty_cache<locus::cpu>();
  CHECK(a.stats().reserved_bytes == a.stats().allocated_bytes);
  CHECK(a.stats().allocated_bytes == base.allocated_bytes);
}

TEST_CASE("a tensor made in a kept block starts as its factory says, not as the last user left it") {
  cpu_cache_reset reset;
  const std::int64_t n = std::int64_t{1} << 18;  // 1 MiB of floats
  {
    auto junk = locus::full<float, locus::cpu>({n}, std::numeric_limits<float>::quiet_NaN());
  }
  const auto hits = locus::memory_stats<locus::cpu>().cache_hits;
  auto z = locus::zeros<float, locus::cpu>({n});
  CHECK(locus::memory_stats<locus::cpu>().cache_hits == hits + 1);
  auto zh = z.data();
  std::int64_t nonzero = 0;
  for (std::int64_t i = 0; i < n; ++i) nonzero += zh[i] != 0.0f;
  CHECK(nonzero == 0);
}

TEST_CASE("the cpu cache: a freed block that does not fit pushes out the blocks kept longest") {
  cpu_cache_reset reset;
  auto& a = locus::detail::allocator_for<locus::cpu>();
  const std::size_t big = std::size_t{1} << 20;
  { auto w = locus::empty<float, locus::cpu>({static_cast<std::int64_t>(8 * big / sizeof(float))}); }
  locus::empty_cache<locus::cpu>();
  locus::set_cpu_cache_limit(3 * big);
  void* p1 = a.allocate(big);
  void* p2 = a.allocate(big + 64);
  void* p3 = a.allocate(2 * big);
  a.deallocate(p1);  // kept: 1 MiB
  a.deallocate(p2);  // kept: 2 MiB + 64 B
  a.deallocate(p3);  // 2 MiB more does not fit: p1 and then p2 go, p3 is kept
  const auto s = a.stats();
  CHECK(s.reserved_bytes - s.allocated_bytes == 2 * big);
  const auto hits = s.cache_hits;
  void* q3 = a.allocate(2 * big);
  CHECK(q3 == p3);
  CHECK(a.stats().cache_hits == hits + 1);
  void* q1 = a.allocate(big);
  CHECK(a.stats().cache_hits == hits + 1);  // given back: a new block
  a.deallocate(q1);
  a.deallocate(q3);
  // A block larger than the whole limit is never kept, and pushes nothing out.
  const auto before = a.stats();
  a.deallocate(a.allocate(4 * big));
  CHECK(a.stats().reserved_bytes == before.reserved_bytes);
}

TEST_CASE("the cpu cache: its limit, 0 to turn it off, and lowering it gives back what is over") {
  cpu_cache_reset reset;
  auto& a = locus::detail::allocator_for<locus::cpu>();
  const std::size_t big = std::size_t{1} << 20;
  { auto w = locus::empty<float, locus::cpu>({static_cast<std::int64_t>(8 * big / sizeof(float))}); }
  locus::empty_cache<locus::cpu>();
  const auto base = a.stats();

  locus::set_cpu_cache_limit(0);
  CHECK(locus::cpu_cache_limit() == 0);
  a.deallocate(a.allocate(big));
  CHECK(a.stats().reserved_bytes == base.reserved_bytes);  // off: given back at once
  CHECK(a.stats().cache_hits == base.cache_hits);

  locus::set_cpu_cache_limit(2 * big + big / 2);
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(a.allocate(big));
  for (void* p : blocks) a.deallocate(p);
  CHECK(a.stats().reserved_bytes == base.reserved_bytes + 2 * big);  // the third was over the limit

  locus::set_cpu_cache_limit(big);
  CHECK(a.stats().reserved_bytes == base.reserved_bytes + big);
  locus::set_cpu_cache_limit(0);
  CHECK(a.stats().reserved_bytes == base.reserved_bytes);
}

TEST_CASE("the cpu cache under a memory limit: kept blocks give way, and a fault still fires on a hit") {
  cpu_cache_reset reset;
  auto& a = locus::detail::allocator_for<locus::cpu>();
  const std::size_t big = std::size_t{1} << 20;
  { auto w = locus::empty<float, locus::cpu>({static_cast<std::int64_t>(8 * big / sizeof(float))}); }
  locus::empty_cache<locus::cpu>();
  const auto base = a.stats();
  a.deallocate(a.allocate(2 * big));
  CHECK(a.stats().reserved_bytes == base.reserved_bytes + 2 * big);
  // Room for 3 MiB more of tensors: a 3 MiB request does not fit beside the kept 2 MiB.
  locus::set_memory_limit<locus::cpu>(base.allocated_bytes + 3 * big);
  void* p = a.allocate(3 * big);
  const auto s = a.stats();
  CHECK(s.reserved_bytes == s.allocated_bytes);  // the kept block was given back first
  CHECK(s.reserved_bytes <= base.allocated_bytes + 3 * big);
  a.deallocate(p);
  locus::set_memory_limit<locus::cpu>(std::numeric_limits<std::size_t>::max());

  // A limit set below what is kept gives kept blocks back at once, the oldest first,
  // until the reserved bytes fit (a workload of cache hits alone would never do it).
  // (An outside review found the limit only stored.)
  locus::empty_cache<locus::cpu>();
  a.deallocate(a.allocate(4 * big));
  a.deallocate(a.allocate(big));  // kept: 4 MiB (older), 1 MiB (newer)
  const auto kept = a.stats();
  REQUIRE(kept.reserved_bytes == kept.allocated_bytes + 5 * big);
  locus::set_memory_limit<locus::cpu>(kept.allocated_bytes + 2 * big);
  auto lowered = a.stats();
  CHECK(lowered.reserved_bytes == lowered.allocated_bytes + big);  // the 4 MiB went, the 1 MiB stays
  CHECK(lowered.reserved_bytes <= lowered.limit_bytes);
  for (int i = 0; i < 3; ++i) a.deallocate(a.allocate(big));  // hits of the block that stayed
  CHECK(a.stats().cache_hits == lowered.cache_hits + 3);
  locus::set_memory_limit<locus::cpu>(kept.allocated_bytes);  // nothing kept fits
  lowered = a.stats();
  CHECK(lowered.reserved_bytes == lowered.allocated_bytes);
  locus::set_memory_limit<locus::cpu>(std::numeric_limits<std::size_t>::max());

  // A request the cache would serve still counts for fault injection.
  a.deallocate(a.allocate(big));
  const auto before = a.stats();
  locus::fault::fail_allocation(1);
  CHECK_THROWS_AS((void)a.allocate(big), locus::out_of_memory);
  CHECK(locus::fault::fired());
  CHECK(a.stats().reserved_bytes == before.reserved_bytes);  // the kept block is still kept
  CHECK(a.stats().allocated_bytes == before.allocated_bytes);
  void* q = a.allocate(big);
  CHECK(a.stats().cache_hits == before.cache_hits + 1);
  a.deallocate(q);
}

#ifdef LOCUS_HOST_CACHE_ASAN
TEST_CASE("under AddressSanitizer a kept block is poisoned until it is handed out again") {
  cpu_cache_reset reset;
  auto& a = locus::detail::allocator_for<locus::cpu>();
  const std::size_t big = std::size_t{1} << 20;
  { auto w = locus::empty<float, locus::cpu>({static_cast<std::int64_t>(4 * big / sizeof(float))}); }
  auto* p = static_cast<unsigned char*>(a.allocate(big));
  a.deallocate(p);
  CHECK(__asan_address_is_poisoned(p));
  CHECK(__asan_address_is_poisoned(p + big - 1));
  auto* q = static_cast<unsigned char*>(a.allocate(big));
  REQUIRE(q == p);
  CHECK_FALSE(__asan_address_is_poisoned(q));
  CHECK_FALSE(__asan_address_is_poisoned(q + big - 1));
  a.deallocate(q);
}
#endif

namespace {
// Writes the first and last byte of a block (out of line: g++ -O3 cannot see that the
// block is never null and warns about a subscript of -1 otherwise).
[[gnu::noinline]] void touch_ends(void* p, std::size_t bytes) {
  auto* c = static_cast<volatile unsigned char*>(p);
  c[0] = 1;
  c[bytes - 1] = 2;
}
}  // namespace

TEST_CASE("the cpu cache from several threads: every block back, the statistics add up") {
  cpu_cache_reset reset;
  auto& a = locus::detail::allocator_for<locus::cpu>();
  { auto w = locus::empty<float, locus::cpu>({std::int64_t{1} << 22}); }
  locus::empty_cache<locus::cpu>();
  const auto base = a.stats();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&a, t] {
      for (int i = 0; i < 500; ++i) {
        const std::size_t bytes = (std::size_t{64} << 10) * static_cast<std::size_t>(1 + (i + t) % 3);
        void* p = a.allocate(bytes);
        touch_ends(p, bytes);
        a.deallocate(p);
      }
    });
  for (auto& th : threads) th.join();
  const auto s = a.stats();
  CHECK(s.allocated_bytes == base.allocated_bytes);
  CHECK(s.allocations == base.allocations + 2000);
  CHECK(s.cache_hits > base.cache_hits);
  CHECK(s.reserved_bytes >= s.allocated_bytes);
  // Kept blocks serve requests of their own size only, and a block of a size is made
  // only while every kept one of that size is held: at most 4 blocks (one per thread)
  // of each of the 3 sizes, 64, 128 and 192 KiB, can be kept.
  CHECK(s.reserved_bytes - s.allocated_bytes <= 4 * (1 + 2 + 3) * (std::size_t{64} << 10));
}

TEST_CASE("the cpu allocator: 64-byte aligned data, a request too large to round is out_of_memory") {
  auto& a = locus::detail::allocator_for<locus::cpu>();
  const auto before = a.stats();
  std::vector<void*> blocks;
  for (std::size_t bytes : {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{65}, std::size_t{1} << 20}) {
    void* p = a.allocate(bytes);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    std::memset(p, 0xab, bytes);  // the whole request is writable (ASan checks the header is not overrun)
    blocks.push_back(p);
  }
  for (void* p : blocks) a.deallocate(p);
  CHECK(a.stats().allocated_bytes == before.allocated_bytes);
  // Sizes within an alignment of SIZE_MAX used to wrap when rounded up (to 0 or 64 bytes).
  for (std::size_t bytes : {std::numeric_limits<std::size_t>::max(), std::numeric_limits<std::size_t>::max() - 63,
                            std::numeric_limits<std::size_t>::max() - 127}) {
    CHECK_THROWS_AS(a.allocate(bytes), locus::out_of_memory);
  }
  CHECK(a.stats().allocated_bytes == before.allocated_bytes);
  CHECK(a.allocate(0) == nullptr);
  a.deallocate(nullptr);
}

TEST_CASE("messages: out_of_memory's text, long messages and shapes of every extent") {
  const locus::out_of_memory e("cpu", 3u << 20, 1536, 1536, 4096, "memory limit");
  CHECK(std::string(e.what()) ==
        "locus: out of memory on cpu: tried to allocate 3.00 MiB; 1.50 KiB allocated by tensors, 1.50 KiB "
        "reserved by the allocator, limit 4.00 KiB (memory limit). Try a smaller batch size, gradient "
        "accumulation over several micro-batches, bf16/f16 compute, or free tensors you no longer need (or "
        "raise the limit: locus::set_memory_limit<D>(bytes)).");
  const locus::out_of_memory f("cuda", 100, 0, 0, static_cast<std::size_t>(-1), "");
  CHECK(std::string(f.what()) ==
        "locus: out of memory on cuda: tried to allocate 100 B; 0 B allocated by tensors, 0 B reserved by the "
        "allocator. Try a smaller batch size, gradient accumulation over several micro-batches, bf16/f16 "
        "compute, or free tensors you no longer need.");
  // Past the 512-byte stack buffer, the whole text still arrives.
  const std::string long_arg(3000, 'x');
  const std::string m = locus::detail::format("a%sb%d", long_arg.c_str(), 7);
  CHECK(m == "a" + long_arg + "b7");
  // Shapes at the extremes of index_t, at rank 0 and at a high rank.
  using L = std::numeric_limits<locus::index_t>;
  CHECK(locus::detail::shape_string(locus::extents<0>{}) == "[]");
  CHECK(locus::detail::shape_string(locus::extents<3>{L::min(), 0, L::max()}) ==
        "[-9223372036854775808, 0, 9223372036854775807]");
  locus::extents<12> big;
  big.fill(L::min());
  std::string want = "[";
  for (int i = 0; i < 12; ++i) want += (i ? ", " : "") + std::to_string(L::min());
  CHECK(locus::detail::shape_string(big) == want + "]");
  try {
    (void)locus::empty<float, locus::cpu>({2, -3});
    FAIL("a negative extent must throw");
  } catch (const locus::shape_error& err) {
    CHECK(std::string(err.what()) == "locus: negative extent -3 at axis 1 in shape [2, -3]; extents must be >= 0");
  }
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

#if LOCUS_HAS_CUDA
TEST_CASE("a caching allocator registers itself for release_stream_blocks when it is created") {
  // locus::stream's destructor reaches the allocators through these hooks, so that
  // files which never allocate pinned or cuda memory do not instantiate them.
  (void)locus::ones<float, locus::pinned>({4});  // the pinned allocator exists from here on
  const bool registered = locus::detail::stream_release_hook(1).load() != nullptr;
  REQUIRE(registered);
  // Releasing a stream no block knows changes no statistic.
  const auto before = locus::memory_stats<locus::pinned>();
  locus::detail::release_stream_blocks(reinterpret_cast<cudaStream_t>(std::uintptr_t{0x1234}));
  const auto after = locus::memory_stats<locus::pinned>();
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.reserved_bytes == before.reserved_bytes);
}
#endif
