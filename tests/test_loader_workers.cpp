// Host suite: data::loader with several workers (loader_options::workers). The batches
// are checked against samples gathered by hand (an order computed here from the
// documented Fisher-Yates over philox4x32, the documented shards, each sample loaded and
// transformed by the test), at 1, 2 and 3 workers and prefetch depths 1 to 3, shuffled,
// sharded and across epochs; then errors in a worker, stopping and destroying a loader
// mid-epoch, and the loader-wait figure (data::loader::wait_seconds, the trainer's
// metrics::loader_wait_seconds). Also run under ThreadSanitizer and ASan (QT_FLAGS).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <locus/data/loader.hpp>
#include <locus/data/transforms.hpp>
#include <locus/train.hpp>

#include "host_devices.hpp"

namespace {

using locus::index_t;
namespace data = locus::data;
namespace nn = locus::nn;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

/// 1 x 8 x 8 images: pixel p of sample i is a value no other (i, p) has; label i % 10.
struct image_source {
  index_t n = 0;
  index_t size() const { return n; }
  index_t features() const { return 64; }
  std::int64_t load(index_t i, std::span<float> x) const {
    if (i < 0 || i >= n || x.size() != 64) throw std::logic_error("image_source::load out of range");
    for (std::size_t p = 0; p < 64; ++p) x[p] = static_cast<float>(i) + static_cast<float>(p) / 128.0f;
    return i % 10;
  }
};

/// The augmentation of the main job, plus a normalize: every part draws or computes.
data::sample_transform augmentation() {
  return data::compose(data::random_crop{.channels = 1, .height = 8, .width = 8, .padding = 2},
                       data::horizontal_flip{.channels = 1, .height = 8, .width = 8},
                       data::normalize{.mean = {0.25f}, .std = {0.5f}});
}

/// An epoch's batches as bits: x of each batch, then its labels.
struct epoch_bits {
  std::vector<std::vector<std::uint32_t>> x;
  std::vector<std::vector<std::int64_t>> y;
  bool operator==(const epoch_bits&) const = default;
};

template <class D, class S>
epoch_bits collect(data::loader<D, S>& l) {
  epoch_bits out;
  for (auto& b : l) {
    const auto x = locus::to<locus::cpu>(b.x);
    const auto y = locus::to<locus::cpu>(b.y);
    std::vector<std::uint32_t> xb(static_cast<std::size_t>(x.numel()));
    for (std::size_t k = 0; k < xb.size(); ++k) xb[k] = std::bit_cast<std::uint32_t>(x.data_handle()[k]);
    out.x.push_back(std::move(xb));
    out.y.emplace_back(y.data_handle(), y.data_handle() + y.numel());
  }
  return out;
}

/// The epoch as the documentation specifies it, computed here: Fisher-Yates from the
/// last position down, position i swapping with (philox4x32(seed, i, epoch) words 0 and
/// 1 as a 64-bit number) mod (i + 1); rank r's contiguous block (the first n % world
/// ranks one longer); batches of batch_size (the last smaller unless drop_last); each
/// sample loaded and transformed with the key (seed, epoch, dataset index).
epoch_bits by_hand(const image_source& src, const data::sample_transform& t, bool shuffle, std::uint64_t seed,
                   std::uint64_t epoch, int rank, int world, index_t batch_size, bool drop_last) {
  const index_t n = src.size();
  std::vector<index_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), index_t{0});
  if (shuffle)
    for (index_t i = n - 1; i > 0; --i) {
      const auto r = locus::detail::philox4x32(seed, static_cast<std::uint64_t>(i), epoch);
      const std::uint64_t u = (std::uint64_t{r.v[0]} << 32) | r.v[1];
      std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(u % static_cast<std::uint64_t>(i + 1))]);
    }
  const index_t q = n / world, m = n % world;
  const index_t begin = rank * q + std::min<index_t>(rank, m), len = q + (rank < m ? 1 : 0);
  epoch_bits out;
  for (index_t first = 0; first < len; first += batch_size) {
    const index_t count = std::min(batch_size, len - first);
    if (count < batch_size && drop_last) break;
    std::vector<std::uint32_t> xb;
    std::vector<std::int64_t> yb;
    for (index_t k = 0; k < count; ++k) {
      const index_t i = order[static_cast<std::size_t>(begin + first + k)];
      std::vector<float> s(64);
      yb.push_back(src.load(i, s));
      if (t) t(s, data::sample_key{seed, epoch, i});
      for (float v : s) xb.push_back(std::bit_cast<std::uint32_t>(v));
    }
    out.x.push_back(std::move(xb));
    out.y.push_back(std::move(yb));
  }
  return out;
}

/// Thrown by the failing transforms below: a type of the test's own, so that a
/// rethrow as anything else (a copy sliced to std::runtime_error, a locus::error) fails.
struct sample_failure : std::runtime_error {
  index_t index;
  sample_failure(const std::string& what, index_t i) : std::runtime_error(what), index(i) {}
};

}  // namespace

TEST_CASE_TEMPLATE("loader workers: the batches of samples gathered by hand, bit for bit, at 1, 2 and 3 workers and "
                   "prefetch 1 to 3, shuffled, sharded, across epochs",
                   D, LOCUS_TEST_DEVICES) {
  const image_source src{.n = 203};
  const auto aug = augmentation();
  for (const bool shuffle : {true, false}) {
    for (const int world : {1, 3}) {
      for (int rank = 0; rank < world; ++rank) {
        const bool drop_last = world > 1;
        for (const std::uint64_t epoch : {0u, 1u, 2u}) {
          if (!shuffle && epoch > 0) continue;  // the order does not depend on it; the transform does, below
          const epoch_bits want = by_hand(src, aug, shuffle, 7, epoch, rank, world, 16, drop_last);
          REQUIRE(!want.x.empty());
          for (const int workers : {1, 2, 3}) {
            for (const int prefetch : {1, 2, 3}) {
              CAPTURE(shuffle);
              CAPTURE(world);
              CAPTURE(rank);
              CAPTURE(epoch);
              CAPTURE(workers);
              CAPTURE(prefetch);
              data::loader<D, image_source> l(src, {.batch_size = 16, .shuffle = shuffle, .seed = 7,
                                                     .drop_last = drop_last, .rank = rank, .world_size = world,
                                                     .prefetch = prefetch, .workers = workers, .transform = aug});
              l.set_epoch(epoch);
              CHECK(collect(l) == want);
            }
          }
        }
      }
    }
  }
  // The transform makes a difference (else the comparison above would prove little),
  // and so does the epoch, through the order and the transform's draws.
  const auto plain = by_hand(src, {}, true, 7, 0, 0, 1, 16, false);
  CHECK(plain != by_hand(src, aug, true, 7, 0, 0, 1, 16, false));
  CHECK(by_hand(src, aug, false, 7, 0, 0, 1, 16, false) != by_hand(src, aug, false, 7, 1, 0, 1, 16, false));
  // One loader through several epochs, workers 3: each epoch as by hand.
  data::loader<D, image_source> l(src, {.batch_size = 10, .shuffle = true, .seed = 3, .prefetch = 2, .workers = 3,
                                         .transform = aug});
  for (const std::uint64_t e : {0u, 1u, 5u, 1u}) {
    CAPTURE(e);
    l.set_epoch(e);
    CHECK(collect(l) == by_hand(src, aug, true, 3, e, 0, 1, 10, false));
  }
}

TEST_CASE("loader workers: the samples of a batch are made by several threads at once") {
  // A transform that notes how many calls are inside it at once: with N workers
  // (and samples slow enough to overlap) more than one, with one worker never.
  const image_source src{.n = 48};
  for (const int workers : {1, 2, 4}) {
    CAPTURE(workers);
    std::atomic<int> inside{0}, most{0};
    const data::sample_transform slow = [&](std::span<float>, const data::sample_key&) {
      const int now = ++inside;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      --inside;
    };
    data::loader<locus::cpu, image_source> l(src, {.batch_size = 12, .workers = workers, .transform = slow});
    index_t rows = 0;
    for (auto& b : l) rows += b.x.extent(0);
    CHECK(rows == 48);
    if (workers == 1)
      CHECK(most.load() == 1);
    else
      CHECK(most.load() >= 2);
    CHECK(most.load() <= workers);
  }
}

TEST_CASE("loader workers: a throwing transform surfaces as the same typed error at every worker count") {
  const image_source src{.n = 100};
  // Sample 37 (position 37 without shuffle: batch 4, after 4 whole batches) throws.
  const data::sample_transform failing = [](std::span<float> x, const data::sample_key& k) {
    if (k.index == 37) throw sample_failure("locus test: sample 37 is corrupt", k.index);
    x[0] += 1.0f;
  };
  for (const int workers : {1, 2, 3}) {
    CAPTURE(workers);
    data::loader<locus::cpu, image_source> l(src, {.batch_size = 8, .prefetch = 2, .workers = workers, .transform = failing});
    for (int attempt = 0; attempt < 2; ++attempt) {  // the loader stays usable: the same again
      CAPTURE(attempt);
      std::vector<std::int64_t> labels;
      bool caught = false;
      try {
        for (auto& b : l)
          for (index_t k = 0; k < b.y.extent(0); ++k) labels.push_back(b.y(k));
      } catch (const sample_failure& e) {
        caught = true;
        CHECK(std::string(e.what()) == "locus test: sample 37 is corrupt");
        CHECK(e.index == 37);
      }
      CHECK(caught);
      CHECK(labels.size() == 32);  // the four batches before it
    }
  }
  // A failing first batch throws from begin(), typed, at 2 workers too.
  const data::sample_transform first = [](std::span<float>, const data::sample_key& k) {
    if (k.index == 1) throw locus::value_error("locus: test: sample 1");
  };
  data::loader<locus::cpu, image_source> l0(src, {.batch_size = 4, .workers = 2, .transform = first});
  CHECK_THROWS_WITH_AS((void)l0.begin(), "locus: test: sample 1", locus::value_error);
  CHECK_THROWS_WITH_AS((void)l0.begin(), "locus: test: sample 1", locus::value_error);
}

TEST_CASE("loader workers: of two failures in one batch the earlier sample's is raised, as with one worker") {
  // Samples 17 and 30 of batch 1 (batch 16, no shuffle) fail; 17 only after a pause, so
  // with several workers 30 fails first in time. The error raised must still be 17's:
  // the one a single worker meets first.
  const image_source src{.n = 64};
  const data::sample_transform two = [](std::span<float>, const data::sample_key& k) {
    if (k.index == 17) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      throw sample_failure("locus test: sample 17", 17);
    }
    if (k.index == 30) throw sample_failure("locus test: sample 30", 30);
  };
  for (const int workers : {1, 2, 3, 8}) {
    for (int round = 0; round < 3; ++round) {
      CAPTURE(workers);
      CAPTURE(round);
      data::loader<locus::cpu, image_source> l(src, {.batch_size = 16, .workers = workers, .transform = two});
      index_t batches = 0;
      try {
        for (auto& b : l) {
          (void)b;
          ++batches;
        }
        FAIL("expected sample 17's failure");
      } catch (const sample_failure& e) {
        CHECK(e.index == 17);
      }
      CHECK(batches == 1);
    }
  }
}

TEST_CASE("loader workers: leaving an epoch early, starting again, and destroying a loader mid-epoch are clean") {
  const image_source src{.n = 120};
  const auto aug = augmentation();
  const auto base = locus::memory_stats<locus::cpu>().allocated_bytes;
  {
    data::loader<locus::cpu, image_source> l(src, {.batch_size = 8, .shuffle = true, .seed = 9, .prefetch = 3,
                                                    .workers = 3, .transform = aug});
    for (auto& b : l) {
      (void)b;
      break;  // the producer is blocked on a full queue, the helpers wait for a batch
    }
    CHECK(collect(l) == by_hand(src, aug, true, 9, 0, 0, 1, 8, false));
    auto it = l.begin();
    ++it;
    CHECK(it->y.extent(0) == 8);
    // destroyed here with an epoch in progress
  }
  CHECK(locus::memory_stats<locus::cpu>().allocated_bytes == base);

  // Destroyed while the workers are inside slow samples: it returns at once (after a
  // sample each, not the rest of the epoch: 2.7 s of samples for 3 workers, 4 s for 2).
  const image_source big{.n = 4000};
  std::atomic<index_t> made{0};
  const data::sample_transform slow = [&](std::span<float>, const data::sample_key&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ++made;
  };
  for (const int workers : {2, 3}) {
    CAPTURE(workers);
    made = 0;
    clock_type::time_point t0;
    {
      data::loader<locus::cpu, image_source> l(big, {.batch_size = 64, .prefetch = 2, .workers = workers, .transform = slow});
      auto it = l.begin();
      ++it;
      CHECK(it->y(0) == 64 % 10);
      t0 = clock_type::now();
    }
    const double took = seconds_since(t0);
    CHECK(took < 1.0);
    CHECK(made.load() < 4000);
    // and begin() of a new epoch stops the running one the same way
    data::loader<locus::cpu, image_source> l(big, {.batch_size = 64, .prefetch = 2, .workers = workers, .transform = slow});
    (void)l.begin();
    t0 = clock_type::now();
    (void)l.begin();
    CHECK(seconds_since(t0) < 1.0);
  }
  CHECK(locus::memory_stats<locus::cpu>().allocated_bytes == base);
}

TEST_CASE("loader workers: bad worker counts are refused naming the option") {
  const image_source src{.n = 10};
  using L = data::loader<locus::cpu, image_source>;
  for (const int w : {0, -1, 257}) {
    CAPTURE(w);
    try {
      L l(src, {.workers = w});
      FAIL("expected locus::error");
    } catch (const locus::error& e) {
      const std::string m = e.what();
      CHECK(m.rfind("locus: loader workers must be in [1, 256]", 0) == 0);
      CHECK(m.find("got " + std::to_string(w)) != std::string::npos);
    }
  }
  CHECK_NOTHROW(L(src, {.workers = 256}));
}

TEST_CASE("loader wait: most of the epoch when the transform is slow, near zero when the loader keeps ahead, reset per epoch") {
  const image_source src{.n = 64};
  // Slow only in epoch 0: 1 ms a sample, one worker, a consumer that does nothing.
  const data::sample_transform slow_first = [](std::span<float>, const data::sample_key& k) {
    if (k.epoch == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  data::loader<locus::cpu, image_source> l(src, {.batch_size = 8, .prefetch = 2, .transform = slow_first});
  CHECK(l.wait_seconds() == 0.0);
  auto t0 = clock_type::now();
  index_t rows = 0;
  for (auto& b : l) rows += b.x.extent(0);
  const double wall0 = seconds_since(t0), wait0 = l.wait_seconds();
  CHECK(rows == 64);
  CHECK(wait0 >= 0.064 * 0.9);  // at least the samples' sleeps, less a clock's rounding
  CHECK(wait0 > 0.5 * wall0);
  CHECK(wait0 <= wall0);

  // Epoch 1: fast samples, a consumer that takes 10 ms a batch: the loader keeps ahead
  // and only the first batch is waited for.
  l.set_epoch(1);
  t0 = clock_type::now();
  for (auto& b : l) {
    (void)b;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double wall1 = seconds_since(t0), wait1 = l.wait_seconds();
  CHECK(wait1 >= 0.0);
  CHECK(wait1 < 0.1 * wall1);  // reset by begin(): not epoch 0's wait
  CHECK(wait1 <= wall1);
}

TEST_CASE("loader wait: the trainer reports it per epoch beside samples/s, and its progress callback carries it") {
  using D = locus::cpu;
  using P = locus::amp::fp32;
  const image_source src{.n = 96};
  const data::sample_transform slow = [](std::span<float>, const data::sample_key& k) {
    if (k.epoch == 0) std::this_thread::sleep_for(std::chrono::milliseconds(4));
  };
  data::loader<D, image_source> rows(src, {.batch_size = 16, .shuffle = true, .seed = 2, .workers = 2, .transform = slow});
  auto images = data::images(rows, 1, 8, 8);
  nn::sequential m(nn::flatten<D, P>(), nn::linear<D, P>(64, 10));
  m.reset_parameters(1);
  locus::optim::adamw<D> opt(m.parameters(), {.lr = 1e-3});
  locus::train::trainer t(m, opt, nn::cross_entropy{});
  std::vector<locus::train::progress> seen;
  const auto r0 = t.train_epoch(images, {.epoch = 0, .report_every = 2,
                                         .on_progress = [&](const locus::train::progress& p) { seen.push_back(p); }});
  CHECK(r0.samples == 96);
  // 96 samples of 4 ms over 2 workers (192 ms) against six steps of a small linear
  // layer: most of the epoch is spent waiting
  CHECK(r0.seconds >= 0.192 * 0.9);
  CHECK(r0.loader_wait_seconds > 0.5 * r0.seconds);
  CHECK(r0.loader_wait_seconds <= r0.seconds);
  CHECK(r0.loader_wait_seconds == images.wait_seconds());
  REQUIRE(seen.size() == 3);  // batches 2, 4 and the last
  CHECK(seen[0].loader_wait_seconds > 0.0);
  CHECK(seen[0].loader_wait_seconds <= seen[1].loader_wait_seconds);  // accumulates through the epoch
  CHECK(seen[1].loader_wait_seconds <= seen[1].seconds);
  CHECK(seen[2].last);
  CHECK(seen[2].loader_wait_seconds == r0.loader_wait_seconds);
  // the progress bar shows it
  CHECK(locus::train::progress_bar::line(seen[2], 10).find("  data wait ") != std::string::npos);
  CHECK(locus::train::progress_bar::line(locus::train::progress{}, 10).find("wait") == std::string::npos);

  const auto r1 = t.train_epoch(images, {.epoch = 1});  // fast samples
  CHECK(r1.loader_wait_seconds >= 0.0);
  CHECK(r1.loader_wait_seconds < r0.loader_wait_seconds);
  CHECK(r1.loader_wait_seconds <= r1.seconds);

  // A range of batches that is not a loader: no figure.
  std::vector<data::batch<D>> plain;
  for (auto& b : rows) plain.push_back({locus::to<D>(b.x), locus::to<D>(b.y)});
  nn::sequential m2(nn::linear<D, P>(64, 10));
  m2.reset_parameters(1);
  locus::optim::adamw<D> opt2(m2.parameters(), {.lr = 1e-3});
  locus::train::trainer t2(m2, opt2, nn::cross_entropy{});
  const auto r2 = t2.train_epoch(plain, {.epoch = 0});
  CHECK(r2.samples == 96);
  CHECK(r2.loader_wait_seconds == 0.0);
}
