// locus::dist: collectives typed by device, over MPI (cpu and pinned tensors) and NCCL
// (cuda tensors, its unique id broadcast over MPI).
//
//   locus::dist::environment env(argc, argv);    // MPI_Init_thread when launched by mpirun
//   locus::dist::communicator<locus::cpu> comm(env);
//   comm.all_reduce(t, locus::dist::reduce_op::average);   // in place, on every rank
//   comm.broadcast(t, 0);  comm.all_gather(part, whole);  comm.barrier();
//
// Rules (compile time, `locus:` messages): a communicator takes tensors and views of its
// own device only (communicator<cpu> and a cuda tensor: use communicator<cuda>, or copy
// with locus::to<cpu> first); the destination of all_reduce, broadcast and all_gather is
// written, so a view of const elements, a const tensor or a temporary tensor (its result
// would be lost) does not compile; MPI has no sum of bf16 or f16 (reduce an f32 copy),
// NCCL has them.
//
// Run time: every MPI and NCCL return code is checked and becomes a locus::error naming
// the call and the library's text (the communicator's MPI error handler returns codes
// instead of aborting). Shapes must agree on every rank; a rank cannot know another's
// shape without a collective, so all_reduce and broadcast first compare element counts
// (one small MPI_Allreduce of min and max) and throw shape_error on every rank when they
// differ, instead of reading past a buffer or hanging. A collective that waits longer
// than the environment's timeout (a rank died, or took another path) prints which one
// and ends the process, so the launcher ends the job instead of waiting for ever.
//
// Without a launcher (no mpirun: no OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMI_RANK or PMIX_RANK
// in the environment) the environment does not initialise MPI at all: a world of one,
// where every collective on host tensors is the identity (on cuda, NCCL still runs them
// over its one rank). LOCUS_DIST=mpi forces MPI_Init (a singleton).
//
// Built without MPI (LOCUS_HAS_MPI unset: locus::dist where CMake found no MPI, such as a
// GPU machine without Open MPI), the same code compiles and runs as a world of one, NCCL
// included; started by a launcher, such a program refuses to run (every rank would train
// alone).
//
// NCCL calls go on locus's current stream (locus::stream_guard), so they are ordered with
// the kernels and the stream-ordered allocator as any kernel is: a buffer freed after a
// collective is reused only by work that runs after it on that stream.
//
// Length (over 600 lines): one class per back end (MPI, NCCL) behind one typed
// interface, with the rules that the device decides which; split, each would repeat the
// interface's checks.
#pragma once

#include "../core/config.hpp"

#if defined(LOCUS_HAS_MPI) && LOCUS_HAS_MPI
#define LOCUS_DIST_MPI 1
// MPI's C API only (Open MPI's and MPICH's C++ bindings are deprecated and warn).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#else
#define LOCUS_DIST_MPI 0  // a world of one (see above)
#endif

#if LOCUS_HAS_CUDA && defined(LOCUS_HAS_NCCL) && LOCUS_HAS_NCCL
#include <nccl.h>
#define LOCUS_DIST_NCCL 1
#else
#define LOCUS_DIST_NCCL 0
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>
#include <functional>

#include "../core/device.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../tensor/factories.hpp"
#include "../tensor/tensor.hpp"
#include "../transfer/copy.hpp"

namespace locus::dist {

/// What all_reduce combines: the sum, or the sum divided by world_size (the mean; for
/// integer dtypes the sum, which must fit the dtype, divided and truncated).
enum class reduce_op { sum, average };

struct environment_options {
  /// A collective waiting longer than this (a rank died or diverged) ends the process
  /// with a message naming the collective; 0: wait for ever. LOCUS_DIST_TIMEOUT (seconds)
  /// in the environment overrides it.
  double timeout_s = 600.0;
};

namespace detail {

#if LOCUS_DIST_MPI
/// "MPI_Allreduce failed: <the library's text>".
inline std::string mpi_text(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "error code " + std::to_string(rc);
  return std::string(buf, static_cast<std::size_t>(len));
}
inline void mpi_check(int rc, const char* call) {
  if (rc != MPI_SUCCESS) throw ::locus::error(std::string("locus: ") + call + " failed: " + mpi_text(rc));
}
#endif

/// Whether this process was started by an MPI launcher (or LOCUS_DIST=mpi asks for MPI).
inline bool launched_by_mpi() noexcept {
  if (const char* e = std::getenv("LOCUS_DIST")) {
    if (std::strcmp(e, "mpi") == 0) return true;
    if (std::strcmp(e, "none") == 0) return false;
  }
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

/// Ends a process stuck in a collective: a thread that looks every 100 ms at when the
/// current collective began. It prints and calls std::_Exit (MPI_Abort from a second
/// thread would need MPI_THREAD_MULTIPLE); the launcher then ends the other ranks.
class watchdog {
 public:
  watchdog(double timeout_s, int rank) : timeout_s_(timeout_s), rank_(rank) {
    if (timeout_s_ > 0) thread_ = std::thread([this] { run(); });
  }
  ~watchdog() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  watchdog(const watchdog&) = delete;
  watchdog& operator=(const watchdog&) = delete;

  void begin(const char* what) noexcept {
    what_.store(what, std::memory_order_relaxed);
    since_.store(now_ms(), std::memory_order_release);
  }
  void end() noexcept { since_.store(0, std::memory_order_release); }

 private:
  static std::int64_t now_ms() noexcept {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void run() {
    std::unique_lock<std::mutex> l(m_);
    while (!cv_.wait_for(l, std::chrono::milliseconds(100), [this] { return stop_; })) {
      const std::int64_t s = since_.load(std::memory_order_acquire);
      if (s != 0 && static_cast<double>(now_ms() - s) > timeout_s_ * 1000.0) {
        std::fprintf(stderr,
                     "locus: rank %d: %s waited more than %.0f s for the other ranks (one of them stopped, or "
                     "took another path); ending this process so that the launcher ends the job\n",
                     rank_, what_.load(std::memory_order_relaxed), timeout_s_);
        std::fflush(stderr);
        std::_Exit(124);
      }
    }
  }

  double timeout_s_;
  int rank_;
  std::atomic<std::int64_t> since_{0};
  std::atomic<const char*> what_{"a collective"};
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

/// Holds the watchdog's begin/end around one collective.
struct timed {
  watchdog* w;
  timed(watchdog* wd, const char* what) noexcept : w(wd) {
    if (w) w->begin(what);
  }
  ~timed() {
    if (w) w->end();
  }
  timed(const timed&) = delete;
  timed& operator=(const timed&) = delete;
};

}  // namespace detail

/// The process's place in the job: initialises MPI (MPI_Init_thread, funneled: only the
/// thread that made the environment calls MPI) when a launcher started the process, and
/// finalises it at the end of its scope when it initialised it. One per process.
class environment {
 public:
  environment(int& argc, char**& argv, const environment_options& o = {}) { start(&argc, &argv, o); }
  explicit environment(const environment_options& o = {}) { start(nullptr, nullptr, o); }
  ~environment() {
#if LOCUS_DIST_MPI
    if (owns_) {
      int done = 0;
      MPI_Finalized(&done);
      if (!done) {
        detail::timed w(watchdog_.get(), "MPI_Finalize");  // waits for the other ranks too
        MPI_Finalize();
      }
    }
#endif
    watchdog_.reset();
  }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int world_size() const noexcept { return size_; }
  /// This rank's place among the ranks on its machine (MPI_Comm_split_type, shared
  /// memory), and how many there are: what picks a rank's GPU on a multi-GPU node,
  /// e.g. cudaSetDevice(local_rank() % device_count) before any cuda work.
  [[nodiscard]] int local_rank() const noexcept { return local_rank_; }
  [[nodiscard]] int local_size() const noexcept { return local_size_; }
  /// Whether MPI is initialised (false: a world of one without MPI).
  [[nodiscard]] bool uses_mpi() const noexcept { return mpi_; }
  [[nodiscard]] bool is_root() const noexcept { return rank_ == 0; }
  [[nodiscard]] double timeout_s() const noexcept { return timeout_; }

  /// Ends the whole job after printing "locus: rank r of n: <message>" (MPI_Abort when
  /// MPI runs, else exit): what a rank that cannot go on does, so the others do not wait.
  [[noreturn]] void abort(const std::string& message, int code = 1) const noexcept {
    std::fprintf(stderr, "locus: rank %d of %d: %s\n", rank_, size_, message.c_str());
    std::fflush(stderr);
#if LOCUS_DIST_MPI
    if (mpi_) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    std::_Exit(code);
  }

  detail::watchdog* watchdog() const noexcept { return watchdog_.get(); }

 private:
  void start(int* argc, char*** argv, const environment_options& o) {
    timeout_ = o.timeout_s;
    if (const char* t = std::getenv("LOCUS_DIST_TIMEOUT")) {
      char* end = nullptr;
      const double v = std::strtod(t, &end);
      if (end == t || *end != '\0' || !(v >= 0))
        throw value_error(std::string("locus: LOCUS_DIST_TIMEOUT='") + t + "' is not a number of seconds >= 0");
      timeout_ = v;
    }
#if LOCUS_DIST_MPI
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited || detail::launched_by_mpi()) {
      if (!inited) {
        int provided = 0;
        detail::mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
        owns_ = true;
      }
      mpi_ = true;
      if (owns_) MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // a caller's MPI keeps its own
      detail::mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
      detail::mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
      MPI_Comm node = MPI_COMM_NULL;
      detail::mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
                        "MPI_Comm_split_type");
      detail::mpi_check(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank (node)");
      detail::mpi_check(MPI_Comm_size(node, &local_size_), "MPI_Comm_size (node)");
      MPI_Comm_free(&node);
    }
#else
    (void)argc;
    (void)argv;
    if (detail::launched_by_mpi())
      throw ::locus::error(
          "locus: this program was built without MPI (locus::dist found none), but MPI was asked for: it was started "
          "by an MPI launcher (every rank would train alone) or LOCUS_DIST=mpi is set; build where MPI is found "
          "(Debian: openmpi-bin libopenmpi-dev), or run it as one process");
#endif
    if (size_ > 1) watchdog_ = std::make_unique<detail::watchdog>(timeout_, rank_);
  }

  [[maybe_unused]] bool owns_ = false;  // read only where MPI is built in
  bool mpi_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  double timeout_ = 600.0;
  std::unique_ptr<detail::watchdog> watchdog_;
};

/// Runs body(env) and turns an exception on any rank into the end of the whole job:
/// "locus: rank r of n: <what()>" on stderr, then MPI_Abort (a single process returns 1
/// after printing). Returns body's result (an int) otherwise.
template <class F>
int run(int& argc, char**& argv, F&& body, const environment_options& o = {}) {
  std::unique_ptr<environment> env;
  try {
    env = std::make_unique<environment>(argc, argv, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "locus: %s\n", e.what());
    return 1;
  }
  try {
    const int rc = body(*env);
    // A rank that gives up without an exception would leave the others waiting in their
    // next collective (or in MPI_Finalize): end the job.
    if (rc != 0 && env->world_size() > 1) env->abort("returned " + std::to_string(rc), rc);
    return rc;
  } catch (const std::exception& e) {
    if (env->world_size() > 1) env->abort(e.what());
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

namespace detail {

template <class T>
struct mpi_type {
  static constexpr bool reducible = false;
};
template <>
struct mpi_type<float> {
  static constexpr bool reducible = true;
#if LOCUS_DIST_MPI
  static MPI_Datatype get() { return MPI_FLOAT; }
#endif
};
template <>
struct mpi_type<double> {
  static constexpr bool reducible = true;
#if LOCUS_DIST_MPI
  static MPI_Datatype get() { return MPI_DOUBLE; }
#endif
};
template <>
struct mpi_type<std::int32_t> {
  static constexpr bool reducible = true;
#if LOCUS_DIST_MPI
  static MPI_Datatype get() { return MPI_INT32_T; }
#endif
};
template <>
struct mpi_type<std::int64_t> {
  static constexpr bool reducible = true;
#if LOCUS_DIST_MPI
  static MPI_Datatype get() { return MPI_INT64_T; }
#endif
};

#if LOCUS_DIST_NCCL
template <class T>
constexpr bool nccl_reducible =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, ::locus::bf16> || std::is_same_v<T, ::locus::f16>;
template <class T>
ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;
  else if constexpr (std::is_same_v<T, ::locus::bf16>) return ncclBfloat16;
  else if constexpr (std::is_same_v<T, ::locus::f16>) return ncclFloat16;
  else return ncclUint8;
}
inline void nccl_check(ncclResult_t rc, const char* call) {
  if (rc != ncclSuccess) throw ::locus::error(std::string("locus: ") + call + " failed: " + ncclGetErrorString(rc));
}
#endif

template <class D>
constexpr const char* device_word() {
  if constexpr (std::is_same_v<D, cpu>) return "cpu";
  else if constexpr (std::is_same_v<D, pinned>) return "pinned";
  else return "cuda";
}

// Prevents: a collective on another device's memory (MPI reading device pointers, NCCL
// reading host memory). CD: the communicator's device, TD: the tensor's.
template <class CD, class TD>
constexpr bool require_communicator_device() {
  if constexpr (std::is_same_v<CD, TD>) {
    return true;
  } else if constexpr (std::is_same_v<CD, cpu> && std::is_same_v<TD, cuda>) {
    static_assert(::locus::detail::always_false<CD>, "locus: communicator<cpu> (MPI) got a cuda tensor; reduce cuda tensors with locus::dist::communicator<locus::cuda> (NCCL), or copy explicitly first: locus::to<locus::cpu>(t)");
    return false;
  } else if constexpr (std::is_same_v<CD, cpu> && std::is_same_v<TD, pinned>) {
    static_assert(::locus::detail::always_false<CD>, "locus: communicator<cpu> got a pinned tensor; a communicator takes its own device's tensors: use locus::dist::communicator<locus::pinned>");
    return false;
  } else if constexpr (std::is_same_v<CD, pinned> && std::is_same_v<TD, cpu>) {
    static_assert(::locus::detail::always_false<CD>, "locus: communicator<pinned> got a cpu tensor; a communicator takes its own device's tensors: use locus::dist::communicator<locus::cpu>");
    return false;
  } else if constexpr (std::is_same_v<CD, pinned> && std::is_same_v<TD, cuda>) {
    static_assert(::locus::detail::always_false<CD>, "locus: communicator<pinned> (MPI) got a cuda tensor; reduce cuda tensors with locus::dist::communicator<locus::cuda> (NCCL), or copy explicitly first: locus::to<locus::pinned>(t)");
    return false;
  } else if constexpr (std::is_same_v<CD, cuda> && std::is_same_v<TD, cpu>) {
    static_assert(::locus::detail::always_false<CD>, "locus: communicator<cuda> (NCCL) got a cpu tensor; reduce host tensors with locus::dist::communicator<locus::cpu> (MPI), or copy explicitly first: locus::to<locus::cuda>(t)");
    return false;
  } else if constexpr (std::is_same_v<CD, cuda> && std::is_same_v<TD, pinned>) {
    static_assert(::locus::detail::always_false<CD>, "locus: communicator<cuda> (NCCL) got a pinned tensor; reduce host tensors with locus::dist::communicator<locus::pinned> (MPI), or copy explicitly first: locus::to<locus::cuda>(t)");
    return false;
  } else {
    static_assert(::locus::detail::always_false<CD>, "locus: a communicator takes tensors of its own device");
    return false;
  }
}

// Prevents: a collective writing into memory the caller cannot see afterwards or may not
// write: a view of const elements, a const tensor, a temporary tensor.
template <class X>
constexpr bool require_writable_destination(const char* /*what*/) {
  using t = ::locus::detail::tensor_traits<std::remove_cvref_t<X>>;
  if constexpr (std::is_const_v<typename t::element_type>) {
    static_assert(::locus::detail::always_false<X>, "locus: a collective's destination is a view of const elements, and the collective writes into it; pass a tensor or a mutable tensor_view");
    return false;
  } else if constexpr (t::is_tensor && std::is_const_v<std::remove_reference_t<X>>) {
    static_assert(::locus::detail::always_false<X>, "locus: a collective's destination is a const tensor (std::as_const(t), or a const& parameter), and the collective writes into it; pass a mutable tensor");
    return false;
  } else if constexpr (t::is_tensor && !std::is_lvalue_reference_v<X>) {
    static_assert(::locus::detail::always_false<X>, "locus: a collective's destination is a temporary tensor, so its result would be lost; reduce into a named tensor: auto t = ...; comm.all_reduce(t)");
    return false;
  } else {
    return true;
  }
}

// Prevents: a gather whose output cannot hold the ranks' inputs side by side (and, for
// rank-0 inputs, a message about a rank mismatch that is not the reason).
template <std::size_t RI, std::size_t RO>
constexpr bool require_gather_ranks() {
  if constexpr (RI == 0 && RO != 1) {
    static_assert(RI != 0 || RO == 1, "locus: all_gather of rank-0 (scalar) tensors gathers them into a 1-D tensor "
                                      "of world_size elements; gather into auto out = locus::zeros<T, D>({comm.world_size()})");
    return false;
  } else if constexpr (RI != 0 && RI != RO) {
    static_assert(RI == 0 || RI == RO, "locus: all_gather's output has another rank than its input; the output "
                                       "stacks the ranks' inputs along the first axis: same rank, first extent "
                                       "world_size times larger");
    return false;
  } else {
    return true;
  }
}

// Prevents: MPI_SUM over a dtype MPI cannot add (bf16, f16, bool, bytes).
template <class T, bool Nccl>
constexpr bool require_reducible() {
  if constexpr (Nccl) {
#if LOCUS_DIST_NCCL
    if constexpr (!nccl_reducible<T>) {
      static_assert(::locus::detail::always_false<T>, "locus: NCCL cannot sum this dtype; all_reduce f32, f64, bf16, f16, i32 or i64 tensors");
      return false;
    }
#endif
    return true;
  } else if constexpr (std::is_same_v<T, ::locus::bf16> || std::is_same_v<T, ::locus::f16>) {
    static_assert(::locus::detail::always_false<T>, "locus: MPI has no sum of bf16 or f16; all_reduce an f32 copy (locus::tensor<float, D, R> f = locus::cast<float>(t)), or reduce cuda tensors with NCCL");
    return false;
  } else if constexpr (!mpi_type<T>::reducible) {
    static_assert(::locus::detail::always_false<T>, "locus: MPI all_reduce takes f32, f64, i32 or i64 tensors");
    return false;
  } else {
    return true;
  }
}

}  // namespace detail

/// Collectives over the ranks of the job on device D's memory: MPI for cpu and pinned,
/// NCCL for cuda. Every rank calls the same collectives in the same order.
template <Device D>
class communicator {
  static constexpr bool nccl = std::is_same_v<D, cuda>;

 public:
  using device = D;

  // Prevents: communicator<cpu> c(dist::environment{}): the environment (MPI's lifetime,
  // the watchdog every collective reports to) would end with the statement.
  template <class E>
    requires(std::is_same_v<std::remove_cvref_t<E>, environment> && !std::is_lvalue_reference_v<E>)
  explicit communicator(E&&) {
    static_assert(locus::detail::always_false<E>,
                  "locus: communicator got a temporary environment, which ends with this statement (MPI would be "
                  "finalised) while the communicator keeps using it; name it first: locus::dist::environment "
                  "env(argc, argv); locus::dist::communicator<D> comm(env);");
  }

  /// env is kept by address: it must outlive the communicator.
  explicit communicator(const environment& env) : env_(&env), rank_(env.rank()), size_(env.world_size()) {
#if LOCUS_DIST_MPI
    if (env.uses_mpi()) {
      detail::timed w(env.watchdog(), "MPI_Comm_dup (making a communicator)");
      detail::mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
      MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    }
#endif
    if constexpr (nccl) {
#if LOCUS_DIST_NCCL
      // Also for a world of one: the collectives then run through NCCL over its one rank
      // (the same calls, streams and error paths as on many).
      ncclUniqueId id;
      if (rank_ == 0) detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
#if LOCUS_DIST_MPI
      if (size_ > 1)
        detail::mpi_check(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm_), "MPI_Bcast (the NCCL unique id)");
#endif
      gpu_ = locus::detail::current_device();  // NCCL binds the communicator to it
      detail::nccl_check(ncclCommInitRank(&nccl_, size_, id, rank_), "ncclCommInitRank");
#else
      static_assert(locus::detail::always_false<D>,
                    "locus: communicator<cuda> needs NCCL: configure with CUDA and NCCL found (the toolkit's nccl.h and "
                    "libnccl.so) and link locus::dist");
#endif
    }
  }
  ~communicator() {
#if LOCUS_DIST_NCCL
    if constexpr (nccl) {
      if (nccl_) ncclCommDestroy(nccl_);
    }
#endif
#if LOCUS_DIST_MPI
    if (comm_ != MPI_COMM_NULL) {
      int done = 0;
      MPI_Finalized(&done);
      if (!done) MPI_Comm_free(&comm_);
    }
#endif
  }
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int world_size() const noexcept { return size_; }
  [[nodiscard]] bool is_root() const noexcept { return rank_ == 0; }
  [[nodiscard]] const environment& env() const noexcept { return *env_; }
  /// communicator<cuda>: the GPU it was made on (current at construction), where NCCL
  /// runs its collectives; every tensor it reduces must live there and that GPU must be
  /// current (device_error otherwise, before any rank waits). -1 on host devices.
  [[nodiscard]] int device_index() const noexcept { return gpu_; }

 private:
  // communicator<cuda>: the tensors and the current GPU are the communicator's GPU.
  template <class... V>
  void check_gpu(const char* what, const V&... vs) const {
    if constexpr (nccl) {
      locus::detail::gpu_seen seen;
      seen.add(gpu_);
      (seen.add(vs.device_index()), ...);
      locus::detail::check_gpus<D>(what, seen);
    } else {
      (void)what, ((void)vs, ...);
    }
  }

 public:

  /// x = the sum (or mean) of x over the ranks, on every rank. Element counts must agree
  /// (shape_error on every rank otherwise).
  template <class X>
    requires TensorLike<X>
  void all_reduce(X&& x, reduce_op op = reduce_op::sum) {
    using t = locus::detail::tensor_traits<std::remove_cvref_t<X>>;
    using T = typename t::value_type;
    if constexpr (detail::require_communicator_device<D, typename t::device>() &&
                  detail::require_writable_destination<X>("all_reduce") &&
                  detail::require_reducible<T, nccl>()) {
      auto v = locus::detail::as_view(x);
      check_gpu("all_reduce", v);
      if (size_ == 1 && !nccl) return;
      agree_on_count("all_reduce", static_cast<std::int64_t>(v.numel()));
      with_contiguous(v, [&](T* p, std::size_t n) { reduce_raw(p, n, op); });
    }
  }

  /// x = rank root's x, on every rank. Element counts must agree.
  template <class X>
    requires TensorLike<X>
  void broadcast(X&& x, int root = 0) {
    using t = locus::detail::tensor_traits<std::remove_cvref_t<X>>;
    using T = typename t::value_type;
    if constexpr (detail::require_communicator_device<D, typename t::device>() &&
                  detail::require_writable_destination<X>("broadcast")) {
      check_root(root);
      auto v = locus::detail::as_view(x);
      check_gpu("broadcast", v);
      if (size_ == 1 && !nccl) return;
      agree_on_count("broadcast", static_cast<std::int64_t>(v.numel()), root);
      with_contiguous(v, [&](T* p, std::size_t n) { broadcast_raw(p, n, root); });
    }
  }

  /// out = the ranks' `in` one after the other (rank order) along the first axis: out's
  /// first extent is world_size times in's, the other extents equal (shape_error
  /// otherwise). Every rank's `in` must have the same shape. Rank-0 (scalar) inputs
  /// gather into a 1-D output of world_size elements (PyTorch's all_gather_into_tensor).
  template <class In, class Out>
    requires(TensorLike<In> && TensorLike<Out>)
  void all_gather(const In& in, Out&& out) {
    using ti = locus::detail::tensor_traits<std::remove_cvref_t<In>>;
    using to_ = locus::detail::tensor_traits<std::remove_cvref_t<Out>>;
    static_assert(std::is_same_v<std::remove_const_t<typename ti::value_type>, std::remove_const_t<typename to_::value_type>>,
                  "locus: all_gather's input and output have different dtypes; gather into a tensor of the input's dtype");
    if constexpr (detail::require_gather_ranks<ti::rank, to_::rank>() &&
                  detail::require_communicator_device<D, typename ti::device>() &&
                  detail::require_communicator_device<D, typename to_::device>() &&
                  detail::require_writable_destination<Out>("all_gather")) {
      using T = std::remove_const_t<typename ti::value_type>;
      const auto given = locus::detail::as_view(in);
      // a scalar is gathered as one element; its shape stays [] in the messages
      const auto iv = [&] {
        if constexpr (ti::rank == 0) return given.reshape(extents<1>{1});
        else return given;
      }();
      auto ov = locus::detail::as_view(out);
      check_gpu("all_gather", iv, ov);
      auto want = iv.shape();
      want[0] *= size_;
      const bool shape_ok = ov.shape() == want;
      // every rank learns whether every output fits before any waits in the gather
      if (!(size_ == 1 && !nccl)) agree_on_count("all_gather", static_cast<std::int64_t>(iv.numel()), 0, shape_ok);
      if (!shape_ok)
        throw shape_error("locus: all_gather of " + locus::detail::shape_string(given.shape()) + " over " +
                          std::to_string(size_) + " ranks needs an output of " + locus::detail::shape_string(want) +
                          ", got " + locus::detail::shape_string(ov.shape()));
      if (size_ == 1 && !nccl) {
        copy(iv, ov);
        return;
      }
      const auto src = to<D>(iv);  // contiguous
      with_contiguous(ov, [&](T* p, std::size_t n) { gather_raw(src.data_handle(), p, n / static_cast<std::size_t>(size_)); });
    }
  }

  /// Starts x = the sum (or mean) of x over the ranks without waiting for it: MPI's
  /// MPI_Iallreduce (NCCL: enqueued on the current stream, as every NCCL call is). x, a
  /// contiguous tensor or view of any rank (a scalar too), must stay alive and untouched
  /// until wait(). Ranks start the same reductions in the same order.
  template <class X>
    requires TensorLike<X>
  void all_reduce_start(X&& x, reduce_op op = reduce_op::sum) {
    using t = locus::detail::tensor_traits<std::remove_cvref_t<X>>;
    using T = typename t::value_type;
    if constexpr (detail::require_communicator_device<D, typename t::device>() &&
                  detail::require_writable_destination<X>("all_reduce_start") &&
                  detail::require_reducible<T, nccl>()) {
      const auto v = locus::detail::as_view(x);
      check_gpu("all_reduce_start", v);
      if (v.numel() == 0) return;
      // checked in a world of one too, so that a program fails the same way on any count
      if (!v.is_contiguous())
        throw value_error("locus: all_reduce_start needs a contiguous tensor or view (MPI reduces it in place while "
                          "the caller goes on); reduce a strided view with all_reduce, or a clone() of it");
      if (size_ == 1 && !nccl) return;
      start_reduce(v.data_handle(), static_cast<std::size_t>(v.numel()), op);
    }
  }

  /// Lets started reductions move on (MPI progresses them only inside its calls).
  void progress() {
#if LOCUS_DIST_MPI
    if constexpr (!nccl) {
      if (pending_.empty()) return;
      int done = 0;
      detail::mpi_check(MPI_Testall(static_cast<int>(pending_.size()), pending_.data(), &done, MPI_STATUSES_IGNORE),
                        "MPI_Testall");
    }
#endif
  }
  /// Completes every reduction all_reduce_start began (apply = false: without their
  /// averaging, when the result is dropped anyway).
  void wait(bool apply = true) {
    (void)apply;  // NCCL, and a build without MPI, have nothing pending here
#if LOCUS_DIST_MPI
    if constexpr (!nccl) {
      if (pending_.empty()) return;
      {
        detail::timed w(env_->watchdog(), "all_reduce (buckets)");
        detail::mpi_check(MPI_Waitall(static_cast<int>(pending_.size()), pending_.data(), MPI_STATUSES_IGNORE),
                          "MPI_Waitall");
      }
      pending_.clear();
      if (apply)
        for (auto& f : finish_) f();
      finish_.clear();
    }
#endif
  }

  /// Waits until every rank is here (cuda: also until this rank's current stream is done).
  void barrier() {
    if (size_ == 1) return;
    if constexpr (std::is_same_v<D, cuda>) {
#if LOCUS_HAS_CUDA
      LOCUS_CUDA_CHECK(cudaStreamSynchronize(locus::detail::current_stream()));
#endif
    }
#if LOCUS_DIST_MPI
    detail::timed w(env_->watchdog(), "barrier");
    detail::mpi_check(MPI_Barrier(comm_), "MPI_Barrier");
#endif
  }

  /// A host number combined over the ranks (metrics, counters): the sum, min or max.
  [[nodiscard]] double sum(double v) const { return host_reduce(v, 0, "sum"); }
  [[nodiscard]] double min(double v) const { return host_reduce(v, 1, "min"); }
  [[nodiscard]] double max(double v) const { return host_reduce(v, 2, "max"); }

 private:
  double host_reduce(double v, int which, const char* what) const {
    if (size_ == 1) return v;
    double out = v;
#if LOCUS_DIST_MPI
    const MPI_Op op = which == 0 ? MPI_SUM : which == 1 ? MPI_MIN : MPI_MAX;
    detail::timed w(env_->watchdog(), what);
    detail::mpi_check(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, op, comm_), "MPI_Allreduce (a host value)");
#else
    (void)which;
    (void)what;
#endif
    return out;
  }

  void check_root(int root) const {
    if (root < 0 || root >= size_)
      throw value_error("locus: broadcast from rank " + std::to_string(root) + " in a world of " +
                        std::to_string(size_) + " ranks");
  }

  /// Every rank learns whether all passed the same count; a mismatch is a shape_error on
  /// every rank (so none waits in the collective that would follow).
  /// ... and on the root (broadcast) and on every rank's own argument check (`ok`): a
  /// rank whose check failed makes the others throw too, instead of leaving them waiting.
  void agree_on_count(const char* what, std::int64_t n, int root = 0, bool ok = true) const {
    if (size_ == 1) return;
    std::int64_t mm[5] = {n, -n, root, -root, ok ? 1 : 0}, out[5] = {n, -n, root, -root, ok ? 1 : 0};
#if LOCUS_DIST_MPI
    {
      detail::timed w(env_->watchdog(), what);
      detail::mpi_check(MPI_Allreduce(mm, out, 5, MPI_INT64_T, MPI_MIN, comm_), "MPI_Allreduce (element counts)");
    }
#else
    (void)mm;
#endif
    if (out[4] == 0 && ok)
      throw shape_error(std::string("locus: ") + what + ": another rank's arguments were refused (its error says why)");
    if (out[2] != -out[3])
      throw value_error(std::string("locus: ") + what + " over " + std::to_string(size_) +
                        " ranks got different roots (from " + std::to_string(out[2]) + " to " +
                        std::to_string(-out[3]) + "; this rank: " + std::to_string(root) +
                        "); every rank passes the same root");
    if (out[0] != -out[1])
      throw shape_error(std::string("locus: ") + what + " over " + std::to_string(size_) +
                        " ranks got different element counts (from " + std::to_string(out[0]) + " to " +
                        std::to_string(-out[1]) + "; this rank: " + std::to_string(n) +
                        "); every rank passes a tensor of the same shape");
  }

  /// f(pointer, count) on v's memory, through a contiguous copy when v is strided.
  template <class T, std::size_t R, class F>
  void with_contiguous(const tensor_view<T, D, R>& v, F&& f) {
    if (v.numel() == 0) return;
    if (v.is_contiguous()) {
      f(v.data_handle(), static_cast<std::size_t>(v.numel()));
    } else {
      tensor<T, D, R> tmp = to<D>(v);
      f(tmp.data_handle(), static_cast<std::size_t>(tmp.numel()));
      copy(tmp, v);
    }
  }

  template <class T>
  void start_reduce(T* p, std::size_t n, reduce_op op) {
    if constexpr (nccl) {
      reduce_raw(p, n, op);
    } else {
#if LOCUS_DIST_MPI
      if (n > static_cast<std::size_t>(std::numeric_limits<int>::max()))
        throw value_error("locus: all_reduce_start of more than 2^31 - 1 elements");
      MPI_Request r;
      detail::mpi_check(MPI_Iallreduce(MPI_IN_PLACE, p, static_cast<int>(n), detail::mpi_type<T>::get(), MPI_SUM, comm_, &r),
                        "MPI_Iallreduce");
      pending_.push_back(r);
      if (op == reduce_op::average) {
        const int world = size_;
        finish_.push_back([p, n, world] {
          if constexpr (std::is_floating_point_v<T>) {
            const T inv = T(1) / static_cast<T>(world);
            for (std::size_t i = 0; i < n; ++i) p[i] *= inv;
          } else {
            for (std::size_t i = 0; i < n; ++i) p[i] /= static_cast<T>(world);
          }
        });
      }
#else
      (void)p, (void)n, (void)op;  // a world of one: never reached
#endif
    }
  }

  template <class T>
  void reduce_raw(T* p, std::size_t n, reduce_op op) {
    if constexpr (nccl) {
#if LOCUS_DIST_NCCL
      detail::nccl_check(ncclAllReduce(p, p, n, detail::nccl_type<T>(), op == reduce_op::average ? ncclAvg : ncclSum,
                                       nccl_, locus::detail::current_stream()),
                         "ncclAllReduce");
#endif
    } else {
#if LOCUS_DIST_MPI
      detail::timed w(env_->watchdog(), "all_reduce");
      for (std::size_t off = 0; off < n;) {  // MPI counts are int
        const std::size_t c = n - off < chunk ? n - off : chunk;
        detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, p + off, static_cast<int>(c), detail::mpi_type<T>::get(),
                                        MPI_SUM, comm_),
                          "MPI_Allreduce");
        off += c;
      }
      if (op == reduce_op::average) {
        if constexpr (std::is_floating_point_v<T>) {
          const T inv = T(1) / static_cast<T>(size_);
          for (std::size_t i = 0; i < n; ++i) p[i] *= inv;
        } else {
          for (std::size_t i = 0; i < n; ++i) p[i] /= static_cast<T>(size_);
        }
      }
#else
      (void)p, (void)n, (void)op;  // a world of one: reached only with size 1, never called
#endif
    }
  }

  template <class T>
  void broadcast_raw(T* p, std::size_t n, int root) {
    const std::size_t bytes = n * sizeof(T);
    if constexpr (nccl) {
#if LOCUS_DIST_NCCL
      detail::nccl_check(ncclBroadcast(p, p, bytes, ncclUint8, root, nccl_, locus::detail::current_stream()),
                         "ncclBroadcast");
#endif
    } else {
#if LOCUS_DIST_MPI
      detail::timed w(env_->watchdog(), "broadcast");
      auto* b = reinterpret_cast<unsigned char*>(p);
      for (std::size_t off = 0; off < bytes;) {
        const std::size_t c = bytes - off < chunk ? bytes - off : chunk;
        detail::mpi_check(MPI_Bcast(b + off, static_cast<int>(c), MPI_BYTE, root, comm_), "MPI_Bcast");
        off += c;
      }
#else
      (void)p, (void)bytes, (void)root;
#endif
    }
  }

  template <class T>
  void gather_raw(const T* src, T* dst, std::size_t n_each) {
    const std::size_t bytes = n_each * sizeof(T);
    if constexpr (nccl) {
#if LOCUS_DIST_NCCL
      detail::nccl_check(ncclAllGather(src, dst, bytes, ncclUint8, nccl_, locus::detail::current_stream()),
                         "ncclAllGather");
#endif
    } else {
#if LOCUS_DIST_MPI
      if (bytes > static_cast<std::size_t>(std::numeric_limits<int>::max()))
        throw value_error("locus: all_gather of more than 2^31 - 1 bytes per rank over MPI");
      detail::timed w(env_->watchdog(), "all_gather");
      detail::mpi_check(MPI_Allgather(src, static_cast<int>(bytes), MPI_BYTE, dst, static_cast<int>(bytes), MPI_BYTE,
                                      comm_),
                        "MPI_Allgather");
#else
      (void)src, (void)dst, (void)bytes;
#endif
    }
  }

  static constexpr std::size_t chunk = std::size_t{1} << 30;  // elements (or bytes) per MPI call

  const environment* env_ = nullptr;
  int rank_ = 0, size_ = 1;
  int gpu_ = -1;  // communicator<cuda>: the GPU NCCL runs on (device_index())
#if LOCUS_DIST_MPI
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<MPI_Request> pending_;         // all_reduce_start's, until wait()
  std::vector<std::function<void()>> finish_;  // their averaging, after wait()
#endif
#if LOCUS_DIST_NCCL
  ncclComm_t nccl_ = nullptr;
#endif
};

}  // namespace locus::dist
