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
#include <map>
#include <string>

#include "../train.hpp"
#include "communicator.hpp"

namespace locus::dist {

struct data_parallel_options {
  /// 0: one all-reduce of every gradient after backward (the default; measured faster on
  /// a 2-core CPU, bench/RESULTS.md). Above 0: buckets of at least this many bytes, each
  /// reduced (non-blocking) as soon as backward has finished its layers, the rest after
  /// backward; the result is the same.
  std::size_t bucket_bytes = 0;
};

template <class Trainer>
class data_parallel {
  static constexpr bool has_final_hook =
      requires(Trainer& t) { t.set_gradients_final(std::function<void(typename Trainer::gradient_view, index_t)>{}); };

 public:
  using device = typename Trainer::device;

  data_parallel(communicator<device>& comm, Trainer& t, const data_parallel_options& o = {})
      : comm_(&comm), t_(&t), o_(o) {
    if constexpr (!has_final_hook) {
      if (o_.bucket_bytes > 0)
        throw value_error("locus: data_parallel buckets need a model that reports its gradients during backward "
                          "(nn::sequential does)");
    }
    broadcast_parameters();
    // the hooks last: nothing below throws, so no hook outlives a failed construction
    t_->set_gradient_sync([this](typename Trainer::gradient_view g) { sync(g); });
    if constexpr (has_final_hook) {
      if (o_.bucket_bytes > 0)
        t_->set_gradients_final([this](typename Trainer::gradient_view g, index_t first) { bucket(g, first); });
    }
  }
  ~data_parallel() {
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
  void sync(typename Trainer::gradient_view g) {
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
  void bucket(typename Trainer::gradient_view g, index_t first) {
    const auto t0 = std::chrono::steady_clock::now();
    if (first < 0) {  // backward failed: complete what was started, without averaging
      if (pending_end_ >= 0) comm_->wait(false);
      pending_end_ = -1;
      return;
    }
    if (pending_end_ < 0) pending_end_ = g.numel();
    const auto bytes = static_cast<std::size_t>(pending_end_ - first) * sizeof(typename Trainer::gradient_view::value_type);
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

}  // namespace locus::dist
