// The data the fixed programs of examples/pitfalls train on: a small synthetic
// classification problem made on the host, as a dataset read from disk would be, so the
// programs need no files and run in a second or two on a CPU.
//
//   x ~ N(0, 1), [n, features];  label = argmax over the classes of x w, for a fixed
//   random w [features, classes] (a linearly separable problem an MLP learns quickly).
//
// Element i of every random tensor depends only on (seed, i) (Philox), so the data is
// the same on every machine and thread count.
#pragma once

#include <locus/locus.hpp>

#include <cstdint>
#include <utility>

namespace pitfalls {

struct host_data {
  locus::tensor<float, locus::cpu, 2> x;         // [n, features]
  locus::tensor<std::int64_t, locus::cpu, 1> y;  // [n] class indices
};

inline host_data make_data(locus::index_t n, locus::index_t features, locus::index_t classes, std::uint64_t seed) {
  auto x = locus::randn<float, locus::cpu>({n, features}, seed);
  auto w = locus::randn<float, locus::cpu>({features, classes}, /*seed=*/1000);  // the same rule for every split
  auto logits = locus::matmul(x, w);
  auto y = locus::argmax(logits, 1);
  return {std::move(x), std::move(y)};
}

}  // namespace pitfalls
