// DLPack at a typed boundary: a locus tensor handed to another framework without a copy,
// and another framework's tensor taken in as a typed locus view, checked where it enters.
//
//   #include <locus/interop/dlpack.hpp>   // needs <dlpack/dlpack.h> (Debian: libdlpack-dev, 0.6)
//
//   DLManagedTensor* m = locus::to_dlpack(std::move(t));   // t: tensor<T, D, R>
//     The DLManagedTensor owns the tensor (moved into its manager_ctx, with the shape and
//     strides arrays); `data` is the tensor's own pointer (zero-copy), byte_offset 0,
//     strides given (C-contiguous). The consumer calls m->deleter(m) once, which frees the
//     tensor through locus's allocator. Device: cpu -> kDLCPU, pinned -> kDLCUDAHost,
//     cuda -> kDLCUDA with the id of the GPU that holds the memory. dtype (code, bits,
//     lanes 1): f32 (kDLFloat, 32), f64 (kDLFloat, 64), f16 (kDLFloat, 16), bf16
//     (kDLBfloat, 16), i32 (kDLInt, 32), i64 (kDLInt, 64), u8 (kDLUInt, 8), bool
//     (kDLUInt, 8: DLPack 0.6 has no kDLBool; later versions' kDLBool is code 6).
//     An lvalue tensor or a view is a compile error: a DLManagedTensor owns its memory, so
//     move the tensor in (std::move(t)) or clone the view (v.clone()).
//
//   locus::dlpack_tensor<T, D, R> h = locus::from_dlpack<T, D, R>(m);
//   locus::tensor_view<T, D, R> v = h.view();              // the producer's memory, no copy
//     dlpack_tensor owns m from the first line of from_dlpack on: it is move-only and its
//     destructor calls m->deleter(m) exactly once (a null deleter is not called), also
//     when from_dlpack refuses m (it throws after taking ownership, so the producer's
//     memory is always released). Checked, each refusal saying what was expected and what
//     was found:
//       value_error: a null DLManagedTensor; the device type (cpu takes kDLCPU and
//         kDLCUDAHost, page-locked host memory being host memory; pinned takes
//         kDLCUDAHost; cuda takes kDLCUDA with a device id that exists, device_id() says
//         which: make it current before computing on it); the dtype's code, bits and
//         lanes (lanes must be 1; bool takes kDLUInt 8 and kDLBool 8, and on host
//         devices every byte must be 0 or 1); a null data pointer with elements; a
//         pointer (data + byte_offset) that is not aligned for T or wraps around.
//       shape_error: ndim other than R; a null shape (rank >= 1); a negative extent; an
//         element count or byte size over 64 bits; strides (null means C-contiguous;
//         otherwise counted in elements) that are negative, whose last element's offset
//         overflows, or that map two elements to one address when T is not const
//         (locus's rule for writable views: from_dlpack<const T, D, R> takes overlapping
//         strides such as NumPy's broadcast stride 0).
//     T may be const (tensor_view<const T, D, R> then); view() const is always
//     tensor_view<const T, D, R>. A view of a temporary handle does not compile.
//
// Opt-in, as <locus/fmt.hpp>: locus.hpp does not include this header, so programs that do
// not use DLPack need no DLPack header. Consumers tested: NumPy's from_dlpack both ways
// (tests/python/dlpack_numpy.py); PyTorch's from_dlpack on a GPU is not tested yet.
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "../tensor/tensor.hpp"

namespace locus {

namespace detail {

/// DLPack's (code, bits) of a locus dtype (lanes are always 1).
template <class T>
struct dlpack_dtype;
template <> struct dlpack_dtype<float> { static constexpr std::uint8_t code = kDLFloat, bits = 32; };
template <> struct dlpack_dtype<double> { static constexpr std::uint8_t code = kDLFloat, bits = 64; };
template <> struct dlpack_dtype<f16> { static constexpr std::uint8_t code = kDLFloat, bits = 16; };
template <> struct dlpack_dtype<bf16> { static constexpr std::uint8_t code = kDLBfloat, bits = 16; };
template <> struct dlpack_dtype<std::int32_t> { static constexpr std::uint8_t code = kDLInt, bits = 32; };
template <> struct dlpack_dtype<std::int64_t> { static constexpr std::uint8_t code = kDLInt, bits = 64; };
template <> struct dlpack_dtype<std::uint8_t> { static constexpr std::uint8_t code = kDLUInt, bits = 8; };
template <> struct dlpack_dtype<bool> { static constexpr std::uint8_t code = kDLUInt, bits = 8; };

/// kDLBool in DLPack 0.8 and later (NumPy 2 exports bool arrays with it).
inline constexpr std::uint8_t dlpack_bool_code = 6;

inline const char* dlpack_code_name(unsigned code) noexcept {
  switch (code) {
    case kDLInt: return "kDLInt";
    case kDLUInt: return "kDLUInt";
    case kDLFloat: return "kDLFloat";
    case kDLOpaqueHandle: return "kDLOpaqueHandle";
    case kDLBfloat: return "kDLBfloat";
    case kDLComplex: return "kDLComplex";
    case dlpack_bool_code: return "kDLBool";
    default: return "an unknown code";
  }
}

inline const char* dlpack_device_name(int type) noexcept {
  switch (type) {
    case kDLCPU: return "kDLCPU";
    case kDLCUDA: return "kDLCUDA";
    case kDLCUDAHost: return "kDLCUDAHost";
    case kDLOpenCL: return "kDLOpenCL";
    case kDLVulkan: return "kDLVulkan";
    case kDLMetal: return "kDLMetal";
    case kDLVPI: return "kDLVPI";
    case kDLROCM: return "kDLROCM";
    case kDLROCMHost: return "kDLROCMHost";
    case kDLExtDev: return "kDLExtDev";
    case kDLCUDAManaged: return "kDLCUDAManaged";
    default: return "an unknown device type";
  }
}

template <class D>
constexpr DLDeviceType dlpack_device_type() noexcept {
  if constexpr (std::is_same_v<D, cpu>) return kDLCPU;
  else if constexpr (std::is_same_v<D, pinned>) return kDLCUDAHost;
  else return kDLCUDA;
}

/// What to_dlpack's DLManagedTensor points to: the tensor and its shape and strides.
template <class T, class D, std::size_t R>
struct dlpack_context {
  tensor<T, D, R> t;
  std::int64_t shape[R == 0 ? 1 : R] = {};
  std::int64_t strides[R == 0 ? 1 : R] = {};
  DLManagedTensor managed{};

  static void deleter(DLManagedTensor* self) noexcept {
    if (self) delete static_cast<dlpack_context*>(self->manager_ctx);
  }
};

#define LOCUS_DLPACK_OWNERSHIP_MESSAGE                                                          \
  "locus: to_dlpack hands ownership of a tensor's memory to the consumer, so it takes a "     \
  "tensor by rvalue: move the tensor in, locus::to_dlpack(std::move(t)) (t is empty "          \
  "afterwards); a view owns nothing: clone it first, locus::to_dlpack(v.clone())"

}  // namespace detail

/// A tensor handed over as DLPack: the returned DLManagedTensor owns it (zero-copy) until
/// its deleter is called. See the top of this file.
template <class T, class D, std::size_t R>
[[nodiscard]] DLManagedTensor* to_dlpack(tensor<T, D, R>&& t) {
  auto* ctx = new detail::dlpack_context<T, D, R>{std::move(t)};
  const auto shape = ctx->t.shape();
  const auto strides = ctx->t.strides();
  for (std::size_t a = 0; a < R; ++a) {
    ctx->shape[a] = shape[a];
    ctx->strides[a] = strides[a];
  }
  DLTensor& dl = ctx->managed.dl_tensor;
  dl.data = static_cast<void*>(ctx->t.data_handle());
  dl.device.device_type = detail::dlpack_device_type<D>();
  dl.device.device_id = 0;
#if LOCUS_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    try {
      dl.device.device_id = dl.data ? detail::device_of(dl.data) : detail::current_device_or_zero();
    } catch (...) {
      delete ctx;  // the tensor goes with it: nothing was handed over
      throw;
    }
  }
#endif
  dl.ndim = static_cast<int>(R);
  dl.dtype.code = detail::dlpack_dtype<T>::code;
  dl.dtype.bits = detail::dlpack_dtype<T>::bits;
  dl.dtype.lanes = 1;
  dl.shape = R == 0 ? nullptr : ctx->shape;
  dl.strides = R == 0 ? nullptr : ctx->strides;
  dl.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = &detail::dlpack_context<T, D, R>::deleter;
  return &ctx->managed;
}

// Prevents: a DLManagedTensor that points into a tensor the caller still owns (freed
// twice, or read after the caller's tensor died), or into a view's borrowed memory.
template <class X>
  requires TensorLike<X>
DLManagedTensor* to_dlpack(X&&) {
  static_assert(detail::always_false<X>, LOCUS_DLPACK_OWNERSHIP_MESSAGE);
  return nullptr;
}

template <class T, class D, std::size_t R>
class dlpack_tensor;

template <class T, class D, std::size_t R>
dlpack_tensor<T, D, R> from_dlpack(DLManagedTensor* m);

/// Another framework's tensor as locus sees it: owns the DLManagedTensor (its deleter is
/// called once, by the destructor) and views its memory as tensor_view<T, D, R>.
template <class T, class D, std::size_t R>
class dlpack_tensor {
  static_assert(Dtype<T> && !std::is_volatile_v<T>,
                "locus: from_dlpack's element type must be one of f32, f64, i32, i64, u8, bool, f16, "
                "bf16 (optionally const)");
  static_assert(is_device_v<D>, "locus: from_dlpack's device must be locus::cpu, locus::pinned or locus::cuda");

 public:
  using value_type = std::remove_const_t<T>;
  using element_type = T;
  using device_type = D;
  static constexpr std::size_t rank = R;

  dlpack_tensor() noexcept = default;
  dlpack_tensor(dlpack_tensor&& o) noexcept
      : m_(std::exchange(o.m_, nullptr)), view_(std::exchange(o.view_, {})), device_id_(o.device_id_) {}
  dlpack_tensor& operator=(dlpack_tensor&& o) noexcept {
    if (this != &o) {
      reset();
      m_ = std::exchange(o.m_, nullptr);
      view_ = std::exchange(o.view_, {});
      device_id_ = o.device_id_;
    }
    return *this;
  }
  dlpack_tensor(const dlpack_tensor&) = delete;  // locus: a dlpack_tensor owns its producer's memory and is move-only; take a view: h.view()
  dlpack_tensor& operator=(const dlpack_tensor&) = delete;
  ~dlpack_tensor() { reset(); }

  [[nodiscard]] tensor_view<T, D, R> view() & noexcept { return view_; }
  [[nodiscard]] tensor_view<const value_type, D, R> view() const& noexcept { return view_; }
  // Prevents: a view of a temporary handle, whose destructor frees the memory at the end
  // of the statement (locus::from_dlpack<float, cpu, 2>(m).view()).
  tensor_view<T, D, R> view() const&& {
    static_assert(detail::always_false<T>,
                  "locus: view() of a temporary dlpack_tensor would dangle: its destructor calls the "
                  "producer's deleter at the end of the statement; keep it in a variable first: auto h = "
                  "locus::from_dlpack<T, D, R>(m); auto v = h.view();");
    return {};
  }

  // By value on a temporary handle: a reference would outlive the handle (and the
  // producer's memory its deleter frees), e.g. `const auto& s = from_dlpack<...>(m).shape();`.
  [[nodiscard]] const extents<R>& shape() const& noexcept { return view_.shape(); }
  [[nodiscard]] extents<R> shape() const&& noexcept { return view_.shape(); }
  [[nodiscard]] const extents<R>& strides() const& noexcept { return view_.strides(); }
  [[nodiscard]] extents<R> strides() const&& noexcept { return view_.strides(); }
  [[nodiscard]] index_t numel() const noexcept { return view_.numel(); }
  /// The DLPack device id (the GPU that holds the memory, for cuda; 0 on the host).
  [[nodiscard]] int device_id() const noexcept { return device_id_; }
  /// The DLManagedTensor this handle owns (still owned: do not call its deleter).
  [[nodiscard]] const DLManagedTensor* managed() const noexcept { return m_; }
  explicit operator bool() const noexcept { return m_ != nullptr; }

 private:
  friend dlpack_tensor from_dlpack<T, D, R>(DLManagedTensor* m);
  explicit dlpack_tensor(DLManagedTensor* m) noexcept : m_(m) {}

  void reset() noexcept {
    if (m_ && m_->deleter) m_->deleter(m_);
    m_ = nullptr;
    view_ = {};
  }

  /// The checks of from_dlpack; the handle already owns m_, so a throw releases it.
  void bind();

  DLManagedTensor* m_ = nullptr;
  tensor_view<T, D, R> view_{};
  int device_id_ = 0;
};

template <class T, class D, std::size_t R>
void dlpack_tensor<T, D, R>::bind() {
  using V = std::remove_const_t<T>;
  const DLTensor& dl = m_->dl_tensor;
  char what[96];
  std::snprintf(what, sizeof what, "locus: from_dlpack<%s, %s, %zu>", dtype_name<V>.data(), D::name.data(), R);

  // device
  const int type = static_cast<int>(dl.device.device_type);
  if constexpr (std::is_same_v<D, cpu>) {
    if (type != kDLCPU && type != kDLCUDAHost)
      detail::throw_value_error("%s: expected host memory (device type kDLCPU = 1, or kDLCUDAHost = 3), found "
                                "device type %d (%s), device id %d",
                                what, type, detail::dlpack_device_name(type), dl.device.device_id);
  } else if constexpr (std::is_same_v<D, pinned>) {
    if (type != kDLCUDAHost)
      detail::throw_value_error("%s: expected page-locked host memory (device type kDLCUDAHost = 3), found device "
                                "type %d (%s), device id %d%s",
                                what, type, detail::dlpack_device_name(type), dl.device.device_id,
                                type == kDLCPU ? "; pageable memory is locus::cpu: from_dlpack<T, locus::cpu, R>" : "");
  } else {
    if (type != kDLCUDA)
      detail::throw_value_error("%s: expected GPU memory (device type kDLCUDA = 2), found device type %d (%s), "
                                "device id %d",
                                what, type, detail::dlpack_device_name(type), dl.device.device_id);
#if LOCUS_HAS_CUDA
    int count = 0;
    const cudaError_t st = cudaGetDeviceCount(&count);
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      detail::throw_value_error("%s: the tensor is on CUDA device %d, but this process sees no CUDA device (%s)", what,
                                dl.device.device_id, cudaGetErrorString(st));
    }
    if (dl.device.device_id < 0 || dl.device.device_id >= count)
      detail::throw_value_error("%s: the tensor is on CUDA device %d, but this process sees %d CUDA device%s "
                                "(ids 0 to %d)",
                                what, dl.device.device_id, count, count == 1 ? "" : "s", count - 1);
#endif
  }
  device_id_ = dl.device.device_id;

  // dtype
  const unsigned code = dl.dtype.code, bits = dl.dtype.bits, lanes = dl.dtype.lanes;
  constexpr unsigned want_code = detail::dlpack_dtype<V>::code, want_bits = detail::dlpack_dtype<V>::bits;
  const bool code_ok = code == want_code || (std::is_same_v<V, bool> && code == detail::dlpack_bool_code);
  if (!code_ok || bits != want_bits || lanes != 1)
    detail::throw_value_error("%s: expected dtype %s (code %u %s%s, %u bits, 1 lane), found code %u (%s), %u bits, "
                              "%u lane%s",
                              what, dtype_name<V>.data(), want_code, detail::dlpack_code_name(want_code),
                              std::is_same_v<V, bool> ? " or 6 kDLBool" : "", want_bits, code,
                              detail::dlpack_code_name(code), bits, lanes, lanes == 1 ? "" : "s");

  // rank and shape
  if (dl.ndim != static_cast<int>(R))
    detail::throw_shape_error("%s: expected ndim %zu, found ndim %d", what, R, dl.ndim);
  extents<R> shape{};
  if constexpr (R > 0) {
    if (dl.shape == nullptr) detail::throw_shape_error("%s: the DLTensor's shape is a null pointer (ndim %zu)", what, R);
    for (std::size_t a = 0; a < R; ++a) shape[a] = dl.shape[a];
  }
  for (std::size_t a = 0; a < R; ++a)
    if (shape[a] < 0)
      detail::throw_shape_error("%s: expected extents >= 0, found %lld on axis %zu of shape %s", what,
                                static_cast<long long>(shape[a]), a, detail::shape_chars<R>(shape).s);
  const index_t n = [&] {
    for (std::size_t a = 0; a < R; ++a)
      if (shape[a] == 0) return index_t{0};  // before multiplying: [0, huge, huge] is empty
    index_t k = 1;
    const index_t max_elems = std::numeric_limits<index_t>::max() / static_cast<index_t>(sizeof(V));
    for (std::size_t a = 0; a < R; ++a) {
      if (k > max_elems / shape[a])
        detail::throw_shape_error("%s: shape %s has more elements than fit in %zu-byte elements addressed by 64 bits",
                                  what, detail::shape_chars<R>(shape).s, sizeof(V));
      k *= shape[a];
    }
    return k;
  }();

  // strides (elements)
  extents<R> strides = detail::contiguous_strides(shape);
  if constexpr (R > 0) {
    if (dl.strides != nullptr) {
      for (std::size_t a = 0; a < R; ++a) strides[a] = dl.strides[a];
      for (std::size_t a = 0; a < R; ++a)
        if (strides[a] < 0 && shape[a] > 1)
          detail::throw_shape_error("%s: expected strides >= 0, found %lld on axis %zu (shape %s, strides %s); locus "
                                    "views do not step backwards: copy the array first (numpy.ascontiguousarray)",
                                    what, static_cast<long long>(strides[a]), a, detail::shape_chars<R>(shape).s,
                                    detail::shape_chars<R>(strides).s);
      // An axis of extent 0 or 1 is never stepped along: its stride may be anything.
      for (std::size_t a = 0; a < R; ++a)
        if (shape[a] <= 1) strides[a] = detail::contiguous_strides(shape)[a];
      if (n > 0) {
        index_t last = 0;
        for (std::size_t a = 0; a < R; ++a) {
          if (shape[a] > 1 && strides[a] > (std::numeric_limits<index_t>::max() / static_cast<index_t>(sizeof(V)) - last) /
                                               (shape[a] - 1))
            detail::throw_shape_error("%s: shape %s with strides %s: the last element's byte offset overflows 64 bits",
                                      what, detail::shape_chars<R>(shape).s, detail::shape_chars<R>(strides).s);
          last += strides[a] * (shape[a] - 1);
        }
        if constexpr (!std::is_const_v<T>) {
          // locus's rule for writable views (unsafe_view's): axes by increasing stride,
          // each stride must pass everything the smaller ones reach.
          std::size_t order[R];
          for (std::size_t a = 0; a < R; ++a) order[a] = a;
          for (std::size_t i = 1; i < R; ++i)
            for (std::size_t j = i; j > 0 && strides[order[j]] < strides[order[j - 1]]; --j) std::swap(order[j], order[j - 1]);
          index_t reach = 0;
          for (std::size_t a : order) {
            if (shape[a] <= 1) continue;
            if (strides[a] <= reach)
              detail::throw_shape_error("%s: shape %s with strides %s maps two elements to one address; a writable "
                                        "view must not overlap itself: take from_dlpack<const %s, %s, %zu> to read it",
                                        what, detail::shape_chars<R>(shape).s, detail::shape_chars<R>(strides).s,
                                        dtype_name<V>.data(), D::name.data(), R);
            reach += strides[a] * (shape[a] - 1);
          }
        }
      }
    }
  }

  // pointer: data + byte_offset, aligned for T
  T* p = nullptr;
  if (dl.data == nullptr) {
    if (n > 0)
      detail::throw_value_error("%s: the DLTensor's data is a null pointer, but its shape %s holds %lld elements", what,
                                detail::shape_chars<R>(shape).s, static_cast<long long>(n));
  } else {
    const auto base = reinterpret_cast<std::uintptr_t>(dl.data);
    if (dl.byte_offset > std::numeric_limits<std::uintptr_t>::max() - base)
      detail::throw_value_error("%s: data %p + byte_offset %llu wraps around the address space", what, dl.data,
                                static_cast<unsigned long long>(dl.byte_offset));
    const std::uintptr_t addr = base + static_cast<std::uintptr_t>(dl.byte_offset);
    if (addr % alignof(V) != 0)
      detail::throw_value_error("%s: expected a pointer aligned to %zu bytes for %s, found data %p + byte_offset %llu "
                                "= 0x%llx (%llu bytes past a multiple of %zu)",
                                what, alignof(V), dtype_name<V>.data(), dl.data,
                                static_cast<unsigned long long>(dl.byte_offset), static_cast<unsigned long long>(addr),
                                static_cast<unsigned long long>(addr % alignof(V)), alignof(V));
    p = reinterpret_cast<T*>(addr);
  }

  // bool: bytes other than 0 and 1 are not bools (host memory is read; cuda is not checked)
  if constexpr (std::is_same_v<V, bool> && D::host_accessible) {
    if (n > 0) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(p);
      extents<R> idx{};
      for (index_t k = 0; k < n; ++k) {
        index_t off = 0;
        for (std::size_t a = 0; a < R; ++a) off += idx[a] * strides[a];
        const unsigned char b = bytes[off];
        if (b > 1)
          detail::throw_value_error("%s: a bool element holds the byte %u (element %lld, index %s); bools are 0 or 1: "
                                    "take from_dlpack<u8, %s, %zu> for bytes",
                                    what, static_cast<unsigned>(b), static_cast<long long>(k),
                                    detail::shape_chars<R>(idx).s, D::name.data(), R);
        for (std::size_t a = R; a-- > 0;) {
          if (++idx[a] < shape[a]) break;
          idx[a] = 0;
        }
      }
    }
  }

  view_ = detail::raw_view<D>(p, shape, strides);
}

/// Takes ownership of a producer's DLManagedTensor and views it as tensor_view<T, D, R>
/// (zero-copy), after the checks listed at the top of this file; a refusal throws, and
/// the deleter has run by then. A null m is a value_error (nothing to release).
template <class T, class D, std::size_t R>
[[nodiscard]] dlpack_tensor<T, D, R> from_dlpack(DLManagedTensor* m) {
  if (m == nullptr) {
    char what[96];
    std::snprintf(what, sizeof what, "locus: from_dlpack<%s, %s, %zu>", dtype_name<std::remove_const_t<T>>.data(),
                  D::name.data(), R);
    detail::throw_value_error("%s: expected a DLManagedTensor, found a null pointer", what);
  }
  dlpack_tensor<T, D, R> h(m);  // owns m from here: a throw below calls m's deleter
  h.bind();
  return h;
}

}  // namespace locus
