// train::detail::graph_state: what the trainer's graph mode holds (cuda only): its own
// stream, the graph-private memory pool, a captured graph per branch of the accumulation
// cycle, the static batch buffers and the device-resident step values; the capture
// itself. The trainer (train/trainer.hpp) decides when to warm up, capture and replay.
//
// Graph mode ({.cuda_graph = true}, cuda only): the step runs on the trainer's own
// non-blocking stream and is captured as a CUDA graph once per branch of the
// accumulation cycle (a micro-batch without an update, and one with it), then replayed:
// one graph launch per step, plus the copy of the batch into the trainer's static input
// buffers and one tiny kernel that writes the step's values (micro-step, window, the
// scheduled lr) into device memory the graph reads. The first step of each branch runs
// ordinarily on that stream under a graph-private memory pool (filling the pool, the
// cuBLASLt algorithm cache and the layers' buffers); the second is captured
// (cudaStreamCaptureModeThreadLocal: the loader's producer thread may allocate and
// synchronise meanwhile; this thread may not, and does not) and replays from then on.
// Replays compute exactly what the ordinary step computes (the same kernels on the same
// buffers): the losses are equal bit for bit. A batch of another shape (an epoch's last,
// partial batch) drops the graphs (the layers' buffers are reallocated for it, and the
// graphs point at the old ones): it runs ordinarily, and the graphs are captured again
// after it; so do evaluate() and probe(), which may resize the same buffers. An epoch
// whose size is not a multiple of the batch costs two ordinary steps and two captures
// (use the loader's drop_last to avoid them). The caller's stream waits for
// each step, so report(), evaluate() and the loader's reuse of the batch are ordered
// after it. Refused (locus::error at construction): a trainer on a host device (a
// run-time flag, so a run-time error), a model with dropout (its mask would repeat) and
// an unfused optimizer step (check_finite = false without a scaler, an optimizer without
// fused_step, a scaler without options()): that step takes the learning rate as a kernel
// argument, which a graph would freeze at the captured step's value. Warm-up: every
// branch of the cycle runs eagerly once before the first capture (with accumulate >= 3
// the micro-batch branch runs eagerly until the update branch has), so no eager step
// allocates from the pool after a graph was captured in it.
// Label errors in graph mode name "the batch", not the micro-step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "../core/config.hpp"

#if LOCUS_HAS_CUDA
#include "../backend/cuda/runtime.hpp"
#include "../memory/allocator.hpp"
#include "../optim/optim.hpp"
#include "../tensor/factories.hpp"
#include "../transfer/stream.hpp"

namespace locus::train::detail {

/// Graph mode's state (of a trainer computing in C on D, batches of rank R, targets
/// Target): the stream, the graph-private pool, one graph per branch of the
/// accumulation cycle (0: a micro-batch without an update, 1: with it), the static
/// batch buffers and the device-resident step values.
template <class C, class D, std::size_t R, class Target>
struct graph_state {
  using device = D;
  static constexpr std::size_t input_rank = R;
  using target_tensor = Target;
  locus::stream owned;  // non-blocking, listed (host reads wait for it)
  cudaStream_t stream = owned.native_handle(), caller = nullptr;
  cudaEvent_t ready = nullptr, done = nullptr;
  std::shared_ptr<locus::detail::graph_pool> pool;
  cudaGraph_t graph[2] = {nullptr, nullptr};
  cudaGraphExec_t exec[2] = {nullptr, nullptr};
  bool warmed[2] = {false, false};
  tensor<C, device, input_rank> x;
  target_tensor y;
  tensor<std::int64_t, device, 1> vars;

  graph_state() {
    LOCUS_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    LOCUS_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    pool = locus::detail::make_graph_pool();
    locus::stream_guard on(owned);
    vars = zeros<std::int64_t, device>(extents<1>{static_cast<index_t>(sizeof(optim::detail::step_vars) / 8)});
  }
  graph_state(const graph_state&) = delete;
  graph_state& operator=(const graph_state&) = delete;
  ~graph_state() {
    (void)cudaStreamSynchronize(stream);
    drop();
    // The buffers go back to this stream's cache. Making the stream current can throw
    // (its device cannot be made current: a lost device); a destructor must not, so
    // the buffers are then freed by the members' destructors under the caller's stream
    // (the stream was synchronised above: nothing of it still reads them).
    try {
      locus::stream_guard on(owned);
      x = tensor<C, device, input_rank>();
      y = target_tensor();
      vars = tensor<std::int64_t, device, 1>();
    } catch (...) {
    }
    (void)cudaEventDestroy(ready);
    (void)cudaEventDestroy(done);
  }
  optim::detail::step_vars* vars_ptr() noexcept { return reinterpret_cast<optim::detail::step_vars*>(vars.data_handle()); }
  /// Forgets the graphs (their buffers may be reallocated next); the next step of each
  /// branch warms up again.
  void drop() noexcept {
    for (int b = 0; b < 2; ++b) {
      if (exec[b]) (void)cudaGraphExecDestroy(exec[b]);
      if (graph[b]) (void)cudaGraphDestroy(graph[b]);
      exec[b] = nullptr;
      graph[b] = nullptr;
      warmed[b] = false;
    }
  }
  /// The graph stream waits for the caller's work and becomes current.
  void begin(std::optional<locus::stream_guard>& on) {
    caller = locus::detail::current_stream();
    LOCUS_CUDA_CHECK(cudaEventRecord(ready, caller));
    LOCUS_CUDA_CHECK(cudaStreamWaitEvent(stream, ready, 0));
    on.emplace(owned);
  }
  /// The caller's stream waits for the step (report(), the loader's reuse of the batch).
  void end(std::optional<locus::stream_guard>& on) {
    on.reset();
    LOCUS_CUDA_CHECK(cudaEventRecord(done, stream));
    LOCUS_CUDA_CHECK(cudaStreamWaitEvent(caller, done, 0));
  }
  /// end() on an error path: the original error is the one to report, so a failure
  /// here (already a broken device) is dropped, and the caller's stream then waits for
  /// the whole graph stream instead.
  void end_after_error(std::optional<locus::stream_guard>& on) noexcept {
    on.reset();
    try {
      end(on);
    } catch (...) {
      (void)cudaStreamSynchronize(stream);
      (void)cudaGetLastError();
    }
  }
  /// Whether every branch this accumulation cycle uses has run its eager warm-up:
  /// captures wait for that, so that no eager step allocates from the pool after a
  /// graph (whose temporaries the pool keeps for it) was captured in it.
  [[nodiscard]] bool all_warmed(int accumulate) const noexcept { return warmed[1] && (accumulate == 1 || warmed[0]); }
  /// Captures f() as branch b's graph and instantiates it. Thread-local mode: this
  /// thread may not call what breaks a capture (the runtime reports it, and it becomes
  /// a cuda_error); other threads (the loader's) are not restricted.
  template <class F>
  void capture(int b, F&& f) {
    locus::detail::graph_pool_scope scope(*pool);
    LOCUS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      f();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      (void)cudaStreamEndCapture(stream, &broken);
      if (broken) (void)cudaGraphDestroy(broken);
      (void)cudaGetLastError();
      throw;
    }
    LOCUS_CUDA_CHECK(cudaStreamEndCapture(stream, &graph[b]));
    LOCUS_CUDA_CHECK(cudaGraphInstantiate(&exec[b], graph[b], 0));
  }
};

}  // namespace locus::train::detail
#endif
