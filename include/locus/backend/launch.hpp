// One kernel source for every device: a kernel is a functor called once per index,
// and the device only picks the execution policy. Host devices run it through
// Thrust's OpenMP system (sequential system without OpenMP), cuda through
// thrust::cuda::par_nosync on the current stream. This is the only place that
// includes Thrust for elementwise work, and it is not included by the core headers.
#pragma once

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
#include "../core/rules.hpp"

#if LOCUS_HAS_CUDA
#include "cuda/runtime.hpp"
#endif
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
#include <thrust/system/cuda/execution_policy.h>
#endif

namespace locus::detail {

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
#endif

/// Calls f(i) for every i in [0, n) on device D. `work` is the number of elements each
/// call touches (a row of a softmax, the length of a reduced axis): host devices run in
/// parallel when n * work reaches host_parallel_threshold and there are two calls or more.
template <class D, class F>
void launch_n(index_t n, F f, index_t work = 1) {
  if (n <= 0) return;
  if constexpr (std::is_same_v<typename D::execution, host_execution>) {
    const index_t total = work > 1 && n > host_parallel_threshold / work ? host_parallel_threshold : n * work;
    if (total < host_parallel_threshold || n < 2) {
      for (index_t i = 0; i < n; ++i) f(i);
    } else {
      thrust::for_each_n(host_policy(), thrust::counting_iterator<index_t>(0), n, f);
    }
  } else if constexpr (require_kernel_compiler<D>()) {
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
    thrust::for_each_n(cuda_policy(), thrust::counting_iterator<index_t>(0), n, f);
    LOCUS_CUDA_CHECK(cudaGetLastError());
#endif
  }
}

}  // namespace locus::detail
