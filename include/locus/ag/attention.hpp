// Scaled dot-product attention over ag::var values, fused (PyTorch's
// torch.nn.functional.scaled_dot_product_attention):
//
//   auto o = ag::scaled_dot_product_attention(q, k, v, {.causal = true});
//
// q [B, H, Tq, E], k [B, H, Tk, E], v [B, H, Tk, Ev] give o [B, H, Tq, Ev]:
// o = softmax(q k^T * scale + mask) v, row by row, with scale = 1/sqrt(E) unless given,
// and with `causal` query i attending the keys j <= i (PyTorch's is_causal: the mask is
// lower triangular from the top left, also when Tq != Tk).
//
// No T x T matrix exists at any point, for any head: each query row runs an online
// softmax over its keys, a block of keys at a time (running maximum and sum, the output
// row rescaled when the maximum grows; flash attention's forward), and keeps only its
// log-sum-exp. Backward recomputes the probabilities from q, k and that log-sum-exp:
// one pass per query row gives dq, one pass per key row gives dk and dv (no atomics, so
// the same bits on every run), after a pass that forms each row's sum(do * o). The extra
// memory is two numbers per query row (B*H*Tq each): linear in the sequence length.
// One source for every device (launch_n: OpenMP on the host, one thread per row on
// cuda); arithmetic in compute_t<T> (f32 for bf16/f16, f64 for f64).
//
// Rules: the three values on one tape, of one dtype and device (the compile-time rules
// of ag/ops.hpp); at run time B and H equal in all three, k and v of equal length, q and
// k of equal E, E and Ev in [1, 256], and Tk >= 1 (an empty key sequence has no
// softmax): shape_error naming the three shapes, before anything is recorded.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "ops.hpp"

// The kernels' dot products as vector reductions on the host (lane-wise partial sums in a
// fixed order: the same bits on every run of one build); a plain loop on the device.
#if defined(_OPENMP) && !defined(__CUDA_ARCH__)
#  define LOCUS_ATTENTION_PRAGMA(x) _Pragma(#x)
#  define LOCUS_ATTENTION_SUM(v) LOCUS_ATTENTION_PRAGMA(omp simd reduction(+ : v))
#else
#  define LOCUS_ATTENTION_SUM(v)
#endif

namespace locus::ag {

/// Options of scaled_dot_product_attention.
struct attention_options {
  /// Query i attends keys 0..i only (a decoder's mask).
  bool causal = false;
  /// The factor of q k^T; 0 means 1/sqrt(E), PyTorch's default.
  double scale = 0.0;
};

/// The largest head dimension (E and Ev) the fused kernels take.
inline constexpr index_t max_attention_head_dim = 256;

namespace detail {

/// Keys scored together before the running maximum is updated.
inline constexpr index_t attention_key_block = 32;

/// Forward of one query row r (of B*H*Tq): o_r and lse_r.
template <class T>
struct attention_forward_rows {
  using C = ::locus::detail::compute_t<T>;
  const T *q, *k, *v;
  T* o;
  C* lse;  // null: not kept (no gradient wanted)
  index_t tq, tk, e, ev;
  C scale;
  bool causal;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    const index_t bh = r / tq, i = r - bh * tq;
    const T* qr = q + r * e;
    const T* kb = k + bh * tk * e;
    const T* vb = v + bh * tk * ev;
    C acc[max_attention_head_dim];
    C qs[max_attention_head_dim];
    for (index_t d = 0; d < e; ++d) qs[d] = ::locus::detail::load(qr[d]) * scale;
    for (index_t d = 0; d < ev; ++d) acc[d] = C(0);
    const index_t end = causal ? (i + 1 < tk ? i + 1 : tk) : tk;
    C m = -INFINITY, l = C(0);
    bool nan = false;  // a NaN score: the row is NaN (as PyTorch's softmax), not left out
    C s[attention_key_block];
    for (index_t j0 = 0; j0 < end; j0 += attention_key_block) {
      const index_t nb = end - j0 < attention_key_block ? end - j0 : attention_key_block;
      C bm = -INFINITY;
      for (index_t jj = 0; jj < nb; ++jj) {
        const T* kr = kb + (j0 + jj) * e;
        C dot(0);
        LOCUS_ATTENTION_SUM(dot)
        for (index_t d = 0; d < e; ++d) dot += qs[d] * ::locus::detail::load(kr[d]);
        s[jj] = dot;
        bm = dot > bm ? dot : bm;
        nan = nan || dot != dot;
      }
      if (bm > m) {  // the maximum grew: what was summed so far shrinks by exp(m - bm)
        const C c = ::locus::detail::m_exp(m - bm);  // m = -inf: 0
        l *= c;
        for (index_t d = 0; d < ev; ++d) acc[d] *= c;
        m = bm;
      }
      // Every score so far -inf (masked out, or overflowed): the block adds nothing, and
      // exp(-inf - -inf) would be NaN. (A row with no finite score at all ends 0/0 = NaN,
      // as PyTorch's softmax over -inf only.)
      if (m == -INFINITY) continue;
      for (index_t jj = 0; jj < nb; ++jj) {
        const C p = ::locus::detail::m_exp(s[jj] - m);
        l += p;
        const T* vr = vb + (j0 + jj) * ev;
        for (index_t d = 0; d < ev; ++d) acc[d] += p * ::locus::detail::load(vr[d]);
      }
    }
    const C inv = nan ? C(NAN) : C(1) / l;
    T* orow = o + r * ev;
    for (index_t d = 0; d < ev; ++d) orow[d] = ::locus::detail::store<T>(acc[d] * inv);
    if (lse) lse[r] = nan ? C(NAN) : m + ::locus::detail::m_log(l);
  }
};

/// delta_r = sum_d do[r, d] * o[r, d] (each query row's term of the softmax's backward).
template <class T>
struct attention_delta_rows {
  using C = ::locus::detail::compute_t<T>;
  const T *g, *o;
  C* delta;
  index_t ev;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    C s(0);
    LOCUS_ATTENTION_SUM(s)
    for (index_t d = 0; d < ev; ++d) s += ::locus::detail::load(g[r * ev + d]) * ::locus::detail::load(o[r * ev + d]);
    delta[r] = s;
  }
};

/// dq of one query row: scale * sum_j p_ij (do_i . v_j - delta_i) k_j.
template <class T>
struct attention_dq_rows {
  using C = ::locus::detail::compute_t<T>;
  const T *q, *k, *v, *g;
  const C *lse, *delta;
  T* dq;
  index_t tq, tk, e, ev;
  C scale;
  bool causal, overwrite;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    const index_t bh = r / tq, i = r - bh * tq;
    const T* qr = q + r * e;
    const T* gr = g + r * ev;
    const T* kb = k + bh * tk * e;
    const T* vb = v + bh * tk * ev;
    C qs[max_attention_head_dim], gs[max_attention_head_dim], acc[max_attention_head_dim];
    for (index_t d = 0; d < e; ++d) {
      qs[d] = ::locus::detail::load(qr[d]) * scale;
      acc[d] = C(0);
    }
    for (index_t d = 0; d < ev; ++d) gs[d] = ::locus::detail::load(gr[d]);
    const C li = lse[r], di = delta[r];
    const index_t end = causal ? (i + 1 < tk ? i + 1 : tk) : tk;
    for (index_t j = 0; j < end; ++j) {
      const T* kr = kb + j * e;
      const T* vr = vb + j * ev;
      C s(0), dp(0);
      LOCUS_ATTENTION_SUM(s)
      for (index_t d = 0; d < e; ++d) s += qs[d] * ::locus::detail::load(kr[d]);
      LOCUS_ATTENTION_SUM(dp)
      for (index_t d = 0; d < ev; ++d) dp += gs[d] * ::locus::detail::load(vr[d]);
      const C ds = ::locus::detail::m_exp(s - li) * (dp - di);
      for (index_t d = 0; d < e; ++d) acc[d] += ds * ::locus::detail::load(kr[d]);
    }
    T* out = dq + r * e;
    for (index_t d = 0; d < e; ++d) {
      const C val = acc[d] * scale;
      out[d] = ::locus::detail::store<T>(overwrite ? val : ::locus::detail::load(out[d]) + val);
    }
  }
};

/// dk and dv of one key row c (of B*H*Tk): dv_j = sum_i p_ij do_i and
/// dk_j = scale * sum_i p_ij (do_i . v_j - delta_i) q_i, over the queries that see key j.
template <class T>
struct attention_dkv_rows {
  using C = ::locus::detail::compute_t<T>;
  const T *q, *k, *v, *g;
  const C *lse, *delta;
  T *dk, *dv;  // either may be null (no gradient wanted)
  index_t tq, tk, e, ev;
  C scale;
  bool causal, overwrite_k, overwrite_v;
  LOCUS_HOST_DEVICE void operator()(index_t c) const {
    const index_t bh = c / tk, j = c - bh * tk;
    const T* kr = k + c * e;
    const T* vr = v + c * ev;
    const T* qb = q + bh * tq * e;
    const T* gb = g + bh * tq * ev;
    const C* lb = lse + bh * tq;
    const C* db = delta + bh * tq;
    C ks[max_attention_head_dim], vs[max_attention_head_dim], ak[max_attention_head_dim], av[max_attention_head_dim];
    for (index_t d = 0; d < e; ++d) {
      ks[d] = ::locus::detail::load(kr[d]) * scale;
      ak[d] = C(0);
    }
    for (index_t d = 0; d < ev; ++d) {
      vs[d] = ::locus::detail::load(vr[d]);
      av[d] = C(0);
    }
    for (index_t i = causal ? j : 0; i < tq; ++i) {
      const T* qr = qb + i * e;
      const T* gr = gb + i * ev;
      C s(0), dp(0);
      LOCUS_ATTENTION_SUM(s)
      for (index_t d = 0; d < e; ++d) s += ks[d] * ::locus::detail::load(qr[d]);
      LOCUS_ATTENTION_SUM(dp)
      for (index_t d = 0; d < ev; ++d) dp += vs[d] * ::locus::detail::load(gr[d]);
      const C p = ::locus::detail::m_exp(s - lb[i]);
      const C ds = p * (dp - db[i]);
      for (index_t d = 0; d < ev; ++d) av[d] += p * ::locus::detail::load(gr[d]);
      for (index_t d = 0; d < e; ++d) ak[d] += ds * ::locus::detail::load(qr[d]);
    }
    if (dk) {
      T* out = dk + c * e;
      for (index_t d = 0; d < e; ++d) {
        const C val = ak[d] * scale;
        out[d] = ::locus::detail::store<T>(overwrite_k ? val : ::locus::detail::load(out[d]) + val);
      }
    }
    if (dv) {
      T* out = dv + c * ev;
      for (index_t d = 0; d < ev; ++d)
        out[d] = ::locus::detail::store<T>(overwrite_v ? av[d] : ::locus::detail::load(out[d]) + av[d]);
    }
  }
};

template <class T, class D>
struct attention_node final : node<T, D> {
  using C = ::locus::detail::compute_t<T>;
  std::uint32_t q = 0, k = 0, v = 0, out = 0;
  tensor_view<const T, D, 4> qv, kv, vv, ov;
  tensor<C, D, 1> lse, delta;  // B*H*Tq each, kept from step to step
  C scale = C(0);
  bool causal = false;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<4>(out, ov.shape());
    if (g.data_handle() == nullptr) return;
    const bool wq = t.wants_grad(q), wk = t.wants_grad(k), wv = t.wants_grad(v);
    if (!wq && !wk && !wv) return;
    const index_t b = qv.shape()[0], h = qv.shape()[1], tq = qv.shape()[2], e = qv.shape()[3];
    const index_t tk = kv.shape()[2], ev = vv.shape()[3];
    const index_t qrows = b * h * tq, krows = b * h * tk;
    if (qrows == 0 || krows == 0) return;
    ensure_flat(delta, qrows);
    ::locus::detail::launch_n<D>(qrows, attention_delta_rows<T>{g.data_handle(), ov.data_handle(), delta.data_handle(), ev},
                                 ev);
    if (wq) {
      auto [gq, fresh] = t.template grad_out<4>(q, qv.shape());
      ::locus::detail::launch_n<D>(
          qrows,
          attention_dq_rows<T>{qv.data_handle(), kv.data_handle(), vv.data_handle(), g.data_handle(), lse.data_handle(),
                               delta.data_handle(), gq.data_handle(), tq, tk, e, ev, scale, causal, fresh},
          tk * (e + ev));
    }
    if (wk || wv) {
      // One pass for both: thread c writes dk's row c, then dv's row c. When k and v are
      // one value, the second grad_out returns the same buffer to add to (fresh false),
      // and the row's two contributions are added in that order, by the same thread.
      T* dk = nullptr;
      T* dv = nullptr;
      bool fk = false, fv = false;
      if (wk) {
        auto [gk, fresh] = t.template grad_out<4>(k, kv.shape());
        dk = gk.data_handle();
        fk = fresh;
      }
      if (wv) {
        auto [gv, fresh] = t.template grad_out<4>(v, vv.shape());
        dv = gv.data_handle();
        fv = fresh;
      }
      ::locus::detail::launch_n<D>(
          krows,
          attention_dkv_rows<T>{qv.data_handle(), kv.data_handle(), vv.data_handle(), g.data_handle(), lse.data_handle(),
                                delta.data_handle(), dk, dv, tq, tk, e, ev, scale, causal, fk, fv},
          tq * (e + ev));
    }
  }
};

inline void check_attention_shapes(const extents<4>& q, const extents<4>& k, const extents<4>& v) {
  const auto fail = [&](const std::string& why) {
    throw shape_error("locus: ag::scaled_dot_product_attention of q " + shape_text(q) + ", k " + shape_text(k) +
                      " and v " + shape_text(v) + ": " + why +
                      " (q [B, H, Tq, E], k [B, H, Tk, E], v [B, H, Tk, Ev])");
  };
  if (q[0] != k[0] || q[0] != v[0] || q[1] != k[1] || q[1] != v[1])
    fail("the batch and head extents (the first two) must be equal in all three");
  if (k[2] != v[2]) fail("k and v must have the same length (their third extent)");
  if (q[3] != k[3]) fail("q and k must have the same head dimension E (their last extent)");
  if (q[3] < 1 || q[3] > max_attention_head_dim || v[3] < 1 || v[3] > max_attention_head_dim)
    fail("the head dimensions must be in [1, " + std::to_string(max_attention_head_dim) + "]");
  if (k[2] < 1) fail("the key sequence is empty (Tk = 0): a softmax over no keys is undefined");
}

}  // namespace detail

/// softmax(q k^T * scale [+ causal mask]) v, fused (see the file comment): q [B, H, Tq, E],
/// k [B, H, Tk, E], v [B, H, Tk, Ev] give [B, H, Tq, Ev].
template <class T, class D>
var<T, D, 4> scaled_dot_product_attention(const var<T, D, 4>& q, const var<T, D, 4>& k, const var<T, D, 4>& v,
                                          attention_options o = {}) {
  auto& t = detail::owner(q, k, "ag::scaled_dot_product_attention");
  t.check_owned(v, "ag::scaled_dot_product_attention");
  detail::check_contiguous_value(q, "ag::scaled_dot_product_attention");
  detail::check_contiguous_value(k, "ag::scaled_dot_product_attention");
  detail::check_contiguous_value(v, "ag::scaled_dot_product_attention");
  detail::check_attention_shapes(q.shape(), k.shape(), v.shape());
  if (!(o.scale >= 0.0) || !std::isfinite(o.scale))
    throw value_error("locus: ag::scaled_dot_product_attention: scale " + std::to_string(o.scale) +
                      " is not a finite number >= 0 (0 means 1/sqrt(E))");
  using C = ::locus::detail::compute_t<T>;
  const auto qs = q.shape();
  const index_t tq = qs[2], e = qs[3], tk = k.shape()[2], ev = v.shape()[3];
  const C scale = static_cast<C>(o.scale > 0.0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(e)));
  const bool grad = q.requires_grad() || k.requires_grad() || v.requires_grad();
  const index_t rows = qs[0] * qs[1] * tq;
  auto out = t.template result<4>(extents<4>{qs[0], qs[1], tq, ev}, grad);
  // Without a gradient nothing keeps the log-sum-exp: the forward writes none (and an
  // inference step allocates nothing).
  detail::attention_node<T, D>* n = nullptr;
  if (grad) {
    n = &t.template record<detail::attention_node<T, D>>();
    try {
      detail::ensure_flat(n->lse, rows);
    } catch (...) {  // nothing of the call stays on the tape
      t.unrecord();
      t.unresult();
      throw;
    }
  }
  if (rows > 0)
    ::locus::detail::launch_n<D>(
        rows,
        detail::attention_forward_rows<T>{q.value().data_handle(), k.value().data_handle(), v.value().data_handle(),
                                          t.writable(out).data_handle(), n ? n->lse.data_handle() : nullptr, tq, tk, e, ev, scale,
                                          o.causal},
        tk * (e + ev));
  if (n) {
    n->q = detail::access::id(q);
    n->k = detail::access::id(k);
    n->v = detail::access::id(v);
    n->out = detail::access::id(out);
    n->qv = q.value();
    n->kv = k.value();
    n->vv = v.value();
    n->ov = out.value();
    n->scale = scale;
    n->causal = o.causal;
  }
  return out;
}

// Prevents: attention over values of two devices or dtypes ("no matching function").
template <class Q, class K, class V>
  requires(is_var_v<Q> && is_var_v<K> && is_var_v<V> &&
           !(std::is_same_v<typename Q::value_type, typename K::value_type> &&
             std::is_same_v<typename Q::value_type, typename V::value_type> &&
             std::is_same_v<typename Q::device, typename K::device> &&
             std::is_same_v<typename Q::device, typename V::device>))
int scaled_dot_product_attention(const Q&, const K&, const V&, attention_options = {}) {
  if constexpr (detail::check_pair<Q, K>()) (void)detail::check_pair<Q, V>();
  return 0;
}
// Prevents: q, k or v of another rank than 4 ("no matching function").
template <class Q, class K, class V>
  requires(is_var_v<Q> && is_var_v<K> && is_var_v<V> && std::is_same_v<typename Q::value_type, typename K::value_type> &&
           std::is_same_v<typename Q::value_type, typename V::value_type> &&
           std::is_same_v<typename Q::device, typename K::device> &&
           std::is_same_v<typename Q::device, typename V::device> && (Q::rank != 4 || K::rank != 4 || V::rank != 4))
int scaled_dot_product_attention(const Q&, const K&, const V&, attention_options = {}) {
  static_assert(Q::rank == 4 && K::rank == 4 && V::rank == 4,
                "locus: ag::scaled_dot_product_attention takes rank-4 values q [B, H, Tq, E], k [B, H, Tk, E] and "
                "v [B, H, Tk, Ev]; split the heads first: ag::transpose(ag::reshape(x, {B, T, H, E}), 1, 2)");
  return 0;
}

}  // namespace locus::ag

#undef LOCUS_ATTENTION_SUM
#undef LOCUS_ATTENTION_PRAGMA
