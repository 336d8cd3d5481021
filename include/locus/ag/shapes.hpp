// Differentiable layout operations and softmax over ag::var values, the family of
// ag/ops.hpp that moves elements rather than computing them (ag/ops.hpp includes this
// header; either may be included first):
//
//   ag::transpose(x)              the last two axes exchanged (any two: transpose(x, 0, 2))
//   ag::slice(x, axis, b, e)      elements [b, e) along `axis` (PyTorch's x.narrow)
//   ag::concat(axis, a, b, ...)   along `axis`; ag::concat(axis, span) for a run-time count
//   ag::softmax(x)                along the last axis (stable: max-shifted)
//   ag::gather_rows(table, ids)   table[ids] for integer ids of any rank (an embedding's
//                                 lookup): [V, E] and ids [B, T] give [B, T, E]
//
// Each result is a contiguous value of its own (one copy); each backward writes or adds
// its inputs' gradients through strided views of them, so no operation here keeps more
// than its output. The rules are those of ag/ops.hpp: two devices or dtypes in one call
// do not compile (`locus:` first line); an axis outside the rank, a slice outside the
// extent, concatenated shapes that differ off the axis, and ids outside [0, V) are
// shape_error / value_error naming what was given, before anything is recorded.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops.hpp"

namespace locus::ag {

namespace detail {
template <std::size_t R>
extents<R> swapped(extents<R> s, std::size_t a, std::size_t b) noexcept {
  const index_t k = s[a];
  s[a] = s[b];
  s[b] = k;
  return s;
}

/// v's elements with axes a and b exchanged (a strided view: no copy).
template <class E, class D, std::size_t R>
tensor_view<E, D, R> swap_axes(const tensor_view<E, D, R>& v, std::size_t a, std::size_t b) noexcept {
  return {::locus::detail::raw_view_key{}, v.data_handle(), swapped(v.shape(), a, b), swapped(v.strides(), a, b),
          v.device_index()};
}

/// Elements [begin, begin + len) of v along `axis` (a strided view: no copy).
template <class E, class D, std::size_t R>
tensor_view<E, D, R> narrow(const tensor_view<E, D, R>& v, std::size_t axis, index_t begin, index_t len) noexcept {
  extents<R> s = v.shape();
  s[axis] = len;
  E* p = len == 0 ? v.data_handle() : v.data_handle() + begin * v.strides()[axis];
  return {::locus::detail::raw_view_key{}, p, s, v.strides(), v.device_index()};
}

template <std::size_t R>
void check_axis(std::size_t axis, const char* what) {
  if (axis >= R)
    throw shape_error(std::string("locus: ") + what + " of axis " + std::to_string(axis) + " of a rank-" +
                      std::to_string(R) + " value; axes are 0 to " + std::to_string(R - 1));
}

template <class T, class D, std::size_t R>
void fill_zero(const tensor_view<T, D, R>& v) {
  ::locus::detail::launch_n<D>(v.numel(),
                               ::locus::detail::fill_value<T>{v.data_handle(), ::locus::detail::scalar_cast<T>(0.0)});
}

// ---- transpose ---------------------------------------------------------------------------
template <class T, class D, std::size_t R>
struct transpose_node final : node<T, D> {
  std::uint32_t x = 0, out = 0;
  extents<R> in{};
  std::size_t a = 0, b = 0;
  void backward(tape<T, D>& t) override {
    const auto os = swapped(in, a, b);
    const auto g = t.template grad_in<R>(out, os);
    if (g.data_handle() == nullptr || !t.wants_grad(x)) return;
    auto [gx, fresh] = t.template grad_out<R>(x, in);
    put(swap_axes(gx, a, b), fresh, g);  // gx seen in the output's order
  }
};

// ---- slice -------------------------------------------------------------------------------
template <class T, class D, std::size_t R>
struct slice_node final : node<T, D> {
  std::uint32_t x = 0, out = 0;
  extents<R> in{};
  std::size_t axis = 0;
  index_t begin = 0, len = 0;
  void backward(tape<T, D>& t) override {
    extents<R> os = in;
    os[axis] = len;
    const auto g = t.template grad_in<R>(out, os);
    if (g.data_handle() == nullptr || !t.wants_grad(x)) return;
    auto [gx, fresh] = t.template grad_out<R>(x, in);
    if (fresh) fill_zero(gx);  // what lies outside the slice gets no gradient
    narrow(gx, axis, begin, len) += g;
  }
};

// ---- concat ------------------------------------------------------------------------------
template <class T, class D, std::size_t R>
struct concat_node final : node<T, D> {
  std::vector<std::uint32_t> ids;
  std::vector<index_t> lens;
  std::uint32_t out = 0;
  extents<R> os{};
  std::size_t axis = 0;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<R>(out, os);
    if (g.data_handle() == nullptr) return;
    index_t off = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (t.wants_grad(ids[i])) {
        extents<R> s = os;
        s[axis] = lens[i];
        auto [gx, fresh] = t.template grad_out<R>(ids[i], s);
        put(gx, fresh, narrow(g, axis, off, lens[i]));
      }
      off += lens[i];
    }
  }
};

template <class T, class D, std::size_t R>
var<T, D, R> concat_impl(std::span<const var<T, D, R>> xs, std::size_t axis) {
  if (xs.empty()) throw shape_error("locus: ag::concat of no values; give it at least one");
  auto& t = owner(xs[0], "ag::concat");
  check_axis<R>(axis, "ag::concat");
  extents<R> os = xs[0].shape();
  os[axis] = 0;
  bool rg = false;
  for (const auto& x : xs) {
    t.check_owned(x, "ag::concat");
    for (std::size_t a = 0; a < R; ++a)
      if (a != axis && x.shape()[a] != xs[0].shape()[a])
        throw shape_error("locus: ag::concat along axis " + std::to_string(axis) + " of values of shapes " +
                          shape_text(xs[0].shape()) + " and " + shape_text(x.shape()) +
                          ": every other axis must match; nothing was recorded");
    if (__builtin_add_overflow(os[axis], x.shape()[axis], &os[axis]))
      throw shape_error("locus: ag::concat: the extents along the axis overflow 64-bit indices");
    rg = rg || x.requires_grad();
  }
  auto out = t.template result<R>(os, rg);
  const auto o = t.writable(out);
  index_t off = 0;
  for (const auto& x : xs) {
    const index_t len = x.shape()[axis];
    if (x.numel() > 0) assign_expr(narrow(o, axis, off, len), ::locus::detail::to_expr(x.value()));
    off += len;
  }
  if (rg) {
    auto& n = t.template record<concat_node<T, D, R>>();
    n.ids.clear();
    n.lens.clear();
    for (const auto& x : xs) {
      n.ids.push_back(access::id(x));
      n.lens.push_back(x.shape()[axis]);
    }
    n.out = access::id(out);
    n.os = os;
    n.axis = axis;
  }
  return out;
}

// ---- softmax -----------------------------------------------------------------------------
/// Row r of y = softmax(x) over `cols` columns (max-shifted, in compute_t<T>).
template <class T>
struct softmax_rows {
  const T* x;
  T* y;
  index_t cols;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    using C = ::locus::detail::compute_t<T>;
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    C m, s;
    row_max_sum(xr, cols, m, s);
    const C inv = C(1) / s;
    for (index_t j = 0; j < cols; ++j)
      yr[j] = ::locus::detail::store<T>(::locus::detail::m_exp(::locus::detail::load(xr[j]) - m) * inv);
  }
};
/// Row r of gx (= or +=) y * (g - sum(g * y)) (softmax's backward).
template <class T>
struct softmax_back_rows {
  const T* g;
  const T* y;
  T* gx;
  index_t cols;
  bool overwrite;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    using C = ::locus::detail::compute_t<T>;
    const T* gr = g + r * cols;
    const T* yr = y + r * cols;
    T* out = gx + r * cols;
    C s(0);
    for (index_t j = 0; j < cols; ++j) s += ::locus::detail::load(gr[j]) * ::locus::detail::load(yr[j]);
    for (index_t j = 0; j < cols; ++j) {
      const C v = ::locus::detail::load(yr[j]) * (::locus::detail::load(gr[j]) - s);
      out[j] = ::locus::detail::store<T>(overwrite ? v : ::locus::detail::load(out[j]) + v);
    }
  }
};

template <class T, class D, std::size_t R>
struct softmax_node final : node<T, D> {
  std::uint32_t x = 0, out = 0;
  tensor_view<const T, D, R> yv;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<R>(out, yv.shape());
    if (g.data_handle() == nullptr || !t.wants_grad(x)) return;
    auto [gx, fresh] = t.template grad_out<R>(x, yv.shape());
    const index_t cols = yv.shape()[R - 1];
    if (cols == 0) return;
    ::locus::detail::launch_n<D>(yv.numel() / cols,
                                 softmax_back_rows<T>{g.data_handle(), yv.data_handle(), gx.data_handle(), cols, fresh},
                                 cols);
  }
};

// ---- gather_rows -------------------------------------------------------------------------
template <class T, class I>
struct gather_rows_kernel {
  const T* table;
  const I* ids;
  T* out;
  index_t cols;
  LOCUS_HOST_DEVICE void operator()(index_t k) const {
    const index_t i = k / cols, j = k - i * cols;
    out[k] = table[static_cast<index_t>(ids[i]) * cols + j];
  }
};
/// Column j of the table's gradient: the rows' contributions added in the order of the
/// ids (the same bits on every run and device; no atomics).
template <class T, class I>
struct scatter_rows_column {
  const T* g;
  const I* ids;
  T* gt;
  index_t n, cols;
  LOCUS_HOST_DEVICE void operator()(index_t j) const {
    for (index_t i = 0; i < n; ++i) {
      T* d = gt + static_cast<index_t>(ids[i]) * cols + j;
      *d = ::locus::detail::store<T>(::locus::detail::load(*d) + ::locus::detail::load(g[i * cols + j]));
    }
  }
};

template <class T, class D, class I, std::size_t K>
struct gather_rows_node final : node<T, D> {
  std::uint32_t table = 0, out = 0;
  extents<2> ts{};
  extents<K> is{};
  index_t count = 0;
  // The ids as the forward checked them: a copy, so that ids changed or refilled before
  // backward (a loader's next batch in the same buffer) cannot send a row out of range.
  tensor<I, D, 1> ids;
  void backward(tape<T, D>& t) override {
    extents<K + 1> os{};
    for (std::size_t a = 0; a < K; ++a) os[a] = is[a];
    os[K] = ts[1];
    const auto g = t.template grad_in<K + 1>(out, os);
    if (g.data_handle() == nullptr || !t.wants_grad(table)) return;
    auto [gt, fresh] = t.template grad_out<2>(table, ts);
    if (fresh) fill_zero(gt);
    const index_t n = count, cols = ts[1];
    if (n == 0 || cols == 0) return;
    if constexpr (D::host_accessible) {
      // row by row, in the order of the ids: contiguous reads and writes
      const T* gp = g.data_handle();
      T* tp = gt.data_handle();
      const I* ip = ids.data_handle();
      using C = ::locus::detail::compute_t<T>;
      for (index_t i = 0; i < n; ++i) {
        T* d = tp + static_cast<index_t>(ip[i]) * cols;
        const T* s = gp + i * cols;
        for (index_t j = 0; j < cols; ++j)
          d[j] = ::locus::detail::store<T>(::locus::detail::load(d[j]) + static_cast<C>(::locus::detail::load(s[j])));
      }
    } else {
      ::locus::detail::launch_n<D>(cols, scatter_rows_column<T, I>{g.data_handle(), ids.data_handle(), gt.data_handle(),
                                                                   n, cols},
                                   n);
    }
  }
};

/// The first id outside [0, rows) and its position (flat), if any (on cuda the ids are
/// copied to the host for it: one device-to-host copy, which waits).
struct bad_id {
  index_t position = -1;
  long long id = 0;
};
template <class I, class D, std::size_t K>
std::optional<bad_id> find_bad_id(const tensor_view<const I, D, K>& ids, index_t rows) {
  const index_t n = ids.numel();
  if (n == 0) return std::nullopt;
  const auto find = [&](const I* p) -> std::optional<bad_id> {
    for (index_t i = 0; i < n; ++i)
      if (p[i] < 0 || static_cast<index_t>(p[i]) >= rows) return bad_id{i, static_cast<long long>(p[i])};
    return std::nullopt;
  };
  if constexpr (D::host_accessible) {
    return find(ids.data_handle());
  } else {
    const auto h = ::locus::to<::locus::cpu>(ids);
    return find(h.data_handle());
  }
}

template <class I, class D, std::size_t K>
void check_ids(const tensor_view<const I, D, K>& ids, index_t rows) {
  if (!ids.is_contiguous())
    throw shape_error("locus: ag::gather_rows needs contiguous ids; pass a tensor or a contiguous view");
  if (const auto bad = find_bad_id(ids, rows))
    throw value_error("locus: ag::gather_rows: id " + std::to_string(bad->id) + " at position " +
                      std::to_string(bad->position) + " is outside the table's " + std::to_string(rows) +
                      " rows [0, " + std::to_string(rows) + "); nothing was recorded");
}
}  // namespace detail

/// x with axes a and b exchanged (a contiguous copy); transpose(x) exchanges the last two.
template <class T, class D, std::size_t R>
var<T, D, R> transpose(const var<T, D, R>& x, std::size_t a, std::size_t b) {
  static_assert(R >= 2, "locus: ag::transpose needs a value of rank 2 or more (a rank-1 value has one axis)");
  auto& t = detail::owner(x, "ag::transpose");
  detail::check_axis<R>(a, "ag::transpose");
  detail::check_axis<R>(b, "ag::transpose");
  const auto src = detail::swap_axes(x.value(), a, b);
  auto out = t.template result<R>(src.shape(), x.requires_grad());
  if (x.numel() > 0) detail::assign_expr(t.writable(out), ::locus::detail::to_expr(src));
  if (x.requires_grad()) {
    auto& n = t.template record<detail::transpose_node<T, D, R>>();
    n.x = detail::access::id(x);
    n.out = detail::access::id(out);
    n.in = x.shape();
    n.a = a;
    n.b = b;
  }
  return out;
}
template <class T, class D, std::size_t R>
var<T, D, R> transpose(const var<T, D, R>& x) {
  static_assert(R >= 2, "locus: ag::transpose needs a value of rank 2 or more (a rank-1 value has one axis)");
  return transpose(x, R - 2, R - 1);
}

/// Elements [begin, end) of x along `axis` (a contiguous copy; PyTorch's x.narrow(axis,
/// begin, end - begin)). Its backward adds the gradient into that part of x's.
template <class T, class D, std::size_t R>
var<T, D, R> slice(const var<T, D, R>& x, std::size_t axis, index_t begin, index_t end) {
  static_assert(R >= 1, "locus: ag::slice needs a value of rank 1 or more");
  auto& t = detail::owner(x, "ag::slice");
  detail::check_axis<R>(axis, "ag::slice");
  const index_t extent = x.shape()[axis];
  if (begin < 0 || end < begin || end > extent)
    throw shape_error("locus: ag::slice [" + std::to_string(begin) + ", " + std::to_string(end) + ") of axis " +
                      std::to_string(axis) + " of a value of shape " + detail::shape_text(x.shape()) +
                      ": it must lie in [0, " + std::to_string(extent) + "]; nothing was recorded");
  const auto src = detail::narrow(x.value(), axis, begin, end - begin);
  auto out = t.template result<R>(src.shape(), x.requires_grad());
  if (src.numel() > 0) detail::assign_expr(t.writable(out), ::locus::detail::to_expr(src));
  if (x.requires_grad()) {
    auto& n = t.template record<detail::slice_node<T, D, R>>();
    n.x = detail::access::id(x);
    n.out = detail::access::id(out);
    n.in = x.shape();
    n.axis = axis;
    n.begin = begin;
    n.len = end - begin;
  }
  return out;
}

/// The values joined along `axis` (PyTorch's torch.cat(values, axis)): every other axis
/// must match. concat(axis, a, b, ...) for values known when writing the forward;
/// concat(axis, span) for a run-time list (a std::vector of values).
template <class T, class D, std::size_t R>
var<T, D, R> concat(std::size_t axis, std::span<const var<T, D, R>> xs) {
  return detail::concat_impl<T, D, R>(xs, axis);
}
template <class T, class D, std::size_t R>
var<T, D, R> concat(std::size_t axis, const std::vector<var<T, D, R>>& xs) {
  return detail::concat_impl<T, D, R>(std::span<const var<T, D, R>>(xs.data(), xs.size()), axis);
}
template <class A, class... B>
  requires(is_var_v<A> && (is_var_v<B> && ...))
auto concat(std::size_t axis, const A& a, const B&... rest) {
  if constexpr ((detail::check_pair<A, B>() && ...)) {
    if constexpr (((B::rank != A::rank) || ...)) {
      static_assert(::locus::detail::always_false<A>,
                    "locus: ag::concat of values of different ranks; reshape them to one rank first "
                    "(ag::reshape(v, {n, 1}))");
      return a;
    } else {
      const std::array<A, 1 + sizeof...(B)> xs{a, rest...};
      return detail::concat_impl<typename A::value_type, typename A::device, A::rank>(
          std::span<const A>(xs.data(), xs.size()), axis);
    }
  } else {
    return a;
  }
}

/// exp(x - max) / sum(exp(x - max)) along the last axis.
template <class T, class D, std::size_t R>
var<T, D, R> softmax(const var<T, D, R>& x) {
  static_assert(R >= 1, "locus: ag::softmax needs a value of rank 1 or more (it normalises the last axis)");
  auto& t = detail::owner(x, "ag::softmax");
  detail::check_contiguous_value(x, "ag::softmax");
  auto out = t.template result<R>(x.shape(), x.requires_grad());
  const index_t cols = x.shape()[R - 1];
  if (cols > 0)
    ::locus::detail::launch_n<D>(x.numel() / cols,
                                 detail::softmax_rows<T>{x.value().data_handle(), t.writable(out).data_handle(), cols},
                                 cols);
  if (x.requires_grad()) {
    auto& n = t.template record<detail::softmax_node<T, D, R>>();
    n.x = detail::access::id(x);
    n.out = detail::access::id(out);
    n.yv = out.value();
  }
  return out;
}

/// Rows of `table` [V, E] picked by integer ids (int32 or int64) of any rank K on the
/// same device: the result has the ids' shape plus [E] (an embedding's lookup, PyTorch's
/// F.embedding(ids, table)). An id outside [0, V) is a value_error naming it and V,
/// before anything is recorded (on cuda the ids are copied to the host for that check).
/// The table's gradient adds each row's contributions in the order of the ids: the same
/// bits on every run. The tape keeps a copy of the ids for backward (one copy of B*T ids).
namespace detail {
/// gather_rows after its checks of the ids (contiguous, in range): nn::embedding checks
/// them with its own message first (on cuda that check copies the ids to the host once).
template <class T, class D, class I, std::size_t K>
var<T, D, K + 1> gather_checked_rows(const var<T, D, 2>& table, const tensor_view<const I, D, K>& ids) {
  auto& t = owner(table, "ag::gather_rows");
  check_contiguous_value(table, "ag::gather_rows");
  extents<K + 1> os{};
  for (std::size_t a = 0; a < K; ++a) os[a] = ids.shape()[a];
  os[K] = table.shape()[1];
  auto out = t.template result<K + 1>(os, table.requires_grad());
  const index_t cols = table.shape()[1];
  if (ids.numel() > 0 && cols > 0)
    ::locus::detail::launch_n<D>(ids.numel() * cols, detail::gather_rows_kernel<T, I>{
                                                         table.value().data_handle(), ids.data_handle(),
                                                         t.writable(out).data_handle(), cols});
  if (table.requires_grad()) {
    auto& n = t.template record<detail::gather_rows_node<T, D, I, K>>();
    n.table = detail::access::id(table);
    n.out = detail::access::id(out);
    n.ts = table.shape();
    n.is = ids.shape();
    n.count = ids.numel();
    if (n.count > 0) {
      try {
        ensure_flat(n.ids, n.count);
        ::locus::copy(with_shape<I, D, 1>(ids.data_handle(), extents<1>{n.count}, ids.device_index()),
                      n.ids.view().slice(0, n.count));
      } catch (...) {  // nothing of the call stays on the tape
        t.unrecord();
        t.unresult();
        throw;
      }
    }
  }
  return out;
}
}  // namespace detail

template <class T, class D, class I, std::size_t K>
var<T, D, K + 1> gather_rows(const var<T, D, 2>& table, const tensor_view<const I, D, K>& ids) {
  static_assert(std::is_same_v<I, std::int32_t> || std::is_same_v<I, std::int64_t>,
                "locus: ag::gather_rows takes int32 or int64 ids (token ids, class ids); convert others with "
                "locus::cast<std::int64_t>(ids)");
  (void)detail::owner(table, "ag::gather_rows");
  detail::check_contiguous_value(table, "ag::gather_rows");
  detail::check_ids(ids, table.shape()[0]);
  return detail::gather_checked_rows(table, ids);
}
template <class T, class D, class I, std::size_t K>
var<T, D, K + 1> gather_rows(const var<T, D, 2>& table, const tensor_view<I, D, K>& ids) {
  return gather_rows(table, tensor_view<const I, D, K>(ids));
}
template <class T, class D, class I, std::size_t K>
var<T, D, K + 1> gather_rows(const var<T, D, 2>& table, const tensor<I, D, K>& ids) {
  return gather_rows(table, ids.view());
}
/// Rows of `table` picked by a forward's ids (tape.ids(x), or what nn::model passes):
/// as above, both of one tape.
template <class T, class D, class I, std::size_t K>
var<T, D, K + 1> gather_rows(const var<T, D, 2>& table, const ids<T, D, K, I>& x) {
  (void)detail::owner(table, x, "ag::gather_rows");
  return gather_rows(table, x.value());
}
// Prevents: ids that are freed before backward reads them.
template <class T, class D, class I, std::size_t K>
var<T, D, K + 1> gather_rows(const var<T, D, 2>& table, tensor<I, D, K>&& ids) {
  static_assert(::locus::detail::always_false<I>,
                "locus: ag::gather_rows of temporary ids would dangle: backward reads them, but they are freed at "
                "the end of the statement; keep them in a variable first: auto ids = ...; then gather_rows(table, ids)");
  return gather_rows(table, ids.view());
}
// Prevents: ids on another device than the table (one operation, one device).
template <class V, class X>
  requires(is_var_v<V> && (::locus::detail::tensor_traits<std::remove_cvref_t<X>>::is_tensor ||
                           ::locus::detail::tensor_traits<std::remove_cvref_t<X>>::is_view) &&
           !std::is_same_v<typename ::locus::detail::tensor_traits<std::remove_cvref_t<X>>::device,
                           typename V::device>)
int gather_rows(const V&, const X&) {
  (void)::locus::detail::require_same_operand_device<
      typename V::device, typename ::locus::detail::tensor_traits<std::remove_cvref_t<X>>::device>();
  return 0;
}

}  // namespace locus::ag
