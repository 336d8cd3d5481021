// {fmt} support: fmt::format("{}", t) and fmt::print for host tensors and views, with
// the text of `std::cout << t` (tensor/print.hpp):
//
//   #include <locus/fmt.hpp>   // needs {fmt} (Debian: libfmt-dev); link fmt::fmt
//   fmt::print("{}\n", t);      // tensor([[0.1000, 0.2000], ...], shape=[2, 2], dtype=f32, device=cpu)
//   fmt::format("{:>90}", t);   // the string's fill, alignment and width apply
//
// As with operator<<, a cuda tensor or view is a compile error that says to copy it
// first, and a lazy expression one that says to evaluate it. Opt-in: locus.hpp does not
// include this header, so programs that do not use {fmt} neither need nor link it.
// std::format is not covered: the standard libraries locus is tested with (GCC 12's)
// have no <format>.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <string>
#include <type_traits>

#include "tensor/print.hpp"

namespace locus::detail {

/// The string a formatter writes (device memory never gets here: parse() refuses it).
template <class T, class D, std::size_t R>
std::string fmt_text(const tensor_view<T, D, R>& v) {
  if constexpr (D::host_accessible) return format_view(v);
  else return {};
}

/// Parses a string spec (fill, alignment, width); the device rule fires here first, in
/// the compile-time check of the format string, so it is the first error.
template <class D, class Base, class Ctx>
constexpr auto fmt_parse(Base& base, Ctx& ctx) {
  static_assert(require_printable_device<D>());
  return base.parse(ctx);
}

}  // namespace locus::detail

template <class T, class D, std::size_t R>
struct fmt::formatter<locus::tensor_view<T, D, R>> : fmt::formatter<fmt::string_view> {
  constexpr auto parse(fmt::format_parse_context& ctx) {
    return locus::detail::fmt_parse<D>(static_cast<fmt::formatter<fmt::string_view>&>(*this), ctx);
  }
  // the return type spelled out: fmt's formattability probe then does not instantiate
  // the body, and the device rule in parse() is the first error
  template <class FormatContext>
  typename FormatContext::iterator format(const locus::tensor_view<T, D, R>& v, FormatContext& ctx) const {
    const std::string s = locus::detail::fmt_text(v);
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};

template <class T, class D, std::size_t R>
struct fmt::formatter<locus::tensor<T, D, R>> : fmt::formatter<fmt::string_view> {
  constexpr auto parse(fmt::format_parse_context& ctx) {
    return locus::detail::fmt_parse<D>(static_cast<fmt::formatter<fmt::string_view>&>(*this), ctx);
  }
  template <class FormatContext>
  typename FormatContext::iterator format(const locus::tensor<T, D, R>& t, FormatContext& ctx) const {
    const std::string s = locus::detail::fmt_text(t.view());
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};

// Prevents: "type is not formattable" pages for a lazy expression.
template <class E>
  requires std::is_base_of_v<locus::detail::expression_tag, E>
struct fmt::formatter<E> {
  constexpr auto parse(fmt::format_parse_context& ctx) {
    static_assert(locus::detail::always_false<E>,
                  "locus: an expression is lazy and has no values to print yet; evaluate it first: "
                  "fmt::print(\"{}\", locus::eval(e))");
    return ctx.begin();
  }
  template <class FormatContext>
  typename FormatContext::iterator format(const E&, FormatContext& ctx) const {
    return ctx.out();
  }
};
