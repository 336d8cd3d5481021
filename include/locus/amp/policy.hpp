// Precision policies: types that name the dtype a model computes in and the dtype of
// its master weights (the copy the optimizer updates).
//
//   amp::fp32        compute f32,  master f32
//   amp::bf16_mixed  compute bf16, master f32  (bf16 has f32's range: no loss scaling)
//   amp::fp16_mixed  compute f16,  master f32  (needs a grad_scaler: f16 gradients
//                                               underflow without loss scaling)
//   amp::fp64        compute f64,  master f64  (gradient checks and numerics)
//
// A policy is any type with `compute`, `master`, `requires_loss_scaling` and `name`;
// check_policy<P>() rejects master weights in f16 or bf16 at compile time. Loss scaling
// (a grad_scaler) follows from f16 compute itself: requires_loss_scaling = false does
// not lift it; the flag can only add the need to a policy of another compute dtype
// (amp::needs_loss_scaling<P>).
#pragma once

#include <string_view>
#include <type_traits>

#include "../core/dtype.hpp"
#include "../core/rules.hpp"
#include "../core/rules_train.hpp"

namespace locus::amp {

struct fp32 {
  using compute = float;
  using master = float;
  static constexpr bool requires_loss_scaling = false;
  static constexpr std::string_view name = "fp32";
};

struct bf16_mixed {
  using compute = ::locus::bf16;
  using master = float;
  static constexpr bool requires_loss_scaling = false;
  static constexpr std::string_view name = "bf16";
};

struct fp16_mixed {
  using compute = ::locus::f16;
  using master = float;
  static constexpr bool requires_loss_scaling = true;
  static constexpr std::string_view name = "fp16";
};

struct fp64 {
  using compute = double;
  using master = double;
  static constexpr bool requires_loss_scaling = false;
  static constexpr std::string_view name = "fp64";
};

/// A precision policy: the dtypes a model computes and keeps its weights in.
template <class P>
concept precision_policy = requires {
  typename P::compute;
  typename P::master;
  { P::requires_loss_scaling } -> std::convertible_to<bool>;
  { P::name } -> std::convertible_to<std::string_view>;  // checkpoints record it
};

/// Whether training with policy P needs loss scaling: always when it computes in f16
/// (f16 gradients below 6e-8 flush to zero, whatever the policy declares), and
/// whenever P::requires_loss_scaling says so.
template <precision_policy P>
inline constexpr bool needs_loss_scaling =
    std::is_same_v<std::remove_cv_t<typename P::compute>, ::locus::f16> || static_cast<bool>(P::requires_loss_scaling);

}  // namespace locus::amp

namespace locus::detail {

// Prevents: training with f16/bf16 master weights, where updates smaller than half an
// ulp of the weight (lr * grad is usually that small) round away and training stalls.
template <class P>
constexpr bool check_policy() {
  if constexpr (!amp::precision_policy<P>) {
    static_assert(always_false<P>,
                  "locus: a precision policy needs `compute`, `master`, "
                  "`requires_loss_scaling` and `name`, but this type lacks at least one of them; "
                  "use locus::amp::fp32, bf16_mixed or fp16_mixed, or declare all four");
    return false;
  } else if constexpr (is_half_v<typename P::master>) {
    static_assert(always_false<P>,
                  "locus: master weights in f16 or bf16 lose every update smaller than half a "
                  "unit in the last place, so training stalls; keep master weights in f32 "
                  "(locus::amp::bf16_mixed or fp16_mixed compute in 16 bits with f32 master "
                  "weights)");
    return false;
  } else if constexpr (!std::is_same_v<typename P::master, float> &&
                       !std::is_same_v<typename P::master, double>) {
    static_assert(always_false<P>,
                  "locus: master weights must be f32 (or f64), but the policy's `master` is "
                  "another type; declare `using master = float;`");
    return false;
  } else if constexpr (!std::is_floating_point_v<typename P::compute> &&
                       !is_half_v<typename P::compute>) {
    static_assert(always_false<P>,
                  "locus: a policy computes in f32, f64, bf16 or f16, but its `compute` is another "
                  "type; declare `using compute = float;` (or locus::bf16, locus::f16)");
    return false;
  } else {
    return true;
  }
}

/// P when check_policy<P>() passes, else amp::fp32 (after check_policy has reported
/// why): a class that names its dtypes through it reports one error for a bad policy,
/// check_policy's own, instead of one per member that names P::compute or P::master.
template <class P>
using checked_policy_t = std::conditional_t<check_policy<P>(), P, amp::fp32>;

}  // namespace locus::detail
