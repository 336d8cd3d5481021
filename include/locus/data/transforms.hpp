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
// Samples are channels x height x width floats in CHW order (the loader's rows). Each
// transform has a check(sample_shape&) that the loader runs when it is built (with the
// dataset's features()) and data::images runs again (with channels, height and width),
// so sizes that do not fit the samples, a normalize with another channel count than the
// images, a padding past the image or a probability outside [0, 1] are a shape_error or
// value_error before any batch. random_crop and horizontal_flip declare the shape they
// take, and compose passes it on: compose(random_crop{.channels = 1, ...},
// normalize{.mean = {a, b, c}}) is refused even on a loader of rows. A transform called
// by hand on a sample of the wrong size throws shape_error (on the loader's thread, the
// loader rethrows it where that batch would have been received).
#pragma once

#include <cstdint>
#include <span>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../ops/random.hpp"
#include "loader.hpp"

namespace locus::data {

namespace detail {
/// channels * height * width, all positive and the product within index_t; shape_error
/// naming the transform otherwise.
inline index_t sample_floats(const char* what, index_t c, index_t h, index_t w) {
  index_t n = 0;
  if (c <= 0 || h <= 0 || w <= 0 || __builtin_mul_overflow(c, h, &n) || __builtin_mul_overflow(n, w, &n))
    throw shape_error(std::string("locus: data::") + what + " needs positive channels, height and width whose " +
                      "product fits in 64 bits; got " + std::to_string(c) + " x " + std::to_string(h) + " x " +
                      std::to_string(w));
  return n;
}
inline void check_sample(const char* what, std::size_t got, index_t c, index_t h, index_t w) {
  if (got != static_cast<std::size_t>(sample_floats(what, c, h, w)))
    throw shape_error(std::string("locus: data::") + what + " of " + std::to_string(c) + " x " + std::to_string(h) +
                      " x " + std::to_string(w) + " got a sample of " + std::to_string(got) + " floats");
}
inline std::string shape_text(const sample_shape& s) {
  if (s.channels > 0)
    return std::to_string(s.channels) + " x " + std::to_string(s.height) + " x " + std::to_string(s.width) +
           " images (" + std::to_string(s.features) + " floats)";
  return "samples of " + std::to_string(s.features) + " floats";
}
/// A transform that takes c x h x w samples: they must be the loader's (its features,
/// and its channels, height and width when known); fills them in when not known yet.
inline void declare_shape(const char* what, sample_shape& s, index_t c, index_t h, index_t w) {
  const index_t n = sample_floats(what, c, h, w);
  const bool differs = n != s.features || (s.channels > 0 && (s.channels != c || s.height != h || s.width != w));
  if (differs)
    throw shape_error(std::string("locus: data::") + what + " takes " + std::to_string(c) + " x " +
                      std::to_string(h) + " x " + std::to_string(w) + " samples (" + std::to_string(n) +
                      " floats), but the loader's are " + shape_text(s) + "; set its channels, height and width to "
                      "the samples'");
  s.channels = c;
  s.height = h;
  s.width = w;
}
/// Philox for a transform's stream number at (seed, epoch, sample): the Philox stream
/// is 2^63 | epoch * 2^16 | stream, distinct for every (epoch, stream) pair below 2^47
/// epochs and 2^16 streams, and from every stream the loader's shuffle uses (the epoch).
inline void check_stream(const char* what, std::uint32_t stream) {
  if (stream >= (1u << 16))
    throw value_error(std::string("locus: data::") + what + ": a data transform's stream number must be below 65536, got " +
                      std::to_string(stream));
}
inline locus::detail::philox_out draw(const sample_key& k, std::uint32_t stream) {
  if (stream >= (1u << 16)) throw value_error("locus: a data transform's stream number must be below 65536");
  return locus::detail::philox4x32(k.seed, static_cast<std::uint64_t>(k.index),
                                   (std::uint64_t{1} << 63) | (k.epoch << 16) | stream);
}
}  // namespace detail

/// A random crop of height x width from the sample padded by `padding` on every side
/// (the padding filled with `fill`), the crop's corner uniform over the 2 * padding + 1
/// positions on each axis: PyTorch's RandomCrop(size, padding). The padding must be
/// below the height and the width, so every crop keeps part of the image (a larger one
/// gives crops of nothing but `fill`); fill must be finite.
struct random_crop {
  index_t channels = 1, height = 28, width = 28;
  index_t padding = 2;
  float fill = 0.0f;
  std::uint32_t stream = 1;

  /// The loader's check (see the header comment): the fields, and the samples' shape.
  void check(sample_shape& s) const {
    check_fields();
    detail::declare_shape("random_crop", s, channels, height, width);
  }
  void operator()(std::span<float> x, const sample_key& k) const {
    detail::check_sample("random_crop", x.size(), channels, height, width);
    check_fields();
    if (padding == 0) return;
    const auto r = detail::draw(k, stream);
    const index_t span = 2 * padding + 1;  // padding < min(height, width) and < 2^31: no overflow
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

 private:
  void check_fields() const {
    (void)detail::sample_floats("random_crop", channels, height, width);
    const index_t side = height < width ? height : width;
    if (padding < 0 || padding >= side || padding >= (index_t{1} << 31))
      throw shape_error("locus: data::random_crop padding must be in [0, " + std::to_string(side - 1) +
                        "] for " + std::to_string(height) + " x " + std::to_string(width) +
                        " images (below the height and the width: every crop keeps part of the image), got " +
                        std::to_string(padding));
    if (!(fill - fill == 0.0f))
      throw value_error("locus: data::random_crop fill must be a finite number, got " + std::to_string(fill));
    detail::check_stream("random_crop", stream);
  }
};

/// Mirrors the sample left to right with probability p (in [0, 1]).
struct horizontal_flip {
  index_t channels = 1, height = 28, width = 28;
  float p = 0.5f;
  std::uint32_t stream = 2;

  void check(sample_shape& s) const {
    check_fields();
    detail::declare_shape("horizontal_flip", s, channels, height, width);
  }
  void operator()(std::span<float> x, const sample_key& k) const {
    detail::check_sample("horizontal_flip", x.size(), channels, height, width);
    check_fields();
    if (!(locus::detail::uniform_float(detail::draw(k, stream).v[0]) < p)) return;
    for (index_t r = 0; r < channels * height; ++r) {
      float* row = x.data() + r * width;
      for (index_t a = 0, b = width - 1; a < b; ++a, --b) std::swap(row[a], row[b]);
    }
  }

 private:
  void check_fields() const {
    (void)detail::sample_floats("horizontal_flip", channels, height, width);
    if (!(p >= 0.0f && p <= 1.0f))  // NaN too: it would never flip, silently
      throw value_error("locus: data::horizontal_flip probability p must be in [0, 1], got " + std::to_string(p));
    detail::check_stream("horizontal_flip", stream);
  }
};

/// (x - mean[c]) / std[c] per channel: one mean and one std per channel of the images,
/// or a single one for every channel (PyTorch's Normalize broadcasts it). The loader
/// checks the count against the images' channels when they are known (data::images, or
/// a random_crop / horizontal_flip in the same compose): another count is a shape_error
/// naming both counts and the image shape. Where no shape is known (a loader of rows
/// and nothing declaring one), a sample is cut into mean.size() equal planes.
struct normalize {
  std::vector<float> mean{0.0f};
  std::vector<float> std{1.0f};

  void check(sample_shape& s) const {
    check_values();
    const std::size_t n = mean.size();
    if (s.channels > 0) {
      if (n != 1 && static_cast<index_t>(n) != s.channels)
        throw shape_error("locus: data::normalize has " + std::to_string(n) + " means and stds (one per channel), but "
                          "the loader's samples are " + detail::shape_text(s) + " with " +
                          std::to_string(s.channels) + " channel" + (s.channels == 1 ? "" : "s") + "; give " +
                          std::to_string(s.channels) + " values (or one for every channel)");
    } else if (s.features % static_cast<index_t>(n) != 0) {
      throw shape_error("locus: data::normalize has " + std::to_string(n) + " means and stds (one per channel), but "
                        "the loader's samples of " + std::to_string(s.features) + " floats do not split into " +
                        std::to_string(n) + " channels");
    }
  }
  void operator()(std::span<float> x, const sample_key&) const {
    check_values();
    if (x.size() % mean.size() != 0)
      throw shape_error("locus: data::normalize needs one mean and one std per channel, and samples of a multiple "
                        "of that many floats; got " + std::to_string(mean.size()) + " means, " +
                        std::to_string(std.size()) + " stds and a sample of " + std::to_string(x.size()));
    const std::size_t plane = x.size() / mean.size();
    for (std::size_t c = 0; c < mean.size(); ++c) {
      const float inv = 1.0f / std[c];
      for (std::size_t i = 0; i < plane; ++i) x[c * plane + i] = (x[c * plane + i] - mean[c]) * inv;
    }
  }

 private:
  void check_values() const {
    if (mean.empty() || mean.size() != std.size())
      throw shape_error("locus: data::normalize needs one mean and one std per channel; got " +
                        std::to_string(mean.size()) + " means and " + std::to_string(std.size()) + " stds");
    for (std::size_t c = 0; c < mean.size(); ++c) {
      if (!(mean[c] - mean[c] == 0.0f))
        throw value_error("locus: data::normalize mean[" + std::to_string(c) + "] must be finite, got " +
                          std::to_string(mean[c]));
      // positive, finite, and with a finite reciprocal (a subnormal std would give inf)
      if (!(std[c] > 0.0f && std[c] - std[c] == 0.0f && 1.0f / std[c] - 1.0f / std[c] == 0.0f))
        throw value_error("locus: data::normalize std[" + std::to_string(c) + "] must be positive and finite with a "
                          "finite reciprocal, got " + std::to_string(std[c]));
    }
  }
};

namespace detail {
template <class... T>
struct composed {
  std::tuple<T...> parts;
  void operator()(std::span<float> x, const sample_key& k) const {
    std::apply([&](const auto&... t) { (t(x, k), ...); }, parts);
  }
  /// Twice over the parts: the first pass learns the shape any part declares (a failure
  /// there is raised by the second, which checks every part with all that is known), so
  /// the order of the parts does not matter to the check.
  void check(sample_shape& s) const {
    const auto each = [&](auto&& one) {
      std::apply([&](const auto&... t) { (one(t), ...); }, parts);
    };
    each([&](const auto& t) {
      if constexpr (requires { t.check(s); }) {
        try {
          t.check(s);
        } catch (const ::locus::error&) {
        }
      }
    });
    each([&](const auto& t) {
      if constexpr (requires { t.check(s); }) t.check(s);
    });
  }
};
}  // namespace detail

/// The transforms applied in order, as one loader_options::transform (checked as one:
/// a shape one part declares is known to the others).
template <class... T>
sample_transform compose(T... t) {
  return detail::composed<T...>{std::tuple<T...>(std::move(t)...)};
}

}  // namespace locus::data
