// Moving data between devices is only ever explicit: copy(src, dst) into existing
// memory, to<D>(t) for a new tensor (blocking), clone() on the same device. Every
// device pair works; dtype and rank must match (compile time), shapes must match
// (run time, before the destination is touched).
//
// Overlap follows the rule expressions follow (ops/expr.hpp): a source that reads the
// destination's memory through the same mapping (same address, same strides: copy(t,
// t)) is already in place and nothing is copied; overlapping contiguous ranges (two
// shifted slices of one tensor) are a memmove on the host and go through a temporary
// on cuda (cudaMemcpy of overlapping ranges is undefined); any other overlap
// (copy(transpose(t), t)) reads the whole source into a temporary first. Host and cuda
// memory never overlap (separate allocations).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "../core/rules.hpp"
#include "../tensor/tensor.hpp"

#if LOCUS_HAS_CUDA
#include "../backend/cuda/runtime.hpp"
#endif

namespace locus {

namespace detail {

template <class X>
auto as_view(X& x) noexcept {
  using tr = tensor_traits<std::remove_cvref_t<X>>;
  if constexpr (tr::is_view)
    return x;
  else
    return x.view();
}

/// A lazy expression (ops/expr.hpp) rather than a tensor or view.
template <class X>
inline constexpr bool is_expression_v = std::is_base_of_v<expression_tag, std::remove_cvref_t<X>>;

/// Do two views share a byte? (Asked only of two views in one address space.)
template <class A, class B>
bool views_overlap(const A& a, const B& b) noexcept {
  return ranges_overlap(range_of(a), range_of(b));
}
/// Same address and the same stride on every axis that has more than one position:
/// each element of b is the element of a at the same index (shapes are equal).
template <class A, class B>
bool same_mapping(const A& a, const B& b) noexcept {
  if (static_cast<const void*>(a.data_handle()) != static_cast<const void*>(b.data_handle())) return false;
  for (std::size_t k = 0; k < a.shape().size(); ++k)
    if (a.shape()[k] > 1 && a.strides()[k] != b.strides()[k]) return false;
  return true;
}

/// Element-by-element copy between two host-accessible, possibly strided views.
template <class T, std::size_t R>
void strided_host_copy(const T* src, const extents<R>& shape, const extents<R>& sst, T* dst,
                       const extents<R>& dst_strides) {
  if constexpr (R == 0) {
    *dst = *src;
  } else {
    const index_t n = numel_of(shape);
    extents<R> idx{};
    for (index_t k = 0; k < n; ++k) {
      index_t so = 0, d = 0;
      for (std::size_t a = 0; a < R; ++a) {
        so += idx[a] * sst[a];
        d += idx[a] * dst_strides[a];
      }
      dst[d] = src[so];
      for (std::size_t a = R; a-- > 0;) {
        if (++idx[a] < shape[a]) break;
        idx[a] = 0;
      }
    }
  }
}

#if LOCUS_HAS_CUDA
template <class S, class D>
constexpr cudaMemcpyKind memcpy_kind() {
  if constexpr (S::host_accessible && D::host_accessible) return cudaMemcpyHostToHost;
  else if constexpr (S::host_accessible) return cudaMemcpyHostToDevice;
  else if constexpr (D::host_accessible) return cudaMemcpyDeviceToHost;
  else return cudaMemcpyDeviceToDevice;
}
#endif

/// Contiguous byte copy between devices. Device-to-device copies are ordered on the
/// current stream (the host does not wait). A copy with host memory on one side is
/// blocking, and it waits for the right work: it runs on the current stream of the
/// device that owns the cuda side, after everything already enqueued on every locus
/// stream of that device and on the legacy stream (backend/cuda/runtime.hpp says why),
/// so data written under another stream_guard, from any thread, is never read stale,
/// and memory a kernel on another locus stream still reads is never overwritten from
/// the host. Every host read of cuda memory in locus (to<cpu>, copy() to a host
/// tensor, the trainer's, scaler's and optimizer's reads) goes through here.
template <class SD, class DD>
void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if constexpr (SD::host_accessible && DD::host_accessible) {
    std::memcpy(dst, src, bytes);
  } else {
#if LOCUS_HAS_CUDA
    if constexpr (SD::host_accessible || DD::host_accessible) {
      const host_transfer_scope scope(SD::host_accessible ? static_cast<const void*>(dst) : src);
      LOCUS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, memcpy_kind<SD, DD>(), scope.stream()));
      LOCUS_CUDA_CHECK(cudaStreamSynchronize(scope.stream()));
    } else {
      LOCUS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, memcpy_kind<SD, DD>(), current_stream()));
    }
#endif
  }
}

/// The body of copy() for every argument form: one instance per dtype, device pair
/// and rank, however the caller spelled its tensors and views.
template <class T, class SD, class DD, std::size_t R>
void copy_views(const tensor_view<const T, SD, R> s, const tensor_view<T, DD, R> d) {
  if (s.shape() != d.shape())
    throw_shape_error("locus: copy from shape %s to shape %s; shapes must be equal (the destination was not "
                      "changed)",
                      shape_chars<R>(s.shape()).s, shape_chars<R>(d.shape()).s);
  if (s.numel() == 0) return;
  // Both sides in one address space (host and host, or cuda and cuda) may overlap.
  if constexpr (SD::host_accessible == DD::host_accessible) {
    if (views_overlap(s, d)) {
      if (same_mapping(s, d)) return;  // every element is its own source
      if constexpr (SD::host_accessible) {
        if (s.is_contiguous() && d.is_contiguous()) {
          std::memmove(d.data_handle(), s.data_handle(), s.size_bytes());
          return;
        }
      }
      // Read the whole source into separate memory first (host temporaries are
      // pageable: nothing asynchronous reads them).
      using TD = std::conditional_t<SD::host_accessible, cpu, SD>;
      tensor<T, TD, R> tmp(s.shape());
      copy_views<T, SD, TD, R>(s, tmp.view());
      copy_views<T, TD, DD, R>(std::as_const(tmp).view(), d);
      return;
    }
  }
  const T* sp = s.data_handle();
  T* dp = d.data_handle();
#if LOCUS_HAS_CUDA
  if constexpr (!SD::host_accessible && !DD::host_accessible) {
    // Between GPUs (or on a GPU that is not current): a blocking peer copy. It waits
    // for every locus stream of the source's GPU (the writer may be any of them), runs
    // on the destination GPU's current stream after every locus stream there, and is
    // complete when copy() returns, so no later work on either GPU can race with it.
    // Two GPUs never share memory: no overlap.
    const int current = allocation_gpu<DD>();
    const int sg = s.device_index() >= 0 ? s.device_index() : current;
    const int dg = d.device_index() >= 0 ? d.device_index() : current;
    if (sg != current || dg != current) {
      if (!s.is_contiguous() || !d.is_contiguous())
        throw_shape_error("locus: a copy between GPU %d and GPU %d of a non-contiguous view (shape %s) needs a "
                          "gather kernel; copy a contiguous tensor (clone() it on its GPU first)",
                          sg, dg, shape_chars<R>(s.shape()).s);
      {
        const host_transfer_scope src_scope(sp);
        LOCUS_CUDA_CHECK(cudaStreamSynchronize(src_scope.stream()));
      }
      const host_transfer_scope dst_scope(dp);
      LOCUS_CUDA_CHECK(cudaMemcpyPeerAsync(dp, dg, sp, sg, s.size_bytes(), dst_scope.stream()));
      LOCUS_CUDA_CHECK(cudaStreamSynchronize(dst_scope.stream()));
      return;
    }
  }
#endif
  if (s.is_contiguous() && d.is_contiguous()) {
    copy_bytes<SD, DD>(dp, sp, s.size_bytes());
  } else if constexpr (SD::host_accessible && DD::host_accessible) {
    strided_host_copy(sp, s.shape(), s.strides(), dp, d.strides());
  } else {
    // One side is GPU memory and one side is strided: stage the strided host side
    // through a contiguous host buffer. A strided cuda view needs a kernel.
    if ((!SD::host_accessible && !s.is_contiguous()) || (!DD::host_accessible && !d.is_contiguous()))
      throw_shape_error("locus: copy of a non-contiguous cuda view of shape %s needs a gather kernel; copy "
                        "through a contiguous cuda tensor (evaluate it in a .cu file) or copy whole rows",
                        shape_chars<R>(s.shape()).s);
    tensor<T, cpu, R> staging(s.shape());
    if constexpr (SD::host_accessible) {
      strided_host_copy(sp, s.shape(), s.strides(), staging.data_handle(),
                      staging.strides());
      copy_bytes<cpu, DD>(dp, staging.data_handle(), s.size_bytes());
    } else {
      copy_bytes<SD, cpu>(staging.data_handle(), sp, s.size_bytes());
      strided_host_copy(staging.data_handle(), s.shape(), staging.strides(), dp,
                      d.strides());
    }
  }
}

}  // namespace detail

/// Copies src into dst (existing memory, any pair of devices). Same dtype and rank
/// are compile-time rules; a shape mismatch throws shape_error and leaves dst as it
/// was. Blocking when either side is host memory. Overlapping sides are handled as
/// the header says (the result is always that of a copy from a separate source).
template <class Src, TensorLike Dst>
  requires(TensorLike<Src> || detail::is_expression_v<Src>)
void copy(const Src& src, Dst&& dst) {
  if constexpr (detail::is_expression_v<Src>) {
    static_assert(detail::always_false<Src>,
                  "locus: copy() copies a tensor or tensor_view, but the source is an "
                  "expression (a lazy tree with no memory yet); assign it instead, dst = e "
                  "(same device: one fused kernel), or copy its value: "
                  "locus::copy(locus::eval(e), dst)");
  } else {
    using st = detail::tensor_traits<std::remove_cvref_t<Src>>;
    using dt = detail::tensor_traits<std::remove_cvref_t<Dst>>;
    if constexpr (std::is_const_v<typename dt::element_type>) {
      static_assert(detail::always_false<Dst>,
                    "locus: copy destination is a view of const elements; pass a tensor or a "
                    "mutable tensor_view");
    } else if constexpr (dt::is_tensor && !std::is_lvalue_reference_v<Dst>) {
      // Prevents: copy(src, dst.clone()), copy(src, to<cpu>(dst)): the copy lands in a
      // temporary and is lost.
      static_assert(detail::always_false<Dst>,
                    "locus: copy()'s destination is a temporary tensor, so the copy would be lost with it; copy "
                    "into a named tensor (auto dst = ...; locus::copy(src, dst);) or into a view of one");
    } else if constexpr (std::is_const_v<std::remove_reference_t<Dst>> && dt::is_tensor) {
      static_assert(detail::always_false<Dst>,
                    "locus: copy destination is a const tensor (std::as_const(t), or a const& "
                    "parameter), and copy writes into it; pass a mutable tensor: "
                    "locus::copy(src, t)");
    } else if constexpr (detail::require_same_copy_dtype<typename st::value_type, typename dt::value_type>() &&
                         detail::require_same_copy_rank<st::rank, dt::rank>()) {
      using SD = typename st::device;
      using DD = typename dt::device;
      using T = typename dt::value_type;
      constexpr std::size_t R = dt::rank;
      detail::copy_views<T, SD, DD, R>(detail::as_view(src), detail::as_view(dst));
    }
  }
}

/// A new tensor on device D2 holding src's elements (blocking when host memory is
/// involved). The only way, with copy() and to_async(), to change device.
template <class D2, class Src>
  requires(TensorLike<Src> || detail::is_expression_v<Src>)
auto to(const Src& src) {
  if constexpr (detail::is_expression_v<Src>) {
    static_assert(detail::always_false<Src>,
                  "locus: to<D>() copies a tensor or tensor_view, but the argument is an "
                  "expression (a lazy tree with no memory yet); evaluate it first: "
                  "locus::to<D>(locus::eval(e)) (a cuda expression is evaluated by a kernel: "
                  "in a .cu file)");
    return 0;
  } else {
    using st = detail::tensor_traits<std::remove_cvref_t<Src>>;
    tensor<typename st::value_type, D2, st::rank> out(detail::as_view(src).shape());
    copy(src, out);
    return out;
  }
}

template <class T, class D, std::size_t R>
template <class S>
  requires(detail::tensor_traits<S>::is_tensor || detail::tensor_traits<S>::is_view)
const tensor_view<T, D, R>& tensor_view<T, D, R>::operator=(const S& src) && {
  using st = detail::tensor_traits<S>;
  if constexpr (std::is_const_v<T>) {
    static_assert(detail::always_false<S>,
                  "locus: assigning to a view of const elements (a view of a const tensor, or "
                  "tensor_view<const T, D, R>); take the view of a non-const tensor to write "
                  "through it: t.slice(0, 2) = u");
  } else if constexpr (detail::require_assign_device<typename st::device, D>()) {
    copy(src, *this);  // dtype and rank rules, shape check, overlap: copy()'s
  }
  return *this;
}

template <class T, class D, std::size_t R>
tensor<T, D, R> tensor<T, D, R>::clone() const {
  return view().clone();
}

template <class T, class D, std::size_t R>
tensor<std::remove_const_t<T>, D, R> tensor_view<T, D, R>::clone() const {
  tensor<std::remove_const_t<T>, D, R> out(shape_);
  copy(*this, out);
  return out;
}

}  // namespace locus
