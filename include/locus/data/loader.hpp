// data::loader<D>: batches of a dataset on device D, shuffled with a seed, sharded
// across ranks, prepared ahead on a background thread, its samples loaded and transformed
// by `workers` threads.
//
// Length: the consumer, the producer thread, the worker pool and the cuda staging path
// share one object's state (the queue, the epoch's order, the stop flags); the worker
// pool is the seam to split out next (issue 31).
//
//   locus::data::idx_dataset train = locus::data::idx_dataset::from_directory(dir, "train");
//   locus::data::loader<locus::cuda> batches(train, {.batch_size = 128, .shuffle = true,
//                                                    .seed = 42, .rank = r, .world_size = n});
//   for (int e = 0; e < epochs; ++e) {
//     batches.set_epoch(e);                 // a new, reproducible order per epoch
//     for (auto& [x, y] : batches) { ... }  // x: f32 [B, features], y: i64 [B], on cuda
//   }
//
// Batches. x is float [B, features] (for Fashion-MNIST [B, 784]: an image is a row,
// which is what a linear layer takes; x.reshape({B, 28, 28}) is a free view), y is
// i64 [B]. The last batch of an epoch is smaller unless drop_last.
//
// Order. The sample order of an epoch depends only on (seed, epoch, dataset size):
// Fisher-Yates from the last position down, where position i swaps with
// (philox4x32-10(key = seed, counter = i, stream = epoch) words 0 and 1 as a 64-bit
// number) mod (i + 1). No std::shuffle (its algorithm is unspecified), no
// global state: every machine, compiler and run gives the same order. set_epoch(e)
// selects the epoch; without it every pass repeats the same order.
//
// Shards. The epoch's order (the same on every rank) is cut into world_size
// contiguous blocks; rank r reads block r. Block sizes differ by at most one: with
// N = q * world_size + m, ranks 0 .. m-1 read q + 1 samples and the others q. The
// shards partition the dataset exactly (no sample dropped or repeated); so ranks may
// see different batch counts (compare size() across ranks, or use drop_last with a
// batch size that divides q).
//
// Prefetch. A background thread prepares up to `prefetch` batches ahead and blocks
// when that many are waiting, so the loader holds at most `prefetch` batches plus
// the one handed out (the previous one is freed before the next is taken). For
// D = cuda it fills a pinned staging batch and copies it to the batch's device tensors
// on its own side stream, which overlaps kernels on the consumer's stream. The host
// never waits for those copies on the consumer's side: when a batch is handed out, the
// consumer's current stream (of the loader's device, on the thread that advances the
// iterator) is made to wait on the copy's event (cudaStreamWaitEvent), so every kernel
// the consumer enqueues after that sees the complete batch, and host reads of it
// (to<cpu>) wait for it too. The batch's memory is recorded as used on the side stream
// and on that consumer stream (record_stream), so a freed batch is not reused before
// either is done with it. The producer thread keeps each pinned staging batch until
// its copy's event has completed (at most `prefetch` of them), so the host never
// rewrites or frees staging memory under the copy engine. Device memory for a batch is
// allocated on the consumer's current stream (captured by begin()) and the side stream
// first waits for the work already enqueued there, so a block recycled from an earlier
// batch is never overwritten while kernels still read it.
//
// Workers. The samples of a batch (load() and the transform) are produced by
// `workers` threads at once (default 1: the background thread alone, one sample at a
// time, as the loader always did). With N > 1 the background thread and N - 1 helper
// threads, started with the epoch and joined at its end, claim chunks of the batch's
// positions from one atomic counter; each writes its samples into their own rows of
// the batch, and the batch is queued once all N are done with it. A sample's rows
// depend only on its position and on (seed, epoch, dataset index), never on which
// thread made it, so the batches are the same, bit for bit, at every worker count and
// prefetch depth. One batch is filled at a time, so the memory bound above holds at any
// worker count. With N > 1 the dataset's load() and the transform are called from
// several threads at once (on different samples): they must be safe to call
// concurrently (idx_dataset, tensor_dataset and the transforms of data/transforms.hpp
// are). A failure is the first in the batch's order, as with one worker: a thread that
// fails stops claiming, the others finish the chunks they hold (each claimed before
// the failing one, or after it), and the failure at the lowest position is raised
// (below); load() may have been called on later samples of that batch.
//
// Workers and OpenMP. The workers are std::threads of the loader, not an OpenMP team,
// and nothing the loader runs (the IDX and tensor datasets, the transforms of
// data/transforms.hpp) enters an OpenMP region, so the loader never waits on the
// training step's OpenMP team nor the team on the loader: the consumer waits only for
// a batch (a condition variable: it sleeps), the producer only for queue space. They
// share the cores, though: while the step computes with OMP_NUM_THREADS threads, N
// workers prepare the next batch beside them, so N + OMP_NUM_THREADS threads may be
// runnable; the transforms then take cores from the step. Where the step waits for
// data (wait_seconds() is a large part of the epoch), its OpenMP threads are idle and
// the workers have the cores, unless OMP_WAIT_POLICY=active keeps idle OpenMP threads
// spinning: leave the policy passive (or libgomp's default, which spins briefly and
// then sleeps) for a data-bound job. A SampleSource or transform that itself uses
// OpenMP starts a team per worker (N x OMP_NUM_THREADS threads): give it one thread.
//
// Loader wait. wait_seconds() is the time the consumer spent blocked in begin() and in
// the iterator's increments of the current (or last) epoch waiting for its batches:
// near zero when the loader keeps ahead of the step, most of the epoch when the data
// is the bottleneck. begin() resets it; the trainer reports it per epoch
// (train::metrics::loader_wait_seconds).
//
// Devices. A loader<cuda> belongs to the device current when it was constructed: its
// side stream is made there, its batches are allocated there, and its producer thread
// makes that device current. begin() captures that device's current stream of the
// calling thread (an explicit handle, cudaStreamLegacy for the default stream: never
// 0, which another thread would read as its own per-thread default stream).
//
// Errors. An exception thrown on the background thread or a worker (by the dataset, a
// transform, an allocation, a CUDA call) ends the epoch and is rethrown, as the same
// object with its message, by the consumer's call that would have received that batch
// (the batches before it are delivered first). The loader stays usable: the next
// begin() starts the epoch again, and destroying it at any point joins its threads.
//
// The dataset must outlive the loader (it is held by reference). Any type with
// size(), features() and load(i, span<float>) -> label works (SampleSource); that is
// also the test seam.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <iterator>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/config.hpp"
#include "../core/device.hpp"
#include "../core/error.hpp"
#include "../ops/random.hpp"
#include "../tensor/tensor.hpp"
#include "idx.hpp"
#include "tensor_dataset.hpp"

#if LOCUS_HAS_CUDA
#include "../backend/cuda/runtime.hpp"
#include "../transfer/stream.hpp"
#endif

namespace locus::data {

/// What a loader reads: a number of samples, each `features()` floats and an i64
/// label. load(i, x) writes sample i into x (exactly features() floats) and returns
/// its label; it is called from the loader's background threads: one at a time with
/// loader_options::workers = 1, from several at once (on different samples) with more.
template <class S>
concept SampleSource = requires(const S& s, index_t i, std::span<float> x) {
  { s.size() } -> std::convertible_to<index_t>;
  { s.features() } -> std::convertible_to<index_t>;
  { s.load(i, x) } -> std::convertible_to<std::int64_t>;
};

/// What a per-sample transform draws its randomness from: the loader's seed, the epoch
/// and the sample's index in the dataset (counter-based: a (seed, epoch, index) gives
/// the same sample on every device, thread count and prefetch depth).
struct sample_key {
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  index_t index = 0;
};

/// What a loader knows of its samples when it checks its transform, before the first
/// batch: the floats per sample (the dataset's features()) and, when known, channels x
/// height x width (data::images gives them; a transform that declares them, such as
/// random_crop or horizontal_flip, fills them in). 0: not known.
struct sample_shape {
  index_t features = 0;
  index_t channels = 0, height = 0, width = 0;
};

/// A per-sample transform: rewrites the sample's features() floats in place (data
/// augmentation: data/transforms.hpp). Called on the loader's background threads
/// (concurrently, on different samples, with loader_options::workers > 1). Any
/// callable void(std::span<float>, const sample_key&) converts to it, as to a
/// std::function; one that also has `void check(sample_shape&) const` (every transform
/// of data/transforms.hpp, and compose) is checked against the samples' shape when the
/// loader is built and again by data::images, so a transform that does not fit the
/// samples is a shape_error before any batch, not a wrong image on the loader's thread.
class sample_transform {
 public:
  sample_transform() = default;
  sample_transform(std::nullptr_t) noexcept {}
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, sample_transform> &&
             std::is_invocable_v<std::remove_cvref_t<F>&, std::span<float>, const sample_key&>)
  sample_transform(F&& f) : apply_(f) {  // NOLINT: converts implicitly, as std::function does
    using G = std::remove_cvref_t<F>;
    if constexpr (requires(const G& g, sample_shape& s) { g.check(s); })
      check_ = [g = G(f)](sample_shape& s) { g.check(s); };
  }

  void operator()(std::span<float> sample, const sample_key& key) const { apply_(sample, key); }
  explicit operator bool() const noexcept { return static_cast<bool>(apply_); }
  /// Checks the transform against what is known of the samples (shape_error or
  /// value_error), and fills in the shape it declares; nothing for a plain callable.
  void check(sample_shape& s) const {
    if (check_) check_(s);
  }

 private:
  std::function<void(std::span<float>, const sample_key&)> apply_;
  std::function<void(sample_shape&)> check_;
};

struct loader_options {
  index_t batch_size = 64;
  bool shuffle = false;      ///< false: dataset order (still sharded)
  std::uint64_t seed = 0;    ///< with shuffle: the order is a function of (seed, epoch)
  bool drop_last = false;    ///< drop this rank's last, smaller batch
  int rank = 0;              ///< this process's shard, in [0, world_size)
  int world_size = 1;        ///< number of shards
  int prefetch = 2;          ///< batches prepared ahead by the background thread (>= 1)
  /// Threads that load and transform the samples of a batch, in [1, 256]: 1 is the
  /// background thread alone; N > 1 adds N - 1 helpers for the epoch. The batches are
  /// the same, bit for bit, at every count (see the header comment: Workers).
  int workers = 1;
  /// Applied to every sample after load (empty: none), e.g. data::compose(
  /// data::random_crop{...}, data::horizontal_flip{...}); evaluation loaders take none.
  sample_transform transform{};
};

/// One batch: x float [B, features], y i64 [B], both on D.
template <Device D>
struct batch {
  using device_type = D;
  tensor<float, D, 2> x;
  tensor<std::int64_t, D, 1> y;
};

namespace detail {

/// The sample order of one epoch over n samples (see the header comment).
inline std::vector<index_t> epoch_order(index_t n, bool shuffle, std::uint64_t seed,
                                        std::uint64_t epoch) {
  std::vector<index_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), index_t{0});
  if (shuffle) {
    for (index_t i = n - 1; i > 0; --i) {
      const auto r = locus::detail::philox4x32(seed, static_cast<std::uint64_t>(i), epoch);
      const std::uint64_t u = (static_cast<std::uint64_t>(r.v[0]) << 32) | r.v[1];
      const auto j = static_cast<index_t>(u % static_cast<std::uint64_t>(i + 1));
      std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
    }
  }
  return order;
}

/// Positions [begin, end) of rank's contiguous block of n samples over world ranks:
/// the first n % world ranks get one more.
inline std::pair<index_t, index_t> shard_range(index_t n, int rank, int world) {
  const index_t q = n / world, m = n % world, r = rank;
  const index_t begin = r * q + (r < m ? r : m);
  return {begin, begin + q + (r < m ? 1 : 0)};
}

}  // namespace detail

template <Device D, SampleSource Source = idx_dataset>
class loader {
  static constexpr bool is_cuda = std::is_same_v<D, cuda>;

 public:
  using batch_type = batch<D>;
  struct sentinel {};

  /// A single-pass iterator over the current epoch's batches.
  class iterator {
   public:
    using value_type = batch<D>;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;

    iterator() = default;
    batch<D>& operator*() const { return *owner_->current_; }
    batch<D>* operator->() const { return &*owner_->current_; }
    /// Frees the batch handed out, then waits for the next (rethrowing an error
    /// from the background thread).
    iterator& operator++() {
      owner_->advance();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, sentinel) noexcept { return it.done(); }

   private:
    friend class loader;
    bool done() const noexcept { return !owner_ || !owner_->current_; }
    explicit iterator(loader* owner) noexcept : owner_(owner) {}
    loader* owner_ = nullptr;
  };

  /// Throws locus::error for bad options; loader<cuda> throws cuda_error without a
  /// usable GPU (it creates its side stream here).
  loader(const Source& source, loader_options options = {})
      : source_(&source), options_(options) {
    if (options_.batch_size < 1)
      throw value_error("locus: loader batch_size must be >= 1, got " + std::to_string(options_.batch_size));
    if (options_.world_size < 1 || options_.rank < 0 || options_.rank >= options_.world_size)
      throw value_error("locus: loader rank " + std::to_string(options_.rank) + " of world_size " +
                  std::to_string(options_.world_size) +
                  "; expected world_size >= 1 and 0 <= rank < world_size");
    if (options_.prefetch < 1)
      throw value_error("locus: loader prefetch must be >= 1, got " + std::to_string(options_.prefetch));
    if (options_.workers < 1 || options_.workers > max_workers)
      throw value_error("locus: loader workers must be in [1, " + std::to_string(max_workers) + "] (threads that load and "
                  "transform a batch's samples; 1: the background thread alone), got " +
                  std::to_string(options_.workers));
    if (static_cast<index_t>(source.size()) < 0 || static_cast<index_t>(source.features()) < 0)
      throw value_error("locus: loader dataset reports a negative size or feature count");
    check_transform(sample_shape{features()});
#if LOCUS_HAS_CUDA
    if constexpr (is_cuda) {
      cuda_.device = locus::detail::current_device();
      // Host reads need not wait for it: its copies reach the consumer through an event.
      cuda_.side.emplace(locus::detail::unlisted_stream_key{});
    }
#endif
  }
  /// Held by reference: a temporary dataset would dangle.
  // Prevents: a loader over a temporary dataset, which reads freed memory from its
  // background thread.
  template <class S>
    requires(std::is_same_v<std::remove_cvref_t<S>, Source> && !std::is_lvalue_reference_v<S>)
  explicit loader(S&&, loader_options = {}) {
    static_assert(locus::detail::always_false<S>,
                  "locus: a loader over a temporary dataset would read freed memory (it keeps the dataset by "
                  "reference); keep the dataset in a variable: auto ds = ...; locus::data::loader<D> l(ds, o);");
  }
  loader(const loader&) = delete;
  loader& operator=(const loader&) = delete;
  ~loader() { stop(); }

  /// The most workers a loader takes (loader_options::workers).
  static constexpr int max_workers = 256;

  /// Selects the epoch whose order the next begin() uses.
  void set_epoch(std::uint64_t epoch) noexcept { epoch_ = epoch; }
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] const loader_options& options() const noexcept { return options_; }

  /// Floats per sample (the dataset's features()).
  [[nodiscard]] index_t features() const { return static_cast<index_t>(source_->features()); }

  /// Checks the transform against the samples' shape s (its features() those of the
  /// dataset): the loader's constructor does with the features alone, data::images with
  /// channels, height and width. shape_error or value_error; nothing changes.
  void check_transform(sample_shape s) const {
    if (options_.transform) options_.transform.check(s);
  }

  /// Samples this rank reads per epoch.
  [[nodiscard]] index_t shard_size() const {
    const auto [b, e] = detail::shard_range(static_cast<index_t>(source_->size()), options_.rank,
                                            options_.world_size);
    return e - b;
  }
  /// Batches this rank yields per epoch.
  [[nodiscard]] index_t size() const {
    const index_t n = shard_size(), bs = options_.batch_size;
    return options_.drop_last ? n / bs : n / bs + (n % bs != 0 ? 1 : 0);  // no n + bs overflow
  }
  /// The dataset indices this rank reads in the current epoch, in order (dropped
  /// tail included: drop_last only stops before it).
  [[nodiscard]] std::vector<index_t> indices() const {
    const index_t n = static_cast<index_t>(source_->size());
    auto order = detail::epoch_order(n, options_.shuffle, options_.seed, epoch_);
    const auto [b, e] = detail::shard_range(n, options_.rank, options_.world_size);
    return {order.begin() + b, order.begin() + e};
  }

  /// Starts an epoch (stopping an unfinished one) and waits for its first batch.
  iterator begin() {
    wait_ = {};
    const waiting timed(wait_);
    stop();
    order_ = indices();
    pass_epoch_ = epoch_;
    batches_ = size();
    delivered_ = 0;
    stop_ = false;
    abort_.store(false, std::memory_order_relaxed);
    active_ = true;
#if LOCUS_HAS_CUDA
    if constexpr (is_cuda) cuda_.consumer = locus::detail::current_stream_for(cuda_.device);
#endif
    try {
      start_helpers();
      worker_ = std::thread([this] { produce(); });
    } catch (const std::system_error& e) {  // no thread left: a locus::error like every failure
      stop();
      throw error(std::string("locus: loader could not start its threads (") + std::to_string(options_.workers) +
                  " worker" + (options_.workers == 1 ? "" : "s") + "): " + e.what() +
                  "; use fewer workers, lower the number of threads the process runs, or read the dataset "
                  "without a loader");
    }
    next();
    return iterator(this);
  }
  sentinel end() const noexcept { return {}; }

  /// Seconds the consumer spent blocked in begin() and the iterator's increments since
  /// the last begin(), waiting for batches (see the header comment: Loader wait). Read
  /// it on the consumer's thread.
  [[nodiscard]] double wait_seconds() const noexcept { return std::chrono::duration<double>(wait_).count(); }

 private:
  // One prepared batch, or the error that ended the epoch.
  struct item {
    std::optional<batch<D>> b;
    index_t k = 0;  // the batch's position in the epoch
    std::exception_ptr error;
#if LOCUS_HAS_CUDA
    // Completes when the side stream's copies into b are done.
    std::optional<event> copied;
#endif
  };

  // ---- consumer side -------------------------------------------------------------
  // Adds the time from its construction to its destruction to `total`.
  struct waiting {
    std::chrono::steady_clock::duration& total;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    explicit waiting(std::chrono::steady_clock::duration& t) noexcept : total(t) {}
    waiting(const waiting&) = delete;
    waiting& operator=(const waiting&) = delete;
    ~waiting() { total += std::chrono::steady_clock::now() - t0; }
  };

  // The iterator's increment: the next batch, its wait counted.
  void advance() {
    const waiting timed(wait_);
    next();
  }

  void next() {
    if constexpr (recycles) {  // the batch handed out before: back in its slot, for the producer to refill
      if (current_) {
        std::lock_guard lock(mutex_);
        slot_of(current_k_) = std::move(*current_);
      }
    }
    current_.reset();  // free the batch handed out before taking the next
    if (!active_) return;
    if (delivered_ == batches_) {
      finish_epoch();
      return;
    }
    item it;
    {
      std::unique_lock lock(mutex_);
      ready_cv_.wait(lock, [&] { return !queue_.empty(); });
      it = std::move(queue_.front());
      queue_.pop_front();
    }
    space_cv_.notify_one();
    if (it.error) {
      finish_epoch();
      std::rethrow_exception(it.error);
    }
#if LOCUS_HAS_CUDA
    if constexpr (is_cuda) {
      // Work enqueued on the consumer's stream from now on runs after the copies (the
      // host does not wait), and the batch's blocks are not reused before that stream
      // is done with them. A failure ends the epoch like any other error.
      // The batch's device is made current first: the consumer's stream is this thread's
      // stream of that device, and for the default stream the handle is cudaStreamLegacy,
      // which names the legacy stream of the *current* device (with device 0 current, the
      // wait would land on device 0 while the batch lives on device 1).
      try {
        locus::detail::device_scope on_device(cuda_.device);
        const cudaStream_t on = locus::detail::current_stream_for(cuda_.device);
        LOCUS_CUDA_CHECK(cudaStreamWaitEvent(on, it.copied->native_handle(), 0));
        locus::detail::record_on_stream(it.b->x, on, cuda_.device);
        locus::detail::record_on_stream(it.b->y, on, cuda_.device);
      } catch (...) {
        it.b.reset();
        stop();
        throw;
      }
    }
#endif
    current_ = std::move(it.b);
    current_k_ = it.k;
    ++delivered_;
  }

  void finish_epoch() {
    active_ = false;
    join_worker();
    stop_helpers();
  }

  // join() throws std::system_error only for a thread that cannot be joined (this one,
  // or a deadlock the runtime detects), neither of which a joinable producer that is
  // told to stop can be; stop() is noexcept, so it must not escape: detached instead.
  void join_worker() noexcept {
    if (!worker_.joinable()) return;
    try {
      worker_.join();
    } catch (...) {
      if (worker_.joinable()) worker_.detach();
    }
  }

  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    abort_.store(true, std::memory_order_relaxed);  // the workers leave a batch half done
    space_cv_.notify_all();
    join_worker();
    stop_helpers();  // after the producer: nothing waits for them any more
#if LOCUS_HAS_CUDA
    // Batches never handed out may still be being written by the side stream.
    if constexpr (is_cuda)
      if (!queue_.empty() && cuda_.side) (void)cudaStreamSynchronize(cuda_.side->native_handle());
#endif
    queue_.clear();
    current_.reset();
    active_ = false;
  }

  // ---- background thread -------------------------------------------------------------
  void produce() {
    try {
#if LOCUS_HAS_CUDA
      std::optional<event> consumer_ready;
      staging_in_flight staging;  // destroyed last: waits for the side stream, then frees
      if constexpr (is_cuda) {
        LOCUS_CUDA_CHECK(cudaSetDevice(cuda_.device));
        consumer_ready.emplace();
      }
#endif
      for (index_t k = 0; k < batches_; ++k) {
        {
          std::unique_lock lock(mutex_);
          space_cv_.wait(lock, [&] {
            return stop_ || queue_.size() < static_cast<std::size_t>(options_.prefetch);
          });
          if (stop_) return;
        }
        const index_t first = k * options_.batch_size;
        const index_t count = std::min<index_t>(options_.batch_size,
                                                static_cast<index_t>(order_.size()) - first);
        item it;
        it.k = k;
        if constexpr (!is_cuda) {
          it.b.emplace(make_filled<D>(first, count, k));
          if (abort_.load(std::memory_order_relaxed)) return;  // stopped: the batch may be half filled
        } else {
#if LOCUS_HAS_CUDA
          // At most `prefetch` staging batches under the copy engine, this one included.
          staging.retire(static_cast<std::size_t>(options_.prefetch) - 1);
          auto staged = make_filled<pinned>(first, count, k);
          if (abort_.load(std::memory_order_relaxed)) return;  // stopped: the batch may be half filled
          const index_t f = static_cast<index_t>(source_->features());
          batch<D> b;  // D is cuda here; a non-dependent batch<cuda> made clang instantiate its destructor in every file
          {
            // Allocate on the consumer's stream, and let the side stream wait for
            // what is already enqueued there (a recycled block may still be read).
            locus::detail::raw_stream_guard on_consumer(cuda_.consumer, cuda_.device);
            b.x = tensor<float, D, 2>(extents<2>{count, f});
            b.y = tensor<std::int64_t, D, 1>(extents<1>{count});
            consumer_ready->record();
          }
          const cudaStream_t side = cuda_.side->native_handle();
          // Used by the side stream's copy: freed unconsumed (or on an error below), the
          // blocks are not reused before it is done.
          locus::detail::record_on_stream(b.x, side, cuda_.device);
          locus::detail::record_on_stream(b.y, side, cuda_.device);
          cuda_.side->wait(*consumer_ready);
          event copied;
          // From here on the staging must outlive the copies: it goes into `staging`
          // before anything else can throw (its destructor waits for the side stream).
          staging.keep(std::move(staged), side);
          const auto& held = staging.newest();
          LOCUS_CUDA_CHECK(cudaMemcpyAsync(b.x.data_handle(), held.x.data_handle(), held.x.size_bytes(),
                                           cudaMemcpyHostToDevice, side));
          LOCUS_CUDA_CHECK(cudaMemcpyAsync(b.y.data_handle(), held.y.data_handle(), held.y.size_bytes(),
                                           cudaMemcpyHostToDevice, side));
          staging.record_newest();
          copied.record(*cuda_.side);
          it.b.emplace(std::move(b));
          it.copied.emplace(std::move(copied));
#endif
        }
        {
          std::lock_guard lock(mutex_);
          if (stop_) return;
          queue_.push_back(std::move(it));
        }
        ready_cv_.notify_one();
      }
    } catch (...) {
      {
        std::lock_guard lock(mutex_);
        item failed;
        failed.error = std::current_exception();
        queue_.push_back(std::move(failed));
      }
      ready_cv_.notify_one();
    }
  }

#if LOCUS_HAS_CUDA
  /// The producer's pinned staging batches whose copies may still be running, oldest
  /// first, each with the event that completes after its copies. Frees a batch only
  /// once its event has completed; the destructor waits for all of them.
  class staging_in_flight {
   public:
    staging_in_flight() = default;
    staging_in_flight(const staging_in_flight&) = delete;
    staging_in_flight& operator=(const staging_in_flight&) = delete;
    ~staging_in_flight() {
      if (side_) (void)cudaStreamSynchronize(side_);  // every copy that reads them
    }
    /// Frees completed batches, then waits for the oldest until at most `keep` remain.
    void retire(std::size_t keep) {
      while (!held_.empty() && (held_.size() > keep || held_.front().done.query())) {
        held_.front().done.synchronize();
        held_.pop_front();
      }
    }
    void keep(batch<pinned> b, cudaStream_t side) {
      side_ = side;
      held_.push_back({std::move(b), event()});
    }
    [[nodiscard]] const batch<pinned>& newest() const { return held_.back().b; }
    void record_newest() { held_.back().done.record_on(side_); }

   private:
    struct entry {
      batch<pinned> b;
      event done;  // not recorded yet: query() and synchronize() return at once
    };
    std::deque<entry> held_;
    cudaStream_t side_ = nullptr;
  };
#endif

  /// Positions [first, first + count) of this epoch's order (batch `pos`), gathered on host
  /// device H (cpu or pinned): by this thread alone with one worker, else by this
  /// thread and the helpers (fill_in_parallel).
  template <class H>
  batch<H> make_filled(index_t first, index_t count, index_t pos) {
    const index_t f = static_cast<index_t>(source_->features());
    batch<H> b = fresh_batch<H>(count, f, pos);
    const fill_job job{b.x.data_handle(), b.y.data_handle(), first, count, f};
    if (helpers_.empty()) {
      for (index_t k = 0; k < count; ++k) fill_sample(job, k);
    } else {
      fill_in_parallel(job);
    }
    return b;
  }

  // ---- workers ------------------------------------------------------------------------
  // One batch to fill: rows x[k * f, (k + 1) * f) and y[k] for positions k of [0, count),
  // which are positions first + k of the epoch's order.
  struct fill_job {
    float* x = nullptr;
    std::int64_t* y = nullptr;
    index_t first = 0, count = 0, f = 0;
  };

  /// Position k of the job: load and transform (the one place a sample is made, so
  /// every worker count gives the same bits).
  void fill_sample(const fill_job& job, index_t k) const {
    const index_t i = order_[static_cast<std::size_t>(job.first + k)];
    const std::span<float> sample(job.x + k * job.f, static_cast<std::size_t>(job.f));
    job.y[k] = static_cast<std::int64_t>(source_->load(i, sample));
    if (options_.transform) options_.transform(sample, sample_key{options_.seed, pass_epoch_, i});
  }

  /// The producer's side of a batch with helpers: publishes it, fills chunks with them,
  /// waits until every helper has left it, then raises the failure at the lowest
  /// position, if any (the one a single worker would have met first).
  void fill_in_parallel(const fill_job& job) {
    {
      std::lock_guard lock(pool_mutex_);
      job_ = job;
      // About 8 chunks per worker: small enough to even out threads the step's OpenMP
      // team slows down, large enough that the counter is not contended.
      chunk_ = std::max<index_t>(1, job.count / (8 * static_cast<index_t>(options_.workers)));
      next_chunk_.store(0, std::memory_order_relaxed);
      failed_.store(false, std::memory_order_relaxed);
      failure_ = nullptr;
      failure_at_ = job.count;
      busy_ = static_cast<int>(helpers_.size());
      busy_spin_.store(busy_, std::memory_order_relaxed);
      ++generation_;
      generation_spin_.store(generation_, std::memory_order_release);
    }
    job_cv_.notify_all();
    fill_chunks(job);
    std::exception_ptr failure;
    {
      std::unique_lock lock(pool_mutex_);
      if (busy_ != 0) {  // the helpers finish within microseconds: spin briefly before sleeping
        lock.unlock();
        spin_until([&] { return busy_spin_.load(std::memory_order_acquire) == 0; });
        lock.lock();
      }
      done_cv_.wait(lock, [&] { return busy_ == 0; });
      failure = std::exchange(failure_, nullptr);
    }
    if (failure) std::rethrow_exception(failure);
  }

  /// Claims chunks of the job until none is left, a worker has failed, or the loader
  /// stops. A claimed chunk is finished (or failed): every chunk before a failing one
  /// has been claimed, so the failure at the lowest position is always found.
  void fill_chunks(const fill_job& job) noexcept {
    for (;;) {
      if (failed_.load(std::memory_order_relaxed) || abort_.load(std::memory_order_relaxed)) return;
      const index_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
      const index_t begin = c * chunk_;
      if (begin >= job.count) return;
      const index_t end = std::min(job.count, begin + chunk_);
      for (index_t k = begin; k < end; ++k) {
        if (abort_.load(std::memory_order_relaxed)) return;
        try {
          fill_sample(job, k);
        } catch (...) {
          std::lock_guard lock(pool_mutex_);
          if (k < failure_at_) {
            failure_at_ = k;
            failure_ = std::current_exception();
          }
          failed_.store(true, std::memory_order_relaxed);
          return;
        }
      }
    }
  }

  /// A helper thread: each batch the producer publishes, until stop_helpers().
  void help() noexcept {
    std::uint64_t seen = 0;
    for (;;) {
      fill_job job;
      {
        std::unique_lock lock(pool_mutex_);
        if (!pool_stop_ && generation_ == seen) {  // the next batch comes soon: spin briefly before sleeping
          lock.unlock();
          spin_until([&] {
            return generation_spin_.load(std::memory_order_acquire) != seen || stop_spin_.load(std::memory_order_acquire);
          });
          lock.lock();
        }
        job_cv_.wait(lock, [&] { return pool_stop_ || generation_ != seen; });
        if (pool_stop_) return;
        seen = generation_;
        job = job_;
      }
      fill_chunks(job);
      bool last = false;
      {
        std::lock_guard lock(pool_mutex_);
        last = --busy_ == 0;
        busy_spin_.store(busy_, std::memory_order_release);
      }
      if (last) done_cv_.notify_one();
    }
  }

  /// The epoch's workers - 1 helpers (none for one worker). Throws std::system_error
  /// when a thread cannot be started (begin() stops those that were).
  void start_helpers() {
    {
      std::lock_guard lock(pool_mutex_);
      pool_stop_ = false;
      generation_ = 0;
      busy_ = 0;
      generation_spin_.store(0, std::memory_order_relaxed);
      busy_spin_.store(0, std::memory_order_relaxed);
      stop_spin_.store(false, std::memory_order_relaxed);
    }
    helpers_.reserve(static_cast<std::size_t>(options_.workers - 1));
    for (int w = 1; w < options_.workers; ++w) helpers_.emplace_back([this] { help(); });
  }

  // Only once the producer has left: then no batch is being filled and none will be.
  void stop_helpers() noexcept {
    if (helpers_.empty()) return;
    {
      std::lock_guard lock(pool_mutex_);
      pool_stop_ = true;
      stop_spin_.store(true, std::memory_order_release);
    }
    job_cv_.notify_all();
    for (auto& h : helpers_) {
      try {
        if (h.joinable()) h.join();
      } catch (...) {  // as join_worker: cannot happen for a helper told to stop
        if (h.joinable()) h.detach();
      }
    }
    helpers_.clear();
  }

  /// Batch k's slot: batch k of an epoch is always filled into slot k % (prefetch + 1).
  /// At most prefetch + 1 batches are alive at once (the queue, the one being filled,
  /// the consumer's), so when batch k is filled the consumer has handed back batch
  /// k - prefetch - 1, the slot's previous batch: the slot is full, and what is allocated
  /// (how many batches, of which shapes) does not depend on the threads' timing.
  std::optional<batch<D>>& slot_of(index_t k) {
    const std::size_t n = static_cast<std::size_t>(options_.prefetch) + 1;
    if (slots_.size() != n) slots_.resize(n);
    return slots_[static_cast<std::size_t>(k) % n];
  }

  /// Batch k's rows to fill: on cpu its slot's batch when that has the shape (no
  /// allocation per batch in steady state), else a new one.
  template <class H>
  batch<H> fresh_batch(index_t count, index_t f, index_t k) {
    if constexpr (recycles && std::is_same_v<H, D>) {
      std::optional<batch<D>> old;
      {
        std::lock_guard lock(mutex_);
        auto& s = slot_of(k);
        if (s && s->x.shape() == extents<2>{count, f}) {
          batch<H> b = std::move(*s);
          s.reset();
          return b;
        }
        old = std::move(s);  // another shape (an epoch's last, smaller batch): freed, outside the lock
        s.reset();
      }
      old.reset();
    }
    return batch<H>{tensor<float, H, 2>(extents<2>{count, f}), tensor<std::int64_t, H, 1>(extents<1>{count})};
  }

  // Only pageable cpu batches are recycled: a pinned batch may still be the source of an
  // asynchronous copy the user started, which must not see it refilled.
  static constexpr bool recycles = std::is_same_v<D, cpu>;

  const Source* source_;
  loader_options options_;
  std::uint64_t epoch_ = 0;

  // the epoch in progress
  std::uint64_t pass_epoch_ = 0;
  std::vector<index_t> order_;
  index_t batches_ = 0, delivered_ = 0;
  bool active_ = false;
  std::optional<batch<D>> current_;
  index_t current_k_ = 0;  // current_'s position in its epoch
  std::vector<std::optional<batch<D>>> slots_;  // guarded by mutex_: batches to refill (cpu), slot_of

  std::mutex mutex_;
  std::condition_variable ready_cv_, space_cv_;
  std::deque<item> queue_;
  bool stop_ = false;
  std::thread worker_;
  std::atomic<bool> abort_{false};  // stop(): the workers leave the batch they fill
  std::chrono::steady_clock::duration wait_{};  // consumer's: see wait_seconds()

  // the helpers of the epoch (workers - 1 of them) and the batch they fill
  std::vector<std::thread> helpers_;
  std::mutex pool_mutex_;
  std::condition_variable job_cv_, done_cv_;
  fill_job job_;                     // guarded by pool_mutex_, as the next four
  std::uint64_t generation_ = 0;     // batches published this epoch
  // Mirrors of generation_, busy_ and pool_stop_ that the threads spin on for a few
  // microseconds before they sleep on the condition variables (waking a sleeping thread
  // costs as much as a quarter of a batch's transforms).
  std::atomic<std::uint64_t> generation_spin_{0};
  std::atomic<int> busy_spin_{0};
  std::atomic<bool> stop_spin_{false};
  /// Spins until done() or about 20 microseconds have passed.
  template <class Done>
  static void spin_until(Done done) noexcept {
    for (int i = 0; i < 2000; ++i) {
      if (done()) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
  int busy_ = 0;                     // helpers not yet done with the current batch
  bool pool_stop_ = false;
  std::exception_ptr failure_;       // the failure at the lowest position, failure_at_
  index_t failure_at_ = 0;
  index_t chunk_ = 1;                // positions per claim; written before publishing
  std::atomic<index_t> next_chunk_{0};
  std::atomic<bool> failed_{false};

#if LOCUS_HAS_CUDA
  struct cuda_parts {
    std::optional<stream> side;
    cudaStream_t consumer = locus::detail::default_stream();  // explicit, never 0 (item 4)
    int device = 0;
  };
  struct no_cuda_parts {};
  [[no_unique_address]] std::conditional_t<is_cuda, cuda_parts, no_cuda_parts> cuda_;
#endif
};

/// One batch seen as images: x float [B, channels, height, width] and y i64 [B], views
/// of the loader's batch (valid until the iterator advances).
template <Device D>
struct image_batch {
  tensor_view<const float, D, 4> x;
  tensor_view<const std::int64_t, D, 1> y;
};

/// A loader whose batches are viewed as images [B, channels, height, width] (no copy):
/// what a model that starts with a convolution takes.
///
///   locus::data::loader<locus::cpu> rows(train, {.batch_size = 128, .shuffle = true});
///   auto batches = locus::data::images(rows, 1, 28, 28);
///   trainer.train_epoch(batches, {.epoch = e});
///
/// channels * height * width must be the dataset's features() (shape_error otherwise).
/// set_epoch() and size() are the loader's.
template <class Loader>
class image_loader {
 public:
  using device = typename decltype(std::declval<Loader&>().begin())::value_type::device_type;

  image_loader(Loader& l, index_t channels, index_t height, index_t width) : l_(&l), c_(channels), h_(height), w_(width) {
    index_t chw = 0;
    const bool fits = c_ > 0 && h_ > 0 && w_ > 0 && !__builtin_mul_overflow(c_, h_, &chw) &&
                      !__builtin_mul_overflow(chw, w_, &chw);
    if (!fits || chw != l.features())
      throw shape_error("locus: data::images(loader, " + std::to_string(c_) + ", " + std::to_string(h_) + ", " +
                        std::to_string(w_) + "): the dataset's samples have " + std::to_string(l.features()) +
                        " features, not channels * height * width = " +
                        (fits ? std::to_string(chw) : std::string(c_ > 0 && h_ > 0 && w_ > 0 ? "(beyond 2^63)" : "(not positive)")));
    // the loader's transform, now that the samples' channels, height and width are known
    if constexpr (requires(const Loader& cl) { cl.check_transform(sample_shape{}); })
      l.check_transform(sample_shape{l.features(), c_, h_, w_});
  }

  struct sentinel {};
  class iterator {
   public:
    using value_type = image_batch<device>;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;
    iterator() = default;
    const image_batch<device>& operator*() const {
      refresh();
      return cur_;
    }
    const image_batch<device>* operator->() const { return &**this; }
    iterator& operator++() {
      ++it_;
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& i, sentinel) noexcept { return i.it_ == typename Loader::sentinel{}; }

   private:
    friend class image_loader;
    iterator(typename Loader::iterator it, const image_loader* o) : it_(std::move(it)), owner_(o) {}
    void refresh() const {
      auto& b = *it_;
      cur_.x = std::as_const(b.x).view().reshape(extents<4>{b.x.shape()[0], owner_->c_, owner_->h_, owner_->w_});
      cur_.y = std::as_const(b.y).view();
    }
    typename Loader::iterator it_{};
    const image_loader* owner_ = nullptr;
    mutable image_batch<device> cur_{};
  };

  iterator begin() { return iterator(l_->begin(), this); }
  sentinel end() const noexcept { return {}; }
  void set_epoch(std::uint64_t e) { l_->set_epoch(e); }
  [[nodiscard]] index_t size() const { return l_->size(); }
  /// The loader's wait_seconds(): the consumer's time blocked waiting for batches.
  [[nodiscard]] double wait_seconds() const
    requires requires(const Loader& l) { l.wait_seconds(); }
  {
    return l_->wait_seconds();
  }
  [[nodiscard]] Loader& rows() noexcept { return *l_; }

 private:
  Loader* l_;
  index_t c_, h_, w_;
};

/// The loader's batches as images [B, channels, height, width] (see image_loader).
template <class Loader>
image_loader<Loader> images(Loader& l, index_t channels, index_t height, index_t width) {
  return image_loader<Loader>(l, channels, height, width);
}
/// Held by reference: a temporary loader would dangle.
// Prevents: images() over a temporary loader, which it keeps by reference.
template <class Loader>
  requires(!std::is_lvalue_reference_v<Loader>)
auto images(Loader&&, index_t, index_t, index_t) {
  static_assert(locus::detail::always_false<Loader>,
                "locus: images() of a temporary loader would dangle (it keeps the loader by reference); keep the "
                "loader in a variable: locus::data::loader<D> l(ds, o); auto batches = locus::data::images(l, c, h, w);");
  return 0;  // (deduced: the message comes before any use of the result)
}

}  // namespace locus::data
