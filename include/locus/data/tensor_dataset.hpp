// data::tensor_dataset: a SampleSource over features and labels already in host memory,
// the commonest way to feed a loader one's own data.
//
//   locus::tensor<float, locus::cpu, 2> x = ...;          // [N, features]
//   locus::tensor<std::int64_t, locus::cpu, 1> y = ...;   // [N], class indices
//   locus::data::tensor_dataset set(std::move(x), std::move(y));
//   locus::data::loader<locus::cuda, locus::data::tensor_dataset> batches(set, {.batch_size = 64});
//
// The dataset owns its tensors (moved in, so nothing dangles), checks at construction
// that there is one label per row (shape_error naming both counts), and hands sample i
// to the loader's background thread as a copy of row i. Images of rank 3 or 4 are
// flattened by the caller first: x.reshape({n, c * h * w}) is a view, clone() it or
// build the rank-2 tensor directly. Any other source only needs size(), features() and
// load(i, span<float>) -> label (data::SampleSource in loader.hpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <utility>

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../tensor/tensor.hpp"

namespace locus::data {

class tensor_dataset {
 public:
  /// x: [N, features] floats, y: [N] labels; both on cpu, moved in.
  tensor_dataset(tensor<float, cpu, 2> x, tensor<std::int64_t, cpu, 1> y) : x_(std::move(x)), y_(std::move(y)) {
    if (x_.shape()[0] != y_.shape()[0])
      locus::detail::throw_shape_error("locus: tensor_dataset has %lld rows of features but %lld labels; give one "
                                       "label per row",
                                       static_cast<long long>(x_.shape()[0]), static_cast<long long>(y_.shape()[0]));
  }

  [[nodiscard]] index_t size() const noexcept { return x_.shape()[0]; }
  [[nodiscard]] index_t features() const noexcept { return x_.shape()[1]; }

  /// Row i into out (exactly features() floats); returns its label.
  std::int64_t load(index_t i, std::span<float> out) const {
    if (i < 0 || i >= size() || static_cast<index_t>(out.size()) != features())
      locus::detail::throw_index_error("locus: tensor_dataset::load(%lld, %zu floats): the dataset has %lld samples "
                                       "of %lld features",
                                       static_cast<long long>(i), out.size(), static_cast<long long>(size()),
                                       static_cast<long long>(features()));
    const float* row = x_.data_handle() + i * features();
    if (features() > 0) std::memcpy(out.data(), row, sizeof(float) * static_cast<std::size_t>(features()));
    return y_.data_handle()[i];
  }

  /// The tensors, for reading; of a temporary dataset, moved out (a reference into it
  /// would dangle at the end of the statement).
  [[nodiscard]] const tensor<float, cpu, 2>& x() const& noexcept { return x_; }
  [[nodiscard]] const tensor<std::int64_t, cpu, 1>& y() const& noexcept { return y_; }
  [[nodiscard]] tensor<float, cpu, 2> x() && noexcept { return std::move(x_); }
  [[nodiscard]] tensor<std::int64_t, cpu, 1> y() && noexcept { return std::move(y_); }
  // Prevents: a reference into a const temporary dataset (it cannot be moved from).
  template <class Self = tensor_dataset>
  auto x() const&& {  // (deduced: the message comes before any use of the result)
    static_assert(locus::detail::always_false<Self>,
                  "locus: x() of a const temporary dataset would dangle; keep the dataset in a variable: auto ds = "
                  "...; then ds.x()");
    return 0;
  }
  template <class Self = tensor_dataset>
  auto y() const&& {
    static_assert(locus::detail::always_false<Self>,
                  "locus: y() of a const temporary dataset would dangle; keep the dataset in a variable: auto ds = "
                  "...; then ds.y()");
    return 0;
  }

 private:
  tensor<float, cpu, 2> x_;
  tensor<std::int64_t, cpu, 1> y_;
};

}  // namespace locus::data
