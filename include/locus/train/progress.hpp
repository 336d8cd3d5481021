// The trainer's options and what it reports: train::options, epoch_options, metrics, the
// progress of an epoch and progress_bar (the library's bar on a terminal), no_scaler and
// non_finite_error. Included by train/trainer.hpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#if __has_include(<unistd.h>)
#include <unistd.h>  // isatty (progress_bar)
#endif

#include "../core/error.hpp"
#include "../optim/optim.hpp"

namespace locus::train {

/// Training stopped on a non-finite gradient (amp::fp32 or bf16_mixed, no scaler).
class non_finite_error : public error {
 public:
  non_finite_error(std::string what, std::int64_t step, std::string parameter)
      : error(std::move(what)), step_(step), parameter_(std::move(parameter)) {}
  /// The micro-batch (counted from 0 over the trainer's life) whose gradient was bad.
  [[nodiscard]] std::int64_t step() const noexcept { return step_; }
  /// The parameter whose gradient went non-finite first (backward order).
  [[nodiscard]] const std::string& parameter() const noexcept { return parameter_; }

 private:
  std::int64_t step_;
  std::string parameter_;
};

/// No grad scaler (the default).
struct no_scaler {
  using device = void;
};

/// Passed to an epoch's progress callback every `report_every` micro-batches (the only
/// time the loss is read back) and after the last one.
struct progress {
  std::int64_t epoch = 0;
  std::int64_t batch = 0;    ///< micro-batches done in this epoch
  std::int64_t batches = 0;  ///< in the epoch
  double loss = 0.0;         ///< running mean since the epoch began
  double samples_per_s = 0.0;
  double seconds = 0.0;      ///< since the epoch began
  bool last = false;         ///< the epoch's final call
  /// Of `seconds`, the time spent waiting for the loader's batches (its
  /// wait_seconds(); 0 for a range of batches without one).
  double loader_wait_seconds = 0.0;
};

struct options {
  int accumulate = 1;        ///< micro-batches per optimizer step
  bool cuda_graph = false;   ///< cuda: capture the step as a CUDA graph and replay it
  bool check_finite = true;  ///< without a scaler: stop on a non-finite gradient
  optim::schedule schedule{};  ///< lr of each optimizer step (empty: the optimizer's lr)
  /// Clip the gradients by their global L2 norm before each optimizer step, as
  /// torch.nn.utils.clip_grad_norm_(max_norm) (after the grad scaler's unscale): each
  /// gradient times min(1, max / (norm + 1e-6)). 0: off. Inside the fused step: on the
  /// host the norm comes from the same pass as the finite check; on cuda one reduction
  /// before it. grad_norm() reports the norm.
  double clip_grad_norm = 0.0;
  /// Clip every gradient to [-clip_grad_value, clip_grad_value] before each optimizer
  /// step, as torch.nn.utils.clip_grad_value_ (after the grad scaler's unscale). 0: off.
  /// Inside the fused step's update pass (no pass of its own); not with clip_grad_norm.
  double clip_grad_value = 0.0;
  /// The progress callback of every train_epoch whose own on_progress is empty, e.g.
  /// train::progress_bar{} (a line on a terminal, nothing in a file or pipe).
  std::function<void(const progress&)> on_progress{};
};

/// What report() and the epoch functions return.
struct metrics {
  double loss = 0.0;           ///< mean loss over the samples counted
  double accuracy = 0.0;       ///< evaluate(): fraction of correct predictions
  double samples_per_s = 0.0;  ///< train_epoch(): training throughput
  /// train_epoch(): of `seconds`, the time the step waited for the loader's batches
  /// (data::loader::wait_seconds(); 0 for a range of batches without it). Near 0: the
  /// loader keeps ahead; a large share of the epoch: the data is the bottleneck (more
  /// loader_options::workers).
  double loader_wait_seconds = 0.0;
  std::size_t peak_bytes = 0;  ///< peak memory of the model's device (memory_stats)
  std::int64_t samples = 0;
  std::int64_t optimizer_steps = 0;
  double seconds = 0.0;
};

/// An epoch's progress as one terminal line, redrawn in place (pass it as
/// epoch_options::on_progress):
///   epoch 3 [######..............] 78/234  loss 0.4123  41,200/s  1.2 s (2.4 s left)
/// and, over a data::loader, the time waited for its batches: `  data wait 0.3 s`.
/// It writes only when `out` is a terminal (unless `always`), so logs and pipes get
/// nothing; each update erases the rest of the line, and the epoch's last call ends it.
/// `scale` multiplies the samples/s (a data-parallel rank 0 showing the whole job's rate:
/// scale = world size). `width` (the bar's characters) is kept within [1, 200].
struct progress_bar {
  std::FILE* out = stdout;
  int width = 20;
  bool always = false;
  double scale = 1.0;

  void operator()(const progress& p) const {
    if (!always && !is_terminal(out)) return;
    const std::string l = line(p, width, scale);
    std::fprintf(out, "\r%s\033[K%s", l.c_str(), p.last ? "\n" : "");
    std::fflush(out);
  }

  /// The text of one update (without the carriage return and the erase).
  [[nodiscard]] static std::string line(const progress& p, int width, double scale = 1.0) {
    const int w = width < 1 ? 1 : width > 200 ? 200 : width;
    const double frac = p.batches > 0 ? static_cast<double>(p.batch) / static_cast<double>(p.batches) : 0.0;
    int filled = static_cast<int>(frac * w);
    if (filled > w) filled = w;
    if (filled < 0) filled = 0;
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(static_cast<std::size_t>(w), '.');
    const double r = p.samples_per_s * scale;
    std::string rate;
    char buf[96];
    if (r >= 0.0 && r < 1e15) {
      const std::string digits = std::to_string(static_cast<long long>(r + 0.5));
      const std::size_t nd = digits.size();
      for (std::size_t k = 0; k < nd; ++k) {  // thousands separated by commas
        if (k > 0 && (nd - k) % 3 == 0) rate += ',';
        rate += digits[k];
      }
    } else {
      std::snprintf(buf, sizeof buf, "%.3g", r);
      rate = buf;
    }
    std::string s = "epoch " + std::to_string(p.epoch + 1) + " [" + bar + "] " + std::to_string(p.batch) + "/" +
                    (p.batches > 0 ? std::to_string(p.batches) : std::string("?"));
    std::snprintf(buf, sizeof buf, "  loss %.4f  ", p.loss);
    s += buf;
    s += rate;
    std::snprintf(buf, sizeof buf, "/s  %.1f s", p.seconds);
    s += buf;
    if (p.batch > 0 && p.batches > p.batch) {
      std::snprintf(buf, sizeof buf, " (%.1f s left)",
                    p.seconds * static_cast<double>(p.batches - p.batch) / static_cast<double>(p.batch));
      s += buf;
    }
    if (p.loader_wait_seconds > 0) {  // a loader's (nothing for a plain range of batches)
      std::snprintf(buf, sizeof buf, "  data wait %.1f s", p.loader_wait_seconds);
      s += buf;
    }
    return s;
  }

  static bool is_terminal(std::FILE* f) noexcept {
#if __has_include(<unistd.h>)
    return f && ::isatty(::fileno(f)) != 0;
#else
    (void)f;
    return false;
#endif
  }
};

struct epoch_options {
  std::int64_t epoch = 0;
  std::int64_t report_every = 50;
  std::function<void(const progress&)> on_progress{};
};
}  // namespace locus::train
