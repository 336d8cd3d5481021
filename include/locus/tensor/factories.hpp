// Factories: empty, zeros, ones, full, arange, rand, randn, from_host. The dtype and
// device are template arguments and the shape's length gives the rank:
//   auto x = locus::zeros<float, locus::cuda>({256, 784});   // tensor<float, cuda, 2>
// Fills are one kernel source (backend/launch.hpp) for every device, so filling a
// cuda tensor with anything but zeros needs nvcc, like any other kernel.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <cstring>
#include <limits>
#include <iterator>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backend/launch.hpp"
#include "../ops/math.hpp"
#include "../ops/random.hpp"
#include "tensor.hpp"

namespace locus {

namespace detail {


template <class T>
struct fill_value {
  T* dst;
  T value;
  LOCUS_HOST_DEVICE void operator()(index_t i) const { dst[i] = value; }
};

/// Element i of an arange: start + i * step, in double for floating dtypes; for integer
/// dtypes exactly, in i64 (start and step are whole numbers and every element lies in
/// T's range, checked before the launch; wrap_mul/wrap_add keep the way there defined).
template <class T>
struct arange_fill {
  T* dst;
  double start, step;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      dst[i] = scalar_cast<T>(start + static_cast<double>(i) * step);
    } else {
      const index_t s = static_cast<index_t>(start), d = static_cast<index_t>(step);
      dst[i] = static_cast<T>(wrap_add(s, wrap_mul(i, d)));
    }
  }
};

/// An integer arange: start and step whole numbers, first and last element in T's range
/// (value_error otherwise). PyTorch computes arange(0, 2.5, 0.5, dtype=int) in double
/// and truncates each element (0, 0, 1, 1, 2); locus refuses it: an integer arange
/// with a fractional step is almost always a mistake, and the explicit spelling says
/// which rounding is meant.
/// The message of a refused integer arange: one cold, out-of-line function for every
/// dtype (the strings cost each file that uses arange nothing on the normal path).
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_integer_arange(std::string_view dtype, double start,
                                                                     double stop, double step, bool fractional,
                                                                     long long lo, long long hi) {
  const int dn = static_cast<int>(dtype.size());
  const number_chars a(start), b(stop), c(step);
  if (fractional)
    throw_value_error("locus: arange<%.*s>(%s, %s, %s) needs a whole-number start and step for an integer dtype "
                      "(its elements start + i * step would not be whole numbers); for a fractional step, make a "
                      "floating arange and convert it explicitly, e.g. locus::cast<%s%.*s>(locus::arange<double, "
                      "D>(start, stop, step)) (truncates each element)",
                      dn, dtype.data(), a.s, b.s, c.s, dtype == "bool" ? "" : "locus::", dn, dtype.data());
  throw_value_error("locus: arange<%.*s>(%s, %s, %s) has elements outside the range of %.*s (%lld to %lld); use a "
                    "wider dtype",
                    dn, dtype.data(), a.s, b.s, c.s, dn, dtype.data(), lo, hi);
}

template <class T>
void check_integer_arange(double start, double stop, double step, index_t n) {
  __extension__ typedef __int128 wide_int;  // exact for any int64 start + i * step
  using L = std::numeric_limits<T>;
  const auto fail = [&](bool fractional) {
    throw_integer_arange(dtype_name<T>, start, stop, step, fractional, static_cast<long long>(L::min()),
                         static_cast<long long>(L::max()));
  };
  if (!whole_number_fits<std::int64_t>(start) || !whole_number_fits<std::int64_t>(step)) fail(true);
  if (n == 0) return;
  // The last element exactly, in 128-bit integers (in double, -2^63 - 1024 rounds to
  // -2^63 and passed; the elements then wrapped).
  const wide_int last = static_cast<wide_int>(static_cast<std::int64_t>(start)) +
                        static_cast<wide_int>(n - 1) * static_cast<wide_int>(static_cast<std::int64_t>(step));
  if (!whole_number_fits<T>(start) || last < static_cast<wide_int>(L::min()) || last > static_cast<wide_int>(L::max()))
    fail(false);
}

template <class T>
constexpr bool require_floating_dtype() {
  static_assert(dtype_traits<T>::is_floating,
                "locus: rand and randn produce floating-point values; use f32, f64, f16 or "
                "bf16 (and cast<T> afterwards for integers)");
  return dtype_traits<T>::is_floating;
}

template <class V>
concept Scalar = std::is_arithmetic_v<V> || is_half_v<V>;

/// full()'s value for an integer or bool dtype T: exactly representable, or value_error.
template <class T, class V>
void check_fill_value(V value) {
  if constexpr (!dtype_traits<T>::is_floating) {
    bool ok;
    std::string shown;
    if constexpr (std::is_integral_v<V>) {
      ok = integer_fits<T>(value);
      shown = std::is_signed_v<V> ? std::to_string(static_cast<long long>(value))
                                  : std::to_string(static_cast<unsigned long long>(value));
    } else {
      const double v = static_cast<double>(value);
      ok = whole_number_fits<T>(v);
      shown = number_string(v);
    }
    if (!ok)
      throw value_error("locus: full<" + std::string(dtype_name<T>) + "> cannot hold the value " + shown +
                        " (" + std::string(dtype_name<T>) + " holds the whole numbers " + dtype_range_string<T>() +
                        "); the fill would wrap or truncate: pass a value in range, or use a wider or floating dtype");
  }
}

/// The message of a refused random range or distribution: one cold function for every
/// dtype (what it names: the call, the values, the rule and the fix).
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_random_args(const char* call, std::string_view dtype,
                                                                  double a, double b, const char* a_name,
                                                                  const char* b_name, const char* why) {
  throw_value_error("locus: %s<%.*s>(%s = %s, %s = %s): %s", call, static_cast<int>(dtype.size()), dtype.data(),
                    a_name, number_chars(a).s, b_name, number_chars(b).s, why);
}

/// rand's range for dtype T: finite bounds, lo < hi, both within T's finite range, a
/// width hi - lo finite in the type the draw is computed in (f64 for f64, f32 for the
/// others; PyTorch's uniform_ refuses an overflowing width too) and at least one value of
/// T inside [lo, hi). Returns the smallest and largest such values (uniform_fill keeps
/// every draw between them: an f16 or bf16 draw rounded up to hi would leave the range).
template <class T>
std::pair<double, double> uniform_bounds(double lo, double hi) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto fail = [&](const char* why) { throw_random_args("rand", dtype_name<T>, lo, hi, "lo", "hi", why); };
  if (!std::isfinite(lo) || !std::isfinite(hi)) fail("the bounds must be finite numbers");
  if (!(lo < hi))
    fail("the range is [lo, hi) and needs lo < hi (PyTorch: uniform_ expects to return a [from, to) range)");
  const double top = finite_max<T>();
  if (lo < -top || hi > top) {
    const std::string why = "[lo, hi) reaches beyond the finite values of " + std::string(dtype_name<T>) + " (" +
                            number_string(-top) + " to " + number_string(top) + "); draw a wider dtype and cast";
    fail(why.c_str());
  }
  if (!std::isfinite(static_cast<C>(hi - lo))) {
    const std::string why = "the width hi - lo overflows " +
                            std::string(std::is_same_v<C, double> ? "f64" : "f32") +
                            ", the type the draw is computed in (lo + (hi - lo) * u would be inf); draw over a "
                            "narrower range, e.g. [lo / 2, hi / 2) and scale by 2";
    fail(why.c_str());
  }
  const double first = smallest_at_least<T>(lo), last = largest_below<T>(hi);
  if (!(first <= last)) {
    const std::string why = "no " + std::string(dtype_name<T>) + " value lies in [lo, hi); widen the range";
    fail(why.c_str());
  }
  return {first, last};
}

/// randn's distribution for dtype T: a finite mean, a finite std >= 0 (PyTorch: normal
/// expects std >= 0.0), and every draw mean + std * z finite in T (|z| <= normal_z_max,
/// the largest the generator gives).
template <class T>
void check_normal_args(double mean, double stddev) {
  const auto fail = [&](const char* why) {
    throw_random_args("randn", dtype_name<T>, mean, stddev, "mean", "std", why);
  };
  if (!std::isfinite(mean) || !std::isfinite(stddev)) fail("mean and std must be finite numbers");
  if (!(stddev >= 0.0)) fail("std must be >= 0 (PyTorch: normal expects std >= 0.0)");
  const double reach = std::fabs(mean) + stddev * normal_z_max;
  if (!(reach <= finite_max<T>())) {
    const std::string why = "draws reach |mean| + std * " + number_string(normal_z_max) + " = " +
                            number_string(reach) + " (the generator's largest |z|), beyond the finite values of " +
                            std::string(dtype_name<T>) + " (up to " + number_string(finite_max<T>()) +
                            "); draw a wider dtype, or a smaller std";
    fail(why.c_str());
  }
}

/// The factories take any T and D, so that a wrong one is reported by tensor's own
/// static_assert (a locus: message) rather than as a list of candidates; their bodies
/// run only for valid ones, so that message comes alone.
template <class T, class D>
inline constexpr bool factory_args_ok = Dtype<T> && is_device_v<D>;

}  // namespace detail

// Prevents: a shape from a std::vector (PyTorch's torch.zeros(list)): the rank is part of
// the tensor's type, so it cannot come from a run-time size.
#define LOCUS_DETAIL_VECTOR_SHAPE(NAME)                                                                        \
  template <class T, class D, class I, class... Rest>                                                          \
  auto NAME(const std::vector<I>&, Rest&&...) {                                                                \
    static_assert(detail::always_false<I>,                                                                     \
                  "locus: a shape cannot be a std::vector: the rank is part of the tensor's type and a vector's " \
                  "size is a run-time value; write the extents, e.g. locus::" #NAME "<T, D>({2, 3}), or "       \
                  "locus::extents<2>{v[0], v[1]} when they are in a vector");                                  \
    return 0;                                                                                                  \
  }
LOCUS_DETAIL_VECTOR_SHAPE(zeros)
LOCUS_DETAIL_VECTOR_SHAPE(ones)
LOCUS_DETAIL_VECTOR_SHAPE(empty)
LOCUS_DETAIL_VECTOR_SHAPE(full)
LOCUS_DETAIL_VECTOR_SHAPE(rand)
LOCUS_DETAIL_VECTOR_SHAPE(randn)
#undef LOCUS_DETAIL_VECTOR_SHAPE

/// All-zero tensor (a memset: no kernel, so it works in host-compiled files on cuda).
template <class T, class D, std::size_t R>
tensor<T, D, R> zeros(const extents<R>& shape) {
  tensor<T, D, R> t(shape);
  if (t.size_bytes() == 0) return t;
  if constexpr (!detail::factory_args_ok<T, D>) {
  } else if constexpr (D::host_accessible) {
    std::memset(static_cast<void*>(t.data_handle()), 0, t.size_bytes());
  } else {
#if LOCUS_HAS_CUDA
    LOCUS_CUDA_CHECK(cudaMemsetAsync(t.data_handle(), 0, t.size_bytes(), detail::current_stream()));
#endif
  }
  return t;
}
template <class T, class D, std::size_t R>
tensor<T, D, R> zeros(const index_t (&shape)[R]) {
  return zeros<T, D>(detail::to_extents(shape));
}

/// Uninitialised tensor of the given shape (bool: zeroed).
template <class T, class D, std::size_t R>
tensor<T, D, R> empty(const extents<R>& shape) {
  // bool is the one dtype whose stray bytes are undefined behaviour to read (a bool
  // holds 0 or 1): empty<bool> is zeros<bool>, for the price of a memset.
  if constexpr (std::is_same_v<T, bool>) return zeros<T, D>(shape);
  else return tensor<T, D, R>(shape);
}
template <class T, class D, std::size_t R>
tensor<T, D, R> empty(const index_t (&shape)[R]) {
  return empty<T, D>(detail::to_extents(shape));
}

/// Tensor with every element equal to value (converted to T: rounded for f16/bf16). An
/// integer or bool dtype needs a value it holds exactly (a whole number in its range,
/// given as an integer or a floating value): anything else is a value_error, not a
/// wrap or a truncation.
template <class T, class D, std::size_t R, class V>
tensor<T, D, R> full(const extents<R>& shape, V value) {
  static_assert(detail::Scalar<V>, "locus: full() fills with a number (an arithmetic type, f16 or bf16), "
                                   "but the value given is of another type; pass e.g. 1.5f or locus::bf16(1.5f)");
  if constexpr (detail::Scalar<V> && Dtype<T>) detail::check_fill_value<std::remove_cv_t<T>>(value);
  tensor<T, D, R> t(shape);
  if constexpr (detail::factory_args_ok<T, D> && detail::Scalar<V>)
    detail::launch_n<D>(t.numel(), detail::fill_value<T>{t.data_handle(), detail::scalar_cast<T>(value)});
  return t;
}
template <class T, class D, std::size_t R, class V>
tensor<T, D, R> full(const index_t (&shape)[R], V value) {
  return full<T, D>(detail::to_extents(shape), value);
}

template <class T, class D, std::size_t R>
tensor<T, D, R> ones(const extents<R>& shape) {
  return full<T, D>(shape, 1);
}
template <class T, class D, std::size_t R>
tensor<T, D, R> ones(const index_t (&shape)[R]) {
  return full<T, D>(detail::to_extents(shape), 1);
}

/// [start, start + step, ...) up to but excluding stop, as a rank-1 tensor. Floating
/// dtypes compute start + i * step in double and round once; integer dtypes need a
/// whole-number start and step and every element in range (value_error), and are exact.
template <class T, class D>
tensor<T, D, 1> arange(double start, double stop, double step = 1.0) {
  if (step == 0.0 || !(step - step == 0.0))
    throw shape_error("locus: arange step must be finite and non-zero");
  const double span = (stop - start) / step;
  if (!(span - span == 0.0) || span > 9.0e18)  // NaN or inf bounds, or more elements than index_t counts
    detail::throw_shape_error("locus: arange(%s, %s, %s) has no finite element count",
                              detail::number_chars(start).s, detail::number_chars(stop).s,
                              detail::number_chars(step).s);
  const index_t n = span > 0 ? static_cast<index_t>(std::ceil(span)) : 0;
  if constexpr (Dtype<T> && !dtype_traits<std::remove_cv_t<T>>::is_floating)
    detail::check_integer_arange<std::remove_cv_t<T>>(start, stop, step, n);
  tensor<T, D, 1> t(extents<1>{n});
  if constexpr (detail::factory_args_ok<T, D>)
    detail::launch_n<D>(n, detail::arange_fill<T>{t.data_handle(), start, step});
  return t;
}
/// 0, 1, ..., n-1; n < 0 is a shape_error (as a negative extent is).
template <class T, class D>
tensor<T, D, 1> arange(index_t n) {
  if (n < 0) detail::throw_shape_error("locus: arange(n) needs n >= 0, got %lld", static_cast<long long>(n));
  return arange<T, D>(0.0, static_cast<double>(n), 1.0);
}

/// Uniform values in [lo, hi). Element i depends only on (seed, i): the same seed
/// gives the same tensor on every device. Every value lies in [lo, hi) after rounding
/// to T (a draw that would round to hi takes the largest value of T below it). Bounds
/// that are not finite, lo >= hi, a range beyond T's finite values, a width hi - lo
/// that overflows the draw's type (f32 for f32/f16/bf16, f64 for f64), or a range
/// holding no value of T are a value_error, raised before anything is allocated.
template <class T, class D, std::size_t R>
tensor<T, D, R> rand(const extents<R>& shape, std::uint64_t seed, double lo = 0.0, double hi = 1.0) {
  if constexpr (detail::factory_args_ok<T, D> && detail::require_floating_dtype<T>()) {
    const auto [first, last] = detail::uniform_bounds<std::remove_cv_t<T>>(lo, hi);
    tensor<T, D, R> t(shape);
    detail::launch_n<D>(t.numel(), detail::uniform_fill<T>{t.data_handle(), seed, lo, hi, first, last});
    return t;
  } else {
    return tensor<T, D, R>(shape);
  }
}
template <class T, class D, std::size_t R>
tensor<T, D, R> rand(const index_t (&shape)[R], std::uint64_t seed, double lo = 0.0, double hi = 1.0) {
  return rand<T, D>(detail::to_extents(shape), seed, lo, hi);
}

/// Normal values N(mean, stddev^2); element i depends only on (seed, i). A mean or std
/// that is not finite, std < 0, or draws that could overflow T (|mean| + 8.5717 * std,
/// the generator's largest |z|, beyond T's finite values) are a value_error.
template <class T, class D, std::size_t R>
tensor<T, D, R> randn(const extents<R>& shape, std::uint64_t seed, double mean = 0.0,
                      double stddev = 1.0) {
  if constexpr (detail::factory_args_ok<T, D> && detail::require_floating_dtype<T>()) {
    detail::check_normal_args<std::remove_cv_t<T>>(mean, stddev);
    tensor<T, D, R> t(shape);
    detail::launch_n<D>(t.numel(), detail::normal_fill<T>{t.data_handle(), seed, mean, stddev});
    return t;
  } else {
    return tensor<T, D, R>(shape);
  }
}
template <class T, class D, std::size_t R>
tensor<T, D, R> randn(const index_t (&shape)[R], std::uint64_t seed, double mean = 0.0,
                      double stddev = 1.0) {
  return randn<T, D>(detail::to_extents(shape), seed, mean, stddev);
}

/// A tensor on D holding a copy of host data, laid out row-major in the given shape.
/// The data's size must equal the shape's element count (shape_error naming both).
template <class D, class T, std::size_t R>
tensor<std::remove_cv_t<T>, D, R> from_host(std::span<T> data, const extents<R>& shape) {
  using V = std::remove_cv_t<T>;
  const index_t n = detail::checked_numel(shape, sizeof(V));
  if (static_cast<index_t>(data.size()) != n)
    throw shape_error("locus: from_host got " + std::to_string(data.size()) +
                      " elements for shape " + detail::shape_string(shape) + " (" +
                      std::to_string(n) + " elements)");
  tensor<V, D, R> t(shape);
  if constexpr (detail::factory_args_ok<V, D>) detail::copy_bytes<cpu, D>(t.data_handle(), data.data(), t.size_bytes());
  return t;
}
template <class D, class T, std::size_t R>
tensor<std::remove_cv_t<T>, D, R> from_host(std::span<T> data, const index_t (&shape)[R]) {
  return from_host<D>(data, detail::to_extents(shape));
}
namespace detail {
/// A container with contiguous storage and data()/size() (std::vector, std::array, ...);
/// spelled with std::data/std::size rather than <ranges>, which is costly to compile.
template <class C>
concept HostContainer = requires(const C& c) {
  { std::data(c) } -> std::convertible_to<const void*>;
  { std::size(c) } -> std::convertible_to<std::size_t>;
};
template <class C>
struct container_value {
  using type = void;
};
template <HostContainer C>
struct container_value<C> {
  using type = std::remove_cvref_t<decltype(*std::data(std::declval<const C&>()))>;
};
template <class C>
using container_value_t = typename container_value<C>::type;

template <class C>
inline constexpr bool is_vector_of_bool = false;
template <class A>
inline constexpr bool is_vector_of_bool<std::vector<bool, A>> = true;

/// from_host's argument: one static_assert that names what was passed and the fix,
/// instead of a page of candidates (the container overloads take anything, so a wrong
/// argument lands here). std::vector<bool> is bit-packed: it has no data() to copy from.
template <class Range>
constexpr bool check_host_container() {
  static_assert(!is_vector_of_bool<Range>,
                "locus: from_host got a std::vector<bool>, which is bit-packed and has no data() to copy from; "
                "copy it into a contiguous container first: a std::vector<std::uint8_t> (then "
                "locus::cast<bool>), a std::array<bool, N>, or a bool array passed as std::span<const bool>");
  static_assert(is_vector_of_bool<Range> || HostContainer<Range>,
                "locus: from_host takes host data with contiguous storage (std::vector, std::array, std::span, a "
                "C array), but the argument has no data() and size(); copy it into a std::vector of a locus "
                "dtype first");
  return HostContainer<Range>;
}
}  // namespace detail

/// Any contiguous container (std::vector, std::array, ...) of a locus dtype. A
/// std::vector<bool>, a container without contiguous storage, or elements of another
/// type are a compile error naming the fix (tensor's own message for the element type).
template <class D, class Range, std::size_t R>
auto from_host(const Range& data, const extents<R>& shape) {
  if constexpr (detail::check_host_container<Range>()) {
    return from_host<D>(std::span<const detail::container_value_t<Range>>(std::data(data), std::size(data)), shape);
  } else {
    return tensor<float, D, R>(shape);  // not reached: the static_assert above has failed
  }
}
template <class D, class Range, std::size_t R>
auto from_host(const Range& data, const index_t (&shape)[R]) {
  return from_host<D>(data, detail::to_extents(shape));
}

}  // namespace locus
