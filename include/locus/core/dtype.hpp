// The element types a tensor may hold, their short names (used in every diagnostic)
// and the aliases f32, f64, i32, i64, u8.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "half.hpp"

namespace locus {

template <class T>
struct dtype_traits {
  static constexpr bool is_dtype = false;
};

#define LOCUS_DETAIL_DTYPE(T, NAME, FLOATING)          \
  template <>                                          \
  struct dtype_traits<T> {                             \
    static constexpr bool is_dtype = true;             \
    static constexpr std::string_view name = NAME;     \
    static constexpr bool is_floating = FLOATING;      \
  };
LOCUS_DETAIL_DTYPE(float, "f32", true)
LOCUS_DETAIL_DTYPE(double, "f64", true)
LOCUS_DETAIL_DTYPE(std::int32_t, "i32", false)
LOCUS_DETAIL_DTYPE(std::int64_t, "i64", false)
LOCUS_DETAIL_DTYPE(std::uint8_t, "u8", false)
LOCUS_DETAIL_DTYPE(bool, "bool", false)
LOCUS_DETAIL_DTYPE(f16, "f16", true)
LOCUS_DETAIL_DTYPE(bf16, "bf16", true)
#undef LOCUS_DETAIL_DTYPE

/// One of the element types locus supports (cv-qualifiers ignored, so a view of
/// `const float` has dtype f32).
template <class T>
concept Dtype = dtype_traits<std::remove_cv_t<T>>::is_dtype;

template <class T>
inline constexpr std::string_view dtype_name = dtype_traits<std::remove_cv_t<T>>::name;

/// f16 and bf16: stored in 16 bits, computed in f32.
template <class T>
inline constexpr bool is_half_v =
    std::is_same_v<std::remove_cv_t<T>, f16> || std::is_same_v<std::remove_cv_t<T>, bf16>;

}  // namespace locus
