// Matrix products. matmul(a, b) multiplies two rank-2 operands ([M, K] x [K, N]) or two
// rank-3 batches ([B, M, K] x [B, K, N]); transpose(x) is a view with the last two
// axes swapped (no copy), accepted by every GEMM without a copy either; linear(x, w,
// b, act) is the fused layer y = act(x w^T + b) with PyTorch's weight layout, and
// linear_into / matmul_into write into an existing destination (no allocation for f32/f64
// operands BLAS or cuBLASLt takes as they are; see matmul_into).
//
// The public functions check the type rules (same device, same dtype, ranks that can
// multiply, a floating dtype) and the shapes (shape_error naming both, destination
// untouched), then hand one GEMM description to the device's backend:
//   cpu, pinned  BLAS (backend/blas.hpp) or the blocked fallback; f16 and bf16 convert
//                to f32 around the call; bias and activation are one fused pass after it.
//   cuda         cuBLASLt (backend/cuda/cublaslt.hpp) with fused bias / ReLU / GELU-tanh
//                epilogues; exact GELU (and any epilogue cuBLASLt lacks for a dtype) runs
//                locus's epilogue kernel afterwards, which needs nvcc.
// Accumulation is f32 for f32, f16 and bf16 inputs (f64 for f64); matmul<float>(a, b)
// keeps an f16 or bf16 product in f32 instead of rounding it back.
//
// Length (over 600 lines): matmul, matmul_into, linear and linear_into share the
// operand classification (which layouts a GEMM takes as they are, which it copies) and
// the dispatch to BLAS, oneDNN or cuBLASLt; the back ends themselves are backend/.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "../backend/blas.hpp"
#include "../backend/launch.hpp"
#include "../core/error.hpp"
#include "../core/rules.hpp"
#include "../tensor/tensor.hpp"
#include "../transfer/copy.hpp"
#include "expr.hpp"
#include "math.hpp"

// cuBLASLt only where nvcc compiles: computing on cuda needs nvcc (the same rule as
// any kernel), and keeping <cublasLt.h> (with cuda_fp16.h and cuda_bf16.h) out of
// host-compiled files saves every user file a large share of its compile time.
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
#include "../backend/cuda/cublaslt.hpp"
#endif

namespace locus {

/// The activation linear() applies after the bias.
enum class activation {
  none,       ///< identity
  relu,       ///< max(x, 0)
  gelu,       ///< exact: 0.5 x (1 + erf(x / sqrt 2)), PyTorch's default GELU
  gelu_tanh,  ///< tanh approximation (PyTorch's approximate="tanh"); cuBLASLt's GELU epilogue
};

/// How f32 GEMMs may compute on cuda (PyTorch's torch.set_float32_matmul_precision).
/// `highest` (the default) is full f32 (CUBLAS_COMPUTE_32F). `high` opts in to TF32
/// tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32): inputs rounded to 10 mantissa bits,
/// f32 accumulation, several times faster, relative error around 1e-3. Host GEMMs and
/// f16/bf16/f64 inputs are not affected.
enum class matmul_precision { highest, high };

namespace detail {
inline std::atomic<matmul_precision>& float32_matmul_precision_ref() noexcept {
  static std::atomic<matmul_precision> p{matmul_precision::highest};
  return p;
}
}  // namespace detail

/// Sets the precision of f32 GEMMs on cuda for the whole process (see matmul_precision).
inline void set_float32_matmul_precision(matmul_precision p) noexcept {
  detail::float32_matmul_precision_ref().store(p, std::memory_order_relaxed);
}
inline matmul_precision float32_matmul_precision() noexcept {
  return detail::float32_matmul_precision_ref().load(std::memory_order_relaxed);
}

namespace detail {

/// Marker for matmul<OutT>: the output dtype defaults to the inputs' dtype.
struct input_dtype {};

template <class OutT, class T>
using matmul_out_t =
    std::conditional_t<std::is_same_v<OutT, input_dtype>, std::remove_cv_t<T>, OutT>;

// ---- type rules ----------------------------------------------------------------------

// Prevents: a rank-1 "matmul" that silently means a dot product, an outer product or a
// matrix-vector product depending on the library, and batch/rank mismatches.
template <std::size_t RA, std::size_t RB>
constexpr bool require_matmul_ranks() {
  if constexpr ((RA == 2 && RB == 2) || (RA == 3 && RB == 3)) {
    return true;
  } else if constexpr (RA == 0 && RB == 0) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 0 and 0; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 0 && RB == 1) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 0 and 1; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 0 && RB == 2) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 0 and 2; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 0 && RB == 3) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 0 and 3; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 0 && RB == 4) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 0 and 4; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 1 && RB == 0) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 1 and 0; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 1 && RB == 1) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 1 and 1; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 1 && RB == 2) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 1 and 2; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 1 && RB == 3) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 1 and 3; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 1 && RB == 4) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 1 and 4; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 2 && RB == 0) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 2 and 0; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 2 && RB == 1) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 2 and 1; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 2 && RB == 3) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 2 and 3; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 2 && RB == 4) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 2 and 4; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 3 && RB == 0) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 3 and 0; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 3 && RB == 1) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 3 and 1; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 3 && RB == 2) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 3 and 2; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 3 && RB == 4) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 3 and 4; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 4 && RB == 0) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 4 and 0; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 4 && RB == 1) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 4 and 1; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 4 && RB == 2) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 4 and 2; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 4 && RB == 3) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 4 and 3; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else if constexpr (RA == 4 && RB == 4) {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]), but got ranks 4 and 4; reshape first, e.g. a vector v of length K as v.reshape({1, K}) or v.reshape({K, 1}); for [B, M, K] x [K, N] flatten the batch: x.reshape({B * M, K}) (batches do not broadcast)");
    return false;
  } else {
    static_assert(always_false_v<RA>, "locus: matmul needs two rank-2 operands ([M, K] x [K, N]) or two rank-3 operands ([B, M, K] x [B, K, N]); reshape the operands first");
    return false;
  }
}

// Prevents: integer GEMMs that overflow silently, and bool products.
template <class T>
constexpr bool require_matmul_floating() {
  static_assert(dtype_traits<std::remove_cv_t<T>>::is_floating,
                "locus: matmul needs a floating dtype (f32, f64, f16 or bf16); convert integer "
                "operands into a tensor first: locus::eval(locus::cast<float>(x))");
  return dtype_traits<std::remove_cv_t<T>>::is_floating;
}

// Prevents: an output dtype that no backend produces (the product is only ever
// accumulated in f32 or f64; widening f16/bf16 to f32 keeps that accumulation).
template <class T, class O>
constexpr bool require_matmul_output() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, O> || (is_half_v<U> && std::is_same_v<O, float>)) {
    return true;
  } else {
    static_assert(always_false<O>,
                  "locus: a matmul or linear result has the inputs' dtype, or f32 for f16 or "
                  "bf16 inputs (accumulation is f32 either way), so this output dtype (the OutT "
                  "of matmul<OutT> or the destination's) cannot be produced; convert the result "
                  "instead with locus::cast<T>(...)");
    return false;
  }
}

/// The rules of matmul(a, b) producing dtype OutT (or the inputs' dtype).
template <class A, class B, class OutT>
constexpr bool check_matmul() {
  using XA = std::remove_cvref_t<A>;
  using XB = std::remove_cvref_t<B>;
  if constexpr (!TensorLike<XA> || !TensorLike<XB>) {
    static_assert(always_false<A>,
                  "locus: matmul takes tensors or tensor_views; evaluate an expression first "
                  "with locus::eval(x)");
    return false;
  } else {
    using ta = tensor_traits<XA>;
    using tb = tensor_traits<XB>;
    using T = typename ta::value_type;
    if constexpr (!require_same_operand_device<typename ta::device, typename tb::device>()) {
      return false;
    } else if constexpr (!require_matmul_dtype<T, typename tb::value_type>()) {
      return false;
    } else if constexpr (!require_matmul_ranks<ta::rank, tb::rank>()) {
      return false;
    } else if constexpr (!require_matmul_floating<T>()) {
      return false;
    } else {
      return require_matmul_output<T, matmul_out_t<OutT, T>>();
    }
  }
}

/// The rules of linear(x, w[, b]) producing dtype OutT: x [N, K], w [M, K], b [M] of
/// the output dtype.
template <class X, class W, class Bv, class OutT, bool HasBias>
constexpr bool check_linear() {
  using XX = std::remove_cvref_t<X>;
  using XW = std::remove_cvref_t<W>;
  using XB = std::conditional_t<HasBias, std::remove_cvref_t<Bv>, XX>;
  if constexpr (!TensorLike<XX> || !TensorLike<XW> || !TensorLike<XB>) {
    static_assert(always_false<X>,
                  "locus: linear takes tensors or tensor_views (x, w and the optional bias b); "
                  "evaluate an expression first with locus::eval(x)");
    return false;
  } else {
    using tx = tensor_traits<XX>;
    using tw = tensor_traits<XW>;
    using tbias = tensor_traits<XB>;
    using T = typename tx::value_type;
    using O = matmul_out_t<OutT, T>;
    if constexpr (!require_same_operand_device<typename tx::device, typename tw::device>()) {
      return false;
    } else if constexpr (!require_same_operand_device<typename tx::device, typename tbias::device>()) {
      return false;
    } else if constexpr (!require_matmul_dtype<T, typename tw::value_type>()) {
      return false;
    } else if constexpr (tx::rank != 2) {
      static_assert(always_false<X>,
                    "locus: linear needs x of rank 2 ([N, K]: N rows of K input features); "
                    "flatten leading axes first, e.g. x.reshape({B * T, K})");
      return false;
    } else if constexpr (tw::rank != 2) {
      static_assert(always_false<X>,
                    "locus: linear needs w of rank 2 ([M, K]: out_features x in_features, the "
                    "layout PyTorch stores); make a vector of K weights one row: w.reshape({1, K})");
      return false;
    } else if constexpr (HasBias && tbias::rank != 1) {
      static_assert(always_false<X>,
                    "locus: linear needs a bias of rank 1 ([M]: one value per output feature); "
                    "flatten it first, e.g. b.reshape({M}) for a [1, M] bias");
      return false;
    } else if constexpr (!require_matmul_floating<T>()) {
      return false;
    } else if constexpr (!require_matmul_output<T, O>()) {
      return false;
    } else if constexpr (HasBias) {
      // The bias is added in the output's dtype (as cuBLASLt's epilogue does).
      return require_bias_dtype<typename tbias::value_type, O>();
    } else {
      return true;
    }
  }
}

// ---- shapes --------------------------------------------------------------------------------

/// One GEMM problem: batch x ([m, k] x [k, n]).
struct matmul_dims {
  index_t batch, m, n, k;
};

template <std::size_t R>
matmul_dims matmul_dims_of(const extents<R>& a, const extents<R>& b) {
  if constexpr (R == 2) {
    if (a[1] != b[0])
      throw shape_error("locus: matmul of shapes " + shape_string(a) + " and " + shape_string(b) +
                        ": the inner extents differ (" + std::to_string(a[1]) + " vs " +
                        std::to_string(b[0]) +
                        "); [M, K] x [K, N] needs the first operand's last extent to equal the "
                        "second's first (locus::transpose(x) swaps axes without copying)");
    return {1, a[0], b[1], a[1]};
  } else {
    if (a[0] != b[0])
      throw shape_error("locus: batched matmul of shapes " + shape_string(a) + " and " +
                        shape_string(b) + ": the batch extents differ (" + std::to_string(a[0]) +
                        " vs " + std::to_string(b[0]) + "); [B, M, K] x [B, K, N] needs the same B");
    if (a[2] != b[1])
      throw shape_error("locus: batched matmul of shapes " + shape_string(a) + " and " +
                        shape_string(b) + ": the inner extents differ (" + std::to_string(a[2]) +
                        " vs " + std::to_string(b[1]) +
                        "); [B, M, K] x [B, K, N] needs the first operand's last extent to equal "
                        "the second's middle one (locus::transpose(x) swaps the last two axes)");
    return {a[0], a[1], b[2], a[2]};
  }
}

template <std::size_t R>
extents<R> matmul_result_shape(const matmul_dims& d) {
  if constexpr (R == 2) return {d.m, d.n};
  else return {d.batch, d.m, d.n};
}

template <std::size_t R>
void check_destination_shape(const char* what, const std::string& operands,
                             const extents<R>& want, const extents<R>& got) {
  if (want != got)
    throw shape_error(std::string("locus: ") + what + " of " + operands + " gives shape " +
                      shape_string(want) + ", but the destination has shape " + shape_string(got) +
                      " (the destination was not changed)");
}

inline matmul_dims linear_dims(const extents<2>& x, const extents<2>& w, const extents<1>* b) {
  if (x[1] != w[1])
    throw shape_error("locus: linear with x of shape " + shape_string(x) + " and w of shape " +
                      shape_string(w) + ": the in-feature extents differ (" + std::to_string(x[1]) +
                      " vs " + std::to_string(w[1]) +
                      "); w is [out_features, in_features] as in PyTorch, y = x w^T + b");
  if (b && (*b)[0] != w[0])
    throw shape_error("locus: linear with w of shape " + shape_string(w) +
                      " needs a bias of shape [" + std::to_string(w[0]) + "], but b has shape " +
                      shape_string(*b));
  return {1, x[0], w[0], x[1]};
}

// ---- operands, overlap, layout of the output -------------------------------------------------

template <class T, class D, std::size_t R>
gemm_operand<T> operand_of(const tensor_view<T, D, R>& v) noexcept {
  const auto& s = v.strides();
  if constexpr (R == 2) return {v.data_handle(), 0, s[0], s[1]};
  else return {v.data_handle(), s[0], s[1], s[2]};
}

/// Can the GEMM write into c directly: unit column stride, rows (and batches) that do
/// not overlap?
template <class O, class D, std::size_t R>
bool gemm_output_ok(const tensor_view<O, D, R>& c, const matmul_dims& d) noexcept {
  const auto& st = c.strides();
  const index_t rs = d.m <= 1 ? d.n : st[R - 2];
  if (d.n > 1 && st[R - 1] != 1) return false;
  if (rs < d.n) return false;
  if constexpr (R == 3) {
    if (d.batch > 1 && st[0] < (d.m - 1) * rs + d.n) return false;
  }
  return true;
}

template <class O, class D, std::size_t R>
gemm_operand<O> output_operand(const tensor_view<O, D, R>& c, const matmul_dims& d) noexcept {
  const auto& st = c.strides();
  const index_t rs = d.m <= 1 ? d.n : st[R - 2];
  index_t bs = d.m * rs;
  if constexpr (R == 3) {
    if (d.batch > 1) bs = st[0];
  }
  return {c.data_handle(), bs, rs, 1};
}

/// The bias the GEMM adds: n values of the output dtype with a stride; p == nullptr: none.
template <class O>
struct gemm_bias {
  const O* p = nullptr;
  index_t stride = 1;
};

// ---- the epilogue: bias, activation and dtype conversion in one pass ------------------------

struct act_identity {
  template <class C>
  LOCUS_HOST_DEVICE C operator()(C x) const {
    return x;
  }
};

/// out[b, i, j] = act(in[b, i, j] + bias[j]) for every element; in == nullptr reads
/// zeros (an empty inner dimension). One functor for host and device.
template <class Act, class In, class Out>
struct gemm_epilogue_kernel {
  const In* in;
  index_t in_bs, in_rs;
  Out* out;
  index_t out_bs, out_rs;
  const Out* bias;
  index_t bias_stride;
  index_t m, n;
  index_t batch;  // matrices (the device form derives its index from i alone)
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    using C = compute_t<In>;
    const index_t j = i % n, r = i / n, row = r % m, bi = r / m;
    C v = in ? static_cast<C>(load(in[bi * in_bs + row * in_rs + j])) : C(0);
    if (bias) v += static_cast<C>(load(bias[j * bias_stride]));
    out[bi * out_bs + row * out_rs + j] = store<Out>(Act{}(v));
  }
};

/// gemm_epilogue_kernel's arithmetic on the host, a row at a time: the inner loop over
/// a row's contiguous columns has no index arithmetic and vectorises (ReLU, identity),
/// rows are shared among OpenMP threads when there are enough elements.
template <class Act, class In, class Out>
void gemm_epilogue_host(const gemm_epilogue_kernel<Act, In, Out>& k) {
  using C = compute_t<In>;
  const index_t n = k.n, total_rows = k.m * k.batch;
  // One row a task; a single long row is split into column blocks instead.
  const index_t col_block = total_rows == 1 ? 4096 : n;
  const index_t col_blocks = (n + col_block - 1) / col_block, tasks = total_rows * col_blocks;
  [[maybe_unused]] const bool parallel = tasks > 1 && total_rows * n >= host_parallel_threshold;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (index_t t = 0; t < tasks; ++t) {
    const index_t r = t / col_blocks, j0 = (t % col_blocks) * col_block;
    const index_t nj = n - j0 < col_block ? n - j0 : col_block;
    const index_t bi = r / k.m, row = r % k.m;
    const In* src = k.in ? k.in + bi * k.in_bs + row * k.in_rs + j0 : nullptr;
    Out* dst = k.out + bi * k.out_bs + row * k.out_rs + j0;
    const Out* __restrict b = k.bias ? k.bias + j0 * k.bias_stride : nullptr;
    if constexpr (std::is_same_v<In, Out>) {
      if (static_cast<const void*>(src) == static_cast<const void*>(dst)) {  // in place: the usual f32 case
        Out* __restrict d = dst;
        if (b && k.bias_stride == 1) {
          for (index_t j = 0; j < nj; ++j)
            d[j] = store<Out>(Act{}(static_cast<C>(load(d[j])) + static_cast<C>(load(b[j]))));
        } else if (!b) {
          for (index_t j = 0; j < nj; ++j) d[j] = store<Out>(Act{}(static_cast<C>(load(d[j]))));
        } else {
          for (index_t j = 0; j < nj; ++j)
            d[j] = store<Out>(Act{}(static_cast<C>(load(d[j])) + static_cast<C>(load(b[j * k.bias_stride]))));
        }
        continue;
      }
    }
    if (src && b && k.bias_stride == 1) {
      for (index_t j = 0; j < nj; ++j)
        dst[j] = store<Out>(Act{}(static_cast<C>(load(src[j])) + static_cast<C>(load(b[j]))));
    } else if (src && !b) {
      for (index_t j = 0; j < nj; ++j) dst[j] = store<Out>(Act{}(static_cast<C>(load(src[j]))));
    } else {
      for (index_t j = 0; j < nj; ++j) {
        C v = src ? static_cast<C>(load(src[j])) : C(0);
        if (b) v += static_cast<C>(load(b[j * k.bias_stride]));
        dst[j] = store<Out>(Act{}(v));
      }
    }
  }
}

template <class D, class In, class Out>
void run_gemm_epilogue(activation act, gemm_operand<const In> in, gemm_operand<Out> out,
                       gemm_bias<Out> bias, const matmul_dims& d) {
  const index_t count = d.batch * d.m * d.n;
  if (count <= 0) return;
  if constexpr (D::host_accessible) {
    const auto host = [&](auto op) {
      gemm_epilogue_host(gemm_epilogue_kernel<decltype(op), In, Out>{
          in.p, in.bs, in.rs, out.p, out.bs, out.rs, bias.p, bias.stride, d.m, d.n, d.batch});
    };
    switch (act) {
      case activation::none: host(act_identity{}); break;
      case activation::relu: host(op::relu{}); break;
      case activation::gelu: host(op::gelu_erf{}); break;
      case activation::gelu_tanh: host(op::gelu_tanh{}); break;
    }
    return;
  }
  const auto make = [&](auto op) {
    return gemm_epilogue_kernel<decltype(op), In, Out>{in.p,   in.bs,  in.rs,       out.p, out.bs,
                                                       out.rs, bias.p, bias.stride, d.m,   d.n, d.batch};
  };
  switch (act) {
    case activation::none: launch_n<D>(count, make(act_identity{})); break;
    case activation::relu: launch_n<D>(count, make(op::relu{})); break;
    case activation::gelu: launch_n<D>(count, make(op::gelu_erf{})); break;
    case activation::gelu_tanh: launch_n<D>(count, make(op::gelu_tanh{})); break;
  }
}

// ---- host: BLAS or the fallback, f16/bf16 through f32 -----------------------------------------

/// f16/bf16 -> f32 of a strided operand into contiguous [batch, rows, cols].
template <class T>
struct widen_strided {
  const T* src;
  index_t bs, rs, cs, rows, cols;
  float* dst;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const index_t j = i % cols, r = i / cols, row = r % rows, bi = r / rows;
    dst[i] = static_cast<float>(src[bi * bs + row * rs + j * cs]);
  }
};

template <class T, class D, std::size_t R>
tensor<float, cpu, 3> widen_to_f32(const tensor_view<const T, D, R>& v, index_t batch,
                                   index_t rows, index_t cols) {
  tensor<float, cpu, 3> out(extents<3>{batch, rows, cols});
  if (v.is_contiguous()) {
    convert_n(v.data_handle(), out.data_handle(), static_cast<std::size_t>(out.numel()));
  } else {
    const gemm_operand<const T> o = operand_of(v);
    launch_n<cpu>(out.numel(), widen_strided<T>{o.p, o.bs, o.rs, o.cs, rows, cols, out.data_handle()});
  }
  return out;
}

template <class O, class T, class D, std::size_t R>
void host_gemm_engine(const gemm_operand<O>& c, const tensor_view<const T, D, R>& a,
                      const tensor_view<const T, D, R>& b, gemm_bias<O> bias, activation act,
                      const matmul_dims& d, bool accumulate) {
  const bool epilogue = bias.p != nullptr || act != activation::none;
  const gemm_operand<const O> c_in{c.p, c.bs, c.rs, c.cs};
  if (accumulate && d.k == 0) return;  // c += nothing
  if (d.k == 0) {
    run_gemm_epilogue<D, O, O>(act, {nullptr, 0, 0, 0}, c, bias, d);
  } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    host_gemm<T>(d.batch, d.m, d.n, d.k, operand_of(a), operand_of(b), c, accumulate);
    if (epilogue) run_gemm_epilogue<D, O, O>(act, c_in, c, bias, d);
  } else {
    // f16 / bf16: widen to f32, multiply in f32, then one pass adds the bias, applies the
    // activation and rounds to the output dtype.
    const auto af = widen_to_f32(a, d.batch, d.m, d.k);
    const auto bf = widen_to_f32(b, d.batch, d.k, d.n);
    const gemm_operand<const float> ao{af.data_handle(), d.m * d.k, d.k, 1};
    const gemm_operand<const float> bo{bf.data_handle(), d.k * d.n, d.n, 1};
    if constexpr (std::is_same_v<O, float>) {
      host_gemm<float>(d.batch, d.m, d.n, d.k, ao, bo, c, accumulate);
      if (epilogue) run_gemm_epilogue<D, float, float>(act, c_in, c, bias, d);
    } else {
      tensor<float, cpu, 3> cf(extents<3>{d.batch, d.m, d.n});
      const gemm_operand<float> co{cf.data_handle(), d.m * d.n, d.n, 1};
      host_gemm<float>(d.batch, d.m, d.n, d.k, ao, bo, co);
      run_gemm_epilogue<D, float, O>(act, {co.p, co.bs, co.rs, co.cs}, c, bias, d);
    }
  }
}

// ---- cuda: cuBLASLt ------------------------------------------------------------------------------

#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
/// A contiguous copy of a cuda view (a gather kernel: nvcc only).
template <class T, class D, std::size_t R>
tensor<std::remove_cv_t<T>, D, R> cuda_contiguous(const tensor_view<T, D, R>& v, const char* what) {
  using U = std::remove_cv_t<T>;
  (void)what;
  return tensor<U, D, R>(to_expr(v));
}

template <class O, class T, class D, std::size_t R>
void cuda_gemm_engine(const gemm_operand<O>& c, const tensor_view<const T, D, R>& a,
                      const tensor_view<const T, D, R>& b, gemm_bias<O> bias, activation act,
                      const matmul_dims& d, bool accumulate) {
  const gemm_operand<const O> c_in{c.p, c.bs, c.rs, c.cs};
  if (accumulate && d.k == 0) return;  // c += nothing
  if (d.k == 0) {
    if (!bias.p) {  // every activation maps 0 to 0
      for (index_t bi = 0; bi < d.batch; ++bi)
        LOCUS_CUDA_CHECK(cudaMemset2DAsync(c.p + bi * c.bs, static_cast<std::size_t>(c.rs) * sizeof(O), 0,
                                           static_cast<std::size_t>(d.n) * sizeof(O),
                                           static_cast<std::size_t>(d.m), current_stream()));
    } else {
      run_gemm_epilogue<D, O, O>(act, {nullptr, 0, 0, 0}, c, bias, d);
    }
    return;
  }

  gemm_operand<const T> ao = operand_of(a), bo = operand_of(b);
  std::optional<blas_layout> la = blas_layout_of(d.m, d.k, ao.rs, ao.cs);
  std::optional<blas_layout> lb = blas_layout_of(d.k, d.n, bo.rs, bo.cs);
  tensor<T, D, R> a_copy, b_copy;
  if (!la) {
    a_copy = cuda_contiguous(a, "a matmul operand");
    ao = operand_of(std::as_const(a_copy).view());
    la = blas_layout{false, imax(d.k, 1)};
  }
  if (!lb) {
    b_copy = cuda_contiguous(b, "a matmul operand");
    bo = operand_of(std::as_const(b_copy).view());
    lb = blas_layout{false, imax(d.n, 1)};
  }
  tensor<O, D, 1> bias_copy;
  if (bias.p && bias.stride != 1 && d.n > 1) {
    bias_copy = cuda_contiguous(tensor_view<const O, D, 1>(raw_view_key{}, bias.p, extents<1>{d.n}, extents<1>{bias.stride}),
                                "a strided bias");
    bias = {bias_copy.data_handle(), 1};
  }

  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  if constexpr (std::is_same_v<T, double>) {
    compute = CUBLAS_COMPUTE_64F;
    scale = CUDA_R_64F;
  } else if constexpr (std::is_same_v<T, float>) {
    if (float32_matmul_precision() == matmul_precision::high) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  }

  // cuBLASLt's GELU epilogue is the tanh approximation; exact GELU runs afterwards.
  const bool fuse_act = act != activation::gelu;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (act == activation::relu) epi = bias.p ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  else if (act == activation::gelu_tanh) epi = bias.p ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  else if (bias.p) epi = CUBLASLT_EPILOGUE_BIAS;

  cublaslt_gemm_args g{cublaslt_type<T>(), cublaslt_type<O>(), compute, scale, d.batch, d.m, d.n, d.k,
                       ao.p, *la, ao.bs, bo.p, *lb, bo.bs, c.p, c.rs, c.bs, epi, bias.p, accumulate};
  bool bias_done = bias.p != nullptr, act_done = fuse_act;
  if (!cublaslt_gemm(g)) {
    const std::string problem = "batch " + std::to_string(d.batch) + ", m " + std::to_string(d.m) +
                                ", n " + std::to_string(d.n) + ", k " + std::to_string(d.k) + ", " +
                                std::string(dtype_name<T>) + " inputs, " +
                                std::string(dtype_name<O>) + " output";
    if (epi == CUBLASLT_EPILOGUE_DEFAULT)
      throw cuda_error("cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__,
                       static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED),
                       "cuBLASLt has no algorithm for this matmul (" + problem + ")");
    // No fused epilogue for this problem: plain GEMM, then locus's epilogue kernel.
    g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = nullptr;
    bias_done = false;
    act_done = false;
    if (!cublaslt_gemm(g))
      throw cuda_error("cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__,
                       static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED),
                       "cuBLASLt has no algorithm for this matmul (" + problem + ")");
  }
  const bool need_bias = bias.p != nullptr && !bias_done;
  const bool need_act = act != activation::none && !act_done;
  if (need_bias || need_act) {
    run_gemm_epilogue<D, O, O>(need_act ? act : activation::none, c_in, c,
                               need_bias ? bias : gemm_bias<O>{}, d);
  }
}
#endif

/// c = act(a b + bias) for validated shapes d (c += a b with accumulate, which takes no
/// bias or activation): picks the device's backend. Computes into a temporary first when
/// c cannot take the GEMM's output directly (strided columns, overlapping rows) or
/// overlaps an operand.
template <class O, class T, class D, std::size_t R>
void gemm_engine(const tensor_view<O, D, R>& c, const tensor_view<const T, D, R>& a,
                 const tensor_view<const T, D, R>& b, gemm_bias<O> bias, activation act,
                 const matmul_dims& d, bool accumulate = false) {
  check_same_gpu<D>("a matrix product (matmul, linear)", c, a, b);
  if (d.batch == 0 || d.m == 0 || d.n == 0) return;
  const byte_range rc = range_of(c);
  const bool bias_overlaps =
      bias.p && ranges_overlap(rc, range_of(static_cast<const void*>(bias.p), extents<1>{d.n},
                                            extents<1>{bias.stride}, sizeof(O)));
  if (!gemm_output_ok(c, d) || ranges_overlap(rc, range_of(a)) || ranges_overlap(rc, range_of(b)) ||
      bias_overlaps) {
    // Elementwise assignments, not copy(): they take strided views on every device
    // (copy() of a non-contiguous cuda view would need a gather it does not have).
    tensor<O, D, R> tmp(c.shape());
    if (accumulate) evaluate_into(tmp.view(), to_expr(c));
    gemm_engine(tmp.view(), a, b, bias, act, d, accumulate);
    evaluate_into(c, to_expr(std::as_const(tmp).view()));
    return;
  }
  const gemm_operand<O> co = output_operand(c, d);
  if constexpr (std::is_same_v<typename D::execution, host_execution>) {
    host_gemm_engine(co, a, b, bias, act, d, accumulate);
  } else if constexpr (require_kernel_compiler<D>()) {
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
    cuda_gemm_engine(co, a, b, bias, act, d, accumulate);
#endif
  }
}

template <class T, class D, std::size_t R>
tensor_view<T, D, R> swap_last_axes(const tensor_view<T, D, R>& v) noexcept {
  extents<R> s = v.shape(), st = v.strides();
  std::swap(s[R - 1], s[R - 2]);
  std::swap(st[R - 1], st[R - 2]);
  return {raw_view_key{}, v.data_handle(), s, st, v.device_index()};
}

}  // namespace detail

// ---- public API -------------------------------------------------------------------------------

/// A view with the last two axes swapped: [M, N] -> [N, M], [B, M, N] -> [B, N, M]. No
/// copy; every GEMM takes it without copying either. The tensor must outlive the view.
template <class X>
auto transpose(X&& x) {
  using XX = std::remove_cvref_t<X>;
  using tr = detail::tensor_traits<XX>;
  if constexpr (!TensorLike<XX>) {
    static_assert(detail::always_false<X>,
                  "locus: transpose() takes a tensor or tensor_view (it swaps strides; an expression "
                  "has none); evaluate the expression first: auto t = locus::eval(x); locus::transpose(t)");
    return detail::invalid_expr{};
  } else if constexpr (tr::is_tensor && !std::is_lvalue_reference_v<X>) {
    static_assert(detail::always_false<X>,
                  "locus: transpose() of a temporary tensor would return a view of memory freed "
                  "at the end of the statement; name the tensor first (auto t = ...; "
                  "locus::transpose(t))");
    return detail::invalid_expr{};
  } else if constexpr (tr::rank < 2) {
    static_assert(detail::always_false<X>,
                  "locus: transpose() swaps the last two axes, so it needs rank 2 or more; "
                  "make a vector a row or column first with v.reshape({1, K}) or v.reshape({K, 1})");
    return detail::invalid_expr{};
  } else {
    return detail::swap_last_axes(detail::as_view(x));
  }
}

/// The matrix product of two rank-2 operands ([M, K] x [K, N] -> [M, N]) or of two
/// rank-3 batches ([B, M, K] x [B, K, N] -> [B, M, N]), as a new tensor on their device.
/// Operands may be tensors or views, transposed or strided. matmul<float>(a, b) keeps
/// the f32 accumulation of f16 or bf16 operands instead of rounding the result back.
/// Same device and dtype are compile-time rules; inner extents that differ throw
/// shape_error naming both shapes.
template <class OutT = detail::input_dtype, class A, class B>
auto matmul(const A& a, const B& b) {
  if constexpr (detail::check_matmul<A, B, OutT>()) {
    using ta = detail::tensor_traits<std::remove_cvref_t<A>>;
    using T = typename ta::value_type;
    using O = detail::matmul_out_t<OutT, T>;
    constexpr std::size_t R = ta::rank;
    const auto av = detail::as_view_const(a);
    const auto bv = detail::as_view_const(b);
    const detail::matmul_dims d = detail::matmul_dims_of(av.shape(), bv.shape());
    tensor<O, typename ta::device, R> out(detail::matmul_result_shape<R>(d));
    detail::gemm_engine(out.view(), av, bv, detail::gemm_bias<O>{}, activation::none, d);
    return out;
  } else {
    return detail::invalid_expr{};
  }
}

/// Tag for matmul_into(c, a, b, locus::accumulate): c += a b (BLAS's beta = 1), as
/// gradient accumulation needs, without a temporary for the product.
struct accumulate_t {
  explicit accumulate_t() = default;
};
inline constexpr accumulate_t accumulate{};

namespace detail {
template <class C, class A, class B>
void matmul_into_impl(C&& c, const A& a, const B& b, bool accum);
}  // namespace detail

/// matmul(a, b) written into an existing tensor or view (no allocation when c can take
/// the GEMM's output directly). c's dtype is the output dtype (the inputs', or f32 for
/// f16/bf16 inputs). A shape mismatch throws shape_error and leaves c unchanged.
namespace detail {
// Prevents: matmul_into(tmp(), a, b) and linear_into into a temporary tensor: the result
// is lost with it.
template <class C>
constexpr bool require_named_product() {
  if constexpr (tensor_traits<std::remove_cvref_t<C>>::is_tensor && !std::is_lvalue_reference_v<C>) {
    static_assert(always_false<C>, "locus: the destination of matmul_into/linear_into is a temporary tensor, so the "
                                   "product would be lost with it; write into a named tensor or a view of one, or "
                                   "take the result: auto c = locus::matmul(a, b);");
    return false;
  } else {
    return true;
  }
}
}  // namespace detail

template <class C, class A, class B>
void matmul_into(C&& c, const A& a, const B& b) {
  if constexpr (detail::require_named_product<C>()) detail::matmul_into_impl(std::forward<C>(c), a, b, false);
}

/// c += matmul(a, b): accumulates into c (f32 or f64; f16/bf16 operands accumulate into
/// an f32 c). A shape mismatch throws shape_error and leaves c unchanged.
template <class C, class A, class B>
void matmul_into(C&& c, const A& a, const B& b, accumulate_t) {
  if constexpr (!detail::require_named_product<C>()) {
  } else if constexpr (!TensorLike<std::remove_cvref_t<C>>) {
    detail::matmul_into_impl(std::forward<C>(c), a, b, true);  // reports the destination rule
  } else {
    using O = typename detail::tensor_traits<std::remove_cvref_t<C>>::value_type;
    static_assert(std::is_same_v<O, float> || std::is_same_v<O, double>,
                  "locus: matmul_into(..., locus::accumulate) adds into an f32 or f64 destination "
                  "(f16/bf16 operands accumulate into f32); accumulating into f16/bf16 would round "
                  "every partial sum");
    if constexpr (std::is_same_v<O, float> || std::is_same_v<O, double>)
      detail::matmul_into_impl(std::forward<C>(c), a, b, true);
  }
}

namespace detail {
template <class C, class A, class B>
void matmul_into_impl(C&& c, const A& a, const B& b, bool accum) {
  using XC = std::remove_cvref_t<C>;
  if constexpr (!TensorLike<XC>) {
    static_assert(detail::always_false<C>,
                  "locus: matmul_into writes into a tensor or tensor_view, but the destination is "
                  "an expression or another type; pass the destination tensor itself, or write "
                  "auto c = locus::matmul(a, b)");
  } else {
    using tc = detail::tensor_traits<XC>;
    using O = typename tc::value_type;
    if constexpr (std::is_const_v<typename tc::element_type> ||
                  (tc::is_tensor && std::is_const_v<std::remove_reference_t<C>>)) {
      static_assert(detail::always_false<C>,
                    "locus: matmul_into destination is const (a const tensor or a view of const "
                    "elements); pass a mutable tensor or tensor_view");
    } else if constexpr (detail::check_matmul<A, B, O>()) {
      using ta = detail::tensor_traits<std::remove_cvref_t<A>>;
      if constexpr (detail::require_same_operand_device<typename ta::device, typename tc::device>() &&
                    detail::require_assign_rank<tc::rank, ta::rank>()) {
        constexpr std::size_t R = ta::rank;
        const auto av = detail::as_view_const(a);
        const auto bv = detail::as_view_const(b);
        auto cv = detail::as_view(c);
        const detail::matmul_dims d = detail::matmul_dims_of(av.shape(), bv.shape());
        detail::check_destination_shape(
            "matmul", "shapes " + detail::shape_string(av.shape()) + " and " + detail::shape_string(bv.shape()),
            detail::matmul_result_shape<R>(d), cv.shape());
        detail::gemm_engine(cv, av, bv, detail::gemm_bias<O>{}, activation::none, d, accum);
      }
    }
  }
}
}  // namespace detail

namespace detail {
template <class OutT, class X, class W, class Bv, bool HasBias>
auto linear_impl(const X& x, const W& w, const Bv* b, activation act) {
  if constexpr (check_linear<X, W, Bv, OutT, HasBias>()) {
    using tx = tensor_traits<std::remove_cvref_t<X>>;
    using T = typename tx::value_type;
    using O = matmul_out_t<OutT, T>;
    const auto xv = as_view_const(x);
    const auto wv = as_view_const(w);
    gemm_bias<O> bias{};
    const extents<1>* bshape = nullptr;
    extents<1> bs{};
    if constexpr (HasBias) {
      const auto bv = as_view_const(*b);
      bias = {bv.data_handle(), bv.strides()[0]};
      bs = bv.shape();
      bshape = &bs;
    }
    const matmul_dims d = linear_dims(xv.shape(), wv.shape(), bshape);
    tensor<O, typename tx::device, 2> y(extents<2>{d.m, d.n});
    gemm_engine(y.view(), xv, swap_last_axes(wv), bias, act, d);
    return y;
  } else {
    return invalid_expr{};
  }
}

template <class Y, class X, class W, class Bv, bool HasBias>
void linear_into_impl(Y&& y, const X& x, const W& w, const Bv* b, activation act) {
  using XY = std::remove_cvref_t<Y>;
  if constexpr (!TensorLike<XY>) {
    static_assert(always_false<Y>,
                  "locus: linear_into writes into a tensor or tensor_view, but the destination is "
                  "an expression or another type; pass the destination tensor itself, or write "
                  "auto y = locus::linear(x, w, b)");
  } else {
    using ty = tensor_traits<XY>;
    using O = typename ty::value_type;
    if constexpr (std::is_const_v<typename ty::element_type> ||
                  (ty::is_tensor && std::is_const_v<std::remove_reference_t<Y>>)) {
      static_assert(always_false<Y>,
                    "locus: linear_into destination is const (a const tensor or a view of const "
                    "elements); pass a mutable tensor or tensor_view");
    } else if constexpr (check_linear<X, W, Bv, O, HasBias>()) {
      using tx = tensor_traits<std::remove_cvref_t<X>>;
      if constexpr (require_same_operand_device<typename tx::device, typename ty::device>() &&
                    require_assign_rank<ty::rank, 2>()) {
        const auto xv = as_view_const(x);
        const auto wv = as_view_const(w);
        auto yv = as_view(y);
        gemm_bias<O> bias{};
        const extents<1>* bshape = nullptr;
        extents<1> bs{};
        if constexpr (HasBias) {
          const auto bv = as_view_const(*b);
          bias = {bv.data_handle(), bv.strides()[0]};
          bs = bv.shape();
          bshape = &bs;
        }
        const matmul_dims d = linear_dims(xv.shape(), wv.shape(), bshape);
        check_destination_shape("linear", "x of shape " + shape_string(xv.shape()) + " and w of shape " +
                                              shape_string(wv.shape()),
                                extents<2>{d.m, d.n}, yv.shape());
        gemm_engine(yv, xv, swap_last_axes(wv), bias, act, d);
      }
    }
  }
}
}  // namespace detail

/// The fused linear layer y = act(x w^T + b): x [N, K], w [M, K] (PyTorch's layout:
/// out_features x in_features), b [M] -> y [N, M]. One GEMM with the bias and the
/// activation fused after it (cuBLASLt epilogues on cuda, one pass on the host).
/// linear<float>(x, w, b) keeps f16/bf16 inputs' f32 accumulation; b has the output's
/// dtype.
template <class OutT = detail::input_dtype, class X, class W, class Bv>
  requires(!std::is_same_v<std::remove_cvref_t<Bv>, activation>)
auto linear(const X& x, const W& w, const Bv& b, activation act = activation::none) {
  return detail::linear_impl<OutT, X, W, Bv, true>(x, w, &b, act);
}

/// linear without a bias: y = act(x w^T).
template <class OutT = detail::input_dtype, class X, class W>
auto linear(const X& x, const W& w, activation act = activation::none) {
  return detail::linear_impl<OutT, X, W, X, false>(x, w, nullptr, act);
}

/// linear(x, w, b, act) written into an existing [N, M] tensor or view y (no
/// allocation): for training loops. y's dtype is the output dtype; a shape mismatch
/// throws shape_error and leaves y unchanged.
template <class Y, class X, class W, class Bv>
  requires(!std::is_same_v<std::remove_cvref_t<Bv>, activation>)
void linear_into(Y&& y, const X& x, const W& w, const Bv& b, activation act = activation::none) {
  if constexpr (detail::require_named_product<Y>())
    detail::linear_into_impl<Y, X, W, Bv, true>(std::forward<Y>(y), x, w, &b, act);
}

/// linear_into without a bias.
template <class Y, class X, class W>
void linear_into(Y&& y, const X& x, const W& w, activation act = activation::none) {
  if constexpr (detail::require_named_product<Y>())
    detail::linear_into_impl<Y, X, W, X, false>(std::forward<Y>(y), x, w, nullptr, act);
}

}  // namespace locus
