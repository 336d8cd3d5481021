// Concurrency stress (docs/reliability.md), for the host suite and its ThreadSanitizer
// preset (`cmake --workflow --preset tsan`, OpenMP at one thread there): threads that
// allocate and free on every host device at once, the fault injector armed under them,
// and trainers with their own loaders on separate threads, which must train exactly as
// the same runs one after another. (Streams created and destroyed concurrently need a
// GPU: tests/cuda/test_streams.cu; the stream registry's host logic is in
// tests/test_streams_host.cpp.)
#include <doctest/doctest.h>

#include <locus/data/loader.hpp>
#include <locus/data/tensor_dataset.hpp>
#include <locus/train.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace {

namespace nn = locus::nn;
using locus::index_t;

/// Each thread allocates tensors of random sizes on D, writes a pattern, checks it after
/// the other threads have run, and frees them in random order.
template <class D>
void hammer(int threads, int rounds) {
  const auto before = locus::memory_stats<D>();
  std::atomic<int> wrong{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 1u);
      std::uniform_int_distribution<int> size(1, 40000);
      std::vector<locus::tensor<std::int32_t, D, 1>> held;
      for (int r = 0; r < rounds; ++r) {
        const index_t n = size(rng);
        locus::tensor<std::int32_t, D, 1> x(locus::extents<1>{n});
        std::int32_t* p = x.data_handle();
        for (index_t i = 0; i < n; i += 97) p[i] = t * 1000003 + r;
        held.push_back(std::move(x));
        if (held.size() > 8 || rng() % 3 == 0) {
          const std::size_t k = rng() % held.size();
          const auto& h = held[k];
          const std::int32_t* q = h.data_handle();
          const int owner_round = static_cast<int>(q[0] - t * 1000003);
          for (index_t i = 0; i < h.numel(); i += 97)
            if (q[i] != q[0] || owner_round < 0 || owner_round > r) wrong.fetch_add(1, std::memory_order_relaxed);
          held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
    });
  for (auto& th : pool) th.join();
  CHECK(wrong.load() == 0);  // no block was handed to two threads at once
  const auto after = locus::memory_stats<D>();
  CHECK(after.allocated_bytes == before.allocated_bytes);  // everything came back
  CHECK(after.allocations - before.allocations == static_cast<std::size_t>(threads * rounds));
}

locus::data::tensor_dataset make_set(std::uint64_t seed) {
  auto x = locus::randn<float, locus::cpu>({512, 16}, seed);
  auto y = locus::zeros<std::int64_t, locus::cpu>({512});
  for (index_t i = 0; i < 512; ++i) y(i) = (i * 5 + static_cast<index_t>(seed)) % 4;
  return locus::data::tensor_dataset(std::move(x), std::move(y));
}

/// Two epochs of a small model on its own data and loader; the final weights.
std::vector<float> train_run(std::uint64_t seed) {
  using D = locus::cpu;
  using P = locus::amp::fp32;
  auto set = make_set(seed);
  nn::sequential m(nn::linear<D, P>(16, 32), nn::relu<D, P>(), nn::dropout<D, P>(0.1f, seed), nn::linear<D, P>(32, 4));
  m.reset_parameters(seed);
  locus::optim::adamw<D> opt(m.parameters(), {.lr = 1e-2});
  locus::train::trainer t(m, opt, nn::cross_entropy{}, {.accumulate = 2});
  locus::data::loader<D, locus::data::tensor_dataset> l(set, {.batch_size = 32, .shuffle = true, .seed = seed, .prefetch = 2});
  for (int e = 0; e < 2; ++e) t.train_epoch(l, {.epoch = e});
  const auto w = std::as_const(m).parameters().master();
  return {w.data_handle(), w.data_handle() + w.numel()};
}

}  // namespace

TEST_CASE("concurrency: threads allocating and freeing at once on cpu and pinned share no block and leak none") {
  hammer<locus::cpu>(8, 400);
#if LOCUS_HAS_CUDA  // pinned exists in builds with CUDA (without a driver it is host memory)
  hammer<locus::pinned>(8, 400);
#endif
}

TEST_CASE("concurrency: an armed fault fires exactly once among threads allocating at once") {
  constexpr int threads = 6, each = 200;
  std::atomic<int> faults{0};
  locus::fault::fail_allocation(500);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int i = 0; i < each; ++i) {
        try {
          locus::tensor<float, locus::cpu, 1> x(locus::extents<1>{64});
          x.data_handle()[0] = 1.0f;
        } catch (const locus::out_of_memory&) {
          faults.fetch_add(1);
        }
      }
    });
  for (auto& th : pool) th.join();
  const bool fired = locus::fault::fired();
  const std::int64_t seen = locus::fault::requests();
  locus::fault::fail_allocation(0);
  CHECK(faults.load() == 1);
  CHECK(fired);
  CHECK(seen == 500);  // counting stops at the fault
}

TEST_CASE("concurrency: trainers with their own loaders on separate threads train as they do one after another") {
  const std::uint64_t seeds[] = {1, 2, 3};
  std::vector<std::vector<float>> alone;
  for (const auto s : seeds) alone.push_back(train_run(s));
  std::vector<std::vector<float>> together(3);
  std::vector<std::thread> pool;
  for (std::size_t i = 0; i < 3; ++i) pool.emplace_back([&, i] { together[i] = train_run(seeds[i]); });
  for (auto& th : pool) th.join();
  for (std::size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(together[i] == alone[i]);  // bit for bit
  }
  CHECK(alone[0] != alone[1]);
}
