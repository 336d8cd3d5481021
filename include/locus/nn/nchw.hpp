// What the NCHW layers (conv2d, the pools, batch norm) share: the switch to the
// device-generic path on the host (tests), the host path's OpenMP helpers, per-plane
// tasks and scratch buffers, and the rank-4 shape checks that name the layer.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif


#include "conv_kernels.hpp"
#include "layers.hpp"

namespace locus::nn {

namespace detail {
/// Tests: run the device-generic path of conv2d (per-sample matmul_into around the
/// im2col and col2im kernels) and of pooling (the per-index kernels), what cuda runs, on
/// host devices too.
inline std::atomic<bool>& conv_generic_path() noexcept {
  static std::atomic<bool> on{false};
  return on;
}

/// Samples per task on conv2d's host path (default 1; tests set more).
inline std::atomic<index_t>& conv_host_chunk() noexcept {
  static std::atomic<index_t> chunk{1};
  return chunk;
}

template <class D>
bool host_path() noexcept {
  if constexpr (std::is_same_v<typename D::execution, locus::detail::host_execution>)
    return !conv_generic_path().load(std::memory_order_relaxed);
  else
    return false;
}

inline int host_threads() noexcept {
#if defined(_OPENMP)
  return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
  return 1;
#endif
}
inline int host_thread_id() noexcept {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

inline std::string dims4(const extents<4>& s) {
  return "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) + ", " +
         std::to_string(s[3]) + "]";
}

/// A rank-4 shape with no negative extent whose element count, and every partial product
/// (h * w of an empty batch too), fits in index_t: output_shape takes any numbers.
inline void check_countable(const std::string& layer, const char* what, const extents<4>& s) {
  index_t n = 0;
  const auto at_least_1 = [](index_t v) { return v < 1 ? index_t{1} : v; };
  if (s[0] < 0 || s[1] < 0 || s[2] < 0 || s[3] < 0 ||
      !locus::detail::checked_product(n, at_least_1(s[0]), at_least_1(s[1]), at_least_1(s[2]), at_least_1(s[3])))
    throw shape_error("locus: " + layer + ": the " + what + " " + dims4(s) +
                      (s[0] < 0 || s[1] < 0 || s[2] < 0 || s[3] < 0 ? " has a negative extent"
                                                                      : " has more elements than fit in 64 bits"));
}

/// Checks a rank-4 input's channels; throws shape_error naming the layer.
inline void check_channels(const std::string& layer, index_t expected, const extents<4>& s) {
  if (s[1] != expected)
    throw shape_error("locus: " + layer + " takes " + std::to_string(expected) + " channels, but its input " +
                      dims4(s) + " has " + std::to_string(s[1]));
}
inline std::vector<index_t> check_rank4(const std::string& layer, const std::vector<index_t>& in) {
  if (in.size() != 4)
    throw shape_error("locus: " + layer + " takes [batch, channels, height, width], but its input is " +
                      shape_list(in));
  return in;
}

/// A thread's reusable buffer of at least n values (host pooling's accumulators).
template <class V>
std::vector<V>& scratch_of(index_t n) {
  thread_local std::vector<V> buf;
  if (buf.size() < static_cast<std::size_t>(n)) buf.resize(static_cast<std::size_t>(n));
  return buf;
}

/// Host pooling: a plane per task (OpenMP over planes), loops without divisions. The
/// backward passes scatter each output's gradient in output order, which adds, for every
/// input element, the same terms in the same order as the per-index gather kernels: the
/// same bits.
template <class F>
void for_planes(index_t planes, index_t work_per_plane, F&& f) {
  [[maybe_unused]] const bool parallel = planes > 1 && planes * work_per_plane >= locus::detail::host_parallel_threshold;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (index_t p = 0; p < planes; ++p) f(p);
}
}  // namespace detail


}  // namespace locus::nn
