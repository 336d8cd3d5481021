// {fmt} support: fmt::format("{}", t) and fmt::print for host tensors and views, with
// the text of `std::cout << t` (tensor/print.hpp):
//
//   #include <locus/fmt.hpp>   // needs {fmt} (Debian: libfmt-dev); link fmt::fmt
//   fmt::print("{}\n", t);      // tensor([[0.1000, 0.2000], ...], shape=[2, 2], dtype=f32, device=cpu)
//   fmt::format("{:>90}", t);   // fill, alignment and width apply to the whole text
//   fmt::format("{:*^{}}", t, w); // a width from an argument, as for a string
//                               // (other specs, such as a precision, are refused)
//
// Widths are checked as {fmt} checks them for a string: digits past INT_MAX, and a width
// argument that is negative, too big or not an integer, are a fmt::format_error (at
// compile time for a literal format string), never a width that wrapped around.
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

/// Why a tensor's format spec was refused: a fmt::format_error at run time.
[[noreturn]] inline void refuse_tensor_format_spec(const char* why) { throw fmt::format_error(why); }
/// The same from parse(). In a format string {fmt} checks at compile time (a literal
/// passed to fmt::format), the call of the non-constexpr function above is what stops
/// the compilation, and both compilers print this call with its message ("in 'constexpr'
/// expansion of", "in call to"). A template, so that clang does not reject a constexpr
/// function that never yields a constant.
template <class = void>
constexpr void tensor_format_spec_error(const char* why) {
  refuse_tensor_format_spec(why);
}

inline constexpr int max_format_width = 2147483647;  // INT_MAX: {fmt}'s own limit

/// A width or argument index of decimal digits at `it`: its value, or -1 past INT_MAX
/// (every digit is consumed either way). Prevents: a width wrapping around, 2^64 + 100
/// becoming 100, or a width of 10^30 padding until memory runs out.
template <class It>
constexpr long long parse_format_number(It& it, It end) {
  long long v = 0;
  bool big = false;
  for (; it != end && *it >= '0' && *it <= '9'; ++it) {
    if (!big) v = v * 10 + (*it - '0');
    if (v > max_format_width) big = true;
  }
  return big ? -1 : v;
}

/// A tensor's format spec: `[[fill]align][width]` (`{:>100}`, `{:*^120}`, `{:>{}}` with
/// the width an argument), applied to the whole text. Precision, type and debug specs
/// would cut or quote it, so they are refused (a format_error, at compile time for a
/// literal format string); so are widths {fmt} refuses for a string (above INT_MAX:
/// "number is too big"; a dynamic width that is negative or not an integer).
struct tensor_fmt_spec {
  char fill[4] = {' ', 0, 0, 0};  // one UTF-8 code point
  int fill_size = 1;
  char align = '<';
  int width = 0;
  enum class width_from { literal, index, name } source = width_from::literal;
  int width_index = -1;             // {:{}} / {:{2}}: the argument holding the width
  fmt::string_view width_name;      // {:{w}}: a named argument (fmt::arg("w", 90))

  template <class ParseContext>
  constexpr auto parse(ParseContext& ctx) {
    auto it = ctx.begin();
    const auto end = ctx.end();
    auto is_align = [](char c) { return c == '<' || c == '>' || c == '^'; };
    if (it != end && *it != '}') {
      // fill: one code point (a UTF-8 lead byte says how many bytes), then an alignment
      const auto lead = static_cast<unsigned char>(*it);
      const int n = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 1;
      if (end - it > n && is_align(*(it + n))) {
        if (*it == '{')
          tensor_format_spec_error("locus: '{' cannot be a fill character (as in {fmt}); pick another, e.g. {:*>100}");
        for (int i = 0; i < n; ++i) fill[i] = *(it + i);
        fill_size = n;
        align = *(it + n);
        it += n + 1;
      } else if (is_align(*it)) {
        align = *it;
        ++it;
      }
    }
    if (it != end && *it == '0')
      tensor_format_spec_error("locus: a tensor's format width does not start with 0 (the 0 flag pads numbers, and {fmt} refuses it for text too); give 0 as the fill instead: {:0>100}");
    if (it != end && *it >= '1' && *it <= '9') {
      const long long w = parse_format_number(it, end);
      if (w < 0)
        tensor_format_spec_error("locus: a tensor's format width is larger than 2147483647 (INT_MAX), which {fmt} refuses for text too (\"number is too big\"); give a width that fits an int, e.g. {:>100}");
      width = static_cast<int>(w);
    } else if (it != end && *it == '{') {  // a width from an argument, as {fmt} allows for text
      ++it;
      if (it != end && *it == '}') {
        source = width_from::index;
        width_index = ctx.next_arg_id();
      } else if (it != end && *it >= '0' && *it <= '9') {
        const long long id = parse_format_number(it, end);
        // an index past INT_MAX: {fmt} reads it as INT_MAX, which no argument has
        source = width_from::index;
        width_index = id < 0 ? max_format_width : static_cast<int>(id);
        ctx.check_arg_id(width_index);
      } else if (it != end && ((*it >= 'a' && *it <= 'z') || (*it >= 'A' && *it <= 'Z') || *it == '_')) {
        const auto first = it;
        while (it != end && ((*it >= 'a' && *it <= 'z') || (*it >= 'A' && *it <= 'Z') || (*it >= '0' && *it <= '9') ||
                             *it == '_'))
          ++it;
        source = width_from::name;
        width_name = fmt::string_view(&*first, static_cast<std::size_t>(it - first));
      }
      if (source == width_from::literal || it == end || *it != '}')
        tensor_format_spec_error("locus: a tensor's width from an argument is written {:{}}, {:{1}} or {:{name}}, e.g. fmt::format(\"{:>{}}\", t, 100)");
      if (source == width_from::index) ctx.check_dynamic_spec(width_index);
      ++it;
    }
    // {fmt} checks the closing brace only after format() has written the text
    if (it == end && it != ctx.begin())
      tensor_format_spec_error("locus: a tensor's format spec has no closing '}', e.g. {:>100}");
    if (it != end && *it != '}')
      tensor_format_spec_error("locus: a tensor's format spec is [[fill]align][width] (the whole text is padded; a precision or a type would cut or change it), e.g. {:>100} or {:*^{}}");
    return it;
  }

  /// The width the text is padded to: the literal, or the argument's value checked as
  /// {fmt} checks a dynamic width (an integer from 0 to INT_MAX).
  template <class FormatContext>
  int resolve_width(FormatContext& ctx) const {
    if (source == width_from::literal) return width;
    auto arg = source == width_from::index ? ctx.arg(width_index) : ctx.arg(width_name);
    if (!arg) refuse_tensor_format_spec("locus: a tensor's format width names an argument that was not passed");
    auto get = [](auto v) -> int {
      using V = decltype(v);
      if constexpr (std::is_integral_v<V> && !std::is_same_v<V, bool> && !std::is_same_v<V, char>) {
        if constexpr (std::is_signed_v<V>) {
          if (v < 0) refuse_tensor_format_spec("locus: a tensor's format width from an argument is negative");
        }
        if (static_cast<unsigned long long>(v) > static_cast<unsigned long long>(max_format_width))
          refuse_tensor_format_spec(
              "locus: a tensor's format width from an argument is larger than 2147483647 (INT_MAX), which {fmt} "
              "refuses for text too (\"number is too big\")");
        return static_cast<int>(v);
      } else {
        refuse_tensor_format_spec("locus: a tensor's format width from an argument is not an integer; pass an int");
      }
    };
#if FMT_VERSION >= 110000
    return arg.visit(get);
#else
    return fmt::visit_format_arg(get, arg);
#endif
  }

  template <class Out>
  Out write(Out out, const std::string& s, int w) const {
    const std::size_t wide = static_cast<std::size_t>(w);
    const std::size_t pad = wide > s.size() ? wide - s.size() : 0;
    const std::size_t before = align == '>' ? pad : align == '^' ? pad / 2 : 0;
    auto put_fill = [&] {
      for (int k = 0; k < fill_size; ++k) *out++ = fill[k];
    };
    for (std::size_t i = 0; i < before; ++i) put_fill();
    for (const char c : s) *out++ = c;
    for (std::size_t i = before; i < pad; ++i) put_fill();
    return out;
  }
};

}  // namespace locus::detail

template <class T, class D, std::size_t R>
struct fmt::formatter<locus::tensor_view<T, D, R>> {
  locus::detail::tensor_fmt_spec spec;
  constexpr auto parse(fmt::format_parse_context& ctx) {
    static_assert(locus::detail::require_printable_device<D>());
    return spec.parse(ctx);
  }
  // the return type spelled out: fmt's formattability probe then does not instantiate
  // the body, and the device rule in parse() is the first error
  template <class FormatContext>
  typename FormatContext::iterator format(const locus::tensor_view<T, D, R>& v, FormatContext& ctx) const {
    const int w = spec.resolve_width(ctx);  // before any output: a refused width writes nothing
    return spec.write(ctx.out(), locus::detail::fmt_text(v), w);
  }
};

template <class T, class D, std::size_t R>
struct fmt::formatter<locus::tensor<T, D, R>> {
  locus::detail::tensor_fmt_spec spec;
  constexpr auto parse(fmt::format_parse_context& ctx) {
    static_assert(locus::detail::require_printable_device<D>());
    return spec.parse(ctx);
  }
  template <class FormatContext>
  typename FormatContext::iterator format(const locus::tensor<T, D, R>& t, FormatContext& ctx) const {
    const int w = spec.resolve_width(ctx);
    return spec.write(ctx.out(), locus::detail::fmt_text(t.view()), w);
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
