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
// whole-tensor reductions, cub::DeviceSegmentedReduce along the innermost axis (sum,
// mean, max, min; a linear reader for contiguous operands, one thread per row for
// argmax, argmin and var) and a tiled column reduction along every other axis (32
// columns a warp, coalesced; 16 row groups a block; the axis split over blocks when the
// columns are few; partials combined in a fixed order: the same bits every run; the
// axis a compile-time constant, so no stack frame; sums accumulate in f64 per thread).
// The tiled schedule runs on the host too (reduce_axis_tiled, run_tiled_host), which is
// how the CPU suite checks it. f16 and bf16 accumulate in f32; floating sums are
// combined in f64 on every path (host blocks, blocks along an axis, cub), integers are
// reduced in i64 (never through double) and their sums (bool, u8, i32, i64) return i64,
// as PyTorch's do; mean and var need a floating dtype (as PyTorch's mean does). max of all -inf is -inf, min of all +inf is
// +inf. NaN propagates through sum, max and min; argmax and argmin return the first
// extreme, a NaN counting as extreme, on every device.
//
// Length (over 600 lines): the reduction operators, the host block driver, the tiled
// axis schedule and the cub drivers are one family: the host replays the device's
// schedule through the same per-thread pieces, which the CPU suite relies on.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backend/host_simd.hpp"
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

/// The contiguous f32 data a reader reads element by element (a tensor or view that is
/// itself the operand), or nullptr: host_reduce's sums run over such data with the
/// AVX-512 body where the CPU has it (the same bits as the generic block).
template <class F>
struct reads_contiguous_f32 : std::false_type {};
template <class T, std::size_t RO, std::size_t R>
struct reads_contiguous_f32<flat_reader<const leaf_eval<T, RO>, R, true>> : std::is_same<std::remove_cv_t<T>, float> {};
template <class T, std::size_t RO, std::size_t R>
struct reads_contiguous_f32<flat_reader<leaf_eval<T, RO>, R, true>> : std::is_same<std::remove_cv_t<T>, float> {};
template <class F>
const float* contiguous_f32(const F& f) noexcept {
  if constexpr (reads_contiguous_f32<F>::value) return f.ev.p;
  else return nullptr;
}

/// Host reduction of f(0..n) with op; returns the result in Acc (sum: combined in
/// double for floating types).
template <class Op, class Acc, class F>
Acc host_reduce(index_t n, const F& f) {
  // Floating sums accumulate in f64 lanes: an f32 lane that holds a large partial sum
  // swallows the small terms after it (a row with 1e4 and -1e4 among normal(0, 4)
  // values was off by 6e-4, PyTorch's pairwise sum by 2.7e-3); f64 lanes leave only the
  // final rounding. The loads stay f32, so the sum is as memory-bound as before.
  using Wide = std::conditional_t<std::is_same_v<Op, sum_op> && std::is_floating_point_v<Acc>, double, Acc>;
  const index_t blocks = (n + reduce_block - 1) / reduce_block;
  std::vector<Wide> partial(static_cast<std::size_t>(blocks));
  const Op op{};
#if defined(LOCUS_SIMD_AVX512_DISPATCH)
  const float* const contiguous = contiguous_f32(f);
  const bool avx512 = contiguous != nullptr && simd512::available();
#endif
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (blocks > 8)
#endif
  for (index_t blk = 0; blk < blocks; ++blk) {
    const index_t lo = blk * reduce_block;
    const index_t hi = lo + reduce_block < n ? lo + reduce_block : n;
#if defined(LOCUS_SIMD_AVX512_DISPATCH)
    if constexpr (std::is_same_v<Op, sum_op> && std::is_same_v<Acc, float> && std::is_same_v<Wide, double>) {
      static_assert(reduce_lanes == 16, "simd512::sum_block_f64 forms sixteen lanes");
      if (contiguous && avx512) {
        partial[static_cast<std::size_t>(blk)] = simd512::sum_block_f64(contiguous + lo, hi - lo);
        continue;
      }
    }
#endif
    Wide lanes[reduce_lanes];
    for (int l = 0; l < reduce_lanes; ++l) lanes[l] = Op::template identity<Wide>();
    index_t i = lo;
    for (; i + reduce_lanes <= hi; i += reduce_lanes)
      for (int l = 0; l < reduce_lanes; ++l) lanes[l] = op(lanes[l], static_cast<Wide>(static_cast<Acc>(f(i + l))));
    for (; i < hi; ++i) lanes[0] = op(lanes[0], static_cast<Wide>(static_cast<Acc>(f(i))));
    for (int w = reduce_lanes / 2; w > 0; w /= 2)
      for (int l = 0; l < w; ++l) lanes[l] = op(lanes[l], lanes[l + w]);
    partial[static_cast<std::size_t>(blk)] = lanes[0];
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

/// No compile-time axis: the kernel reads `axis` at run time (host code).
inline constexpr std::size_t runtime_axis = static_cast<std::size_t>(-1);

/// Per-output kernel for axis reductions: output o reduces `len` elements along `axis`
/// (StaticAxis: the same axis known at compile time, so that the multi-index stays in
/// registers on cuda instead of a stack frame).
template <reduce_kind K, class T, class Ev, std::size_t R, std::size_t StaticAxis = runtime_axis>
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
  LOCUS_HOST_DEVICE std::size_t ax() const { return StaticAxis == runtime_axis ? axis : StaticAxis; }
  /// The sum along the axis from idx (of squared deviations from mean if Sq), blocked as
  /// whole-tensor sums are: blocks of reduce_block elements, each summed in A with 8
  /// partial sums (accurate and vectorisable), the blocks combined in W (f64 for floating
  /// types), so a long axis does not drift.
  template <bool Sq>
  LOCUS_HOST_DEVICE W blocked_sum(index_t* idx, W mean) const {
    (void)mean;
    W total = W(0);
    for (index_t lo = 0; lo < len; lo += reduce_block) {
      const index_t hi = lo + reduce_block < len ? lo + reduce_block : len;
      W part[8] = {};  // f64 for floating types: see host_reduce
      // Element j goes to part[j & 7] (lo is a multiple of 8): groups of 8 with constant
      // indices, so the partial sums stay in registers (no stack frame on cuda).
      for (index_t j0 = lo; j0 < hi; j0 += 8) {
        for (int l = 0; l < 8; ++l) {
          const index_t j = j0 + l;
          if (j >= hi) break;
          idx[ax()] = j;
          const W v = static_cast<W>(static_cast<A>(ev.at_index(idx)));
          if constexpr (Sq) {
            const W d = v - mean;
            part[l] += d * d;
          } else {
            part[l] = add_wrapping(part[l], v);
          }
        }
      }
      const W block = add_wrapping(add_wrapping(add_wrapping(part[0], part[1]), add_wrapping(part[2], part[3])),
                                   add_wrapping(add_wrapping(part[4], part[5]), add_wrapping(part[6], part[7])));
      total = add_wrapping(total, block);
    }
    return total;
  }
  LOCUS_HOST_DEVICE void operator()(index_t o) const {
    index_t idx[R];
    unravel_except_axis(o, shape, ax(), idx);
    if constexpr (K == reduce_kind::argmax || K == reduce_kind::argmin) {
      arg_pair<A> best{static_cast<A>(ev.at_index(idx)), 0};
      for (index_t j = 1; j < len; ++j) {
        idx[ax()] = j;
        best = arg_op<K == reduce_kind::argmax>{}(best, arg_pair<A>{static_cast<A>(ev.at_index(idx)), j});
      }
      out[o] = best.index;
    } else if constexpr (K == reduce_kind::max || K == reduce_kind::min) {
      using Op = std::conditional_t<K == reduce_kind::max, max_op, min_op>;
      A acc = Op::template identity<A>();
      for (index_t j = 0; j < len; ++j) {
        idx[ax()] = j;
        acc = Op{}(acc, static_cast<A>(ev.at_index(idx)));
      }
      out[o] = store<Out>(acc);
    } else {
      // sum / mean / var (mean and var: floating types, so W is f64)
      const W s = blocked_sum<false>(idx, W(0));
      if constexpr (K == reduce_kind::sum) {
        out[o] = store<Out>(s);
      } else {
        const W mean = len > 0 ? s / static_cast<W>(len) : std::numeric_limits<W>::quiet_NaN();
        if constexpr (K == reduce_kind::mean) {
          out[o] = store<Out>(mean);
        } else {
          const W ss = blocked_sum<true>(idx, mean);
          out[o] = store<Out>(ss / static_cast<W>(var_divisor(len, correction)));
        }
      }
    }
  }
};

// ---- tiled reductions along an axis: one plan, one set of per-thread pieces ------------
//
// A reduction along axis `axis` of a row-major [outer, len, inner] operand (inner > 1:
// not the innermost axis; bias gradients are [1, rows, cols]) is cut, on cuda, into
// blocks of tile_cols x tile_rows threads: threadIdx.x walks 32 neighbouring columns (so
// a warp reads 32 consecutive elements of one row: coalesced), threadIdx.y a row group
// (rows y, y + tile_rows, ...), and blockIdx.y a split of the reduced axis when there
// are too few columns to fill the GPU. Per-thread partials meet in shared memory and are
// combined by thread y = 0 in the order y = 0, 1, ...; splits are combined by a second
// pass in split order. The order depends only on the shape, never on timing: the result
// is the same bits every run. The host drives the same pieces in the same order
// (`*_host_tiled`), which is how the CPU suite checks what the GPU runs.

/// Columns per block (a warp), and the most row groups per block (blockDim.y).
inline constexpr index_t tile_cols = 32;
inline constexpr index_t max_tile_rows = 16;
/// Blocks that fill an H200 twice (132 SMs); fewer blocks than this split the axis.
inline constexpr index_t tile_target_blocks = 264;
/// A split gives each thread at least this many rows (fewer: the second pass costs more).
inline constexpr index_t tile_min_rows_per_thread = 8;

/// How a column reduction of `rows` reduced elements, `cols` columns and `outer`
/// independent problems is cut into blocks.
struct column_tiles {
  index_t tile_rows = 1;       ///< blockDim.y (1..max_tile_rows)
  index_t col_tiles = 0;       ///< blocks across the columns of one outer index
  index_t splits = 1;          ///< gridDim.y: blocks along the reduced axis
  index_t rows_per_split = 1;  ///< a multiple of tile_rows; the last split may be shorter
};

/// The plan of a [outer, rows, cols] column reduction (a pure function of the shape).
inline column_tiles plan_column_tiles(index_t rows, index_t cols, index_t outer = 1) {
  column_tiles p;
  p.tile_rows = rows < max_tile_rows ? (rows > 0 ? rows : 1) : max_tile_rows;
  p.col_tiles = (cols + tile_cols - 1) / tile_cols;
  const index_t blocks = p.col_tiles * (outer > 0 ? outer : 1);
  const index_t by_rows = rows / (p.tile_rows * tile_min_rows_per_thread);  // every split: >= 8 rows a thread
  const index_t by_blocks = blocks > 0 ? (tile_target_blocks + blocks - 1) / blocks : 1;
  index_t splits = by_rows < by_blocks ? by_rows : by_blocks;
  if (splits > 65535) splits = 65535;  // gridDim.y
  if (splits < 1) splits = 1;
  index_t rps = (rows + splits - 1) / splits;
  rps = (rps + p.tile_rows - 1) / p.tile_rows * p.tile_rows;
  if (rps < 1) rps = p.tile_rows;
  p.rows_per_split = rps;
  p.splits = rows > 0 ? (rows + rps - 1) / rps : 1;
  return p;
}

#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
/// A kernel that is a functor's block(): the functor owns its indexing and shared memory.
template <class F>
__global__ void __launch_bounds__(512) block_kernel(F f) {
  f.block();
}
/// Launches F::block on grid x block threads on the current stream.
template <class F>
void launch_blocks(dim3 grid, dim3 block, const F& f) {
  if (grid.x == 0 || grid.y == 0) return;
  check_kernel_image();
  block_kernel<F><<<grid, block, 0, current_stream()>>>(f);
  LOCUS_CUDA_CHECK(cudaGetLastError());
}
#endif

/// Calls f(std::integral_constant<std::size_t, axis>{}): a runtime axis made a
/// compile-time one (device kernels index their multi-index by it, so it stays in
/// registers instead of a stack frame).
template <std::size_t R, class F>
void with_static_axis(std::size_t axis, F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((axis == I ? (f(std::integral_constant<std::size_t, I>{}), 0) : 0), ...);
  }(std::make_index_sequence<R>{});
}

/// The multi-index of (o, j, i) in a row-major [outer, len, inner] view of `shape`
/// around the compile-time axis Axis (o over the axes before it, i over those after).
template <std::size_t Axis, std::size_t R>
LOCUS_HOST_DEVICE inline void unravel_around_axis(index_t o, index_t i, const index_array<R>& shape, index_t* idx) {
  for (std::size_t k = R; k-- > Axis + 1;) {
    idx[k] = i % shape.v[k];
    i /= shape.v[k];
  }
  idx[Axis] = 0;
  for (std::size_t k = Axis; k-- > 0;) {
    idx[k] = o % shape.v[k];
    o /= shape.v[k];
  }
}

/// Reads element j along the axis of the column (o, i): by linear offset when the
/// operand reads linearly (Linear; Axis unused), else through its multi-index, the axis
/// a compile-time constant (device kernels: the index stays in registers) or, with Axis
/// = runtime_axis, the member `axis` (host code: one instance for every axis).
template <class Ev, std::size_t R, std::size_t Axis, bool Linear>
struct column_reader {
  Ev ev;
  index_array<R> shape;
  index_t len, inner;
  std::size_t axis = Axis;
  struct cursor {
    index_t idx[Linear ? 1 : R];
  };
  LOCUS_HOST_DEVICE cursor start(index_t o, index_t i) const {
    cursor c{};
    if constexpr (Linear) {
      c.idx[0] = o * len * inner + i;
    } else if constexpr (Axis == runtime_axis) {
      // axis < R (checked by the caller); said again so that g++ -O3 sees the bounds
      // (it otherwise warns of reads past shape.v: -Wmaybe-uninitialized).
      const std::size_t ax = axis < R ? axis : R - 1;
      for (std::size_t k = R; k-- > ax + 1;) {
        c.idx[k] = i % shape.v[k];
        i /= shape.v[k];
      }
      c.idx[ax] = 0;
      for (std::size_t k = ax; k-- > 0;) {
        c.idx[k] = o % shape.v[k];
        o /= shape.v[k];
      }
    } else {
      unravel_around_axis<Axis>(o, i, shape, c.idx);
    }
    return c;
  }
  LOCUS_HOST_DEVICE auto at(cursor& c, index_t j) const {
    if constexpr (Linear) {
      return ev.at_linear(c.idx[0] + j * inner);
    } else {
      c.idx[Axis == runtime_axis ? axis : Axis] = j;
      return ev.at_index(c.idx);
    }
  }
};

/// The accumulator of a tiled reduction K of dtype T: arg pairs for argmax/argmin, A for
/// max/min (exact), wide_sum_t<A> (f64 for floating types, i64 for integers) for sums.
template <reduce_kind K, class T>
using tiled_acc_t = std::conditional_t<
    K == reduce_kind::argmax || K == reduce_kind::argmin, arg_pair<acc_t<T>>,
    std::conditional_t<K == reduce_kind::max || K == reduce_kind::min, acc_t<T>, wide_sum_t<acc_t<T>>>>;

/// The per-thread, per-block and per-split pieces of a tiled reduction K along an axis
/// (sum, mean, max, min, argmax, argmin; var as a sum of squared deviations from
/// mean[], its second pass). Reader: column_reader.
template <reduce_kind K, class T, class Reader>
struct tiled_axis_reduce {
  using A = acc_t<T>;
  using W = wide_sum_t<A>;
  using Acc = tiled_acc_t<K, T>;
  using Out = reduce_result_t<K, T>;
  static constexpr bool is_arg = K == reduce_kind::argmax || K == reduce_kind::argmin;
  static constexpr bool is_extreme = K == reduce_kind::max || K == reduce_kind::min;
  Reader rd;
  column_tiles plan;
  index_t outer, len, inner;
  Out* out;            // the result [outer, inner]
  Acc* partial;        // [splits, outer * inner] when plan.splits > 1
  W* mean_out;         // var, first pass: the means go here instead of out
  const W* mean_in;    // var, second pass: deviations from these
  double divisor;      // var, second pass: max(0, len - correction)

  LOCUS_HOST_DEVICE static Acc identity() {
    if constexpr (is_arg) return arg_op<K == reduce_kind::argmax>::template identity<A>();
    else if constexpr (K == reduce_kind::max) return max_op::identity<A>();
    else if constexpr (K == reduce_kind::min) return min_op::identity<A>();
    else return W(0);
  }
  LOCUS_HOST_DEVICE static Acc combine(Acc a, Acc b) {
    if constexpr (is_arg) return arg_op<K == reduce_kind::argmax>{}(a, b);
    else if constexpr (K == reduce_kind::max) return max_op{}(a, b);
    else if constexpr (K == reduce_kind::min) return min_op{}(a, b);
    else return add_wrapping(a, b);
  }
  /// Thread (column (o, i), rows j0, j0 + step, ... < j1).
  LOCUS_HOST_DEVICE Acc thread_part(index_t o, index_t i, index_t j0, index_t j1, index_t step) const {
    Acc acc = identity();
    auto c = rd.start(o, i);
    const W m = mean_in ? mean_in[o * inner + i] : W(0);
    (void)m;
    for (index_t j = j0; j < j1; j += step) {
      const A v = static_cast<A>(rd.at(c, j));
      if constexpr (is_arg) {
        acc = combine(acc, arg_pair<A>{v, j});
      } else if constexpr (is_extreme) {
        acc = combine(acc, v);
      } else if constexpr (K == reduce_kind::var) {
        if (mean_in) {
          const W d = static_cast<W>(v) - m;
          acc += d * d;
        } else {
          acc += static_cast<W>(v);
        }
      } else {
        acc = add_wrapping(acc, static_cast<W>(v));
      }
    }
    return acc;
  }
  /// The result of column oi from its combined accumulator.
  LOCUS_HOST_DEVICE void finish(index_t oi, Acc acc) const {
    if constexpr (is_arg) {
      out[oi] = acc.index;
    } else if constexpr (is_extreme || K == reduce_kind::sum) {
      out[oi] = store<Out>(acc);
    } else if constexpr (K == reduce_kind::mean) {
      out[oi] = store<Out>(len > 0 ? acc / static_cast<W>(len) : std::numeric_limits<W>::quiet_NaN());
    } else {  // var
      if (mean_out) mean_out[oi] = len > 0 ? acc / static_cast<W>(len) : std::numeric_limits<W>::quiet_NaN();
      else out[oi] = store<Out>(acc / static_cast<W>(divisor));
    }
  }
  /// Block (bx, split) after its threads: combines their partials in order y = 0, 1, ...
  /// and finishes column oi, or stores its split's partial.
  LOCUS_HOST_DEVICE void block_result(index_t oi, index_t split, Acc v) const {
    if (plan.splits > 1) partial[split * outer * inner + oi] = v;
    else finish(oi, v);
  }
  /// The second pass (one call per column): the splits in order.
  struct combine_splits {
    tiled_axis_reduce k;
    LOCUS_HOST_DEVICE void operator()(index_t oi) const {
      const index_t n = k.outer * k.inner;
      Acc acc = k.partial[oi];
      for (index_t s = 1; s < k.plan.splits; ++s) acc = combine(acc, k.partial[s * n + oi]);
      k.finish(oi, acc);
    }
  };
  /// Column (o, i) of block x's tile and its row range in split s.
  LOCUS_HOST_DEVICE void locate(index_t bx, index_t tx, index_t& o, index_t& i) const {
    o = bx / plan.col_tiles;
    i = (bx % plan.col_tiles) * tile_cols + tx;
  }
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
  __device__ void block() const {
    __shared__ Acc part[max_tile_rows][tile_cols];
    index_t o, i;
    locate(blockIdx.x, threadIdx.x, o, i);
    const index_t s = blockIdx.y;
    const index_t j1 = (s + 1) * plan.rows_per_split < len ? (s + 1) * plan.rows_per_split : len;
    const bool live = i < inner;
    part[threadIdx.y][threadIdx.x] =
        live ? thread_part(o, i, s * plan.rows_per_split + threadIdx.y, j1, plan.tile_rows) : identity();
    __syncthreads();
    if (threadIdx.y == 0 && live) {
      Acc v = part[0][threadIdx.x];
      for (index_t y = 1; y < plan.tile_rows; ++y) v = combine(v, part[y][threadIdx.x]);
      block_result(o * inner + i, s, v);
    }
  }
#endif
};

/// Runs a tiled reduction on the host in the device's order (every block, every
/// thread, the same combinations), for tests: the CPU suite checks what cuda runs.
template <class F>
void run_tiled_host(const F& k) {
  using Acc = typename F::Acc;
  const index_t n = k.outer * k.inner;
  for (index_t s = 0; s < k.plan.splits; ++s) {
    const index_t j1 = (s + 1) * k.plan.rows_per_split < k.len ? (s + 1) * k.plan.rows_per_split : k.len;
    for (index_t bx = 0; bx < k.outer * k.plan.col_tiles; ++bx) {
      for (index_t tx = 0; tx < tile_cols; ++tx) {
        index_t o, i;
        k.locate(bx, tx, o, i);
        if (i >= k.inner) continue;
        Acc v = k.thread_part(o, i, s * k.plan.rows_per_split, j1, k.plan.tile_rows);
        for (index_t y = 1; y < k.plan.tile_rows; ++y)
          v = F::combine(v, k.thread_part(o, i, s * k.plan.rows_per_split + y, j1, k.plan.tile_rows));
        k.block_result(o * k.inner + i, s, v);
      }
    }
  }
  if (k.plan.splits > 1)
    for (index_t oi = 0; oi < n; ++oi) typename F::combine_splits{k}(oi);
}

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
template <reduce_kind K, class T, bool Linear, class Ev, std::size_t R, class Out>
void segmented_axis_reduce(Out* out, const Ev& ev, const index_array<R>& sh, index_t segments, index_t len) {
  using A = acc_t<T>;
  constexpr bool extreme = K == reduce_kind::max || K == reduce_kind::min;
  using W = std::conditional_t<extreme, A, wide_sum_t<A>>;
  using thrust::counting_iterator;
  using thrust::make_transform_iterator;
  using Reader = flat_reader<Ev, R, Linear>;  // Linear: at_linear, no div/mod per element
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

template <std::size_t R>
void check_axis(std::size_t axis, const extents<R>& shape) {
  if (axis >= R)
    throw shape_error("locus: axis " + std::to_string(axis) + " is out of range for a tensor of rank " +
                      std::to_string(R) + " (shape " + shape_string(shape) + ")");
}

/// Scratch memory from device D's allocator, returned at scope exit (stream-ordered on
/// cuda: later work on the stream may reuse it, earlier work has used it).
template <class D>
struct scratch {
  void* p = nullptr;
  explicit scratch(std::size_t bytes) {
    if (bytes > 0) p = allocator_for<D>().allocate(bytes);
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  ~scratch() {
    if (p) allocator_for<D>().deallocate(p);
  }
  template <class U>
  U* as() const {
    return static_cast<U*>(p);
  }
};

/// One pass of a tiled reduction: the blocks, then (split axis) the combination of the
/// splits, on D (host devices: run_tiled_host, the device's order).
template <class D, class F>
void run_tiled_pass(const F& k) {
  if constexpr (D::host_accessible) {
    run_tiled_host(k);
  } else if constexpr (require_kernel_compiler<D>()) {
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
    launch_blocks(dim3(static_cast<unsigned>(k.outer * k.plan.col_tiles), static_cast<unsigned>(k.plan.splits)),
                  dim3(static_cast<unsigned>(tile_cols), static_cast<unsigned>(k.plan.tile_rows)), k);
    if (k.plan.splits > 1) launch_n<D>(k.outer * k.inner, typename F::combine_splits{k});
#endif
  }
}

/// Reduction K along the compile-time axis Axis of ev (shape sh) into out, tiled
/// (cuda's path for every axis but the innermost; the host runs it only in tests).
template <reduce_kind K, class T, class D, std::size_t Axis, bool Linear, class Ev, std::size_t R, class Out>
void tiled_axis_reduce_run(Out* out, const Ev& ev, const index_array<R>& sh, double correction) {
  index_t outer = 1, inner = 1;
  for (std::size_t k = 0; k < Axis; ++k) outer *= sh.v[k];
  for (std::size_t k = Axis + 1; k < R; ++k) inner *= sh.v[k];
  const index_t len = sh.v[Axis];
  const index_t n = outer * inner;
  if (n == 0) return;
  using Rd = column_reader<Ev, R, Axis, Linear>;
  using F = tiled_axis_reduce<K, T, Rd>;
  using Acc = typename F::Acc;
  using W = typename F::W;
  const column_tiles plan = plan_column_tiles(len, inner, outer);
  scratch<D> partial(plan.splits > 1 ? static_cast<std::size_t>(plan.splits * n) * sizeof(Acc) : 0);
  F f{Rd{ev, sh, len, inner}, plan, outer, len, inner, out, partial.template as<Acc>(), nullptr, nullptr,
      var_divisor(len, correction)};
  if constexpr (K == reduce_kind::var) {
    scratch<D> mean(static_cast<std::size_t>(n) * sizeof(W));
    F first = f;
    first.mean_out = mean.template as<W>();
    run_tiled_pass<D>(first);
    f.mean_in = mean.template as<W>();
    run_tiled_pass<D>(f);
  } else {
    run_tiled_pass<D>(f);
  }
}

/// reduce K along `axis` of operand x with the tiled schedule, on x's device (a seam:
/// the CPU suite runs the GPU's order through it; reductions themselves call it on cuda).
template <reduce_kind K, class X>
auto reduce_axis_tiled(const X& x, std::size_t axis, double correction = 1.0) {
  const auto e = to_expr(x);
  using E = decltype(e);
  using T = typename E::value_type;
  using D = typename E::device;
  constexpr std::size_t R = E::rank;
  const auto shape = e.shape();
  check_axis(axis, shape);
  extents<R - 1> oshape{};
  for (std::size_t k = 0, j = 0; k < R; ++k)
    if (k != axis) oshape[j++] = shape[k];
  tensor<reduce_result_t<K, T>, D, R - 1> out(oshape);
  index_array<R> sh{};
  for (std::size_t k = 0; k < R; ++k) sh.v[k] = shape[k];
  const auto ev = e.make_eval(shape);
  const bool linear = e.linear_ok(shape);
  with_static_axis<R>(axis, [&](auto ax) {
    if (linear) tiled_axis_reduce_run<K, T, D, decltype(ax)::value, true>(out.data_handle(), ev, sh, correction);
    else tiled_axis_reduce_run<K, T, D, decltype(ax)::value, false>(out.data_handle(), ev, sh, correction);
  });
  return out;
}

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

/// Whole-tensor reduction of expression e into `result`, an existing rank-0 tensor on
/// its device (no allocation on the host: what a training step's loss uses).
template <reduce_kind K, class E>
void reduce_all_into(const E& e, tensor<reduce_result_t<K, typename E::value_type>, typename E::device, 0>& result,
                     double correction) {
  using T = typename E::value_type;
  using D = typename E::device;
  constexpr std::size_t R = E::rank;
  check_expr_gpus(reduce_name(K), e, result.device_index());
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
}

/// Whole-tensor reduction of expression e into a new rank-0 tensor on its device.
template <reduce_kind K, class E>
auto reduce_all(const E& e, double correction) {
  tensor<reduce_result_t<K, typename E::value_type>, typename E::device, 0> result(extents<0>{});
  reduce_all_into<K>(e, result, correction);
  return result;
}


/// Reduction along one axis; KeepDim chooses rank R or R-1.
template <reduce_kind K, bool KeepDim, class E>
auto reduce_axis_checked(const E& e, std::size_t axis, double correction) {
  using T = typename E::value_type;
  using D = typename E::device;
  using Out = reduce_result_t<K, T>;
  constexpr std::size_t R = E::rank;
  constexpr std::size_t RO = KeepDim ? R : R - 1;
  check_expr_gpus(reduce_name(K), e);
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
  // cuda: every axis but the innermost is a tiled column reduction (warps read rows
  // coalesced, the axis a compile-time constant); the innermost axis is a segmented CUB
  // reduction for sum, mean, max and min (rows read coalesced, linearly when the operand
  // is contiguous) and one thread per row for argmax, argmin and var.
  if constexpr (std::is_same_v<D, cuda>) {
    if (out.numel() == 0) return out;
    const bool linear = e.linear_ok(shape);
    if (axis + 1 < R) {
      with_static_axis<R>(axis, [&](auto ax) {
        if (linear) tiled_axis_reduce_run<K, T, D, decltype(ax)::value, true>(out.data_handle(), ev, sh, correction);
        else tiled_axis_reduce_run<K, T, D, decltype(ax)::value, false>(out.data_handle(), ev, sh, correction);
      });
      return out;
    }
    if constexpr (K == reduce_kind::sum || K == reduce_kind::mean || K == reduce_kind::max ||
                  K == reduce_kind::min) {
      if (len > 0) {
        if (linear) segmented_axis_reduce<K, T, true>(out.data_handle(), ev, sh, out.numel(), len);
        else segmented_axis_reduce<K, T, false>(out.data_handle(), ev, sh, out.numel(), len);
        return out;
      }
    }
    launch_n<D>(out.numel(),
                axis_reduce_kernel<K, T, decltype(ev), R, R - 1>{out.data_handle(), ev, sh, axis, len, correction}, len);
    return out;
  } else
#endif
  {
    launch_n<D>(out.numel(),
                axis_reduce_kernel<K, T, decltype(ev), R>{out.data_handle(), ev, sh, axis, len, correction}, len);
    return out;
  }
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
