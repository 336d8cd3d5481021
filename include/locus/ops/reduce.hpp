// Reductions: sum, mean, max, min, argmax, argmin, var — over the whole tensor (a
// rank-0 tensor on the same device: read it with to<cpu>(s).item()) or along one axis
// (rank R-1, or R with locus::keepdim). Inputs may be tensors, views or unevaluated
// expressions (sum(a * b) reads a and b once, without a temporary).
//
// The reduction operators (identity, combine) are one source for every device. How
// they are driven is the device's: on the host, fixed blocks of 2048 elements reduced
// with 16 independent accumulators (vectorisable, and accurate: a block's sum is
// formed pairwise-ish from short partial sums, blocks are combined in f64), OpenMP
// over blocks, deterministic for any thread count; on cuda, cub::DeviceReduce for
// whole-tensor reductions, cub::DeviceSegmentedReduce along the innermost axis and one
// thread per output along other axes. f16 and bf16 accumulate in f32; floating sums are
// combined in f64 on every path (host blocks, blocks along an axis, cub), integers are
// reduced in i64 (never through double) and their sums (bool, u8, i32, i64) return i64,
// as PyTorch's do; mean and var need a floating dtype (as PyTorch's mean does). max of all -inf is -inf, min of all +inf is
// +inf. NaN propagates through sum, max and min; argmax and argmin return the first
// extreme, a NaN counting as extreme, on every device.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include "expr.hpp"

#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_segmented_reduce.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#endif

namespace locus {

/// Tag: keep the reduced axis with extent 1 (result rank R instead of R-1).
struct keepdim_t {
  explicit keepdim_t() = default;
};
inline constexpr keepdim_t keepdim{};

namespace detail {

/// var's divisor, max(0, n - correction) as torch.var's: a correction at or past the
/// element count gives inf (or NaN for 0/0), never a negative variance.
LOCUS_HOST_DEVICE inline double var_divisor(index_t n, double correction) {
  const double d = static_cast<double>(n) - correction;
  return d > 0.0 ? d : 0.0;
}

/// Reads element i (row-major over `shape`) of an expression evaluator.
template <class Ev, std::size_t R, bool Linear>
struct flat_reader {
  Ev ev;
  index_array<R> shape;
  LOCUS_HOST_DEVICE auto operator()(index_t i) const {
    if constexpr (Linear || R == 0) {
      return ev.at_linear(i);
    } else {
      index_t idx[R];
      for (std::size_t k = R; k-- > 0;) {
        idx[k] = i % shape.v[k];
        i /= shape.v[k];
      }
      return ev.at_index(idx);
    }
  }
};

// ---- reduction operators: one source for every device ---------------------------------
/// a + b; for signed integers in two's complement (wrap_add, through the unsigned
/// type), so that partial sums may overflow on the way (lanes and blocks group values
/// of one sign) and the total is still exact whenever it fits, with no undefined
/// behaviour; a total beyond i64 wraps, as PyTorch's does.
template <class A>
LOCUS_HOST_DEVICE constexpr A add_wrapping(A a, A b) {
  return wrap_add(a, b);
}
struct sum_op {
  template <class A> LOCUS_HOST_DEVICE A operator()(A a, A b) const { return add_wrapping(a, b); }
  template <class A> static constexpr A identity() { return A(0); }
};
/// The identities of max and min: -inf and +inf for floating accumulators (so the max
/// of all -inf is -inf, not -FLT_MAX), lowest() and max() for integers.
template <class A>
constexpr A lowest_or_neg_inf() {
  if constexpr (std::numeric_limits<A>::has_infinity) return -std::numeric_limits<A>::infinity();
  else return std::numeric_limits<A>::lowest();
}
template <class A>
constexpr A max_or_inf() {
  if constexpr (std::numeric_limits<A>::has_infinity) return std::numeric_limits<A>::infinity();
  else return std::numeric_limits<A>::max();
}
struct max_op {
  template <class A> LOCUS_HOST_DEVICE A operator()(A a, A b) const { return op::maximum{}(a, b); }
  template <class A> static constexpr A identity() { return lowest_or_neg_inf<A>(); }
};
struct min_op {
  template <class A> LOCUS_HOST_DEVICE A operator()(A a, A b) const { return op::minimum{}(a, b); }
  template <class A> static constexpr A identity() { return max_or_inf<A>(); }
};

/// (value, index) pair for argmax/argmin: the first extreme wins; NaN counts as extreme.
template <class A>
struct arg_pair {
  A value;
  index_t index;
};
template <bool Max>
struct arg_op {
  template <class A>
  LOCUS_HOST_DEVICE arg_pair<A> operator()(arg_pair<A> a, arg_pair<A> b) const {
    const bool an = is_nan(a.value), bn = is_nan(b.value);
    if (an || bn) {
      if (an && bn) return a.index <= b.index ? a : b;
      return an ? a : b;
    }
    const bool b_better = Max ? (b.value > a.value) : (b.value < a.value);
    if (b_better || (b.value == a.value && b.index < a.index)) return b;
    return a;
  }
  /// The initial value for CUB, which combines it with the result: the worst value (-inf
  /// for argmax, +inf for argmin; lowest()/max() for integers) at an index past every
  /// element, so every real element beats it or ties with it at a lower index, and NaN
  /// beats it as NaN beats anything.
  template <class A>
  static constexpr arg_pair<A> identity() {
    if constexpr (Max) return {lowest_or_neg_inf<A>(), std::numeric_limits<index_t>::max()};
    else return {max_or_inf<A>(), std::numeric_limits<index_t>::max()};
  }
};

/// Accumulator type: f32 for f16/bf16/f32 (blocks combined in f64 on the host), f64
/// for f64, i64 for integers.
template <class T>
using acc_t = std::conditional_t<std::is_floating_point_v<compute_t<T>>, compute_t<T>, std::int64_t>;

/// What sums of accumulator A are combined in: f64 for floating types (blocks on the
/// host and along axes, whole tensors and rows on cuda), A itself for integers (an i64
/// through double would be rounded to 53 bits).
template <class A>
using wide_sum_t = std::conditional_t<std::is_floating_point_v<A>, double, A>;

inline constexpr index_t reduce_block = 2048;
inline constexpr int reduce_lanes = 16;

/// Host reduction of f(0..n) with op; returns the result in Acc (sum: combined in
/// double for floating types).
template <class Op, class Acc, class F>
Acc host_reduce(index_t n, const F& f) {
  using Wide = std::conditional_t<std::is_same_v<Op, sum_op> && std::is_floating_point_v<Acc>, double, Acc>;
  const index_t blocks = (n + reduce_block - 1) / reduce_block;
  std::vector<Wide> partial(static_cast<std::size_t>(blocks));
  const Op op{};
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (blocks > 8)
#endif
  for (index_t blk = 0; blk < blocks; ++blk) {
    const index_t lo = blk * reduce_block;
    const index_t hi = lo + reduce_block < n ? lo + reduce_block : n;
    Acc lanes[reduce_lanes];
    for (int l = 0; l < reduce_lanes; ++l) lanes[l] = Op::template identity<Acc>();
    index_t i = lo;
    for (; i + reduce_lanes <= hi; i += reduce_lanes)
      for (int l = 0; l < reduce_lanes; ++l) lanes[l] = op(lanes[l], static_cast<Acc>(f(i + l)));
    for (; i < hi; ++i) lanes[0] = op(lanes[0], static_cast<Acc>(f(i)));
    for (int w = reduce_lanes / 2; w > 0; w /= 2)
      for (int l = 0; l < w; ++l) lanes[l] = op(lanes[l], lanes[l + w]);
    partial[static_cast<std::size_t>(blk)] = static_cast<Wide>(lanes[0]);
  }
  Wide total = Op::template identity<Wide>();
  for (const Wide& p : partial) total = op(total, p);
  return static_cast<Acc>(total);
}

template <bool Max, class Acc, class F>
arg_pair<Acc> host_arg_reduce(index_t n, const F& f) {
  const index_t blocks = (n + reduce_block - 1) / reduce_block;
  std::vector<arg_pair<Acc>> partial(static_cast<std::size_t>(blocks));
  const arg_op<Max> op{};
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (blocks > 8)
#endif
  for (index_t blk = 0; blk < blocks; ++blk) {
    const index_t lo = blk * reduce_block;
    const index_t hi = lo + reduce_block < n ? lo + reduce_block : n;
    arg_pair<Acc> best{static_cast<Acc>(f(lo)), lo};
    for (index_t i = lo + 1; i < hi; ++i) best = op(best, arg_pair<Acc>{static_cast<Acc>(f(i)), i});
    partial[static_cast<std::size_t>(blk)] = best;
  }
  arg_pair<Acc> best = partial[0];
  for (const auto& p : partial) best = op(best, p);
  return best;
}

// ---- drivers ----------------------------------------------------------------------------

enum class reduce_kind { sum, mean, max, min, argmax, argmin, var };

/// The result dtype: i64 for argmax and argmin, and for sums of integer and bool dtypes
/// (bool, u8, i32, i64 accumulate in i64 and return i64, as PyTorch's sums do: 300 u8
/// ones sum to 300, three 2^30 to 3 * 2^30); the input's dtype otherwise.
template <reduce_kind K, class T>
using reduce_result_t =
    std::conditional_t<K == reduce_kind::argmax || K == reduce_kind::argmin ||
                           (K == reduce_kind::sum && !dtype_traits<std::remove_cv_t<T>>::is_floating),
                       std::int64_t, T>;

template <reduce_kind K, class T>
constexpr bool check_reduce_dtype() {
  if constexpr (K == reduce_kind::mean || K == reduce_kind::var) {
    static_assert(dtype_traits<T>::is_floating,
                  "locus: mean and var need a floating dtype; convert first with locus::cast<float>(x)");
    return dtype_traits<T>::is_floating;
  } else if constexpr (K == reduce_kind::sum) {
    return true;  // bool counts: an i64
  } else {
    static_assert(!std::is_same_v<T, bool>,
                  "locus: max, min, argmax and argmin of a bool tensor are not defined; count with "
                  "locus::sum(mask) (an i64), or cast first, e.g. locus::max(locus::cast<locus::i32>(mask))");
    return !std::is_same_v<T, bool>;
  }
}

template <reduce_kind K>
constexpr bool needs_elements() {
  return K == reduce_kind::max || K == reduce_kind::min || K == reduce_kind::argmax ||
         K == reduce_kind::argmin;
}
inline const char* reduce_name(reduce_kind k) {
  switch (k) {
    case reduce_kind::sum: return "sum";
    case reduce_kind::mean: return "mean";
    case reduce_kind::max: return "max";
    case reduce_kind::min: return "min";
    case reduce_kind::argmax: return "argmax";
    case reduce_kind::argmin: return "argmin";
    default: return "var";
  }
}

/// The multi-index of position o of a tensor of `shape` with axis `axis` removed,
/// written into idx with idx[axis] = 0 (the start of the row an axis kernel walks).
template <std::size_t R>
LOCUS_HOST_DEVICE inline void unravel_except_axis(index_t o, const index_array<R>& shape,
                                                  std::size_t axis, index_t* idx) {
  for (std::size_t k = R; k-- > 0;) {
    if (k == axis) {
      idx[k] = 0;
      continue;
    }
    idx[k] = o % shape.v[k];
    o /= shape.v[k];
  }
}

/// Per-output kernel for axis reductions: output o reduces `len` elements along `axis`.
template <reduce_kind K, class T, class Ev, std::size_t R>
struct axis_reduce_kernel {
  using A = acc_t<T>;
  using W = wide_sum_t<A>;
  using Out = reduce_result_t<K, T>;
  Out* out;
  Ev ev;
  index_array<R> shape;
  std::size_t axis;
  index_t len;
  double correction;
  /// The sum along the axis from idx (of squared deviations from mean if Sq), blocked as
  /// whole-tensor sums are: blocks of reduce_block elements, each summed in A with 8
  /// partial sums (accurate and vectorisable), the blocks combined in W (f64 for floating
  /// types), so a long axis does not drift.
  template <bool Sq>
  LOCUS_HOST_DEVICE W blocked_sum(index_t* idx, A mean) const {
    (void)mean;
    W total = W(0);
    for (index_t lo = 0; lo < len; lo += reduce_block) {
      const index_t hi = lo + reduce_block < len ? lo + reduce_block : len;
      A part[8] = {};
      for (index_t j = lo; j < hi; ++j) {
        idx[axis] = j;
        const A v = static_cast<A>(ev.at_index(idx));
        if constexpr (Sq) {
          const A d = v - mean;
          part[j & 7] += d * d;
        } else {
          part[j & 7] = add_wrapping(part[j & 7], v);
        }
      }
      const A block = add_wrapping(add_wrapping(add_wrapping(part[0], part[1]), add_wrapping(part[2], part[3])),
                                   add_wrapping(add_wrapping(part[4], part[5]), add_wrapping(part[6], part[7])));
      total = add_wrapping(total, static_cast<W>(block));
    }
    return total;
  }
  LOCUS_HOST_DEVICE void operator()(index_t o) const {
    index_t idx[R];
    unravel_except_axis(o, shape, axis, idx);
    if constexpr (K == reduce_kind::argmax || K == reduce_kind::argmin) {
      arg_pair<A> best{static_cast<A>(ev.at_index(idx)), 0};
      for (index_t j = 1; j < len; ++j) {
        idx[axis] = j;
        best = arg_op<K == reduce_kind::argmax>{}(best, arg_pair<A>{static_cast<A>(ev.at_index(idx)), j});
      }
      out[o] = best.index;
    } else if constexpr (K == reduce_kind::max || K == reduce_kind::min) {
      using Op = std::conditional_t<K == reduce_kind::max, max_op, min_op>;
      A acc = Op::template identity<A>();
      for (index_t j = 0; j < len; ++j) {
        idx[axis] = j;
        acc = Op{}(acc, static_cast<A>(ev.at_index(idx)));
      }
      out[o] = store<Out>(acc);
    } else {
      // sum / mean / var (mean and var: floating types, so W is f64)
      const W s = blocked_sum<false>(idx, A(0));
      if constexpr (K == reduce_kind::sum) {
        out[o] = store<Out>(s);
      } else {
        const W mean = len > 0 ? s / static_cast<W>(len) : std::numeric_limits<W>::quiet_NaN();
        if constexpr (K == reduce_kind::mean) {
          out[o] = store<Out>(mean);
        } else {
          const W ss = blocked_sum<true>(idx, static_cast<A>(mean));
          out[o] = store<Out>(ss / static_cast<W>(var_divisor(len, correction)));
        }
      }
    }
  }
};

template <class Ev, std::size_t R>
struct square_dev_reader {
  Ev ev;
  index_array<R> shape;
  const double* mean;  // where the mean lives (host or device memory, matching the device)
  LOCUS_HOST_DEVICE double operator()(index_t i) const {
    const double d = static_cast<double>(flat_reader<Ev, R, false>{ev, shape}(i)) - *mean;
    return d * d;
  }
};

#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
template <class F, class To>
struct cast_reader {
  F f;
  LOCUS_HOST_DEVICE To operator()(index_t i) const { return static_cast<To>(f(i)); }
};
template <class A>
struct make_arg_pair {
  template <class F>
  struct with {
    F f;
    LOCUS_HOST_DEVICE arg_pair<A> operator()(index_t i) const { return {static_cast<A>(f(i)), i}; }
  };
};
template <class A>
struct write_arg_index {
  std::int64_t* out;
  const arg_pair<A>* p;
  LOCUS_HOST_DEVICE void operator()(index_t) const { out[0] = p->index; }
};

/// cub::DeviceReduce over a reader; result written to *out (device memory).
template <class In, class Out, class Op, class Init>
void cub_reduce(In in, Out* out, index_t n, Op op, Init init) {
  std::size_t bytes = 0;
  LOCUS_CUDA_CHECK(cub::DeviceReduce::Reduce(nullptr, bytes, in, out, n, op, init, current_stream()));
  auto& alloc = allocator_for<cuda>();
  void* tmp = alloc.allocate(bytes > 0 ? bytes : 1);
  try {
    LOCUS_CUDA_CHECK(cub::DeviceReduce::Reduce(tmp, bytes, in, out, n, op, init, current_stream()));
  } catch (...) {
    alloc.deallocate(tmp);
    throw;
  }
  alloc.deallocate(tmp);  // stream-ordered reuse: safe
}

/// Offset of segment s: s * len (begin offsets; end offsets are the same shifted by one).
struct segment_offset {
  index_t len;
  LOCUS_HOST_DEVICE index_t operator()(index_t s) const { return s * len; }
};

/// out[o] = Out(v[o] * scale): the finishing pass of a segmented mean.
template <class A, class Out>
struct scale_store {
  const A* v;
  Out* out;
  A scale;
  LOCUS_HOST_DEVICE void operator()(index_t o) const { out[o] = store<Out>(v[o] * scale); }
};

/// cub::DeviceSegmentedReduce over `segments` consecutive runs of `len` elements of a
/// reader (the innermost axis, contiguous in row-major order), in A, into out (device).
template <class In, class A, class Op>
void cub_segmented_reduce(In in, A* out, index_t segments, index_t len, Op op, A init) {
  using thrust::counting_iterator;
  using thrust::make_transform_iterator;
  auto begins = make_transform_iterator(counting_iterator<index_t>(0), segment_offset{len});
  auto ends = make_transform_iterator(counting_iterator<index_t>(1), segment_offset{len});
  std::size_t bytes = 0;
  LOCUS_CUDA_CHECK(cub::DeviceSegmentedReduce::Reduce(nullptr, bytes, in, out, segments, begins, ends, op, init,
                                                      current_stream()));
  auto& alloc = allocator_for<cuda>();
  void* tmp = alloc.allocate(bytes > 0 ? bytes : 1);
  try {
    LOCUS_CUDA_CHECK(cub::DeviceSegmentedReduce::Reduce(tmp, bytes, in, out, segments, begins, ends, op, init,
                                                        current_stream()));
  } catch (...) {
    alloc.deallocate(tmp);
    throw;
  }
  alloc.deallocate(tmp);
}
#endif

#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
/// Innermost-axis sum, mean, max or min on cuda with cub::DeviceSegmentedReduce (one
/// segment per output, coalesced reads): max and min in A (exact), sum and mean in
/// wide_sum_t<A> (f64 for floating types, as the host blocks and the whole-tensor sums
/// on cuda are combined: a long row does not drift; i64 for integers).
template <reduce_kind K, class T, class Ev, std::size_t R, class Out>
void segmented_axis_reduce(Out* out, const Ev& ev, const index_array<R>& sh, index_t segments, index_t len) {
  using A = acc_t<T>;
  constexpr bool extreme = K == reduce_kind::max || K == reduce_kind::min;
  using W = std::conditional_t<extreme, A, wide_sum_t<A>>;
  using thrust::counting_iterator;
  using thrust::make_transform_iterator;
  using Reader = flat_reader<Ev, R, false>;
  auto in = make_transform_iterator(counting_iterator<index_t>(0), cast_reader<Reader, W>{Reader{ev, sh}});
  auto& alloc = allocator_for<cuda>();
  auto* acc = static_cast<W*>(alloc.allocate(static_cast<std::size_t>(segments) * sizeof(W)));
  try {
    if constexpr (extreme) {
      using Op = std::conditional_t<K == reduce_kind::max, max_op, min_op>;
      cub_segmented_reduce(in, acc, segments, len, Op{}, Op::template identity<W>());
    } else {
      cub_segmented_reduce(in, acc, segments, len, sum_op{}, W(0));
    }
    const W scale = K == reduce_kind::mean ? W(1) / static_cast<W>(len) : W(1);
    launch_n<cuda>(segments, scale_store<W, Out>{acc, out, scale});
  } catch (...) {
    alloc.deallocate(acc);
    throw;
  }
  alloc.deallocate(acc);
}
#endif

/// Whole-tensor reduction through reader rd (element i of the expression) into result.
template <reduce_kind K, class T, class D, class Ev, std::size_t R, class Reader>
void reduce_all_with(tensor<reduce_result_t<K, T>, D, 0>& result, const Ev& ev,
                     const index_array<R>& sh, index_t n, const Reader& rd, double correction) {
  using Out = reduce_result_t<K, T>;
  using A = acc_t<T>;
  if constexpr (D::host_accessible) {
    Out* out = result.data_handle();
    if constexpr (K == reduce_kind::argmax || K == reduce_kind::argmin) {
      *out = host_arg_reduce<K == reduce_kind::argmax, A>(n, rd).index;
    } else if constexpr (K == reduce_kind::max) {
      *out = store<Out>(host_reduce<max_op, A>(n, rd));
    } else if constexpr (K == reduce_kind::min) {
      *out = store<Out>(host_reduce<min_op, A>(n, rd));
    } else if constexpr (K == reduce_kind::sum) {
      *out = store<Out>(host_reduce<sum_op, A>(n, rd));
    } else {
      const double s = static_cast<double>(host_reduce<sum_op, A>(n, rd));
      const double mean = s / static_cast<double>(n);
      if constexpr (K == reduce_kind::mean) {
        *out = store<Out>(static_cast<A>(mean));
      } else {
        const square_dev_reader<decltype(ev), R> sq{ev, sh, &mean};
        const double ss = host_reduce<sum_op, double>(n, sq);
        *out = store<Out>(static_cast<A>(ss / var_divisor(n, correction)));
      }
    }
  } else if constexpr (require_kernel_compiler<D>()) {
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
    using thrust::counting_iterator;
    using thrust::make_transform_iterator;
    Out* out = result.data_handle();
    if constexpr (K == reduce_kind::argmax || K == reduce_kind::argmin) {
      auto& alloc = allocator_for<cuda>();
      auto* pair = static_cast<arg_pair<A>*>(alloc.allocate(sizeof(arg_pair<A>)));
      using MP = typename make_arg_pair<A>::template with<Reader>;
      using AO = arg_op<K == reduce_kind::argmax>;
      cub_reduce(make_transform_iterator(counting_iterator<index_t>(0), MP{rd}), pair, n, AO{},
                 AO::template identity<A>());
      launch_n<D>(1, write_arg_index<A>{out, pair});
      alloc.deallocate(pair);
    } else if constexpr (K == reduce_kind::max || K == reduce_kind::min) {
      // max/min in A, as on the host (exact; an i64 is not rounded to double).
      using Op = std::conditional_t<K == reduce_kind::max, max_op, min_op>;
      auto& alloc = allocator_for<cuda>();
      auto* tmp = static_cast<A*>(alloc.allocate(sizeof(A)));
      auto in = make_transform_iterator(counting_iterator<index_t>(0), cast_reader<Reader, A>{rd});
      cub_reduce(in, tmp, n, Op{}, Op::template identity<A>());
      launch_n<D>(1, scale_store<A, Out>{tmp, out, A(1)});
      alloc.deallocate(tmp);
    } else {
      // sum/mean/var in wide_sum_t<A>: double for floating types (one value; precision
      // over speed), i64 for integer sums (exact, as on the host).
      using W = wide_sum_t<A>;
      auto& alloc = allocator_for<cuda>();
      auto* tmp = static_cast<W*>(alloc.allocate(2 * sizeof(W)));
      auto in = make_transform_iterator(counting_iterator<index_t>(0), cast_reader<Reader, W>{rd});
      cub_reduce(in, tmp, n, sum_op{}, W(0));
      if constexpr (K == reduce_kind::sum) {
        launch_n<D>(1, scale_store<W, Out>{tmp, out, W(1)});
      } else if constexpr (K == reduce_kind::mean) {
        launch_n<D>(1, scale_store<double, Out>{tmp, out, 1.0 / static_cast<double>(n)});
      } else {  // var: the mean (kept on the device), then the squared deviations from it
        launch_n<D>(1, scale_store<double, double>{tmp, tmp + 1, 1.0 / static_cast<double>(n)});
        auto sq = make_transform_iterator(counting_iterator<index_t>(0),
                                          square_dev_reader<decltype(ev), R>{ev, sh, tmp + 1});
        cub_reduce(sq, tmp, n, sum_op{}, 0.0);
        launch_n<D>(1, scale_store<double, Out>{tmp, out, 1.0 / var_divisor(n, correction)});
      }
      alloc.deallocate(tmp);
    }
#endif
  }
}

/// Whole-tensor reduction of expression e into a rank-0 tensor on its device.
template <reduce_kind K, class E>
auto reduce_all(const E& e, double correction) {
  using T = typename E::value_type;
  using D = typename E::device;
  constexpr std::size_t R = E::rank;
  tensor<reduce_result_t<K, T>, D, 0> result(extents<0>{});
  const auto shape = e.shape();
  const index_t n = numel_of(shape);
  if constexpr (needs_elements<K>()) {
    if (n == 0)
      throw shape_error(std::string("locus: ") + reduce_name(K) + " of an empty tensor (shape " +
                        shape_string(shape) + ") has no value; check numel() first");
  }
  index_array<R> sh{};
  for (std::size_t k = 0; k < R; ++k) sh.v[k] = shape[k];
  const auto ev = e.make_eval(shape);
  if (e.linear_ok(shape))
    reduce_all_with<K, T, D>(result, ev, sh, n, flat_reader<decltype(ev), R, true>{ev, sh}, correction);
  else
    reduce_all_with<K, T, D>(result, ev, sh, n, flat_reader<decltype(ev), R, false>{ev, sh}, correction);
  return result;
}

template <std::size_t R>
void check_axis(std::size_t axis, const extents<R>& shape) {
  if (axis >= R)
    throw shape_error("locus: axis " + std::to_string(axis) + " is out of range for a tensor of rank " +
                      std::to_string(R) + " (shape " + shape_string(shape) + ")");
}

/// Reduction along one axis; KeepDim chooses rank R or R-1.
template <reduce_kind K, bool KeepDim, class E>
auto reduce_axis_checked(const E& e, std::size_t axis, double correction) {
  using T = typename E::value_type;
  using D = typename E::device;
  using Out = reduce_result_t<K, T>;
  constexpr std::size_t R = E::rank;
  constexpr std::size_t RO = KeepDim ? R : R - 1;
  const auto shape = e.shape();
  check_axis(axis, shape);
  extents<RO> oshape{};
  for (std::size_t k = 0, j = 0; k < R; ++k) {
    if (k == axis) {
      if constexpr (KeepDim) oshape[j++] = 1;
    } else {
      oshape[j++] = shape[k];
    }
  }
  const index_t len = shape[axis];
  if constexpr (needs_elements<K>()) {
    if (len == 0 && numel_of(oshape) > 0)
      throw shape_error(std::string("locus: ") + reduce_name(K) + " along axis " +
                        std::to_string(axis) + " of extent 0 (shape " + shape_string(shape) +
                        ") has no value");
  }
  tensor<Out, D, RO> out(oshape);
  index_array<R> sh{};
  for (std::size_t k = 0; k < R; ++k) sh.v[k] = shape[k];
  const auto ev = e.make_eval(shape);
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
  // cuda, innermost axis: a segmented CUB reduction reads each row coalesced (one thread
  // per output would stride through memory). Other axes: one thread per output reads
  // neighbouring columns, already coalesced.
  if constexpr (std::is_same_v<D, cuda> && (K == reduce_kind::sum || K == reduce_kind::mean ||
                                            K == reduce_kind::max || K == reduce_kind::min)) {
    if (axis == R - 1 && len > 0 && out.numel() > 0) {
      segmented_axis_reduce<K, T>(out.data_handle(), ev, sh, out.numel(), len);
      return out;
    }
  }
#endif
  launch_n<D>(out.numel(), axis_reduce_kernel<K, T, decltype(ev), R>{out.data_handle(), ev, sh, axis, len, correction},
              len);
  return out;
}

template <reduce_kind K, bool KeepDim, class E>
auto reduce_axis(const E& e, std::size_t axis, double correction) {
  if constexpr (E::rank == 0) {  // nothing below is instantiated: one error
    static_assert(always_false<E>,
                  "locus: an axis reduction needs rank >= 1, but this tensor has rank 0 (no axis to "
                  "reduce along); reduce the whole tensor instead: leave out the axis, e.g. locus::sum(x)");
    return 0;
  } else {
    return reduce_axis_checked<K, KeepDim>(e, axis, correction);
  }
}

}  // namespace detail

#define LOCUS_DETAIL_REDUCTION(NAME, KIND)                                                      \
  template <Operand X>                                                                          \
  auto NAME(const X& x) {                                                                       \
    using E = detail::expr_of_t<X>;                                                             \
    if constexpr (detail::check_reduce_dtype<detail::reduce_kind::KIND, typename E::value_type>()) \
      return detail::reduce_all<detail::reduce_kind::KIND>(detail::to_expr(x), 0.0);            \
    else                                                                                        \
      return 0;                                                                                 \
  }                                                                                             \
  template <Operand X>                                                                          \
  auto NAME(const X& x, std::size_t axis) {                                                     \
    using E = detail::expr_of_t<X>;                                                             \
    if constexpr (detail::check_reduce_dtype<detail::reduce_kind::KIND, typename E::value_type>()) \
      return detail::reduce_axis<detail::reduce_kind::KIND, false>(detail::to_expr(x), axis, 0.0); \
    else                                                                                        \
      return 0;                                                                                 \
  }                                                                                             \
  template <Operand X>                                                                          \
  auto NAME(const X& x, std::size_t axis, keepdim_t) {                                          \
    using E = detail::expr_of_t<X>;                                                             \
    if constexpr (detail::check_reduce_dtype<detail::reduce_kind::KIND, typename E::value_type>()) \
      return detail::reduce_axis<detail::reduce_kind::KIND, true>(detail::to_expr(x), axis, 0.0); \
    else                                                                                        \
      return 0;                                                                                 \
  }
LOCUS_DETAIL_REDUCTION(sum, sum)
LOCUS_DETAIL_REDUCTION(mean, mean)
LOCUS_DETAIL_REDUCTION(max, max)
LOCUS_DETAIL_REDUCTION(min, min)
LOCUS_DETAIL_REDUCTION(argmax, argmax)
LOCUS_DETAIL_REDUCTION(argmin, argmin)
#undef LOCUS_DETAIL_REDUCTION

/// Bessel's correction for var(): the divisor is max(0, n - correction) (1 by default,
/// like torch.var; correction(0) gives the population variance). NaN, negative or
/// huge corrections are a value_error.
struct correction {
  double value = 1.0;
  explicit correction(double v) : value(v) {
    if (!(v >= 0.0) || !(v <= 9.0e15))
      throw value_error("locus: var correction must be a finite number >= 0, got " + std::to_string(v));
  }
};

/// Variance: two passes (mean, then squared deviations), accumulated in f64 for
/// whole-tensor reductions.
template <Operand X>
auto var(const X& x, correction c = correction(1.0)) {
  using E = detail::expr_of_t<X>;
  if constexpr (detail::check_reduce_dtype<detail::reduce_kind::var, typename E::value_type>())
    return detail::reduce_all<detail::reduce_kind::var>(detail::to_expr(x), c.value);
  else
    return 0;
}
template <Operand X>
auto var(const X& x, std::size_t axis, correction c = correction(1.0)) {
  using E = detail::expr_of_t<X>;
  if constexpr (detail::check_reduce_dtype<detail::reduce_kind::var, typename E::value_type>())
    return detail::reduce_axis<detail::reduce_kind::var, false>(detail::to_expr(x), axis, c.value);
  else
    return 0;
}
template <Operand X>
auto var(const X& x, std::size_t axis, keepdim_t, correction c = correction(1.0)) {
  using E = detail::expr_of_t<X>;
  if constexpr (detail::check_reduce_dtype<detail::reduce_kind::var, typename E::value_type>())
    return detail::reduce_axis<detail::reduce_kind::var, true>(detail::to_expr(x), axis, c.value);
  else
    return 0;
}

}  // namespace locus
