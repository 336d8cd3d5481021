// LSTM and GRU layers over a whole sequence, fused, over ag::var values (PyTorch's
// nn.LSTM and nn.GRU of one layer and one direction, batch_first=False):
//
//   auto [y, h, c] = ag::lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh);
//   auto [y, h]    = ag::gru(x, h0, w_ih, w_hh, b_ih, b_hh);
//   auto r = ag::lstm(x, w_ih, w_hh, b_ih, b_hh);   // a zero initial state (as PyTorch without one)
//
// x [T, B, I] (time first), h0 and c0 [B, H]; PyTorch's weight layout and gate order:
// w_ih [G*H, I], w_hh [G*H, H], b_ih and b_hh [G*H], with the gates (i, f, g, o) for the
// LSTM (G = 4) and (r, z, n) for the GRU (G = 3), so nn.LSTM's weight_ih_l0 ... load as
// they are. y [T, B, H] is every step's h; h (and c) [B, H] the last step's.
//
//   LSTM:  i, f, o = sigmoid(.), g = tanh(.) of x_t w_ih^T + b_ih + h_{t-1} w_hh^T + b_hh
//          c_t = f * c_{t-1} + i * g,   h_t = o * tanh(c_t)
//   GRU:   r, z = sigmoid(.) as above,  n = tanh(x_t w_in^T + b_in + r * (h_{t-1} w_hn^T + b_hn))
//          h_t = (1 - z) * n + z * h_{t-1}
//
// One tape entry for the whole sequence, as cuDNN's RNN: forward is one GEMM of every
// step's input projection ([T*B, I] x [I, G*H]), then per step one GEMM of the
// recurrent projection ([B, H] x [H, G*H]) and one pointwise kernel of the gates (every
// device: launch_n; arithmetic in compute_t<T>). Backward runs the steps in reverse:
// the pointwise kernel of the gates' derivatives and one GEMM for dh_{t-1} per step,
// then three GEMMs over the whole sequence (dW_ih = dG^T X, dX = dG W_ih, dW_hh from
// the recurrent derivatives and the previous hidden states) and the biases' column sums.
// Kept for backward: the activated gates (G*H per row; the GRU also keeps h_{t-1} w_hn^T
// + b_hn), every c_t, and copies of h0 and c0 (so a state that the caller overwrites
// after the forward, nn::lstm's carried state, is safe).
//
// Rules: one tape, one dtype and one device for every argument, and the ranks above
// (compile time: `locus:` first line). At run time an empty sequence or batch, an input
// width other than w_ih's, weights or biases of shapes that do not fit G*H, and a state
// of another shape than [B, H] are shape_errors naming the shapes, before anything is
// recorded.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "ops.hpp"

namespace locus::ag {

/// What ag::lstm gives: every step's hidden state y [T, B, H], and the last step's
/// hidden and cell states [B, H].
template <class T, class D>
struct lstm_result {
  var<T, D, 3> y;
  var<T, D, 2> h, c;
};
/// What ag::gru gives: y [T, B, H] and the last step's hidden state [B, H].
template <class T, class D>
struct gru_result {
  var<T, D, 3> y;
  var<T, D, 2> h;
};

namespace detail {

template <class C>
LOCUS_HOST_DEVICE inline C rnn_sigmoid(C a) {
  return C(1) / (C(1) + ::locus::detail::m_exp(-a));
}

/// One step's LSTM cell for element i of [B, H]: reads the input projection (g, gates in
/// place: pre-activation in, activated out when `keep`), the recurrent projection r
/// (null: zero), c_{t-1} (null: zero); writes c_t, y_t and, at the last step, h_n, c_n.
template <class T>
struct lstm_cell {
  using C = ::locus::detail::compute_t<T>;
  T* g;            // [B, 4H] of this step
  const T* r;      // [B, 4H] or null
  const T* bhh;    // [4H]
  const T* cprev;  // [B, H] or null
  T* c;            // [B, H] c_t
  T* y;            // [B, H] h_t
  T *hn, *cn;      // [B, H] or null (only the last step)
  const T* h0;     // the first step: h0 copied to h0_keep, c_{-1} to c0_keep (null: none)
  T *h0_keep, *c0_keep;
  index_t hidden;
  bool keep;
  LOCUS_HOST_DEVICE void operator()(index_t e) const {
    using ::locus::detail::load;
    using ::locus::detail::store;
    const index_t b = e / hidden, j = e - b * hidden, h4 = 4 * hidden;
    T* gr = g + b * h4;
    C a[4];
    for (int k = 0; k < 4; ++k) {
      const index_t col = k * hidden + j;
      a[k] = load(gr[col]) + load(bhh[col]) + (r ? load(r[b * h4 + col]) : C(0));
    }
    const C ig = rnn_sigmoid(a[0]), fg = rnn_sigmoid(a[1]), gg = ::locus::detail::m_tanh(a[2]),
            og = rnn_sigmoid(a[3]);
    const C cp = cprev ? load(cprev[e]) : C(0);
    const C ct = fg * cp + ig * gg;
    const C ht = og * ::locus::detail::m_tanh(ct);
    if (keep) {
      gr[j] = store<T>(ig);
      gr[hidden + j] = store<T>(fg);
      gr[2 * hidden + j] = store<T>(gg);
      gr[3 * hidden + j] = store<T>(og);
    }
    if (c0_keep) c0_keep[e] = store<T>(cp);
    if (h0_keep) h0_keep[e] = h0 ? h0[e] : store<T>(C(0));
    c[e] = store<T>(ct);
    y[e] = store<T>(ht);
    if (hn) hn[e] = store<T>(ht);
    if (cn) cn[e] = store<T>(ct);
  }
};

/// One step of the LSTM's backward for element i of [B, H]: from dh_t (dh, or at the
/// last step gh; plus gy_t) and dc_t (dc, or gc at the last step), the gates'
/// pre-activation derivatives into dg [B, 4H] and dc_{t-1} into dc.
template <class T>
struct lstm_cell_back {
  using C = ::locus::detail::compute_t<T>;
  const T* gates;  // [B, 4H] activated
  const T *c, *cprev;  // c_t, c_{t-1} [B, H]
  const T* gy;     // [B, H] of this step, or null
  const T *gh, *gc;  // the last step: h_n's and c_n's gradients (null: none); else null
  const T* dh;     // dh_t from the step after (null at the last step)
  T* dc;           // in: dc_t (ignored at the last step); out: dc_{t-1}
  T* dg;           // [B, 4H]
  index_t hidden;
  bool last;
  LOCUS_HOST_DEVICE void operator()(index_t e) const {
    using ::locus::detail::load;
    using ::locus::detail::store;
    const index_t b = e / hidden, j = e - b * hidden, h4 = 4 * hidden;
    const T* gr = gates + b * h4;
    const C ig = load(gr[j]), fg = load(gr[hidden + j]), gg = load(gr[2 * hidden + j]), og = load(gr[3 * hidden + j]);
    C dht = last ? (gh ? load(gh[e]) : C(0)) : load(dh[e]);
    if (gy) dht += load(gy[e]);
    const C dct_in = last ? (gc ? load(gc[e]) : C(0)) : load(dc[e]);
    const C tc = ::locus::detail::m_tanh(load(c[e]));
    const C dct = dct_in + dht * og * (C(1) - tc * tc);
    T* d = dg + b * h4;
    d[j] = store<T>(dct * gg * ig * (C(1) - ig));
    d[hidden + j] = store<T>(dct * load(cprev[e]) * fg * (C(1) - fg));
    d[2 * hidden + j] = store<T>(dct * ig * (C(1) - gg * gg));
    d[3 * hidden + j] = store<T>(dht * tc * og * (C(1) - og));
    dc[e] = store<T>(dct * fg);
  }
};

/// One step's GRU cell for element i of [B, H] (gates r, z, n; see lstm_cell).
template <class T>
struct gru_cell {
  using C = ::locus::detail::compute_t<T>;
  T* g;          // [B, 3H]: pre-activation in; r, z, n out when keep
  const T* r;    // [B, 3H] or null
  const T* bhh;  // [3H]
  const T* hprev;  // [B, H] or null
  T* hnb;        // [B, H]: h_{t-1} w_hn^T + b_hn, kept when keep (else null)
  T* y;          // [B, H]
  T* hn;         // the last step's h, or null
  T* h0_keep;    // the first step: h0 (or zeros) copied here, or null
  index_t hidden;
  bool keep;
  LOCUS_HOST_DEVICE void operator()(index_t e) const {
    using ::locus::detail::load;
    using ::locus::detail::store;
    const index_t b = e / hidden, j = e - b * hidden, h3 = 3 * hidden;
    T* gr = g + b * h3;
    const T* rr = r ? r + b * h3 : nullptr;
    const C rg = rnn_sigmoid(load(gr[j]) + load(bhh[j]) + (rr ? load(rr[j]) : C(0)));
    const C zg = rnn_sigmoid(load(gr[hidden + j]) + load(bhh[hidden + j]) + (rr ? load(rr[hidden + j]) : C(0)));
    const C hh = load(bhh[2 * hidden + j]) + (rr ? load(rr[2 * hidden + j]) : C(0));
    const C ng = ::locus::detail::m_tanh(load(gr[2 * hidden + j]) + rg * hh);
    const C hp = hprev ? load(hprev[e]) : C(0);
    const C ht = (C(1) - zg) * ng + zg * hp;
    if (keep) {
      gr[j] = store<T>(rg);
      gr[hidden + j] = store<T>(zg);
      gr[2 * hidden + j] = store<T>(ng);
      hnb[e] = store<T>(hh);
    }
    if (h0_keep) h0_keep[e] = store<T>(hp);
    y[e] = store<T>(ht);
    if (hn) hn[e] = store<T>(ht);
  }
};

/// One step of the GRU's backward: the input side's derivatives into dg [B, 3H], the
/// recurrent side's into dr [B, 3H], and h_{t-1}'s direct part (dh_t * z) into dh.
template <class T>
struct gru_cell_back {
  using C = ::locus::detail::compute_t<T>;
  const T* gates;  // [B, 3H] r, z, n
  const T* hnb;    // [B, H]
  const T* hprev;  // [B, H] h_{t-1}
  const T* gy;     // [B, H] or null
  const T* gh;     // the last step: h_n's gradient or null
  T* dh;           // in: dh_t (not at the last step); out: dh_t * z
  T *dg, *dr;      // [B, 3H]
  index_t hidden;
  bool last;
  LOCUS_HOST_DEVICE void operator()(index_t e) const {
    using ::locus::detail::load;
    using ::locus::detail::store;
    const index_t b = e / hidden, j = e - b * hidden, h3 = 3 * hidden;
    const T* gr = gates + b * h3;
    const C rg = load(gr[j]), zg = load(gr[hidden + j]), ng = load(gr[2 * hidden + j]);
    C dht = last ? (gh ? load(gh[e]) : C(0)) : load(dh[e]);
    if (gy) dht += load(gy[e]);
    const C hh = load(hnb[e]), hp = load(hprev[e]);
    const C dan = dht * (C(1) - zg) * (C(1) - ng * ng);
    const C dar = dan * hh * rg * (C(1) - rg);
    const C daz = dht * (hp - ng) * zg * (C(1) - zg);
    T* d = dg + b * h3;
    T* q = dr + b * h3;
    d[j] = store<T>(dar);
    d[hidden + j] = store<T>(daz);
    d[2 * hidden + j] = store<T>(dan);
    q[j] = store<T>(dar);
    q[hidden + j] = store<T>(daz);
    q[2 * hidden + j] = store<T>(dan * rg);
    dh[e] = store<T>(dht * zg);
  }
};

/// The node both layers record (G = 4: LSTM, G = 3: GRU).
template <class T, class D, int G>
struct rnn_node final : node<T, D> {
  std::uint32_t x = 0, h0 = 0, c0 = 0, wih = 0, whh = 0, bih = 0, bhh = 0, y = 0, hn = 0, cn = 0;
  bool has_h0 = false, has_c0 = false;
  tensor_view<const T, D, 3> xv, yv;
  tensor_view<const T, D, 2> wihv, whhv;
  tensor<T, D, 1> gates;  // [T*B, G*H] activated
  tensor<T, D, 1> cs;     // LSTM: [(T+1)*B*H], c_{-1} .. c_{T-1}; GRU: [T*B*H] h w_hn^T + b_hn
  tensor<T, D, 1> h0k;    // [B*H] h0 (or zeros)
  tensor<T, D, 1> dg, dr, dh, dc, scratch;

  void backward(tape<T, D>& t) override {
    const index_t steps = xv.shape()[0], batch = xv.shape()[1], in = xv.shape()[2], hidden = whhv.shape()[1];
    const index_t bh = batch * hidden, gh = G * hidden, rows = steps * batch;
    const auto gy = t.template grad_in<3>(y, yv.shape());
    const auto ghn = t.template grad_in<2>(hn, extents<2>{batch, hidden});
    tensor_view<const T, D, 2> gcn;
    if constexpr (G == 4) gcn = t.template grad_in<2>(cn, extents<2>{batch, hidden});
    if (gy.data_handle() == nullptr && ghn.data_handle() == nullptr && gcn.data_handle() == nullptr) return;
    const int gpu = xv.device_index();
    ensure_flat(dg, rows * gh);
    ensure_flat(dh, bh);
    if constexpr (G == 4) ensure_flat(dc, bh);
    else ensure_flat(dr, rows * gh);
    T* dgp = dg.data_handle();
    T* drp = G == 4 ? dgp : dr.data_handle();  // the recurrent side's derivatives (the LSTM's are dg's)
    const bool want_h0 = has_h0 && t.wants_grad(h0);
    for (index_t s = steps; s-- > 0;) {
      const bool last = s == steps - 1;
      const T* gys = gy.data_handle() ? gy.data_handle() + s * bh : nullptr;
      if constexpr (G == 4) {
        ::locus::detail::launch_n<D>(
            bh, lstm_cell_back<T>{gates.data_handle() + s * batch * gh, cs.data_handle() + (s + 1) * bh,
                                  cs.data_handle() + s * bh, gys, last ? ghn.data_handle() : nullptr,
                                  last ? gcn.data_handle() : nullptr, last ? nullptr : dh.data_handle(),
                                  dc.data_handle(), dgp + s * batch * gh, hidden, last});
      } else {
        const T* hp = s == 0 ? h0k.data_handle() : yv.data_handle() + (s - 1) * bh;
        ::locus::detail::launch_n<D>(
            bh, gru_cell_back<T>{gates.data_handle() + s * batch * gh, cs.data_handle() + s * bh, hp, gys,
                                 last ? ghn.data_handle() : nullptr, dh.data_handle(), dgp + s * batch * gh,
                                 drp + s * batch * gh, hidden, last});
      }
      if (s > 0 || want_h0) {  // dh_{t-1} (+)= dR_t W_hh
        const auto dv = with_shape_mut<T, D, 2>(dh.data_handle(), extents<2>{batch, hidden}, gpu);
        const auto drs = with_shape<T, D, 2>(drp + s * batch * gh, extents<2>{batch, gh}, gpu);
        gemm_put(dv, G == 4, drs, whhv, scratch);
      }
    }
    const auto dgv = with_shape<T, D, 2>(dgp, extents<2>{rows, gh}, gpu);
    const auto x2 = with_shape<T, D, 2>(xv.data_handle(), extents<2>{rows, in}, gpu);
    if (want_h0) {
      auto [g, fresh] = t.template grad_out<2>(h0, extents<2>{batch, hidden});
      put(g, fresh, with_shape<T, D, 2>(dh.data_handle(), extents<2>{batch, hidden}, gpu));
    }
    if constexpr (G == 4) {
      if (has_c0 && t.wants_grad(c0)) {
        auto [g, fresh] = t.template grad_out<2>(c0, extents<2>{batch, hidden});
        put(g, fresh, with_shape<T, D, 2>(dc.data_handle(), extents<2>{batch, hidden}, gpu));
      }
    }
    if (t.wants_grad(whh)) {  // sum_t dR_t^T h_{t-1}: h0 (or zeros) for t = 0, y_{t-1} after
      auto [g, fresh] = t.template grad_out<2>(whh, whhv.shape());
      gemm_put(g, fresh, ::locus::transpose(with_shape<T, D, 2>(drp, extents<2>{batch, gh}, gpu)),
               with_shape<T, D, 2>(h0k.data_handle(), extents<2>{batch, hidden}, gpu), scratch);
      if (steps > 1)
        gemm_put(g, false,
                 ::locus::transpose(with_shape<T, D, 2>(drp + batch * gh, extents<2>{rows - batch, gh}, gpu)),
                 with_shape<T, D, 2>(yv.data_handle(), extents<2>{rows - batch, hidden}, gpu), scratch);
    }
    if (t.wants_grad(wih)) {
      auto [g, fresh] = t.template grad_out<2>(wih, wihv.shape());
      gemm_put(g, fresh, ::locus::transpose(dgv), x2, scratch);
    }
    if (t.wants_grad(bih)) {
      auto [g, fresh] = t.template grad_out<1>(bih, extents<1>{gh});
      column_sum<D>(dgp, g.data_handle(), rows, gh, fresh);
    }
    if (t.wants_grad(bhh)) {
      auto [g, fresh] = t.template grad_out<1>(bhh, extents<1>{gh});
      column_sum<D>(drp, g.data_handle(), rows, gh, fresh);
    }
    if (t.wants_grad(x)) {
      auto [g, fresh] = t.template grad_out<3>(x, xv.shape());
      gemm_put(with_shape_mut<T, D, 2>(g.data_handle(), extents<2>{rows, in}, gpu), fresh, dgv, wihv, scratch);
    }
  }
};

template <int G, class T, class D>
void check_rnn_shapes(const char* what, const extents<3>& x, const extents<2>* h0, const extents<2>* c0,
                      const extents<2>& wih, const extents<2>& whh, const extents<1>& bih, const extents<1>& bhh) {
  const auto fail = [&](const std::string& why) {
    std::string shapes = "x " + shape_text(x);
    if (h0) shapes += ", h0 " + shape_text(*h0);
    if (c0) shapes += ", c0 " + shape_text(*c0);
    shapes += ", w_ih " + shape_text(wih) + ", w_hh " + shape_text(whh) + ", b_ih " + shape_text(bih) + ", b_hh " +
              shape_text(bhh);
    const std::string g = std::to_string(G);
    throw shape_error(std::string("locus: ") + what + " of " + shapes + ": " + why + " (x [T, B, I], state [B, H], w_ih [" +
                      g + "H, I], w_hh [" + g + "H, H], biases [" + g + "H])");
  };
  const index_t hidden = whh[1];
  if (hidden < 1) fail("the hidden size (w_hh's second extent) must be at least 1");
  if (hidden > std::numeric_limits<index_t>::max() / G)
    fail("the hidden size " + std::to_string(hidden) + " is too large (" + std::to_string(G) + " x it overflows)");
  if (whh[0] != G * hidden) fail("w_hh must have " + std::to_string(G) + " x its second extent rows");
  if (wih[0] != G * hidden) fail("w_ih must have as many rows as w_hh");
  if (wih[1] != x[2]) fail("the input's features (x's last extent) must equal w_ih's second extent");
  if (bih[0] != G * hidden || bhh[0] != G * hidden) fail("each bias must have " + std::to_string(G * hidden) + " elements");
  if (x[0] < 1) fail("the sequence is empty (T = 0): a recurrent layer needs at least one step");
  if (x[1] < 1) fail("the batch is empty (B = 0)");
  if (x[2] < 1) fail("the input has no features (I = 0)");
  if (h0 && ((*h0)[0] != x[1] || (*h0)[1] != hidden)) fail("h0 must be [B, H]");
  if (c0 && ((*c0)[0] != x[1] || (*c0)[1] != hidden)) fail("c0 must be [B, H]");
}

template <int G, class T, class D>
auto rnn_impl(const char* what, const var<T, D, 3>& x, const var<T, D, 2>* h0, const var<T, D, 2>* c0,
              const var<T, D, 2>& wih, const var<T, D, 2>& whh, const var<T, D, 1>& bih, const var<T, D, 1>& bhh) {
  auto& t = owner(x, wih, what);
  t.check_owned(whh, what);
  t.check_owned(bih, what);
  t.check_owned(bhh, what);
  if (h0) t.check_owned(*h0, what);
  if (c0) t.check_owned(*c0, what);
  const extents<2> h0s = h0 ? h0->shape() : extents<2>{}, c0s = c0 ? c0->shape() : extents<2>{};
  check_rnn_shapes<G, T, D>(what, x.shape(), h0 ? &h0s : nullptr, c0 ? &c0s : nullptr, wih.shape(), whh.shape(),
                            bih.shape(), bhh.shape());
  check_contiguous_value(x, what);
  if (h0) check_contiguous_value(*h0, what);
  if (c0) check_contiguous_value(*c0, what);
  check_contiguous_value(bhh, what);  // the gate kernels read b_hh by index (b_ih goes through the GEMM)
  const index_t steps = x.shape()[0], batch = x.shape()[1], in = x.shape()[2], hidden = whh.shape()[1];
  const index_t bh = batch * hidden, gh = G * hidden, rows = steps * batch;
  const bool rg = x.requires_grad() || wih.requires_grad() || whh.requires_grad() || bih.requires_grad() ||
                  bhh.requires_grad() || (h0 && h0->requires_grad()) || (c0 && c0->requires_grad());
  auto y = t.template result<3>(extents<3>{steps, batch, hidden}, rg);
  auto hn = t.template result<2>(extents<2>{batch, hidden}, rg);
  var<T, D, 2> cn;
  if constexpr (G == 4) cn = t.template result<2>(extents<2>{batch, hidden}, rg);
  rnn_node<T, D, G>* n = rg ? &t.template record<rnn_node<T, D, G>>() : nullptr;
  tensor<T, D, 1> local_gates, local_cs;
  tensor<T, D, 1> local_r;
  try {
    ensure_flat(n ? n->gates : local_gates, rows * gh);
    if constexpr (G == 4) ensure_flat(n ? n->cs : local_cs, n ? (steps + 1) * bh : 2 * bh);
    else if (n) ensure_flat(n->cs, rows * hidden);
    if (n) ensure_flat(n->h0k, bh);
    ensure_flat(n ? n->scratch : local_r, batch * gh);
  } catch (...) {  // nothing of the call stays on the tape
    if (n) t.unrecord();
    t.unresult();
    t.unresult();
    if constexpr (G == 4) t.unresult();
    throw;
  }
  const int gpu = x.value().device_index();
  T* gp = (n ? n->gates : local_gates).data_handle();
  T* rp = (n ? n->scratch : local_r).data_handle();
  const auto gv = with_shape_mut<T, D, 2>(gp, extents<2>{rows, gh}, gpu);
  linear_into(gv, with_shape<T, D, 2>(x.value().data_handle(), extents<2>{rows, in}, gpu), wih.value(), bih.value());
  T* yp = t.writable(y).data_handle();
  T* hnp = t.writable(hn).data_handle();
  T* cnp = nullptr;
  if constexpr (G == 4) cnp = t.writable(cn).data_handle();
  const T* bhhp = bhh.value().data_handle();
  const auto rv = with_shape_mut<T, D, 2>(rp, extents<2>{batch, gh}, gpu);
  for (index_t s = 0; s < steps; ++s) {
    const T* hprev = s == 0 ? (h0 ? h0->value().data_handle() : nullptr) : yp + (s - 1) * bh;
    if (hprev) matmul_into(rv, with_shape<T, D, 2>(hprev, extents<2>{batch, hidden}, gpu), ::locus::transpose(whh.value()));
    const bool last = s == steps - 1;
    if constexpr (G == 4) {
      T* csp = (n ? n->cs : local_cs).data_handle();
      // With a node: cs holds c_{-1} .. c_{T-1} (slot s + 1 is c_s); without: two slots in turn.
      const T* cprev = s == 0 ? (c0 ? c0->value().data_handle() : nullptr) : (n ? csp + s * bh : csp + ((s - 1) % 2) * bh);
      T* cnow = n ? csp + (s + 1) * bh : csp + (s % 2) * bh;
      ::locus::detail::launch_n<D>(
          bh, lstm_cell<T>{gp + s * batch * gh, hprev ? rp : nullptr, bhhp, cprev, cnow, yp + s * bh,
                           last ? hnp : nullptr, last ? cnp : nullptr, s == 0 && n ? (h0 ? h0->value().data_handle() : nullptr) : nullptr,
                           s == 0 && n ? n->h0k.data_handle() : nullptr, s == 0 && n ? csp : nullptr, hidden, n != nullptr});
    } else {
      ::locus::detail::launch_n<D>(
          bh, gru_cell<T>{gp + s * batch * gh, hprev ? rp : nullptr, bhhp, hprev, n ? n->cs.data_handle() + s * bh : nullptr,
                          yp + s * bh, last ? hnp : nullptr, s == 0 && n ? n->h0k.data_handle() : nullptr, hidden,
                          n != nullptr});
    }
  }
  if (n) {
    n->x = access::id(x);
    n->has_h0 = h0 != nullptr;
    n->h0 = h0 ? access::id(*h0) : 0;
    n->has_c0 = c0 != nullptr;
    n->c0 = c0 ? access::id(*c0) : 0;
    n->wih = access::id(wih);
    n->whh = access::id(whh);
    n->bih = access::id(bih);
    n->bhh = access::id(bhh);
    n->y = access::id(y);
    n->hn = access::id(hn);
    if constexpr (G == 4) n->cn = access::id(cn);
    n->xv = x.value();
    n->yv = y.value();
    n->wihv = wih.value();
    n->whhv = whh.value();
  }
  if constexpr (G == 4) return lstm_result<T, D>{y, hn, cn};
  else return gru_result<T, D>{y, hn};
}

template <class... A>
constexpr bool rnn_same_place() {
  using F = std::tuple_element_t<0, std::tuple<A...>>;
  return (... && (is_var_v<A> && std::is_same_v<typename A::value_type, typename F::value_type> &&
                  std::is_same_v<typename A::device, typename F::device>));
}
template <class... A>
constexpr bool rnn_all_vars() {
  return (... && is_var_v<A>);
}

}  // namespace detail

/// An LSTM over x [T, B, I] from the state h0, c0 [B, H] (see the header).
template <class T, class D>
lstm_result<T, D> lstm(const var<T, D, 3>& x, const var<T, D, 2>& h0, const var<T, D, 2>& c0, const var<T, D, 2>& w_ih,
                       const var<T, D, 2>& w_hh, const var<T, D, 1>& b_ih, const var<T, D, 1>& b_hh) {
  return detail::rnn_impl<4>("ag::lstm", x, &h0, &c0, w_ih, w_hh, b_ih, b_hh);
}
/// An LSTM over x [T, B, I] from a zero state.
template <class T, class D>
lstm_result<T, D> lstm(const var<T, D, 3>& x, const var<T, D, 2>& w_ih, const var<T, D, 2>& w_hh,
                       const var<T, D, 1>& b_ih, const var<T, D, 1>& b_hh) {
  return detail::rnn_impl<4>("ag::lstm", x, static_cast<const var<T, D, 2>*>(nullptr),
                             static_cast<const var<T, D, 2>*>(nullptr), w_ih, w_hh, b_ih, b_hh);
}
/// A GRU over x [T, B, I] from the state h0 [B, H] (see the header).
template <class T, class D>
gru_result<T, D> gru(const var<T, D, 3>& x, const var<T, D, 2>& h0, const var<T, D, 2>& w_ih, const var<T, D, 2>& w_hh,
                     const var<T, D, 1>& b_ih, const var<T, D, 1>& b_hh) {
  return detail::rnn_impl<3>("ag::gru", x, &h0, static_cast<const var<T, D, 2>*>(nullptr), w_ih, w_hh, b_ih, b_hh);
}
/// A GRU over x [T, B, I] from a zero state.
template <class T, class D>
gru_result<T, D> gru(const var<T, D, 3>& x, const var<T, D, 2>& w_ih, const var<T, D, 2>& w_hh, const var<T, D, 1>& b_ih,
                     const var<T, D, 1>& b_hh) {
  return detail::rnn_impl<3>("ag::gru", x, static_cast<const var<T, D, 2>*>(nullptr),
                             static_cast<const var<T, D, 2>*>(nullptr), w_ih, w_hh, b_ih, b_hh);
}

// Prevents: arguments of two dtypes or devices, or of the wrong ranks ("no matching
// function" otherwise). One overload per arity; the message says which rule.
#define LOCUS_RNN_GUARD(NAME, N, RANKS, ...)                                                                         \
  template <class... A>                                                                                              \
    requires(sizeof...(A) == N && detail::rnn_all_vars<A...>() &&                                                    \
             !(detail::rnn_same_place<A...>() && detail::rnn_ranks_ok<A...>(RANKS)))               \
  int NAME(const A&...) {                                                                                            \
    if constexpr (!detail::rnn_same_place<A...>())                                                                   \
      static_assert(::locus::detail::always_false<A...>,                                                             \
                    "locus: ag::" #NAME " takes values of one dtype and one device (the input, the state, the "     \
                    "weights and the biases); convert them first, e.g. the weights with nn::param::on(x)");          \
    else                                                                                                             \
      static_assert(::locus::detail::always_false<A...>, "locus: ag::" #NAME " takes " __VA_ARGS__);             \
    return 0;                                                                                                        \
  }

namespace detail {
template <class... A, std::size_t N>
constexpr bool rnn_ranks_ok(const std::size_t (&r)[N]) {
  std::size_t i = 0;
  bool ok = true;
  ((ok = ok && A::rank == r[i++]), ...);
  return ok;
}
inline constexpr std::size_t lstm_ranks7[7] = {3, 2, 2, 2, 2, 1, 1};
inline constexpr std::size_t lstm_ranks5[5] = {3, 2, 2, 1, 1};
inline constexpr std::size_t gru_ranks6[6] = {3, 2, 2, 2, 1, 1};
}  // namespace detail

LOCUS_RNN_GUARD(lstm, 7, detail::lstm_ranks7,
                "x [T, B, I] (rank 3), h0 and c0 [B, H], w_ih [4H, I] and w_hh [4H, H] (rank 2), b_ih and b_hh [4H] "
                "(rank 1); a batch-first input [B, T, I] turns with ag::transpose(x, 0, 1)")
LOCUS_RNN_GUARD(lstm, 5, detail::lstm_ranks5,
                "x [T, B, I] (rank 3), w_ih [4H, I] and w_hh [4H, H] (rank 2), b_ih and b_hh [4H] (rank 1); a "
                "batch-first input [B, T, I] turns with ag::transpose(x, 0, 1)")
LOCUS_RNN_GUARD(gru, 6, detail::gru_ranks6,
                "x [T, B, I] (rank 3), h0 [B, H], w_ih [3H, I] and w_hh [3H, H] (rank 2), b_ih and b_hh [3H] "
                "(rank 1); a batch-first input [B, T, I] turns with ag::transpose(x, 0, 1)")
LOCUS_RNN_GUARD(gru, 5, detail::lstm_ranks5,
                "x [T, B, I] (rank 3), w_ih [3H, I] and w_hh [3H, H] (rank 2), b_ih and b_hh [3H] (rank 1); a "
                "batch-first input [B, T, I] turns with ag::transpose(x, 0, 1)")
#undef LOCUS_RNN_GUARD

// Prevents: another number of values (a forgotten c0, a c0 given to the GRU).
template <class... A>
  requires(detail::rnn_all_vars<A...>() && sizeof...(A) != 7 && sizeof...(A) != 5)
int lstm(const A&...) {
  static_assert(::locus::detail::always_false<A...>,
                "locus: ag::lstm takes 7 values, (x, h0, c0, w_ih, w_hh, b_ih, b_hh), or from a zero state 5, (x, "
                "w_ih, w_hh, b_ih, b_hh); the LSTM's state is h0 and c0 together");
  return 0;
}
template <class... A>
  requires(detail::rnn_all_vars<A...>() && sizeof...(A) != 6 && sizeof...(A) != 5)
int gru(const A&...) {
  static_assert(::locus::detail::always_false<A...>,
                "locus: ag::gru takes 6 values, (x, h0, w_ih, w_hh, b_ih, b_hh), or from a zero state 5, (x, w_ih, "
                "w_hh, b_ih, b_hh); the GRU has no cell state c0");
  return 0;
}

}  // namespace locus::ag
