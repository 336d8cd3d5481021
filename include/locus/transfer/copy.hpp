// Moving data between devices is only ever explicit: copy(src, dst) into existing
// memory, to<D>(t) for a new tensor (blocking), clone() on the same device. Every
// device pair works; dtype and rank must match (compile time), shapes must match
// (run time, before the destination is touched).
#pragma once

#include <cstring>
#include <type_traits>

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

/// Contiguous byte copy between devices. Blocking whenever host memory is involved;
/// device-to-device copies are ordered on the current stream.
template <class SD, class DD>
void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if constexpr (SD::host_accessible && DD::host_accessible) {
    std::memcpy(dst, src, bytes);
  } else {
#if LOCUS_HAS_CUDA
    const cudaStream_t s = current_stream();
    LOCUS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, memcpy_kind<SD, DD>(), s));
    if constexpr (SD::host_accessible || DD::host_accessible)
      LOCUS_CUDA_CHECK(cudaStreamSynchronize(s));
#endif
  }
}

}  // namespace detail

/// Copies src into dst (existing memory, any pair of devices). Same dtype and rank
/// are compile-time rules; a shape mismatch throws shape_error and leaves dst as it
/// was. Blocking when either side is host memory.
template <TensorLike Src, TensorLike Dst>
void copy(const Src& src, Dst&& dst) {
  using st = detail::tensor_traits<std::remove_cvref_t<Src>>;
  using dt = detail::tensor_traits<std::remove_cvref_t<Dst>>;
  static_assert(!std::is_const_v<typename dt::element_type>,
                "locus: copy destination is a view of const elements; pass a tensor or a "
                "mutable tensor_view");
  if constexpr (!std::is_const_v<typename dt::element_type> &&  // reported above: one error
                detail::require_same_copy_dtype<typename st::value_type, typename dt::value_type>() &&
                detail::require_same_copy_rank<st::rank, dt::rank>()) {
    using SD = typename st::device;
    using DD = typename dt::device;
    using T = typename dt::value_type;
    const auto s = detail::as_view(src);
    auto d = detail::as_view(dst);
    if (s.shape() != d.shape())
      throw shape_error("locus: copy from shape " + detail::shape_string(s.shape()) +
                        " to shape " + detail::shape_string(d.shape()) +
                        "; shapes must be equal (the destination was not changed)");
    if (s.numel() == 0) return;
    const T* sp = s.data_handle();
    T* dp = d.data_handle();
    if (s.is_contiguous() && d.is_contiguous()) {
      detail::copy_bytes<SD, DD>(dp, sp, s.size_bytes());
    } else if constexpr (SD::host_accessible && DD::host_accessible) {
      detail::strided_host_copy(sp, s.shape(), s.strides(), dp, d.strides());
    } else {
      // One side is GPU memory and one side is strided: stage the strided host side
      // through a contiguous host buffer. A strided cuda view needs a kernel.
      if ((!SD::host_accessible && !s.is_contiguous()) || (!DD::host_accessible && !d.is_contiguous()))
        throw shape_error("locus: copy of a non-contiguous cuda view of shape " +
                          detail::shape_string(s.shape()) +
                          " needs a gather kernel; copy through a contiguous cuda tensor "
                          "(evaluate it in a .cu file) or copy whole rows");
      tensor<T, cpu, dt::rank> staging(s.shape());
      if constexpr (SD::host_accessible) {
        detail::strided_host_copy(sp, s.shape(), s.strides(), staging.data_handle(),
                                  staging.strides());
        detail::copy_bytes<cpu, DD>(dp, staging.data_handle(), s.size_bytes());
      } else {
        detail::copy_bytes<SD, cpu>(staging.data_handle(), sp, s.size_bytes());
        detail::strided_host_copy(staging.data_handle(), s.shape(), staging.strides(), dp,
                                  d.strides());
      }
    }
  }
}

/// A new tensor on device D2 holding src's elements (blocking when host memory is
/// involved). The only way, with copy() and to_async(), to change device.
template <class D2, TensorLike Src>
auto to(const Src& src) {
  using st = detail::tensor_traits<std::remove_cvref_t<Src>>;
  tensor<typename st::value_type, D2, st::rank> out(detail::as_view(src).shape());
  copy(src, out);
  return out;
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
