// Rows for training: softmax and log_softmax along an axis (numerically stable: the
// row maximum is subtracted before exp), and one_hot. One kernel source for every
// device: per-thread pieces that make one online pass over (part of) a row for its
// maximum and sum of exponentials and one pass that writes. The host runs a row per
// call; cuda runs a warp per row (up to 1024 elements), a block per row (longer rows:
// a 50k-class row is read by 512 threads, coalesced) or, along an axis that is not the
// innermost, 32 neighbouring columns per warp (coalesced) with the axis split over 16
// row groups. The axis is a compile-time constant in every kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "expr.hpp"
#include "reduce.hpp"

namespace locus {

namespace detail {

/// The online maximum and sum of exponentials of a row (Milakov & Gimelshein, "Online
/// normalizer calculation for softmax", 2018): one read gives both, s being the sum of
/// exp(v - m) for the running maximum m, rescaled when m grows. Partial states of
/// parts of a row merge (merge is commutative bit for bit, so a warp's butterfly gives
/// every lane the same state). A row whose maximum is not finite (+inf, or every value
/// -inf) or that holds a NaN has sum() NaN: every output of such a row is NaN, as the
/// three-pass form gave (exp(inf - inf), exp(-inf - -inf) and NaN all propagate).
template <class C>
struct online_softmax {
  C m;  // the running maximum (-inf before any value)
  C s;  // sum of exp(v - m)
  LOCUS_HOST_DEVICE static online_softmax start() { return {-std::numeric_limits<C>::infinity(), C(0)}; }
  LOCUS_HOST_DEVICE void add(C v) {
    if (v > m) {
      s = s * m_exp(m - v) + C(1);  // m = -inf: s * 0 + 1
      m = v;
    } else if (v != -std::numeric_limits<C>::infinity()) {
      s += m_exp(v - m);  // NaN v, or v = m = +inf: NaN
    }
  }
  LOCUS_HOST_DEVICE static online_softmax merge(online_softmax a, online_softmax b) {
    const C m = a.m > b.m ? a.m : b.m;
    const C ta = a.m == m ? a.s : a.s * m_exp(a.m - m);  // a.m = -inf < m: 0 (NaN stays NaN)
    const C tb = b.m == m ? b.s : b.s * m_exp(b.m - m);
    return {m, ta + tb};
  }
  /// The row's sum of exp(v - m), NaN when m is not finite.
  LOCUS_HOST_DEVICE C sum() const { return (m - m) == C(0) ? s : std::numeric_limits<C>::quiet_NaN(); }
};

#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
/// Every lane of the warp gets the merge of all 32 lanes' states (butterfly).
template <class C>
__device__ inline online_softmax<C> warp_merge(online_softmax<C> st) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const online_softmax<C> o{__shfl_xor_sync(0xffffffffu, st.m, off), __shfl_xor_sync(0xffffffffu, st.s, off)};
    st = online_softmax<C>::merge(st, o);
  }
  return st;
}
#endif

/// How a row kernel maps rows to threads on cuda: a warp per row (rows up to
/// row_warp_max elements, 8 rows per block), a block of row_block_threads per row
/// (longer rows), or 32 columns x 16 row groups per block (softmax along an axis that
/// is not the innermost: the "rows" are columns of a row-major [outer, len, inner]).
enum class row_mode { warp_rows, block_rows, column_tiles };
inline constexpr index_t row_warp_max = 1024;
inline constexpr index_t rows_per_warp_block = 8;
inline constexpr index_t row_block_threads = 512;
inline row_mode choose_row_mode(index_t len, index_t inner) {
  if (inner > 1) return row_mode::column_tiles;
  return len <= row_warp_max ? row_mode::warp_rows : row_mode::block_rows;
}

/// Softmax (or log-softmax, Log) of every line of a [outer, len, inner] operand: one
/// online pass for the maximum and the sum, one pass that writes. The per-thread pieces
/// are the same on every device; the host runs one line per call.
template <class T, bool Log, class Reader>
struct softmax_lines {
  using C = compute_t<T>;
  using state = online_softmax<C>;
  T* out;  // contiguous, the operand's shape
  Reader rd;
  index_t outer, len, inner;
  row_mode mode;
  LOCUS_HOST_DEVICE state part(index_t o, index_t i, index_t j0, index_t step) const {
    state st = state::start();
    auto c = rd.start(o, i);
    for (index_t j = j0; j < len; j += step) st.add(static_cast<C>(rd.at(c, j)));
    return st;
  }
  LOCUS_HOST_DEVICE void write(index_t o, index_t i, index_t j0, index_t step, state st) const {
    const C s = st.sum();
    const C log_s = m_log(s);  // (x - m) - log_s: x - (m + log_s) would round away small results
    const C inv_s = C(1) / s;
    auto c = rd.start(o, i);
    T* base = out + o * len * inner + i;
    for (index_t j = j0; j < len; j += step) {
      const C z = static_cast<C>(rd.at(c, j)) - st.m;
      base[j * inner] = store<T>(Log ? z - log_s : m_exp(z) * inv_s);
    }
  }
  /// The state of a whole line in two passes (the host's form: the row is in cache, and
  /// one long online sum would rescale at every new maximum, an ulp each time): the
  /// maximum, then the sum of exponentials in f64 for f32 and half rows.
  LOCUS_HOST_DEVICE state whole(index_t o, index_t i) const {
    using Wd = std::conditional_t<std::is_same_v<C, float>, double, C>;
    auto c = rd.start(o, i);
    C m = -std::numeric_limits<C>::infinity();
    for (index_t j = 0; j < len; ++j) m = op::maximum{}(m, static_cast<C>(rd.at(c, j)));  // NaN propagates
    Wd sum(0);
    for (index_t j = 0; j < len; ++j) sum += static_cast<Wd>(m_exp(static_cast<C>(rd.at(c, j)) - m));
    return {m, static_cast<C>(sum)};
  }
  /// Host: line l = (o, i), whole.
  LOCUS_HOST_DEVICE void operator()(index_t l) const {
    const index_t o = l / inner, i = l % inner;
    write(o, i, 0, 1, whole(o, i));
  }
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
  __device__ void block() const {
    if (mode == row_mode::column_tiles) {
      __shared__ C pm[max_tile_rows][tile_cols], ps[max_tile_rows][tile_cols];
      const index_t col_tiles = (inner + tile_cols - 1) / tile_cols;
      const index_t o = blockIdx.x / col_tiles, i = (blockIdx.x % col_tiles) * tile_cols + threadIdx.x;
      const bool live = i < inner;
      const state st = live ? part(o, i, threadIdx.y, blockDim.y) : state::start();
      pm[threadIdx.y][threadIdx.x] = st.m;
      ps[threadIdx.y][threadIdx.x] = st.s;
      __syncthreads();
      if (!live) return;
      state all{pm[0][threadIdx.x], ps[0][threadIdx.x]};
      for (unsigned y = 1; y < blockDim.y; ++y) all = state::merge(all, state{pm[y][threadIdx.x], ps[y][threadIdx.x]});
      write(o, i, threadIdx.y, blockDim.y, all);
      return;
    }
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (mode == row_mode::warp_rows) {
      const index_t row = static_cast<index_t>(blockIdx.x) * rows_per_warp_block + warp;
      if (row >= outer) return;
      const state st = warp_merge(part(row, 0, lane, 32));
      write(row, 0, lane, 32, st);
      return;
    }
    __shared__ C wm[32], ws[32];
    const index_t row = blockIdx.x;
    state st = warp_merge(part(row, 0, threadIdx.x, blockDim.x));
    if (lane == 0) {
      wm[warp] = st.m;
      ws[warp] = st.s;
    }
    __syncthreads();
    st = state{wm[0], ws[0]};
    for (unsigned w = 1; w < blockDim.x / 32; ++w) st = state::merge(st, state{wm[w], ws[w]});
    write(row, 0, threadIdx.x, blockDim.x, st);
  }
#endif
};

/// Runs softmax_lines on device D: one line per call on the host; the row mode's grid
/// on cuda.
template <class D, class F>
void run_softmax_lines(const F& f) {
  if constexpr (D::host_accessible) {
    launch_n<D>(f.outer * f.inner, f, f.len);
  } else if constexpr (require_kernel_compiler<D>()) {
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
    if (f.mode == row_mode::column_tiles) {
      const column_tiles p = plan_column_tiles(f.len, f.inner, f.outer);
      launch_blocks(dim3(static_cast<unsigned>(f.outer * p.col_tiles)),
                    dim3(static_cast<unsigned>(tile_cols), static_cast<unsigned>(p.tile_rows)), f);
    } else if (f.mode == row_mode::warp_rows) {
      launch_blocks(dim3(static_cast<unsigned>((f.outer + rows_per_warp_block - 1) / rows_per_warp_block)),
                    dim3(static_cast<unsigned>(32 * rows_per_warp_block)), f);
    } else {
      launch_blocks(dim3(static_cast<unsigned>(f.outer)), dim3(static_cast<unsigned>(row_block_threads)), f);
    }
#endif
  }
}

template <bool Log, class X>
auto softmax_impl(const X& x, std::size_t axis) {
  using E = expr_of_t<X>;
  using T = typename E::value_type;
  using D = typename E::device;
  constexpr std::size_t R = E::rank;
  if constexpr (R < 1) {
    static_assert(always_false<X>,
                  "locus: softmax needs rank >= 1 (it normalises along an axis), but got a rank-0 "
                  "value; give it an axis first: x.reshape({1}) (an expression: locus::eval(x) first)");
    return 0;
  } else if constexpr (!dtype_traits<T>::is_floating) {
    static_assert(always_false<X>,
                  "locus: softmax needs a floating dtype; convert first with locus::cast<float>(x)");
    return 0;
  } else {
    const E e = to_expr(x);
    check_expr_gpus(Log ? "log_softmax" : "softmax", e);
    const auto shape = e.shape();
    check_axis(axis, shape);
    tensor<T, D, R> out(shape);
    if (out.numel() == 0) return out;
    index_array<R> sh{};
    for (std::size_t k = 0; k < R; ++k) sh.v[k] = shape[k];
    const auto ev = e.make_eval(shape);
    const bool linear = e.linear_ok(shape);
    index_t outer = 1, inner = 1;
    for (std::size_t k = 0; k < axis; ++k) outer *= shape[k];
    for (std::size_t k = axis + 1; k < R; ++k) inner *= shape[k];
    const index_t len = shape[axis];
    const row_mode mode = choose_row_mode(len, inner);
    auto go = [&](auto rd) {
      run_softmax_lines<D>(softmax_lines<T, Log, decltype(rd)>{out.data_handle(), rd, outer, len, inner, mode});
    };
    // A strided operand along its innermost axis reads through the same code as its
    // contiguous copy: the same sums in the same order, so the two agree to the bit.
    if (linear) {
      go(column_reader<decltype(ev), R, 0, true>{ev, sh, len, inner});
    } else if constexpr (std::is_same_v<D, cuda>) {  // the axis at compile time: no stack frame
      with_static_axis<R>(axis, [&](auto ax) {
        go(column_reader<decltype(ev), R, decltype(ax)::value, false>{ev, sh, len, inner});
      });
    } else {  // host: one instance for every axis
      go(column_reader<decltype(ev), R, runtime_axis, false>{ev, sh, len, inner, axis});
    }
    return out;
  }
}

template <class T, class L>
struct one_hot_kernel {
  T* out;
  const L* labels;
  index_t classes;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const index_t row = i / classes, c = i % classes;
    out[i] = store<T>(static_cast<compute_t<T>>(static_cast<index_t>(labels[row]) == c ? 1 : 0));
  }
};

}  // namespace detail

/// exp(x - max) / sum(exp(x - max)) along `axis`.
template <Operand X>
auto softmax(const X& x, std::size_t axis) {
  return detail::softmax_impl<false>(x, axis);
}

/// x - max - log(sum(exp(x - max))) along `axis`: stable for any magnitude of x.
template <Operand X>
auto log_softmax(const X& x, std::size_t axis) {
  return detail::softmax_impl<true>(x, axis);
}

/// One-hot encoding: labels of shape S (integers in [0, classes)) give a tensor of
/// shape S + [classes] with 1 at each label. On host-accessible devices a label out of
/// range throws index_error naming its position and value; on cuda such a row is all
/// zeros (checking would need a synchronisation).
template <Dtype T = float, class L>
  requires detail::tensor_traits<std::remove_cvref_t<L>>::is_tensor ||
           detail::tensor_traits<std::remove_cvref_t<L>>::is_view
auto one_hot(const L& labels, index_t classes) {
  using tr = detail::tensor_traits<std::remove_cvref_t<L>>;
  using LT = typename tr::value_type;
  using D = typename tr::device;
  constexpr std::size_t R = tr::rank;
  static_assert(std::is_integral_v<LT> && !std::is_same_v<LT, bool>,
                "locus: one_hot needs integer labels (i64, i32 or u8), but got a floating or bool "
                "dtype; convert first: locus::one_hot(locus::eval(locus::cast<std::int64_t>(labels)), classes)");
  if (classes <= 0) throw shape_error("locus: one_hot needs classes > 0, got " + std::to_string(classes));
  const auto lv = detail::as_view_const(labels);
  extents<R + 1> shape{};
  for (std::size_t k = 0; k < R; ++k) shape[k] = lv.shape()[k];
  shape[R] = classes;
  if (!lv.is_contiguous()) throw shape_error("locus: one_hot needs contiguous labels; clone() them first");
  detail::check_same_gpu<D>("one_hot", lv);
  if constexpr (D::host_accessible) {
    const LT* p = lv.data_handle();
    for (index_t i = 0; i < lv.numel(); ++i)
      if (p[i] < 0 || static_cast<index_t>(p[i]) >= classes)
        throw index_error("locus: label " + std::to_string(static_cast<long long>(p[i])) + " at position " +
                          std::to_string(i) + " is outside [0, " + std::to_string(classes) + ")");
  }
  tensor<T, D, R + 1> out(shape);
  detail::launch_n<D>(out.numel(), detail::one_hot_kernel<T, LT>{out.data_handle(), lv.data_handle(), classes});
  return out;
}

}  // namespace locus
