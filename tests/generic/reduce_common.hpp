// What the device-generic reduction tests share (reduce_cases.hpp and
// reduce_more_cases.hpp): includes and the double-precision helpers.
#pragma once

#include <algorithm>
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include <locus/locus.hpp>

namespace locus_reduce_test {
template <class T, class D, std::size_t R>
std::vector<double> doubles(const locus::tensor<T, D, R>& t) {
  auto h = locus::to<locus::cpu>(t);
  std::vector<double> out;
  for (const auto& v : h.span()) out.push_back(static_cast<double>(locus::detail::load(v)));
  return out;
}
template <class T, class D>
double scalar(const locus::tensor<T, D, 0>& t) {
  return static_cast<double>(locus::detail::load(locus::to<locus::cpu>(t).item()));
}
inline double rel(double got, double ref) { return std::abs(got - ref) / std::max(1.0, std::abs(ref)); }
}  // namespace locus_reduce_test
