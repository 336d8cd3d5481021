// The kernels of training: one functor per operation, called once per index through
// detail::launch_n on every device (the same source runs on the host and the GPU),
// plus the few host-only loops that walk memory in a host-friendly order. The
// reductions of training are shaped for the GPU with the same per-thread pieces on
// every device: the bias gradient is a tiled column reduction on cuda (block() of
// bias_act_grad_kernel; the host walks rows, and run_tiled_host replays the device's
// schedule for tests), cross-entropy a warp or a block per row with an online maximum
// and sum (block() of cross_entropy_kernel; the host a row per call).
//
// Length (over 600 lines): the kernels of training (activations, the bias gradient,
// softmax rows, the losses, the optimizers' updates) are one family: each functor's
// host block and vector forms sit beside the device form they must equal bit for bit,
// which the tests hold them to.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <limits>
#include <vector>

#include "../backend/host_simd.hpp"
#include "../backend/launch.hpp"
#include "../core/config.hpp"
#include "../ops/math.hpp"
#include "../ops/random.hpp"
#include "../ops/softmax.hpp"

#if LOCUS_HAS_CUDA
#include "../backend/cuda/runtime.hpp"
#endif

namespace locus::detail {

/// Zeroes bytes on device D (memset / cudaMemsetAsync: no kernel).
template <class D>
void zero_bytes(void* p, std::size_t bytes) {
  if (bytes == 0) return;
  if constexpr (D::host_accessible) {
    std::memset(p, 0, bytes);
  } else {
#if LOCUS_HAS_CUDA
    LOCUS_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, current_stream()));
#endif
  }
}

/// Sets *p to 1 from many threads at once (every writer writes the same value).
LOCUS_HOST_DEVICE inline void raise_flag(int* p) {
#if defined(__CUDA_ARCH__)
  *static_cast<volatile int*>(p) = 1;
#else
  __atomic_store_n(p, 1, __ATOMIC_RELAXED);
#endif
}

template <class C>
LOCUS_HOST_DEVICE inline bool finite(C v) {
  // v - v is 0 for finite v, NaN for inf and NaN
  return (v - v) == C(0);
}

// Host loops over simd::vecf: in the width's inline namespace (backend/host_simd.hpp).
inline namespace LOCUS_SIMD_NAMESPACE {

/// Whether every g[i] (times inv when scaled) is finite, on the host, over simd::vecf:
/// x - x is +0 for finite x and NaN for infinities and NaN, so a sum of x - x is 0
/// exactly when all are finite; the pass is loads, multiplies and adds only, and
/// vectorises where a comparison-and-or loop does not. With Store, g[i] = g[i] * inv too.
/// OpenMP over blocks when n reaches host_parallel_threshold. With sq, the same pass also
/// leaves *sq = the sum of the (scaled) squares: f32 lanes within a block of 8192, the
/// blocks' sums added in f64 in block order (the same bits at any thread count).
template <bool Store>
bool host_all_finite(index_t n, std::conditional_t<Store, float*, const float*> g, float inv, bool scaled,
                     double* sq = nullptr) {
  constexpr index_t w = simd::width;
  constexpr index_t block = 8192;
  const index_t blocks = (n + block - 1) / block;
  std::vector<double> block_sq(sq ? static_cast<std::size_t>(blocks) : 0);
  double* bs = block_sq.data();
  int bad = 0;
  [[maybe_unused]] const bool parallel = n >= host_parallel_threshold;
#if defined(_OPENMP)
#pragma omp parallel for reduction(| : bad) schedule(static) if (parallel)
#endif
  for (index_t t = 0; t < blocks; ++t) {
    const index_t i0 = t * block, i1 = n - i0 < block ? n : i0 + block;
    simd::vecf acc{}, acc2{};
    index_t i = i0;
    if (bs) {
      for (; i + w <= i1; i += w) {
        simd::vecf x = simd::load(g + i);
        if (scaled) x = x * inv;
        if constexpr (Store) simd::store(g + i, x);
        acc += x - x;
        acc2 += x * x;
      }
    } else {
      for (; i + w <= i1; i += w) {
        simd::vecf x = simd::load(g + i);
        if (scaled) x = x * inv;
        if constexpr (Store) simd::store(g + i, x);
        acc += x - x;
      }
    }
    float sum = 0.0f;
    double sum2 = 0.0;
    for (; i < i1; ++i) {
      const float x = scaled ? g[i] * inv : g[i];
      if constexpr (Store) g[i] = x;
      sum += x - x;
      sum2 += static_cast<double>(x) * x;
    }
    for (int l = 0; l < static_cast<int>(w); ++l) {
      sum += simd::lane(acc, l);
      sum2 += static_cast<double>(simd::lane(acc2, l));
    }
    bad |= !(sum == 0.0f);
    if (bs) bs[t] = sum2;
  }
  if (sq) {
    double total = 0.0;
    for (const double v : block_sq) total += v;
    // f32 squares overflow above about 1.8e19 (and underflow below 1e-23) although the
    // norm is representable: then again, every square in f64 (a rare, serial pass)
    if (bad == 0 && !(total < std::numeric_limits<double>::infinity() && total > 0.0)) {
      total = 0.0;
      for (index_t i = 0; i < n; ++i) {
        const double x = scaled ? static_cast<double>(g[i] * inv) : static_cast<double>(g[i]);
        total += x * x;
      }
    }
    *sq = total;
  }
  return bad == 0;
}

}  // namespace LOCUS_SIMD_NAMESPACE

/// dst[i] = T(src[i]): master weights to compute weights.
template <class S, class T>
struct cast_kernel {
  const S* src;
  T* dst;
  LOCUS_HOST_DEVICE void operator()(index_t i) const { dst[i] = store<T>(load(src[i])); }
};

/// dst[i] = U(lo, hi) from Philox (seed, i, stream): parameter initialisation. The f64
/// draw rounded to M stays in [lo, hi) (as rand's: a draw rounded up to hi takes the
/// largest M below it), decided on the device in the rare case that needs it.
template <class M>
struct uniform_init_kernel {
  M* dst;
  std::uint64_t seed, stream;
  double lo, hi;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const philox_out r = philox4x32(seed, static_cast<std::uint64_t>(i), stream);
    const M v = static_cast<M>(::fma(hi - lo, uniform_double(r.v[0], r.v[1]), lo));  // explicit: nvcc would contract, g++ not
    const double d = static_cast<double>(v);
    dst[i] = d >= hi ? static_cast<M>(largest_below<M>(hi)) : d < lo ? static_cast<M>(smallest_at_least<M>(lo)) : v;
  }
};

/// Which derivative an activation uses, and from which saved tensor.
enum class act_kind { none, relu, gelu, gelu_tanh, tanh, sigmoid };

/// d act(z) / dz, from z (gelu) or from y = act(z) (relu, tanh, sigmoid).
template <class C>
LOCUS_HOST_DEVICE inline C act_derivative(act_kind k, C z, C y) {
  switch (k) {
    case act_kind::relu: return y > C(0) ? C(1) : C(0);
    case act_kind::tanh: return C(1) - y * y;
    case act_kind::sigmoid: return y * (C(1) - y);
    case act_kind::gelu: {
      const C cdf = C(0.5) * m_erfc(z * C(-0.7071067811865476));  // Phi(z), no cancellation for z < 0
      const C pdf = C(0.3989422804014327) * m_exp(C(-0.5) * z * z);
      return cdf + z * pdf;
    }
    case act_kind::gelu_tanh: {
      const C k0 = C(0.7978845608028654), k1 = C(0.044715);
      const C u = k0 * (z + k1 * z * z * z);
      const C t = m_tanh(u);
      return C(0.5) * (C(1) + t) + C(0.5) * z * (C(1) - t * t) * k0 * (C(1) + C(3) * k1 * z * z);
    }
    default: return C(1);
  }
}

template <class C>
LOCUS_HOST_DEVICE inline C act_apply(act_kind k, C z) {
  switch (k) {
    case act_kind::relu: return op::relu{}(z);
    case act_kind::gelu: return op::gelu_erf{}(z);
    case act_kind::gelu_tanh: return op::gelu_tanh{}(z);
    case act_kind::tanh: return m_tanh(z);
    case act_kind::sigmoid: return op::sigmoid{}(z);
    default: return z;
  }
}

/// y[i] = act(x[i])
template <class T>
struct act_forward_kernel {
  const T* x;
  T* y;
  act_kind kind;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    y[i] = store<T>(act_apply(kind, load(x[i])));
  }
  /// The calls [lo, hi) with the kind decided once (launch_n's host blocks).
  LOCUS_HOST_DEVICE void block(index_t lo, index_t hi) const {
    if (kind == act_kind::relu) {
      for (index_t i = lo; i < hi; ++i) y[i] = store<T>(op::relu{}(load(x[i])));
    } else {
      for (index_t i = lo; i < hi; ++i) (*this)(i);
    }
  }
};

/// gx[i] = gy[i] * act'(x[i] or y[i])
template <class T>
struct act_backward_kernel {
  const T* gy;
  const T* z;  // the activation's input (gelu)
  const T* y;  // its output (relu, tanh, sigmoid)
  T* gx;
  act_kind kind;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    using C = compute_t<T>;
    const C zi = z ? load(z[i]) : C(0), yi = y ? load(y[i]) : C(0);
    gx[i] = store<T>(load(gy[i]) * act_derivative(kind, zi, yi));
  }
  /// The calls [lo, hi) with the kind decided once (launch_n's host blocks).
  LOCUS_HOST_DEVICE void block(index_t lo, index_t hi) const {
    using C = compute_t<T>;
    if (kind == act_kind::relu && y != nullptr) {
      index_t i = lo;
#if defined(LOCUS_HOST_LANES8)
      if constexpr (has_lanes8<T>) {  // explicit lanes: the scalar loop below becomes a branch per element
        using L = typename lanes8_of<T>::type;
        const L one = L{} + T(1), zero{};
        for (; i + 8 <= hi; i += 8) {
          L yl, gl;
          load8(yl, y + i);
          load8(gl, gy + i);
          const L r = gl * (yl > T(0) ? one : zero);
          store8(gx + i, r);
        }
      }
#endif
      for (; i < hi; ++i) {
        const C yi = load(y[i]);
        gx[i] = store<T>(load(gy[i]) * (yi > C(0) ? C(1) : C(0)));
      }
    } else {
      for (index_t i = lo; i < hi; ++i) (*this)(i);
    }
  }
};

/// The backward pass of a linear layer's epilogue: dz[i, j] = gy[i, j] * act'(...) for
/// every row i, and db[j] += sum_i dz[i, j] (in the master dtype M, accumulated in
/// compute_t<T>: f32 for f16/bf16/f32). The sum is what the weights see: dz as stored.
/// On cuda a tiled column reduction (plan_column_tiles: 32 columns x up to 16 row groups
/// per block, the rows split over blocks when the columns cannot fill the GPU, partials
/// combined in a fixed order: the same bits every run); on the host a row-order walk.
template <class T, class M>
struct bias_act_grad_kernel {
  using C = compute_t<T>;
  const T* gy;
  const T* z;
  const T* y;
  T* dz;   // may equal gy's buffer only when kind == none
  M* db;   // nullptr: no bias
  index_t rows, cols;
  act_kind kind;
  C* partial = nullptr;  // [splits, cols] (cuda, split rows)
  column_tiles plan{};
  bool overwrite = false;  // db = the sum (the store discarded it), not db += the sum

  /// dz of element k (written when there is an activation) and what the sum adds.
  LOCUS_HOST_DEVICE C element(index_t k) const {
    const C g = load(gy[k]);
    if (kind == act_kind::none) return g;
    const T d = store<T>(g * act_derivative(kind, z ? load(z[k]) : C(0), y ? load(y[k]) : C(0)));
    dz[k] = d;
    return load(d);
  }
  /// One thread's part of column j: rows r0, r0 + step, ... < r1.
  LOCUS_HOST_DEVICE C thread_part(index_t j, index_t r0, index_t r1, index_t step) const {
    C acc(0);
    for (index_t i = r0; i < r1; i += step) acc += element(i * cols + j);
    return acc;
  }
  LOCUS_HOST_DEVICE void finish(index_t j, C v) const {
    if (db) db[j] = static_cast<M>((overwrite ? C(0) : static_cast<C>(db[j])) + v);
  }
  LOCUS_HOST_DEVICE void block_result(index_t j, index_t split, C v) const {
    if (plan.splits > 1) partial[split * cols + j] = v;
    else finish(j, v);
  }
  /// The second pass when the rows are split: the splits of column j in order.
  struct combine_splits {
    bias_act_grad_kernel k;
    LOCUS_HOST_DEVICE void operator()(index_t j) const {
      C v = k.partial[j];
      for (index_t s = 1; s < k.plan.splits; ++s) v += k.partial[s * k.cols + j];
      k.finish(j, v);
    }
  };
  LOCUS_HOST_DEVICE index_t split_end(index_t s) const {
    return (s + 1) * plan.rows_per_split < rows ? (s + 1) * plan.rows_per_split : rows;
  }
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
  __device__ void block() const {
    __shared__ C part[max_tile_rows][tile_cols];
    const index_t j = static_cast<index_t>(blockIdx.x) * tile_cols + threadIdx.x;
    const index_t s = blockIdx.y;
    const bool live = j < cols;
    part[threadIdx.y][threadIdx.x] =
        live ? thread_part(j, s * plan.rows_per_split + threadIdx.y, split_end(s), plan.tile_rows) : C(0);
    if (!db) return;  // dz only: nothing to combine
    __syncthreads();
    if (threadIdx.y == 0 && live) {
      C v = part[0][threadIdx.x];
      for (index_t t = 1; t < plan.tile_rows; ++t) v += part[t][threadIdx.x];
      block_result(j, s, v);
    }
  }
#endif

  /// The device's schedule run on the host, block by block in the same order (tests:
  /// the CPU suite checks what cuda runs). Needs plan set and, for splits, partial.
  void run_tiled_host() const {
    for (index_t s = 0; s < plan.splits; ++s)
      for (index_t j = 0; j < cols; ++j) {
        C v = thread_part(j, s * plan.rows_per_split, split_end(s), plan.tile_rows);
        for (index_t t = 1; t < plan.tile_rows; ++t)
          v += thread_part(j, s * plan.rows_per_split + t, split_end(s), plan.tile_rows);
        if (db) block_result(j, s, v);
      }
    if (db && plan.splits > 1)
      for (index_t j = 0; j < cols; ++j) combine_splits{*this}(j);
  }

  /// The host form: rows in order (host caches), columns in chunks of 1024, chunks of
  /// rows of host_bias_rows in parallel (OpenMP) when the work is large, their sums
  /// combined in chunk order (the result does not depend on the thread count).
  /// element() with the activation a constant, so the host's inner loops vectorise.
  template <act_kind K>
  C element_as(index_t k) const {
    const C g = load(gy[k]);
    if constexpr (K == act_kind::none) {
      return g;
    } else {
      const T d = store<T>(g * act_derivative(K, z ? load(z[k]) : C(0), y ? load(y[k]) : C(0)));
      dz[k] = d;
      return load(d);
    }
  }

  void run_host() const {
    switch (kind) {
      case act_kind::none: return run_host_as<act_kind::none>();
      case act_kind::relu: return run_host_as<act_kind::relu>();
      case act_kind::tanh: return run_host_as<act_kind::tanh>();
      case act_kind::sigmoid: return run_host_as<act_kind::sigmoid>();
      case act_kind::gelu: return run_host_as<act_kind::gelu>();
      case act_kind::gelu_tanh: return run_host_as<act_kind::gelu_tanh>();
    }
  }

  /// Tasks of up to 256 rows x 64 columns: a training batch's few hundred columns give
  /// every thread work (columns split without changing any sum's order; rows in blocks
  /// of 256, whose partial sums are combined in block order: the same bits at any
  /// thread count).
  template <act_kind K>
  void run_host_as() const {
    constexpr index_t chunk = 64;
    constexpr index_t host_bias_rows = 256;
    const index_t col_chunks = (cols + chunk - 1) / chunk;
    const index_t row_chunks = (rows + host_bias_rows - 1) / host_bias_rows;
    const index_t tasks = col_chunks * row_chunks;
    std::vector<C> part(static_cast<std::size_t>(row_chunks > 1 && db ? row_chunks * cols : 0));
    [[maybe_unused]] const bool parallel = rows * cols >= host_parallel_threshold && tasks > 1;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (parallel)
#endif
    for (index_t t = 0; t < tasks; ++t) {
      const index_t rc = t / col_chunks, j0 = (t % col_chunks) * chunk;
      const index_t nj = cols - j0 < chunk ? cols - j0 : chunk;
      const index_t r0 = rc * host_bias_rows, r1 = r0 + host_bias_rows < rows ? r0 + host_bias_rows : rows;
      C acc[chunk];
      for (index_t j = 0; j < nj; ++j) acc[j] = C(0);
      for (index_t i = r0; i < r1; ++i) {
        const index_t base = i * cols + j0;
        for (index_t j = 0; j < nj; ++j) acc[j] += element_as<K>(base + j);
      }
      if (!db) continue;
      if (row_chunks > 1) {
        for (index_t j = 0; j < nj; ++j) part[static_cast<std::size_t>(rc * cols + j0 + j)] = acc[j];
      } else {
        for (index_t j = 0; j < nj; ++j) finish(j0 + j, acc[j]);
      }
    }
    if (db && row_chunks > 1)
      for (index_t j = 0; j < cols; ++j) {
        C v = part[static_cast<std::size_t>(j)];
        for (index_t rc = 1; rc < row_chunks; ++rc) v += part[static_cast<std::size_t>(rc * cols + j)];
        finish(j, v);
      }
  }
};

template <class D, class T, class M>
void run_bias_act_grad(const bias_act_grad_kernel<T, M>& k) {
  if (k.rows <= 0 || k.cols <= 0) return;
  if constexpr (D::host_accessible) {
    k.run_host();
  } else if constexpr (require_kernel_compiler<D>()) {
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
    bias_act_grad_kernel<T, M> t = k;
    t.plan = plan_column_tiles(k.rows, k.cols);
    using C = typename bias_act_grad_kernel<T, M>::C;
    scratch<D> partial(k.db && t.plan.splits > 1 ? static_cast<std::size_t>(t.plan.splits * k.cols) * sizeof(C) : 0);
    t.partial = partial.template as<C>();
    launch_blocks(dim3(static_cast<unsigned>(t.plan.col_tiles), static_cast<unsigned>(t.plan.splits)),
                  dim3(static_cast<unsigned>(tile_cols), static_cast<unsigned>(t.plan.tile_rows)), t);
    if (k.db && t.plan.splits > 1) launch_n<D>(k.cols, typename bias_act_grad_kernel<T, M>::combine_splits{t});
#endif
  }
}

/// Dropout: y = x * mask / (1 - p) with mask[i] = U(seed, i, stream) >= p; the mask is
/// recomputed in backward from the same (seed, stream), so nothing is saved.
template <class T>
struct dropout_kernel {
  const T* x;
  T* y;
  std::uint64_t seed, stream;
  float p;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    using C = compute_t<T>;
    const philox_out r = philox4x32(seed, static_cast<std::uint64_t>(i), stream);
    const bool keep = uniform_float(r.v[0]) >= p;
    y[i] = keep ? store<T>(load(x[i]) * C(1.0f / (1.0f - p))) : store<T>(C(0));
  }
};

/// What one pass over (part of) a row of logits gives cross-entropy: the online maximum
/// and sum of exponentials, the plain sum of the logits (in f64 for f32 and half
/// logits: eps / k * sum_j log p_j would otherwise lose digits to cancellation) and the
/// first maximum's index (NaN counts as the maximum, as locus::argmax's). Partial
/// states merge; merge is commutative bit for bit.
template <class A>
struct ce_row_state {
  using W = std::conditional_t<std::is_same_v<A, float>, double, A>;
  online_softmax<A> os;
  W sum;
  arg_pair<A> best;
  LOCUS_HOST_DEVICE static ce_row_state start() {
    return {online_softmax<A>::start(), W(0), arg_op<true>::template identity<A>()};
  }
  LOCUS_HOST_DEVICE void add(A v, index_t j) {
    os.add(v);
    sum += static_cast<W>(v);
    best = arg_op<true>{}(best, arg_pair<A>{v, j});
  }
  LOCUS_HOST_DEVICE static ce_row_state merge(const ce_row_state& a, const ce_row_state& b) {
    return {online_softmax<A>::merge(a.os, b.os), a.sum + b.sum, arg_op<true>{}(a.best, b.best)};
  }
};

#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
template <class A>
__device__ inline ce_row_state<A> warp_merge(ce_row_state<A> st) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    ce_row_state<A> o;
    o.os.m = __shfl_xor_sync(0xffffffffu, st.os.m, off);
    o.os.s = __shfl_xor_sync(0xffffffffu, st.os.s, off);
    o.sum = __shfl_xor_sync(0xffffffffu, st.sum, off);
    o.best.value = __shfl_xor_sync(0xffffffffu, st.best.value, off);
    o.best.index = __shfl_xor_sync(0xffffffffu, static_cast<long long>(st.best.index), off);
    st = ce_row_state<A>::merge(st, o);
  }
  return st;
}
#endif

/// Cross-entropy from logits, per row: the loss of row i (label smoothing eps over k
/// classes, in f32 or f64) into row_loss[i], and the gradient of scale * mean loss into
/// gx: one online pass over the row, one pass that writes the gradient. A label outside
/// [0, k) records the first offender in bad[0..2] (tag + 2, row, value) and counts the
/// row as zero loss and zero gradient. The host runs a row per call (operator()); cuda
/// runs a warp per row (k <= row_warp_max) or a block of row_block_threads per row.
/// A row holding NaN, +inf, or only -inf has a NaN loss and NaN gradients.
template <class T, class L, class A>
struct cross_entropy_kernel {
  const T* x;  // [n, k]
  const L* labels;
  T* gx;       // nullptr: forward only
  A* row_loss;
  A* row_correct;  // nullptr: no accuracy
  std::int64_t* bad;
  const float* scale;  // nullptr: 1
  index_t n, k;
  A eps;
  A factor;  // the gradient is of factor * scale * mean loss (1 / micro-batches)
  std::int64_t tag = -1;  // which batch this is (the trainer's micro-step), -1 unknown
  row_mode mode = row_mode::warp_rows;
  using state = ce_row_state<A>;

  LOCUS_HOST_DEVICE std::int64_t label_of(index_t i) const { return static_cast<std::int64_t>(labels[i]); }
  LOCUS_HOST_DEVICE bool label_ok(std::int64_t label) const { return label >= 0 && label < k; }
  /// Records the first bad label (one thread per row calls it).
  LOCUS_HOST_DEVICE void note_bad(index_t i, std::int64_t label) const {
    row_loss[i] = A(0);
    if (row_correct) row_correct[i] = A(0);
    if (!bad) return;  // bad[0] = tag + 2 (nonzero) marks the first bad label seen
#if defined(__CUDA_ARCH__)
    if (atomicCAS(reinterpret_cast<unsigned long long*>(bad), 0ull, static_cast<unsigned long long>(tag + 2)) == 0ull) {
      bad[1] = i;
      bad[2] = label;
    }
#else
    std::int64_t expected = 0;
    if (__atomic_compare_exchange_n(bad, &expected, tag + 2, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      bad[1] = i;
      bad[2] = label;
    }
#endif
  }
  LOCUS_HOST_DEVICE state part(index_t i, index_t j0, index_t step) const {
    const T* row = x + i * k;
    state st = state::start();
    for (index_t j = j0; j < k; j += step) st.add(static_cast<A>(load(row[j])), j);
    return st;
  }
  /// The state of a whole row in two passes (the host's form: the maximum, then the sum
  /// of exponentials in f64 for f32 and half logits; one long online sum would rescale at
  /// every new maximum, an ulp each time).
  LOCUS_HOST_DEVICE state whole(index_t i) const {
    using W = typename state::W;
    const T* row = x + i * k;
    state st = state::start();
    for (index_t j = 0; j < k; ++j) {
      const A v = static_cast<A>(load(row[j]));
      st.os.m = op::maximum{}(st.os.m, v);  // NaN propagates
      st.sum += static_cast<W>(v);
      st.best = arg_op<true>{}(st.best, arg_pair<A>{v, j});
    }
    W s(0);
    for (index_t j = 0; j < k; ++j) s += static_cast<W>(m_exp(static_cast<A>(load(row[j])) - st.os.m));
    st.os.s = static_cast<A>(s);
    return st;
  }
  /// The row's loss and accuracy (one thread per row), formed in f64 for f32 logits (the
  /// smoothing term sums k log-probabilities: k * 3e38 does not fit a float).
  LOCUS_HOST_DEVICE void finish_row(index_t i, std::int64_t label, const state& st) const {
    using W = typename state::W;
    const W m = st.os.m, log_s = m_log(static_cast<W>(st.os.sum()));
    const W zy = static_cast<W>(static_cast<A>(load(x[i * k + label]))) - m;
    const W kk = static_cast<W>(k), e = static_cast<W>(eps);
    const W sum_z = st.sum - kk * m;
    // -(1 - eps) log p_y - eps / k sum_j log p_j, log p_j = z_j - log s
    // (without smoothing the second term is absent, not 0 * (-inf) = NaN for a -inf logit)
    const W nll = -(W(1) - e) * (zy - log_s);
    row_loss[i] = static_cast<A>(eps > A(0) ? nll - e / kk * (sum_z - kk * log_s) : nll);
    if (row_correct) row_correct[i] = st.best.index == label ? A(1) : A(0);
  }
  /// The gradient of row i at j0, j0 + step, ... (zeros for a bad label).
  LOCUS_HOST_DEVICE void write_grad(index_t i, std::int64_t label, bool ok, const state& st, index_t j0,
                                    index_t step) const {
    if (!gx) return;
    T* g = gx + i * k;
    if (!ok) {
      for (index_t j = j0; j < k; j += step) g[j] = store<T>(A(0));
      return;
    }
    const A s = factor * (scale ? static_cast<A>(*scale) : A(1)) / static_cast<A>(n);
    const A m = st.os.m, log_s = m_log(st.os.sum());
    const A kk = static_cast<A>(k);
    const T* row = x + i * k;
    for (index_t j = j0; j < k; j += step) {
      const A p = m_exp((static_cast<A>(load(row[j])) - m) - log_s);
      const A target = (j == label ? A(1) - eps : A(0)) + eps / kk;
      g[j] = store<T>((p - target) * s);
    }
  }
  /// Host: row i, whole.
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const std::int64_t label = label_of(i);
    if (!label_ok(label)) {
      note_bad(i, label);
      write_grad(i, label, false, state::start(), 0, 1);
      return;
    }
    const state st = whole(i);
    finish_row(i, label, st);
    write_grad(i, label, true, st, 0, 1);
  }
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
  __device__ void block() const {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const bool per_warp = mode == row_mode::warp_rows;
    const index_t i = per_warp ? static_cast<index_t>(blockIdx.x) * rows_per_warp_block + warp : blockIdx.x;
    if (i >= n) return;  // whole warps (warp rows) or the whole block (block rows)
    const index_t j0 = per_warp ? lane : threadIdx.x, step = per_warp ? 32 : blockDim.x;
    const std::int64_t label = label_of(i);
    const bool ok = label_ok(label);
    if (!ok) {
      if (j0 == 0) note_bad(i, label);
      write_grad(i, label, false, state::start(), j0, step);
      return;
    }
    state st = warp_merge(part(i, j0, step));
    if (!per_warp) {
      __shared__ A sm[32], ss[32], bv[32];
      __shared__ typename state::W sx[32];
      __shared__ index_t bi[32];
      if (lane == 0) {
        sm[warp] = st.os.m;
        ss[warp] = st.os.s;
        sx[warp] = st.sum;
        bv[warp] = st.best.value;
        bi[warp] = st.best.index;
      }
      __syncthreads();
      st = state{{sm[0], ss[0]}, sx[0], {bv[0], bi[0]}};
      for (unsigned w = 1; w < blockDim.x / 32; ++w) st = state::merge(st, state{{sm[w], ss[w]}, sx[w], {bv[w], bi[w]}});
    }
    if (j0 == 0) finish_row(i, label, st);
    write_grad(i, label, true, st, j0, step);
  }
#endif
};

/// Runs cross_entropy_kernel on D: a row per call on the host, warps or blocks per row
/// on cuda.
template <class D, class T, class L, class A>
void run_cross_entropy(cross_entropy_kernel<T, L, A> f) {
  if (f.n <= 0) return;
  if constexpr (D::host_accessible) {
    launch_n<D>(f.n, f, f.k);
  } else if constexpr (require_kernel_compiler<D>()) {
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
    f.mode = choose_row_mode(f.k, 1);
    if (f.mode == row_mode::warp_rows)
      launch_blocks(dim3(static_cast<unsigned>((f.n + rows_per_warp_block - 1) / rows_per_warp_block)),
                    dim3(static_cast<unsigned>(32 * rows_per_warp_block)), f);
    else
      launch_blocks(dim3(static_cast<unsigned>(f.n)), dim3(static_cast<unsigned>(row_block_threads)), f);
#endif
  }
}

/// Mean squared error, one thread per element: d2[i] = (x - t)^2 and the gradient of
/// scale * mean into gx.
template <class T, class A>
struct mse_kernel {
  const T* x;
  const T* t;
  T* gx;
  A* d2;
  const float* scale;
  index_t count;
  A factor;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const A d = static_cast<A>(load(x[i])) - static_cast<A>(load(t[i]));
    d2[i] = d * d;
    if (gx) {
      // / count before * 2: the same bits (* 2 is exact), and no overflow at a loss scale
      // above half the largest float (the grad scaler grows it up to 2^127)
      const A s = factor * (scale ? static_cast<A>(*scale) : A(1)) / static_cast<A>(count) * A(2);
      gx[i] = store<T>(d * s);
    }
  }
};

/// *acc += *v * w (one thread): running metrics stay on the device.
template <class A>
struct accumulate_scalar_kernel {
  A* acc;
  const A* v;
  A w;
  std::int64_t* first_nonfinite = nullptr;  // when given and still -1: gets `tag` if *v is not finite
  std::int64_t tag = 0;
  LOCUS_HOST_DEVICE void operator()(index_t) const {
    const A x = *v;
    *acc += x * w;
    if (first_nonfinite && *first_nonfinite < 0 && !(x - x == A(0))) *first_nonfinite = tag;  // inf, NaN
  }
};

// ---- gradient checks, loss scaling and optimizer updates ----------------------------------

/// The device-side state shared by the non-finite check, the grad scaler and the
/// optimizers (a few floats and ints in one allocation):
struct step_state {
  float scale;           ///< loss scale (1 without a scaler)
  float growth_tracker;  ///< clean steps since the last change of scale
  int found_inf;         ///< this step saw a non-finite gradient
  int sticky;            ///< a non-finite gradient was seen (fp32 guard): stop
  std::int64_t bad_step;  ///< the micro-step counter when sticky was first set
  std::int64_t steps;     ///< optimizer steps taken (bias correction)
  std::int64_t skipped;   ///< optimizer steps skipped
};

/// Before the check: found_inf = 0 unless the guard is already tripped.
struct check_begin_kernel {
  step_state* st;
  LOCUS_HOST_DEVICE void operator()(index_t) const {
    if (!st->sticky) st->found_inf = 0;
  }
};

/// One pass over all gradients: g *= 1/scale (when unscale), and any non-finite value
/// raises found_inf and marks its parameter in param_bad (offsets: parameter starts,
/// count + 1 entries). Skipped entirely once the guard is tripped.
template <class M>
struct check_grads_kernel {
  M* g;
  step_state* st;
  const index_t* offsets;
  int* param_bad;
  int count;
  bool unscale;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    if (st->sticky) return;
    M v = g[i];
    if (unscale) {
      v *= M(1) / static_cast<M>(st->scale);
      g[i] = v;
    }
    if (!finite(v)) {
      raise_flag(&st->found_inf);
      if (param_bad) {
        int p = 0;
        while (p + 1 < count && offsets[p + 1] <= i) ++p;
        raise_flag(&param_bad[p]);
      }
    }
  }
};

/// check_grads_kernel on the host: the scalars read once, a vectorised pass that only
/// detects, and the per-element kernel again only when something was non-finite.
template <class M>
void check_grads_host(const check_grads_kernel<M>& k, index_t n) {
  if (k.st->sticky) return;
  M* __restrict g = k.g;
  const M inv = M(1) / static_cast<M>(k.st->scale);
  int bad = 0;
  [[maybe_unused]] const bool parallel = n >= host_parallel_threshold;
  if constexpr (std::is_same_v<M, float>) {
    bad = k.unscale ? !host_all_finite<true>(n, g, inv, true) : !host_all_finite<false>(n, g, 1.0f, false);
  } else if (k.unscale) {
#if defined(_OPENMP)
#pragma omp parallel for simd reduction(| : bad) if (parallel)
#endif
    for (index_t i = 0; i < n; ++i) {
      const M v = g[i] * inv;
      g[i] = v;
      bad |= !finite(v);
    }
  } else {
#if defined(_OPENMP)
#pragma omp parallel for simd reduction(| : bad) if (parallel)
#endif
    for (index_t i = 0; i < n; ++i) bad |= !finite(g[i]);
  }
  if (!bad) return;
  check_grads_kernel<M> again = k;
  again.unscale = false;  // already divided
  for (index_t i = 0; i < n; ++i) again(i);
}

template <class D, class M>
void run_check_grads(const check_grads_kernel<M>& k, index_t n) {
  if constexpr (D::host_accessible) check_grads_host(k, n);
  else launch_n<D>(n, k);
}

/// After the check, for the non-finite guard (no scaler): trips it on the first bad step.
struct guard_end_kernel {
  step_state* st;
  std::int64_t micro_step;            // the last micro-step of this optimizer step
  std::int64_t* window_first = nullptr;  // where to note its first micro-step
  std::int64_t first_micro_step = 0;
  LOCUS_HOST_DEVICE void operator()(index_t) const {
    if (st->found_inf && !st->sticky) {
      st->sticky = 1;
      st->bad_step = micro_step;
      if (window_first) *window_first = first_micro_step;
    }
  }
};

/// The smallest scale dynamic loss scaling backs off to: f32's smallest normal value,
/// 2^-126, whose reciprocal (the unscale factor) is finite.
LOCUS_HOST_DEVICE constexpr float min_loss_scale() noexcept { return 1.17549435082228750797e-38f; }

/// The scale and growth tracker after a step: PyTorch's _amp_update_scale_, kept finite.
/// On overflow the scale backs off and the tracker restarts; after `interval` clean
/// steps in a row the scale grows and the tracker restarts. As PyTorch's, the scale
/// grows only to a finite value (an inf scale makes every later gradient inf: every
/// step would be skipped, and the checkpoint refused). Unlike PyTorch's, it backs off no
/// lower than min_loss_scale(): PyTorch's reaches 0 after about 140 overflows in a row
/// from 2^16, and then 1 / scale is inf and every later step is skipped. Every form of
/// the update (scaler_update_kernel, the fused optimizer step's last()) calls this.
struct loss_scale_state {
  float scale, tracker;
};
LOCUS_HOST_DEVICE inline loss_scale_state next_loss_scale(float scale, float tracker, bool found_inf, float growth,
                                                          float backoff, float interval) noexcept {
  if (found_inf) {
    const float s = scale * backoff;
    return {s >= min_loss_scale() ? s : scale, 0.0f};
  }
  const float t = tracker + 1.0f;
  if (t >= interval) {
    const float s = scale * growth;
    return {finite(s) ? s : scale, 0.0f};
  }
  return {scale, t};
}

/// After the optimizer step: dynamic loss scaling (back off on overflow, grow after
/// `interval` clean steps; next_loss_scale).
struct scaler_update_kernel {
  step_state* st;
  float growth, backoff;
  float interval;
  LOCUS_HOST_DEVICE void operator()(index_t) const {
    const loss_scale_state n =
        next_loss_scale(st->scale, st->growth_tracker, st->found_inf != 0, growth, backoff, interval);
    st->scale = n.scale;
    st->growth_tracker = n.tracker;
    st->found_inf = 0;
  }
};

/// Scalars the element-wise update reads (computed on the device from step_state, so
/// a skipped step needs no synchronisation).
struct update_scalars {
  int skip;
  int first;           // the first step taken (momentum buffers start from it)
  float bias1;         // 1 - beta1^t
  float rsqrt_bias2;   // 1 / sqrt(1 - beta2^t), rounded once from double
};

/// 1 / sqrt(1 - beta2^t) in double, rounded to f32: what AdamW's denominator scales
/// sqrt(v) by (one multiplication per element instead of a division inside the root).
LOCUS_HOST_DEVICE inline float adam_rsqrt_bias2(double beta2, double t) {
  return static_cast<float>(1.0 / ::sqrt(1.0 - ::pow(beta2, t)));
}

/// One thread: skip or count the step, and AdamW's bias corrections for it.
struct update_begin_kernel {
  step_state* st;  // nullptr: never skip
  std::int64_t* steps;
  update_scalars* out;
  float beta1, beta2;
  LOCUS_HOST_DEVICE void operator()(index_t) const {
    const bool skip = st && (st->found_inf || st->sticky);
    out->skip = skip ? 1 : 0;
    if (skip) {
      if (st) st->skipped += 1;
      return;
    }
    *steps += 1;
    out->first = *steps == 1 ? 1 : 0;
    const double t = static_cast<double>(*steps);
    out->bias1 = static_cast<float>(1.0 - ::pow(static_cast<double>(beta1), t));
    out->rsqrt_bias2 = adam_rsqrt_bias2(static_cast<double>(beta2), t);
  }
};

/// g limited to [-c, c] when c > 0 (clip_grad_value; c = 0: g unchanged), as
/// torch.clamp: NaN stays NaN and -0.0 stays -0.0. simd::clamp_abs is the vector form,
/// with the same comparisons, so every path gives the same bits.
LOCUS_HOST_DEVICE inline float clamp_abs_if(float g, float c) {
  if (!(c > 0)) return g;
  g = g > c ? c : g;
  return g < -c ? -c : g;
}

/// x, or +0 where x is subnormal (|x| < FLT_MIN, not 0): the optimizers' moments. A
/// moment whose gradient stays 0 decays by beta each step into the subnormal range and
/// then stays at the smallest subnormal for good (0.9 * 2^-149 rounds back to 2^-149),
/// and every step's arithmetic on it costs a microcode assist on x86: the main job's
/// epochs slowed 20-25% by the third epoch (AdamW's pass doubled). Flushed, such a moment
/// is 0, and the update it gives is the same for every weight that is not itself
/// subnormal (step * 2^-149 / (sqrt(v) + eps) is below half an ulp of any normal
/// weight). NaN and infinities pass. simd::flush_subnormal is the vector form.
LOCUS_HOST_DEVICE inline float flush_subnormal(float x) {
  constexpr float tiny = 1.17549435e-38f;  // FLT_MIN
  return x < tiny && x > -tiny ? 0.0f : x;
}

/// AdamW (decoupled weight decay, Loshchilov & Hutter), one fused pass per element:
/// reads p, g, m, v, writes p, m, v and the compute copy of p.
template <class C>
struct adamw_kernel {
  float* p;
  const float* g;
  float* m;
  float* v;
  C* pc;  // compute copy (nullptr when the compute dtype is f32)
  const update_scalars* sc;
  float lr, beta1, beta2, eps, weight_decay;
  /// The update of one element: new p, m and v from p, g, m, v. PyTorch's form of the
  /// bias correction (step lr / bias1, denominator sqrt(v) / sqrt(bias2) + eps) with the
  /// second factor precomputed as a reciprocal: one square root and one division per
  /// element, which bound the host loop's speed (they, not the memory traffic, are its
  /// cost when the optimizer state sits in the last-level cache).
  LOCUS_HOST_DEVICE static float update(float pi, float gi, float& mi, float& vi, float lr, float b1, float b2,
                                        float eps, float wd, float bias1, float rsqrt_bias2) {
    const float step = lr / bias1;
    pi -= lr * wd * pi;
    mi = flush_subnormal(b1 * mi + (1.0f - b1) * gi);  // (flush_subnormal: why)
    vi = flush_subnormal(b2 * vi + (1.0f - b2) * gi * gi);
    return pi - step * mi / (m_sqrt(vi) * rsqrt_bias2 + eps);
  }
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    if (sc->skip) return;
    float mi = m[i], vi = v[i];
    const float pi = update(p[i], g[i], mi, vi, lr, beta1, beta2, eps, weight_decay, sc->bias1, sc->rsqrt_bias2);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (pc) pc[i] = store<C>(pi);
  }
};

inline namespace LOCUS_SIMD_NAMESPACE {  // every width's loops are its own functions

/// Elements [i0, n) of adamw_host_n through the scalar update (the vector loops' tail).
template <class C>
void adamw_host_tail(index_t i0, index_t n, float* __restrict p, const float* __restrict g, float* __restrict m,
                     float* __restrict v, C* __restrict pc, float inv, bool scaled, float clip, float lr, float b1, float b2,
                     float eps, float wd, float bias1, float rsqrt_bias2) {
  for (index_t i = i0; i < n; ++i) {
    const float gi = clamp_abs_if(scaled ? g[i] * inv : g[i], clip);
    float mi = m[i], vi = v[i];
    const float pi = adamw_kernel<C>::update(p[i], gi, mi, vi, lr, b1, b2, eps, wd, bias1, rsqrt_bias2);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if constexpr (!std::is_same_v<C, float>) pc[i] = store<C>(pi);
    else if (pc) pc[i] = pi;
  }
}

#if LOCUS_SIMD_AVX512_DISPATCH
/// Vectors [c0, c1) of adamw_host_n's loop over AVX-512F vectors (simd512): the same
/// lines as adamw_host_n_base with 16 lanes, compiled for AVX-512F without FMA
/// contraction. No OpenMP inside (clang's outlined regions drop the target attribute).
template <class C>
LOCUS_TARGET_AVX512 void adamw_avx512_range(index_t c0, index_t c1, float* __restrict p, const float* __restrict g,
                                            float* __restrict m, float* __restrict v, C* __restrict pc, float inv,
                                            bool scaled, float clip, float lr, float b1, float b2, float eps, float wd,
                                            float step, float rsqrt_bias2) {
  LOCUS_NO_CONTRACT
  namespace s5 = simd512;
  constexpr index_t w = s5::width;
  for (index_t c = c0; c < c1; ++c) {
    const index_t i = c * w;
    s5::vecf gi = s5::load(g + i);
    if (scaled) gi = gi * inv;
    if (clip > 0) gi = s5::clamp_abs(gi, clip);
    s5::vecf pi = s5::load(p + i), mi = s5::load(m + i), vi = s5::load(v + i);
    pi -= lr * wd * pi;
    mi = s5::flush_subnormal(b1 * mi + (1.0f - b1) * gi);
    vi = s5::flush_subnormal(b2 * vi + (1.0f - b2) * gi * gi);
    pi = pi - step * mi / (s5::sqrt(vi) * rsqrt_bias2 + eps);
    s5::store(m + i, mi);
    s5::store(v + i, vi);
    s5::store(p + i, pi);
    if constexpr (std::is_same_v<C, float>) {
      if (pc) s5::store(pc + i, pi);
    }
  }
}

/// adamw_host_n through AVX-512F: blocks of 1024 vectors (64 KiB of each array) over the
/// OpenMP threads, then the scalar tail. A bf16 or f16 compute copy is written by the
/// caller's code right after each block (still in cache): GCC 12 at -O3 miscompiles the
/// narrowing loop inside the AVX-512F function (wrong moments when the gradient is
/// scaled).
template <class C>
void adamw_host_n_avx512(index_t n, float* __restrict p, const float* __restrict g, float* __restrict m,
                         float* __restrict v, C* __restrict pc, float inv, bool scaled, float clip, float lr, float b1, float b2,
                         float eps, float wd, float bias1, float rsqrt_bias2) {
  constexpr index_t w = simd512::width, block = 1024;
  const float step = lr / bias1;
  const index_t chunks = n / w;
  const index_t blocks = (chunks + block - 1) / block;
  [[maybe_unused]] const bool parallel = n >= host_parallel_threshold && blocks > 1;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (index_t b = 0; b < blocks; ++b) {
    const index_t c1 = b * block + block < chunks ? b * block + block : chunks;
    adamw_avx512_range<C>(b * block, c1, p, g, m, v, pc, inv, scaled, clip, lr, b1, b2, eps, wd, step, rsqrt_bias2);
    if constexpr (!std::is_same_v<C, float>)
      for (index_t i = b * block * w; i < c1 * w; ++i) pc[i] = store<C>(p[i]);
  }
  adamw_host_tail<C>(chunks * w, n, p, g, m, v, pc, inv, scaled, clip, lr, b1, b2, eps, wd, bias1, rsqrt_bias2);
}
#endif

/// adamw_host_n over the compiled width (simd::vecf), whatever the CPU also has.
template <class C>
void adamw_host_n_base(index_t n, float* __restrict p, const float* __restrict g, float* __restrict m,
                       float* __restrict v, C* __restrict pc, float inv, bool scaled, float clip, float lr, float b1, float b2,
                       float eps, float wd, float bias1, float rsqrt_bias2) {
  constexpr index_t w = simd::width;
  const float step = lr / bias1;  // the scalar update's first line, once
  const index_t chunks = n / w;
  [[maybe_unused]] const bool parallel = n >= host_parallel_threshold;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (index_t c = 0; c < chunks; ++c) {
    const index_t i = c * w;
    simd::vecf gi = simd::load(g + i);
    if (scaled) gi = gi * inv;
    if (clip > 0) gi = simd::clamp_abs(gi, clip);
    simd::vecf pi = simd::load(p + i), mi = simd::load(m + i), vi = simd::load(v + i);
    pi -= lr * wd * pi;
    mi = simd::flush_subnormal(b1 * mi + (1.0f - b1) * gi);
    vi = simd::flush_subnormal(b2 * vi + (1.0f - b2) * gi * gi);
    pi = pi - step * mi / (simd::sqrt(vi) * rsqrt_bias2 + eps);
    simd::store(m + i, mi);
    simd::store(v + i, vi);
    simd::store(p + i, pi);
    if constexpr (!std::is_same_v<C, float>) {
      for (index_t l = 0; l < w; ++l) pc[i + l] = store<C>(p[i + l]);
    } else if (pc) {
      simd::store(pc + i, pi);
    }
  }
  adamw_host_tail<C>(chunks * w, n, p, g, m, v, pc, inv, scaled, clip, lr, b1, b2, eps, wd, bias1, rsqrt_bias2);
}

/// AdamW over n elements on the host, with g scaled by inv first when scaled (the fused
/// step's unscale) and then limited to [-clip, clip] when clip > 0 (clip_grad_value):
/// adamw_kernel::update's arithmetic, written over simd::vecf (std::sqrt
/// would keep the compiler from vectorising the loop, see backend/host_simd.hpp) in one
/// OpenMP pass, over AVX-512F vectors when the file was compiled for less and the CPU
/// has them (its square roots and divisions, not memory, bound this loop); the last
/// elements through the scalar update. Every element gets the bits the scalar update
/// gives it, on either path.
template <class C>
void adamw_host_n(index_t n, float* __restrict p, const float* __restrict g, float* __restrict m,
                  float* __restrict v, C* __restrict pc, float inv, bool scaled, float clip, float lr, float b1, float b2,
                  float eps, float wd, float bias1, float rsqrt_bias2) {
#if LOCUS_SIMD_AVX512_DISPATCH
  if (simd512::available())
    return adamw_host_n_avx512<C>(n, p, g, m, v, pc, inv, scaled, clip, lr, b1, b2, eps, wd, bias1, rsqrt_bias2);
#endif
  adamw_host_n_base<C>(n, p, g, m, v, pc, inv, scaled, clip, lr, b1, b2, eps, wd, bias1, rsqrt_bias2);
}

}  // namespace LOCUS_SIMD_NAMESPACE

/// adamw_kernel on the host: scalars read once, one vectorised pass (adamw_host_n).
template <class C>
void adamw_host(const adamw_kernel<C>& k, index_t n) {
  if (k.sc->skip) return;
  adamw_host_n<C>(n, k.p, k.g, k.m, k.v, k.pc, 1.0f, false, 0.0f, k.lr, k.beta1, k.beta2, k.eps, k.weight_decay,
                  k.sc->bias1, k.sc->rsqrt_bias2);
}

/// SGD with momentum (PyTorch's formulation: buf = mu buf + g (+ dampening), Nesterov
/// uses g + mu buf) and L2 weight decay added to the gradient. The buffer is flushed
/// when subnormal (flush_subnormal).
template <class C>
struct sgd_kernel {
  float* p;
  const float* g;
  float* buf;  // nullptr without momentum
  C* pc;
  const update_scalars* sc;
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    if (sc->skip) return;
    float d = g[i] + weight_decay * p[i];
    if (buf) {
      const float b = flush_subnormal(sc->first ? d : momentum * buf[i] + (1.0f - dampening) * d);
      buf[i] = b;
      d = nesterov ? d + momentum * b : b;
    }
    const float pi = p[i] - lr * d;
    p[i] = pi;
    if (pc) pc[i] = store<C>(pi);
  }
};

}  // namespace locus::detail

namespace locus::detail {

template <class D, class C>
void run_adamw(const adamw_kernel<C>& k, index_t n) {
  if constexpr (D::host_accessible) {
    if constexpr (std::is_same_v<C, float>) {
      if (k.pc == nullptr) return adamw_host(k, n);
    } else {
      return adamw_host(k, n);
    }
  }
  launch_n<D>(n, k);
}

}  // namespace locus::detail
