// The kernels of training: one functor per operation, called once per index through
// detail::launch_n on every device (the same source runs on the host and the GPU),
// plus the few host-only loops that walk memory in a host-friendly order.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../backend/launch.hpp"
#include "../core/config.hpp"
#include "../ops/math.hpp"
#include "../ops/random.hpp"

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

/// dst[i] = T(src[i]): master weights to compute weights.
template <class S, class T>
struct cast_kernel {
  const S* src;
  T* dst;
  LOCUS_HOST_DEVICE void operator()(index_t i) const { dst[i] = store<T>(load(src[i])); }
};

/// dst[i] = U(lo, hi) from Philox (seed, i, stream): parameter initialisation.
template <class M>
struct uniform_init_kernel {
  M* dst;
  std::uint64_t seed, stream;
  double lo, hi;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const philox_out r = philox4x32(seed, static_cast<std::uint64_t>(i), stream);
    dst[i] = static_cast<M>(::fma(hi - lo, uniform_double(r.v[0], r.v[1]), lo));  // explicit: nvcc would contract, g++ not
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
};

/// The backward pass of a linear layer's epilogue, one thread per output column j:
/// dz[i, j] = gy[i, j] * act'(...) for every row i, and db[j] += sum_i dz[i, j] (in the
/// master dtype M, accumulated in compute_t<T>).
template <class T, class M>
struct bias_act_grad_kernel {
  const T* gy;
  const T* z;
  const T* y;
  T* dz;   // may equal gy's buffer only when kind == none
  M* db;   // nullptr: no bias
  index_t rows, cols;
  act_kind kind;
  LOCUS_HOST_DEVICE void operator()(index_t j) const {
    using C = compute_t<T>;
    C acc(0);
    for (index_t i = 0; i < rows; ++i) {
      const index_t k = i * cols + j;
      C g = load(gy[k]);
      if (kind != act_kind::none) {
        g *= act_derivative(kind, z ? load(z[k]) : C(0), y ? load(y[k]) : C(0));
        dz[k] = store<T>(g);
        acc += load(dz[k]);  // the bias gradient sums what the weights see
      } else {
        acc += g;
      }
    }
    if (db) db[j] = static_cast<M>(static_cast<C>(db[j]) + acc);
  }

  /// The same computation walking rows in order (host caches).
  void run_host() const {
    using C = compute_t<T>;
    constexpr index_t chunk = 1024;
    C acc[chunk];
    for (index_t j0 = 0; j0 < cols; j0 += chunk) {
      const index_t nj = cols - j0 < chunk ? cols - j0 : chunk;
      for (index_t j = 0; j < nj; ++j) acc[j] = C(0);
      for (index_t i = 0; i < rows; ++i) {
        const index_t base = i * cols + j0;
        if (kind != act_kind::none) {
          for (index_t j = 0; j < nj; ++j) {
            const index_t k = base + j;
            const C g = load(gy[k]) * act_derivative(kind, z ? load(z[k]) : C(0), y ? load(y[k]) : C(0));
            dz[k] = store<T>(g);
            acc[j] += load(dz[k]);
          }
        } else {
          for (index_t j = 0; j < nj; ++j) acc[j] += load(gy[base + j]);
        }
      }
      if (db)
        for (index_t j = 0; j < nj; ++j) db[j0 + j] = static_cast<M>(static_cast<C>(db[j0 + j]) + acc[j]);
    }
  }
};

template <class D, class T, class M>
void run_bias_act_grad(const bias_act_grad_kernel<T, M>& k) {
  if constexpr (D::host_accessible) k.run_host();
  else launch_n<D>(k.cols, k);
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

/// Cross-entropy from logits, one thread per row: the loss of row i (label smoothing
/// eps over k classes, in f32 or f64) into row_loss[i], and the gradient of
/// scale * mean loss into gx. A label outside [0, k) records the first offender in
/// bad[0..1] (row, value) and counts the row as zero loss and zero gradient.
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
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const T* row = x + i * k;
    const std::int64_t label = static_cast<std::int64_t>(labels[i]);
    if (label < 0 || label >= k) {
      if (bad) {  // bad[0] = tag + 2 (nonzero) marks the first bad label seen
#if defined(__CUDA_ARCH__)
        if (atomicCAS(reinterpret_cast<unsigned long long*>(bad), 0ull,
                      static_cast<unsigned long long>(tag + 2)) == 0ull) {
          bad[1] = i;
          bad[2] = label;
        }
#else
        std::int64_t expected = 0;
        if (__atomic_compare_exchange_n(bad, &expected, tag + 2, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
          bad[1] = i;
          bad[2] = label;
        }
#endif
      }
      row_loss[i] = A(0);
      if (row_correct) row_correct[i] = A(0);
      if (gx)
        for (index_t j = 0; j < k; ++j) gx[i * k + j] = store<T>(A(0));
      return;
    }
    A mx = static_cast<A>(load(row[0]));
    index_t arg = 0;
    for (index_t j = 1; j < k; ++j) {
      const A v = static_cast<A>(load(row[j]));
      if (v > mx) {
        mx = v;
        arg = j;
      }
    }
    A se(0), sum_z(0);
    for (index_t j = 0; j < k; ++j) {
      const A v = static_cast<A>(load(row[j])) - mx;
      se += m_exp(v);
      sum_z += v;
    }
    const A lse = m_log(se);
    const A zy = static_cast<A>(load(row[label])) - mx;
    const A kk = static_cast<A>(k);
    // -(1 - eps) log p_y - eps / k sum_j log p_j
    row_loss[i] = -(A(1) - eps) * (zy - lse) - eps / kk * (sum_z - kk * lse);
    if (row_correct) row_correct[i] = arg == label ? A(1) : A(0);
    if (gx) {
      const A s = factor * (scale ? static_cast<A>(*scale) : A(1)) / static_cast<A>(n);
      for (index_t j = 0; j < k; ++j) {
        const A p = m_exp(static_cast<A>(load(row[j])) - mx - lse);
        const A target = (j == label ? A(1) - eps : A(0)) + eps / kk;
        gx[i * k + j] = store<T>((p - target) * s);
      }
    }
  }
};

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
      const A s = factor * (scale ? static_cast<A>(*scale) : A(1)) * A(2) / static_cast<A>(count);
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
  if (k.unscale) {
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

/// After the optimizer step: dynamic loss scaling (back off on overflow, grow after
/// `interval` clean steps).
struct scaler_update_kernel {
  step_state* st;
  float growth, backoff;
  float interval;
  LOCUS_HOST_DEVICE void operator()(index_t) const {
    if (st->found_inf) {
      st->scale *= backoff;
      st->growth_tracker = 0.0f;
    } else {
      st->growth_tracker += 1.0f;
      if (st->growth_tracker >= interval) {
        st->scale *= growth;
        st->growth_tracker = 0.0f;
      }
    }
    st->found_inf = 0;
  }
};

/// Scalars the element-wise update reads (computed on the device from step_state, so
/// a skipped step needs no synchronisation).
struct update_scalars {
  int skip;
  int first;           // the first step taken (momentum buffers start from it)
  float bias1, bias2;  // 1 - beta^t
};

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
    out->bias2 = static_cast<float>(1.0 - ::pow(static_cast<double>(beta2), t));
  }
};

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
  /// The update of one element: new p, m and v from p, g, m, v.
  LOCUS_HOST_DEVICE static float update(float pi, float gi, float& mi, float& vi, float lr, float b1, float b2,
                                        float eps, float wd, float bias1, float bias2) {
    pi -= lr * wd * pi;
    mi = b1 * mi + (1.0f - b1) * gi;
    vi = b2 * vi + (1.0f - b2) * gi * gi;
    return pi - lr * (mi / bias1) / (m_sqrt(vi / bias2) + eps);
  }
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    if (sc->skip) return;
    float mi = m[i], vi = v[i];
    const float pi = update(p[i], g[i], mi, vi, lr, beta1, beta2, eps, weight_decay, sc->bias1, sc->bias2);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (pc) pc[i] = store<C>(pi);
  }
};

/// adamw_kernel on the host: scalars read once, restrict pointers, one vectorised
/// OpenMP pass (the same arithmetic, in the same order).
template <class C>
void adamw_host(const adamw_kernel<C>& k, index_t n) {
  if (k.sc->skip) return;
  float* __restrict p = k.p;
  const float* __restrict g = k.g;
  float* __restrict m = k.m;
  float* __restrict v = k.v;
  C* __restrict pc = k.pc;
  const float lr = k.lr, b1 = k.beta1, b2 = k.beta2, eps = k.eps, wd = k.weight_decay;
  const float bias1 = k.sc->bias1, bias2 = k.sc->bias2;
  [[maybe_unused]] const bool parallel = n >= host_parallel_threshold;
  // clang vectorises sqrtf only under -fno-math-errno; asked for simd without it, it
  // warns (-Wpass-failed) in every file that instantiates this, so it is not asked.
#if defined(_OPENMP) && defined(__clang__)
#pragma omp parallel for if (parallel)
#elif defined(_OPENMP)
#pragma omp parallel for simd if (parallel)
#endif
  for (index_t i = 0; i < n; ++i) {
    float mi = m[i], vi = v[i];
    const float pi = adamw_kernel<C>::update(p[i], g[i], mi, vi, lr, b1, b2, eps, wd, bias1, bias2);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if constexpr (!std::is_same_v<C, float>) pc[i] = store<C>(pi);
  }
}

/// SGD with momentum (PyTorch's formulation: buf = mu buf + g (+ dampening), Nesterov
/// uses g + mu buf) and L2 weight decay added to the gradient.
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
      const float b = sc->first ? d : momentum * buf[i] + (1.0f - dampening) * d;
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
