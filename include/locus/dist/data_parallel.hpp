// dist::data_parallel: PyTorch's DistributedDataParallel for a locus trainer. Each rank
// holds the whole model and trains on its shard of the data (data::loader with .rank and
// .world_size); the gradients are averaged over the ranks once per optimizer step, so
// every rank takes the same step and the weights stay equal bit for bit.
//
//   locus::dist::environment env(argc, argv);
//   locus::dist::communicator<locus::cpu> comm(env);
//   locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
//   locus::dist::data_parallel dp(comm, t);      // rank 0's weights on every rank
//   auto train = locus::data::loader<locus::cpu>(ds, {.batch_size = 64, .shuffle = true,
//                                                     .seed = 42, .rank = comm.rank(),
//                                                     .world_size = comm.world_size()});
//   for (int e = 0; e < epochs; ++e) dp.train_epoch(train, {.epoch = e});
//   auto m = dp.evaluate(test);                   // loss and accuracy over all ranks
//   dp.save_checkpoint(path, e);                  // rank 0 writes, every rank waits
//                                                 // (needs nlohmann-json: LOCUS_HAS_JSON)
//
// How it keeps ranks equal:
//   - at construction the master weights of rank 0 are broadcast (and the compute copy
//     re-derived), so the ranks' seeds do not matter;
//   - the trainer calls the gradient sync once per optimizer step, after the last
//     micro-batch's backward (gradient accumulation communicates only then), with the
//     flat gradient buffer: one all_reduce(average) over every parameter;
//   - everything after it (the non-finite check, the grad scaler's overflow decision,
//     the optimizer) reads the averaged gradients, which are the same bits on every rank,
//     so the decisions are the same too: a NaN on one rank reaches every rank's average,
//     and all of them skip the step (or stop with the fp32 guard's error);
//   - an epoch starts only when every rank has the same number of batches (shape_error
//     on all ranks otherwise: one rank would wait in an all_reduce the others never make;
//     use drop_last, or a dataset that the ranks split evenly).
// By default one all-reduce of the flat buffer after backward; with
// data_parallel_options::bucket_bytes, buckets reduced during backward as each group of
// layers finishes (PyTorch DDP's scheme). Which wins is measured in bench/RESULTS.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "../train.hpp"
#include "communicator.hpp"

namespace locus::dist {

struct data_parallel_options {
  /// 0: one all-reduce of every gradient after backward (the default; measured faster on
  /// a 2-core CPU, bench/RESULTS.md). Above 0: buckets of at least this many bytes, each
  /// reduced (non-blocking) as soon as backward has finished its layers, the rest after
  /// backward; the result is the same.
  std::size_t bucket_bytes = 0;
  /// false (the default): each rank's dropout layers draw their own stream (rank r's
  /// masks from the key seed + r * 0x9E3779B97F4A7C15; rank 0 as a model outside
  /// data_parallel), so the ranks' masks are independent, as if one process drew them
  /// for the whole global batch. true: every rank draws rank 0's masks. Augmentation
  /// needs no option: the loader's transforms draw from Philox(seed, global sample index,
  /// epoch), so each sample's draw is its own whichever rank reads it.
  bool same_dropout_on_every_rank = false;
};

namespace detail {

template <class D>
inline constexpr bool is_communicator_v = false;
template <class D>
inline constexpr bool is_communicator_v<communicator<D>> = true;

// Prevents: gradients of one device handed to a communicator of another (MPI reading
// device pointers, NCCL reading host memory). TD: the trainer's device, CD: the
// communicator's.
template <class TD, class CD>
constexpr bool require_dp_same_device() {
  if constexpr (std::is_same_v<TD, CD>) {
    return true;
  } else if constexpr (std::is_same_v<TD, cpu> && std::is_same_v<CD, cuda>) {
    static_assert(::locus::detail::always_false<TD>, "locus: data_parallel got a communicator<cuda> (NCCL) for a trainer on cpu; the gradients it reduces live on the trainer's device: make a locus::dist::communicator<locus::cpu> comm(env) and pass it");
    return false;
  } else if constexpr (std::is_same_v<TD, cpu> && std::is_same_v<CD, pinned>) {
    static_assert(::locus::detail::always_false<TD>, "locus: data_parallel got a communicator<pinned> for a trainer on cpu; the gradients it reduces live on the trainer's device: make a locus::dist::communicator<locus::cpu> comm(env) and pass it");
    return false;
  } else if constexpr (std::is_same_v<TD, pinned> && std::is_same_v<CD, cpu>) {
    static_assert(::locus::detail::always_false<TD>, "locus: data_parallel got a communicator<cpu> for a trainer on pinned; the gradients it reduces live on the trainer's device: make a locus::dist::communicator<locus::pinned> comm(env) and pass it");
    return false;
  } else if constexpr (std::is_same_v<TD, pinned> && std::is_same_v<CD, cuda>) {
    static_assert(::locus::detail::always_false<TD>, "locus: data_parallel got a communicator<cuda> (NCCL) for a trainer on pinned; the gradients it reduces live on the trainer's device: make a locus::dist::communicator<locus::pinned> comm(env) and pass it");
    return false;
  } else if constexpr (std::is_same_v<TD, cuda> && std::is_same_v<CD, cpu>) {
    static_assert(::locus::detail::always_false<TD>, "locus: data_parallel got a communicator<cpu> (MPI) for a trainer on cuda; the gradients it reduces live on the trainer's device: make a locus::dist::communicator<locus::cuda> comm(env) (NCCL) and pass it");
    return false;
  } else if constexpr (std::is_same_v<TD, cuda> && std::is_same_v<CD, pinned>) {
    static_assert(::locus::detail::always_false<TD>, "locus: data_parallel got a communicator<pinned> (MPI) for a trainer on cuda; the gradients it reduces live on the trainer's device: make a locus::dist::communicator<locus::cuda> comm(env) (NCCL) and pass it");
    return false;
  } else {
    static_assert(::locus::detail::always_false<TD>, "locus: data_parallel's communicator and trainer are on different devices; make the communicator of the trainer's device");
    return false;
  }
}

/// What data_parallel needs of its trainer: a device, a gradient view, and the gradient
/// sync hook (locus::train::trainer has them).
template <class T>
concept gradient_syncing_trainer = requires(T& t) {
  typename T::device;
  typename T::gradient_view;
  t.set_gradient_sync(std::function<void(typename T::gradient_view)>{});
  t.model().parameters();
};

/// The trainer's types, or stand-ins after the static_assert below (so that one message,
/// not a page, says what is wrong).
template <class T>
struct dp_trainer_types {
  using device = cpu;
  using gradient_view = tensor_view<float, cpu, 1>;
};
template <gradient_syncing_trainer T>
struct dp_trainer_types<T> {
  using device = typename T::device;
  using gradient_view = typename T::gradient_view;
};

template <class T>
constexpr bool require_trainer() {
  static_assert(gradient_syncing_trainer<T>,
                "locus: data_parallel wraps a locus::train::trainer, and its second argument is not one (a model or "
                "an optimizer?); make the trainer first: locus::train::trainer t(model, opt, loss); "
                "locus::dist::data_parallel dp(comm, t)");
  return gradient_syncing_trainer<T>;
}

/// data_parallel's communicator argument, checked: a named communicator of device D (it
/// is kept by address and used at every step). nullptr only after a static_assert.
template <class D, class Comm>
communicator<D>* dp_communicator(Comm&& comm) {
  using C = std::remove_cvref_t<Comm>;
  if constexpr (!is_communicator_v<C>) {
    static_assert(::locus::detail::always_false<C>, "locus: data_parallel's first argument is not a communicator; pass a locus::dist::communicator<D> of the trainer's device: locus::dist::communicator<D> comm(env); locus::dist::data_parallel dp(comm, trainer)");
    return nullptr;
  } else if constexpr (!require_dp_same_device<D, typename C::device>()) {
    return nullptr;
  } else if constexpr (!std::is_lvalue_reference_v<Comm>) {
    static_assert(::locus::detail::always_false<C>, "locus: data_parallel's communicator is a temporary, destroyed at the end of the statement while data_parallel keeps using it; name it first: locus::dist::communicator<D> comm(env); locus::dist::data_parallel dp(comm, trainer)");
    return nullptr;
  } else if constexpr (std::is_const_v<std::remove_reference_t<Comm>>) {
    static_assert(::locus::detail::always_false<C>, "locus: data_parallel's communicator is const, and its collectives change it (pending reductions); pass a mutable communicator");
    return nullptr;
  } else {
    return &comm;
  }
}

/// data_parallel's trainer argument, checked: a named, mutable trainer (data_parallel
/// installs its gradient sync into it and keeps it by address).
template <class Trainer, class T2>
Trainer* dp_trainer(T2&& t) {
  if constexpr (!std::is_lvalue_reference_v<T2>) {
    static_assert(::locus::detail::always_false<T2>, "locus: data_parallel's trainer is a temporary, destroyed at the end of the statement while data_parallel keeps using it (its gradient sync points into it); name it first: locus::train::trainer t(model, opt, loss); locus::dist::data_parallel dp(comm, t)");
    return nullptr;
  } else if constexpr (std::is_const_v<std::remove_reference_t<T2>>) {
    static_assert(::locus::detail::always_false<T2>, "locus: data_parallel's trainer is const, and data_parallel installs its gradient sync into it and trains it; pass a mutable trainer");
    return nullptr;
  } else {
    return &t;
  }
}

}  // namespace detail

template <class Trainer>
class data_parallel {
  static constexpr bool is_trainer = detail::require_trainer<Trainer>();
  using gradient_view = typename detail::dp_trainer_types<Trainer>::gradient_view;
  static constexpr bool has_final_hook =
      requires(Trainer& t) { t.set_gradients_final(std::function<void(gradient_view, index_t)>{}); };

 public:
  using device = typename detail::dp_trainer_types<Trainer>::device;

  /// comm and t are kept by address: both must be named objects of the same device that
  /// outlive the data_parallel (a temporary, a const trainer or a communicator of another
  /// device is a compile error naming the fix). One constructor template for every
  /// argument, with its deduction guide below, so that a wrong argument reaches these
  /// checks instead of failing class template argument deduction.
  template <class Comm, class T2>
  data_parallel(Comm&& comm, T2&& t, const data_parallel_options& o = {})
      : comm_(detail::dp_communicator<device>(std::forward<Comm>(comm))),
        t_(detail::dp_trainer<Trainer>(std::forward<T2>(t))),
        o_(o) {
    if constexpr (is_trainer) {
      if constexpr (!has_final_hook) {
        if (o_.bucket_bytes > 0)
          throw value_error("locus: data_parallel buckets need a model that reports its gradients during backward "
                            "(nn::sequential does)");
      }
      broadcast_parameters();
      if constexpr (requires { t_->model().set_dropout_rank(std::uint64_t{}); })
        t_->model().set_dropout_rank(o_.same_dropout_on_every_rank ? 0u : static_cast<std::uint64_t>(comm_->rank()));
      // the hooks last: nothing below throws, so no hook outlives a failed construction
      t_->set_gradient_sync([this](gradient_view g) { sync(g); });
      if constexpr (has_final_hook) {
        if (o_.bucket_bytes > 0)
          t_->set_gradients_final([this](gradient_view g, index_t first) { bucket(g, first); });
      }
    }
  }
  ~data_parallel() {
    if constexpr (is_trainer) {
      t_->set_gradient_sync({});
      if constexpr (has_final_hook) {
        if (o_.bucket_bytes > 0) t_->set_gradients_final({});
      }
      if (pending_end_ >= 0) {  // buckets still in flight (a step that never finished)
        try {
          comm_->wait(false);
        } catch (...) {
        }
      }
    }
  }
  data_parallel(const data_parallel&) = delete;
  data_parallel& operator=(const data_parallel&) = delete;

  /// Rank 0's master weights on every rank (the compute copy re-derived): at
  /// construction, and after anything that may have made the ranks differ.
  void broadcast_parameters() {
    auto& store = t_->model().parameters();
    comm_->broadcast(store.master(), 0);
    store.sync_compute();
  }

  /// One epoch of the trainer on this rank's shard; the figures combined over the ranks:
  /// the loss is the mean over every rank's samples, samples and samples/s are the whole
  /// job's (samples/s over the slowest rank's time).
  template <class Loader>
  train::metrics train_epoch(Loader& batches, const train::epoch_options& eo = {}) {
    if constexpr (requires { batches.size(); }) agree_on_batches(static_cast<double>(batches.size()));
    train::metrics m = t_->train_epoch(batches, eo);
    const double samples = comm_->sum(static_cast<double>(m.samples));
    const double loss = comm_->sum(m.loss * static_cast<double>(m.samples));
    const double seconds = comm_->max(m.seconds);
    m.loss = samples > 0 ? loss / samples : 0.0;
    m.samples = static_cast<std::int64_t>(samples);
    m.seconds = seconds;
    m.samples_per_s = seconds > 0 ? samples / seconds : 0.0;
    return m;
  }

  /// The trainer's evaluate on this rank's shard, loss and accuracy combined over the
  /// ranks (weighted by their sample counts: the figures of the whole test set when
  /// the loaders shard it).
  template <class Loader>
  train::metrics evaluate(Loader& batches) {
    train::metrics m = t_->evaluate(batches);
    const double n = static_cast<double>(m.samples);
    const double samples = comm_->sum(n);
    const double loss = comm_->sum(m.loss * n);
    const double correct = comm_->sum(m.accuracy * n);
    const double seconds = comm_->max(m.seconds);
    m.samples = static_cast<std::int64_t>(samples);
    m.loss = samples > 0 ? loss / samples : 0.0;
    m.accuracy = samples > 0 ? correct / samples : 0.0;
    m.seconds = seconds;
    m.samples_per_s = seconds > 0 ? samples / seconds : 0.0;
    return m;
  }

  /// train::save_checkpoint on rank 0 only; every rank returns once the file is complete,
  /// so any rank may read it next. When rank 0 fails, every rank throws (rank 0 its own
  /// error, the others a locus::error saying so) instead of waiting.
  void save_checkpoint(const std::filesystem::path& path, std::int64_t epoch,
                       const std::map<std::string, std::string>& run = {}) {
#if !defined(LOCUS_HAS_JSON) || !LOCUS_HAS_JSON
    // Prevents: every program that includes <locus/dist.hpp> needing nlohmann-json; only
    // one that saves does.
    static_assert(locus::detail::always_false<Trainer>,
                  "locus: data_parallel::save_checkpoint writes a safetensors checkpoint, which needs nlohmann-json, "
                  "but LOCUS_HAS_JSON is not 1: install nlohmann-json3-dev (Debian) and link locus::dist (CMake finds "
                  "it as locus::json), or define LOCUS_HAS_JSON=1 with <nlohmann/json.hpp> on the include path");
    (void)path, (void)epoch, (void)run;
#else
    std::exception_ptr failed;
    if (comm_->is_root()) {
      try {
        train::save_checkpoint(path, *t_, epoch, run);
      } catch (...) {
        failed = std::current_exception();
      }
    }
    const double ok = comm_->min(failed ? 0.0 : 1.0);  // also the barrier
    if (failed) std::rethrow_exception(failed);
    if (ok == 0.0) throw error("locus: rank 0 could not write the checkpoint " + path.string() + " (its own error says why)");
#endif
  }

  [[nodiscard]] bool is_root() const noexcept { return comm_->is_root(); }
  [[nodiscard]] int rank() const noexcept { return comm_->rank(); }
  [[nodiscard]] int world_size() const noexcept { return comm_->world_size(); }
  communicator<device>& comm() noexcept { return *comm_; }
  Trainer& trainer() noexcept { return *t_; }
  /// Seconds this rank spent in the gradient all-reduce (host devices: wall time of the
  /// call; cuda: enqueue time only) and how many all-reduces ran.
  [[nodiscard]] double sync_seconds() const noexcept { return sync_s_; }
  [[nodiscard]] std::int64_t syncs() const noexcept { return syncs_; }
  /// Buckets started during backward (bucket_bytes > 0), over all steps.
  [[nodiscard]] std::int64_t buckets() const noexcept { return buckets_; }

 private:
  void sync(gradient_view g) {
    const auto t0 = std::chrono::steady_clock::now();
    if (o_.bucket_bytes == 0) {
      comm_->all_reduce(g, reduce_op::average);
    } else {
      const index_t end = pending_end_ < 0 ? g.numel() : pending_end_;
      if (end > 0) comm_->all_reduce_start(g.slice(0, end), reduce_op::average);
      comm_->wait();
      pending_end_ = -1;
    }
    sync_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++syncs_;
  }
  /// During backward: [first, the end of the last bucket) is final; reduce it once it is
  /// big enough.
  void bucket(gradient_view g, index_t first) {
    const auto t0 = std::chrono::steady_clock::now();
    if (first < 0) {  // backward failed: complete what was started, without averaging
      if (pending_end_ >= 0) comm_->wait(false);
      pending_end_ = -1;
      return;
    }
    if (pending_end_ < 0) pending_end_ = g.numel();
    const auto bytes = static_cast<std::size_t>(pending_end_ - first) * sizeof(typename gradient_view::value_type);
    if (bytes >= o_.bucket_bytes) {
      comm_->all_reduce_start(g.slice(first, pending_end_), reduce_op::average);
      pending_end_ = first;
      ++buckets_;
    } else {
      comm_->progress();
    }
    sync_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void agree_on_batches(double n) {
    const double lo = comm_->min(n), hi = comm_->max(n);
    if (lo != hi)
      throw shape_error("locus: data_parallel: the ranks' loaders hold " + std::to_string(static_cast<long long>(lo)) +
                        " to " + std::to_string(static_cast<long long>(hi)) + " batches (this rank: " +
                        std::to_string(static_cast<long long>(n)) +
                        "); every rank must take the same number of optimizer steps: use .drop_last = true, or a "
                        "dataset the ranks split evenly");
  }

  communicator<device>* comm_;
  Trainer* t_;
  data_parallel_options o_;
  index_t pending_end_ = -1;  // buckets: the gradients from here on are being reduced
  double sync_s_ = 0.0;
  std::int64_t syncs_ = 0;
  std::int64_t buckets_ = 0;
};

// Every data_parallel(comm, t) deduces the trainer's type from t alone, so a communicator
// of another device, or a temporary, reaches the constructor's locus: checks.
template <class Comm, class T2>
data_parallel(Comm&&, T2&&, const data_parallel_options& = {}) -> data_parallel<std::remove_cvref_t<T2>>;

}  // namespace locus::dist
