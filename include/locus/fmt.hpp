// {fmt} support: fmt::format("{}", t) and fmt::print for host tensors and views, with
// the text of `std::cout << t` (tensor/print.hpp):
//
//   #include <locus/fmt.hpp>   // needs {fmt} (Debian: libfmt-dev); link fmt::fmt
//   fmt::print("{}\n", t);      // tensor([[0.1000, 0.2000], ...], shape=[2, 2], dtype=f32, device=cpu)
//   fmt::format("{:>90}", t);   // fill, alignment and width apply to the whole text
//                               // (other specs, such as a precision, are refused)
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

/// A tensor's format spec: `[[fill]align][width]` (`{:>100}`, `{:*^120}`), applied to the
/// whole text. Precision, type and debug specs would cut or quote it, so they are
/// refused (a format_error, at compile time for a literal format string).
struct tensor_fmt_spec {
  char fill = ' ';
  char align = '<';
  std::size_t width = 0;

  template <class It>
  constexpr It parse(It it, It end) {
    auto is_align = [](char c) { return c == '<' || c == '>' || c == '^'; };
    if (it != end && it + 1 != end && is_align(*(it + 1)) && *it != '}') {
      fill = *it;
      align = *(it + 1);
      it += 2;
    } else if (it != end && is_align(*it)) {
      align = *it;
      ++it;
    }
    while (it != end && *it >= '0' && *it <= '9') width = width * 10 + static_cast<std::size_t>(*it++ - '0');
    if (it != end && *it != '}')
      throw fmt::format_error("locus: a tensor's format spec is [[fill]align][width], e.g. {:>100}");
    return it;
  }

  template <class Out>
  Out write(Out out, const std::string& s) const {
    const std::size_t pad = width > s.size() ? width - s.size() : 0;
    const std::size_t before = align == '>' ? pad : align == '^' ? pad / 2 : 0;
    for (std::size_t i = 0; i < before; ++i) *out++ = fill;
    for (const char c : s) *out++ = c;
    for (std::size_t i = before; i < pad; ++i) *out++ = fill;
    return out;
  }
};

}  // namespace locus::detail

template <class T, class D, std::size_t R>
struct fmt::formatter<locus::tensor_view<T, D, R>> {
  locus::detail::tensor_fmt_spec spec;
  constexpr auto parse(fmt::format_parse_context& ctx) {
    static_assert(locus::detail::require_printable_device<D>());
    return spec.parse(ctx.begin(), ctx.end());
  }
  // the return type spelled out: fmt's formattability probe then does not instantiate
  // the body, and the device rule in parse() is the first error
  template <class FormatContext>
  typename FormatContext::iterator format(const locus::tensor_view<T, D, R>& v, FormatContext& ctx) const {
    return spec.write(ctx.out(), locus::detail::fmt_text(v));
  }
};

template <class T, class D, std::size_t R>
struct fmt::formatter<locus::tensor<T, D, R>> {
  locus::detail::tensor_fmt_spec spec;
  constexpr auto parse(fmt::format_parse_context& ctx) {
    static_assert(locus::detail::require_printable_device<D>());
    return spec.parse(ctx.begin(), ctx.end());
  }
  template <class FormatContext>
  typename FormatContext::iterator format(const locus::tensor<T, D, R>& t, FormatContext& ctx) const {
    return spec.write(ctx.out(), locus::detail::fmt_text(t.view()));
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
