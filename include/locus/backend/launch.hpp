// One kernel source for every device: a kernel is a functor called once per index,
// and the device only picks the execution policy. Host devices run it through
// Thrust's OpenMP system (sequential system without OpenMP), cuda through
// thrust::cuda::par_nosync on the current stream. This is the only place that
// includes Thrust for elementwise work, and it is not included by the core headers.
//
// Failures: Thrust reports a failed launch by throwing thrust::system_error, having
// already cleared the runtime's error (so cudaGetLastError() afterwards sees nothing).
// Every launch here goes through translate_launch_errors, which rethrows anything
// Thrust or CUB throws as locus::cuda_error with the code and text: every failure
// locus reports is a locus::error.
//
// Three launch forms:
//   launch_n<D>(n, f)       f(i) for i in [0, n); n == 1 on cuda is one <<<1, 1>>> launch
//                           (no cub::DeviceFor dispatch: a one-thread kernel costs a launch)
//   launch_n_then<D>(n, f)  f(i) for every i, then f.last() once, after every f(i) has
//                           completed and is visible: one launch on cuda (the last block
//                           to finish runs last()), a loop then a call on the host. This is
//                           how a pass carries the scalar work that used to be its own
//                           one-thread kernel.
// With LOCUS_COUNT_LAUNCHES defined (bench/bench_cuda_step.cu only) every cuda launch
// through these helpers adds one to launch_count().
#pragma once

#include <exception>
#include <new>
#include <string_view>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#if defined(_OPENMP)
// Only the OpenMP policy object and its for_each: the whole of
// <thrust/system/omp/execution_policy.h> (every algorithm of the system) costs each
// user file about a second of parsing.
#include <thrust/system/omp/detail/par.h>
#include <thrust/system/omp/detail/for_each.h>
#else
#include <thrust/system/cpp/execution_policy.h>
#endif

#include "../core/config.hpp"
#include "../core/device.hpp"
#include "../core/error.hpp"
#include "../core/rules.hpp"

// thrust::system_error only where Thrust launches CUDA work (nvcc): on a host compiler
// the header pulls <iostream> and CCCL's <cuda/functional> into every user file
// (bench/compile-time). LOCUS_TRANSLATE_THRUST_ERRORS lets a host test check the
// translation itself.
#if (LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER) || defined(LOCUS_TRANSLATE_THRUST_ERRORS)
#include <thrust/system_error.h>
#define LOCUS_DETAIL_THRUST_SYSTEM_ERROR 1
#endif

#if LOCUS_HAS_CUDA
#include "cuda/runtime.hpp"
#endif
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
#include <atomic>
#include <cstdint>
#include <thrust/system/cuda/execution_policy.h>
#include "../core/preflight.hpp"
#endif

namespace locus::detail {

#if defined(LOCUS_COUNT_LAUNCHES)
/// Launches through locus's helpers on cuda so far (bench builds only).
inline unsigned long long& launch_count() noexcept {
  static unsigned long long n = 0;
  return n;
}
inline void count_launch() noexcept { ++launch_count(); }
#else
inline void count_launch() noexcept {}
#endif

/// The error code a launch failure carries: cudaErrorLaunchFailure (4) when the
/// exception has none (std::bad_alloc: cudaErrorMemoryAllocation, 2).
inline constexpr int launch_failure_code = 4;
inline constexpr int launch_alloc_code = 2;

/// Runs `f` (a launch through Thrust or CUB) and rethrows whatever it throws as
/// locus::cuda_error naming `call`: thrust::system_error with its code and text,
/// std::bad_alloc (Thrust's temporary storage) as cudaErrorMemoryAllocation, any other
/// std::exception with its text. locus's own errors pass through unchanged.
template <class F>
decltype(auto) translate_launch_errors(const char* call, const char* file, int line, F&& f) {
  try {
    return f();
  } catch (const ::locus::error&) {
    throw;
#if defined(LOCUS_DETAIL_THRUST_SYSTEM_ERROR)
  } catch (const thrust::system_error& e) {
    throw ::locus::cuda_error(call, file, line, e.code().value(), e.what());
#endif
  } catch (const std::bad_alloc& e) {
    throw ::locus::cuda_error(call, file, line, launch_alloc_code, e.what());
  } catch (const std::exception& e) {
    throw ::locus::cuda_error(call, file, line, launch_failure_code, e.what());
  }
}

/// Below this many elements a host kernel runs inline: starting an OpenMP team
/// costs more than the work.
inline constexpr index_t host_parallel_threshold = 1 << 15;

/// The Thrust execution policy of device D (host devices).
inline auto host_policy() {
#if defined(_OPENMP)
  return thrust::omp::par;
#else
  return thrust::cpp::par;
#endif
}

#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
/// The Thrust execution policy of cuda: the current stream, no synchronisation.
inline auto cuda_policy() { return thrust::cuda::par_nosync.on(current_stream()); }

/// f(0) on one thread.
template <class F>
__global__ void single_thread_kernel(F f) {
  f(index_t{0});
}

/// f(i) over a grid-stride loop, then f.last() in the last block to finish: every
/// block fences its writes and takes a ticket; the block with the last ticket fences
/// again, runs last() and resets the ticket counter for the next launch.
template <class F>
__global__ void for_each_then_kernel(index_t n, F f, unsigned int* tickets) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
  __shared__ bool last_block;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(tickets, 1u) == gridDim.x - 1;
  __syncthreads();
  if (last_block && threadIdx.x == 0) {
    __threadfence();
    f.last();
    *static_cast<volatile unsigned int*>(tickets) = 0u;
  }
}

/// The first launch of this file's kernels on each GPU checks the card against the
/// architectures compiled into the file (locus::preflight, core/preflight.hpp): a card
/// the build has no kernel image for, or a driver too old for the runtime, is a
/// cuda_error naming the CMake setting or driver to change, instead of "no kernel image
/// is available" after the launch. Archs is the file's list (a type, so that files with
/// other lists keep their own flags); later launches on a GPU that passed cost one
/// relaxed load.
template <class Archs = this_file_cuda_archs>
void check_kernel_image() {
  static std::atomic<std::uint64_t> passed{0};  // bit g: GPU g passed (GPUs 64 and up: every time)
  const int g = current_device_or_zero();
  const std::uint64_t bit = g >= 0 && g < 64 ? std::uint64_t{1} << g : 0;
  if (bit != 0 && (passed.load(std::memory_order_relaxed) & bit) != 0) return;
  (void)::locus::preflight_check(gpu_report(g), g, gpu_precision::fp32, std::span<const int>(Archs::values));
  passed.fetch_or(bit, std::memory_order_relaxed);
}

/// Checks the launch just made (a kernel launch reports bad configurations here).
inline void check_launch(const char* call, const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw ::locus::cuda_error(call, file, line, static_cast<int>(e), cudaGetErrorString(e));
}
#endif

/// Reads *p afresh (volatile on the device: last() reads what other blocks wrote, which
/// this block's L1 may hold stale).
template <class T>
LOCUS_HOST_DEVICE inline T fresh(const T* p) noexcept {
#if defined(__CUDA_ARCH__)
  return *static_cast<const volatile T*>(p);
#else
  return *p;
#endif
}

/// Calls f(i) for every i in [0, n) on device D. `work` is the number of elements each
/// call touches (a row of a softmax, the length of a reduced axis): host devices run in
/// parallel when n * work reaches host_parallel_threshold and there are two calls or more.
/// Calls f.block(lo, hi) for consecutive ranges covering [0, n) (host_blocked below).
template <class F>
struct host_block_caller {
  F f;
  index_t n, size;
  LOCUS_HOST_DEVICE void operator()(index_t b) const {
    const index_t lo = b * size;
    f.block(lo, n - lo < size ? n : lo + size);
  }
};

/// A kernel that also has block(lo, hi) (the calls f(lo) ... f(hi - 1), as one loop that
/// hoists what every call would decide: an activation's kind) runs on the host as
/// blocks of host_block_size consecutive calls, so the compiler sees a plain loop and
/// vectorises it.
inline constexpr index_t host_block_size = 1 << 13;

template <class D, class F>
void launch_n(index_t n, F f, index_t work = 1) {
  if (n <= 0) return;
  if constexpr (std::is_same_v<typename D::execution, host_execution> &&
                requires(const F& g) { g.block(index_t{}, index_t{}); }) {
    const index_t blocks = (n + host_block_size - 1) / host_block_size;
    if (n < host_parallel_threshold || blocks < 2 || work != 1) {
      f.block(0, n);
    } else {
      thrust::for_each_n(host_policy(), thrust::counting_iterator<index_t>(0), blocks,
                         host_block_caller<F>{f, n, host_block_size});
    }
  } else if constexpr (std::is_same_v<typename D::execution, host_execution>) {
    const index_t total = work > 1 && n > host_parallel_threshold / work ? host_parallel_threshold : n * work;
    if (total < host_parallel_threshold || n < 2) {
      for (index_t i = 0; i < n; ++i) f(i);
    } else {
      thrust::for_each_n(host_policy(), thrust::counting_iterator<index_t>(0), n, f);
    }
  } else if constexpr (require_kernel_compiler<D>()) {
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
    count_launch();
    check_kernel_image();
    if (n == 1) {
      single_thread_kernel<<<1, 1, 0, current_stream()>>>(f);
      check_launch("single_thread_kernel<<<1, 1>>>", __FILE__, __LINE__);
      return;
    }
    translate_launch_errors("thrust::for_each_n", __FILE__, __LINE__, [&] {
      thrust::for_each_n(cuda_policy(), thrust::counting_iterator<index_t>(0), n, f);
    });
    check_launch("thrust::for_each_n", __FILE__, __LINE__);
#endif
  }
}

/// Threads per block and the most blocks launch_n_then uses on cuda (a grid-stride loop
/// beyond that: H200's 132 SMs hold 8 such blocks each).
inline constexpr int then_block = 256;
inline constexpr index_t then_max_blocks = 1056;

/// Blocks launch_n_then launches for n elements (at least one: last() always runs).
constexpr index_t then_blocks(index_t n) noexcept {
  const index_t b = n <= 0 ? 1 : n / then_block + (n % then_block != 0 ? 1 : 0);  // no overflow near 2^63
  return b < then_max_blocks ? b : then_max_blocks;
}

/// f(i) for every i in [0, n), then f.last() once after all of them (see the header
/// comment). On host devices f.host(n) runs instead of the loop when F has it (a
/// vectorised form of the same arithmetic). `tickets` is one zeroed unsigned int of
/// device memory that no other launch uses concurrently (cuda only; ignored on the host).
template <class D, class F>
void launch_n_then(index_t n, F f, unsigned int* tickets) {
  if constexpr (std::is_same_v<typename D::execution, host_execution>) {
    (void)tickets;
    if constexpr (requires { f.host(n); }) {
      f.host(n);
    } else {
      for (index_t i = 0; i < n; ++i) f(i);
    }
    f.last();
  } else if constexpr (require_kernel_compiler<D>()) {
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
    count_launch();
    check_kernel_image();
    for_each_then_kernel<<<static_cast<unsigned int>(then_blocks(n)), then_block, 0, current_stream()>>>(n, f, tickets);
    check_launch("for_each_then_kernel", __FILE__, __LINE__);
#endif
  }
}

}  // namespace locus::detail
