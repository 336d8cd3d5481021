// Per-sample transforms for a loader (data augmentation), composable and counter-based:
// each draws its randomness from Philox(key = the loader's seed, counter = the sample's
// dataset index, stream = the epoch and the transform's own stream number), so a
// (seed, epoch, sample) gives the same image on every device, thread count and prefetch
// depth, and two transforms in one composition draw independent numbers.
//
//   locus::data::loader<locus::cpu> rows(train, {
//       .batch_size = 128, .shuffle = true, .seed = 1,
//       .transform = locus::data::compose(locus::data::random_crop{.channels = 1, .height = 28,
//                                                                  .width = 28, .padding = 2},
//                                         locus::data::horizontal_flip{.channels = 1, .height = 28,
//                                                                      .width = 28},
//                                         locus::data::normalize{.mean = {0.2860f}, .std = {0.3530f}})});
//
// Samples are channels x height x width floats in CHW order (the loader's rows). A
// transform whose sizes do not match the sample throws shape_error on the loader's
// thread; the loader rethrows it where that batch would have been received.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../ops/random.hpp"
#include "loader.hpp"

namespace locus::data {

namespace detail {
inline void check_sample(const char* what, std::size_t got, index_t c, index_t h, index_t w) {
  if (c <= 0 || h <= 0 || w <= 0 || got != static_cast<std::size_t>(c * h * w))
    throw shape_error(std::string("locus: data::") + what + " of " + std::to_string(c) + " x " + std::to_string(h) +
                      " x " + std::to_string(w) + " got a sample of " + std::to_string(got) + " floats");
}
/// Philox for a transform's stream number at (seed, epoch, sample): the Philox stream
/// is 2^63 | epoch * 2^16 | stream, distinct for every (epoch, stream) pair below 2^47
/// epochs and 2^16 streams, and from every stream the loader's shuffle uses (the epoch).
inline locus::detail::philox_out draw(const sample_key& k, std::uint32_t stream) {
  if (stream >= (1u << 16)) throw value_error("locus: a data transform's stream number must be below 65536");
  return locus::detail::philox4x32(k.seed, static_cast<std::uint64_t>(k.index),
                                   (std::uint64_t{1} << 63) | (k.epoch << 16) | stream);
}
}  // namespace detail

/// A random crop of height x width from the sample padded by `padding` on every side
/// (the padding filled with `fill`), the crop's corner uniform over the 2 * padding + 1
/// positions on each axis: PyTorch's RandomCrop(size, padding).
struct random_crop {
  index_t channels = 1, height = 28, width = 28;
  index_t padding = 2;
  float fill = 0.0f;
  std::uint32_t stream = 1;

  void operator()(std::span<float> x, const sample_key& k) const {
    detail::check_sample("random_crop", x.size(), channels, height, width);
    if (padding < 0) throw shape_error("locus: data::random_crop padding must not be negative");
    if (padding == 0) return;
    const auto r = detail::draw(k, stream);
    const index_t span = 2 * padding + 1;
    const index_t dy = static_cast<index_t>(r.v[0] % static_cast<std::uint32_t>(span)) - padding;
    const index_t dx = static_cast<index_t>(r.v[1] % static_cast<std::uint32_t>(span)) - padding;
    apply_shift(x, dy, dx);
  }
  /// out(y, x) = in(y + dy, x + dx), `fill` outside: the crop at offset (dy, dx).
  void apply_shift(std::span<float> x, index_t dy, index_t dx) const {
    thread_local std::vector<float> tmp;
    tmp.assign(x.begin(), x.end());
    for (index_t c = 0; c < channels; ++c)
      for (index_t y = 0; y < height; ++y)
        for (index_t xx = 0; xx < width; ++xx) {
          const index_t sy = y + dy, sx = xx + dx;
          x[static_cast<std::size_t>((c * height + y) * width + xx)] =
              sy >= 0 && sy < height && sx >= 0 && sx < width ? tmp[static_cast<std::size_t>((c * height + sy) * width + sx)]
                                                              : fill;
        }
  }
};

/// Mirrors the sample left to right with probability p.
struct horizontal_flip {
  index_t channels = 1, height = 28, width = 28;
  float p = 0.5f;
  std::uint32_t stream = 2;

  void operator()(std::span<float> x, const sample_key& k) const {
    detail::check_sample("horizontal_flip", x.size(), channels, height, width);
    if (!(locus::detail::uniform_float(detail::draw(k, stream).v[0]) < p)) return;
    for (index_t r = 0; r < channels * height; ++r) {
      float* row = x.data() + r * width;
      for (index_t a = 0, b = width - 1; a < b; ++a, --b) std::swap(row[a], row[b]);
    }
  }
};

/// (x - mean[c]) / std[c] per channel (one value each: every sample's channel count).
struct normalize {
  std::vector<float> mean{0.0f};
  std::vector<float> std{1.0f};

  void operator()(std::span<float> x, const sample_key&) const {
    if (mean.empty() || mean.size() != std.size() || x.size() % mean.size() != 0)
      throw shape_error("locus: data::normalize needs one mean and one std per channel, and samples of a multiple "
                        "of that many floats; got " + std::to_string(mean.size()) + " means, " +
                        std::to_string(std.size()) + " stds and a sample of " + std::to_string(x.size()));
    const std::size_t plane = x.size() / mean.size();
    for (std::size_t c = 0; c < mean.size(); ++c) {
      if (!(std[c] > 0.0f)) throw value_error("locus: data::normalize std must be positive");
      const float inv = 1.0f / std[c];
      for (std::size_t i = 0; i < plane; ++i) x[c * plane + i] = (x[c * plane + i] - mean[c]) * inv;
    }
  }
};

/// The transforms applied in order, as one loader_options::transform.
template <class... T>
sample_transform compose(T... t) {
  return [... ts = std::move(t)](std::span<float> x, const sample_key& k) { (ts(x, k), ...); };
}

}  // namespace locus::data
