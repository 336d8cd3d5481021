// The host suite's gradient check for ag:: operations (tests/test_autograd*.cpp):
// dL/d(input) from backward against central finite differences in f64 of the forward
// alone (evaluated at perturbed inputs on a fresh tape: it shares nothing with backward).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include <locus/ag/ops.hpp>
#include <locus/locus.hpp>

namespace ag_test {

using locus::index_t;
using T = double;
using D = locus::cpu;
using tape_t = locus::ag::tape<T, D>;

/// Inputs of a check: tensors whose gradient is taken.
using inputs = std::vector<locus::tensor<T, D, 2>*>;

/// f(tape, leaves) -> a rank-0 value. Checks dL/d(input) from backward against central
/// differences of the forward (f64, step h, relative-or-absolute tolerance tol).
inline void check_gradients(const std::function<locus::ag::var<T, D, 0>(tape_t&, std::vector<locus::ag::var<T, D, 2>>&)>& f, inputs in,
                     double h = 1e-6, double tol = 1e-6) {
  tape_t t;
  std::vector<locus::ag::var<T, D, 2>> leaves;
  for (auto* x : in) leaves.push_back(t.leaf(*x));
  const auto loss = f(t, leaves);
  t.backward(loss);
  std::vector<std::vector<double>> analytic;
  for (auto& l : leaves) {
    const auto g = t.grad(l);
    analytic.emplace_back(g.data_handle(), g.data_handle() + g.numel());
  }
  const auto value_at = [&]() {
    tape_t u;
    std::vector<locus::ag::var<T, D, 2>> ls;
    for (auto* x : in) ls.push_back(u.constant(*x));
    return f(u, ls).value().data_handle()[0];
  };
  for (std::size_t k = 0; k < in.size(); ++k) {
    T* p = in[k]->data_handle();
    for (index_t i = 0; i < in[k]->numel(); ++i) {
      const T keep = p[i];
      p[i] = keep + h;
      const double up = value_at();
      p[i] = keep - h;
      const double down = value_at();
      p[i] = keep;
      const double numeric = (up - down) / (2 * h);
      const double a = analytic[k][static_cast<std::size_t>(i)];
      INFO("input " << k << " element " << i << ": backward " << a << ", finite differences " << numeric);
      CHECK(std::abs(a - numeric) <= tol * std::max(1.0, std::abs(numeric)));
    }
  }
}

}  // namespace ag_test
