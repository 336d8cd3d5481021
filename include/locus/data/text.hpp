// Text for character-level language models: a corpus read from files, its vocabulary of
// bytes, a deterministic train/validation split, and batches of windows of token ids.
//
//   auto corpus = locus::data::text_corpus::from_path("/usr/share/games/fortunes");
//   auto [train, val] = corpus.split(0.1);                 // the last 10% validates
//   locus::data::token_windows batches(train, 32, 128, 7); // 32 windows of 128, seed 7
//   auto b = batches.next();                               // b.x [32, 128], b.y [32 * 128]
//   t.step(b.x, b.y);                                       // next-token targets
//
// text_corpus reads one file, or every regular file of a directory in name order (files
// ending in .dat, fortune's binary indexes, and symbolic links are left out): the same
// bytes, and so the same ids, on every machine. A token is a byte; the vocabulary is the
// bytes the corpus holds, in byte order, so ids run from 0 to vocabulary_size() - 1.
// Errors before anything is returned: a path that does not exist or cannot be read
// (io_error naming it), a file with a NUL byte (io_error: not text, naming the file and
// the offset), a corpus without a byte, a validation fraction outside [0, 1). split()
// keeps the order: the first part trains, the last validates (no shuffling of text, so
// no window spans both). token_windows draws window offsets from Philox(seed): the same
// seed gives the same batches; a context length of zero, or one that leaves no window in
// the tokens, is a value_error naming both. windows_in_order() gives the consecutive
// windows of a split once (evaluation: every token predicted once but the first of each
// window).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../ops/random.hpp"
#include "../tensor/tensor.hpp"

namespace locus::data {

/// A batch of windows: x [batch, context] token ids, y [batch * context] the id after
/// each position (what cross_entropy takes for logits [batch * context, vocabulary]).
struct text_batch {
  tensor<std::int64_t, cpu, 2> x;
  tensor<std::int64_t, cpu, 1> y;
};

class text_corpus {
 public:
  /// The bytes of one file, or of every regular file of a directory in name order.
  static text_corpus from_path(const std::filesystem::path& path) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec || !std::filesystem::exists(status))
      throw io_error("locus: text corpus '" + path.string() + "' does not exist" +
                     (path.string().find("fortunes") != std::string::npos
                          ? std::string(" (Debian's package fortunes installs it: scripts/install-deps)")
                          : std::string()));
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(status)) {
      for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
        if (e.is_symlink() || !e.is_regular_file() || e.path().extension() == ".dat") continue;
        files.push_back(e.path());
      }
      if (ec) throw io_error("locus: text corpus directory '" + path.string() + "' cannot be read: " + ec.message());
      std::sort(files.begin(), files.end());
      if (files.empty()) throw io_error("locus: text corpus directory '" + path.string() + "' holds no text file");
    } else {
      files.push_back(path);
    }
    std::string bytes;
    for (const auto& f : files) append_file(f, bytes);
    return text_corpus(std::move(bytes), path.string());
  }
  /// A corpus of the given text (tests, a prompt's vocabulary).
  static text_corpus from_text(std::string text) {
    for (std::size_t i = 0; i < text.size(); ++i)
      if (text[i] == '\0')
        throw io_error("locus: the text given has a NUL byte at offset " + std::to_string(i) + "; it is not text");
    return text_corpus(std::move(text), "(text)");
  }

  /// Every token of the corpus, in order.
  [[nodiscard]] std::span<const std::int64_t> ids() const noexcept { return ids_; }
  [[nodiscard]] index_t size() const noexcept { return static_cast<index_t>(ids_.size()); }
  [[nodiscard]] index_t vocabulary_size() const noexcept { return static_cast<index_t>(symbols_.size()); }
  /// The byte of id i.
  [[nodiscard]] unsigned char symbol(index_t i) const {
    if (i < 0 || i >= vocabulary_size())
      throw value_error("locus: id " + std::to_string(i) + " is outside the corpus's vocabulary of " +
                        std::to_string(vocabulary_size()));
    return symbols_[static_cast<std::size_t>(i)];
  }
  [[nodiscard]] const std::string& source() const noexcept { return source_; }

  /// The ids of `text`; a byte the corpus does not hold is a value_error naming it.
  [[nodiscard]] std::vector<std::int64_t> encode(std::string_view text) const {
    std::vector<std::int64_t> out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      if (index_of_[c] < 0)
        throw value_error("locus: byte " + std::to_string(c) + " at offset " + std::to_string(i) +
                          " of the text is not in the corpus's vocabulary");
      out.push_back(index_of_[c]);
    }
    return out;
  }
  /// The text of ids (each in [0, vocabulary_size()): a value_error otherwise).
  [[nodiscard]] std::string decode(std::span<const std::int64_t> ids) const {
    std::string out;
    out.reserve(ids.size());
    for (const std::int64_t i : ids) out.push_back(static_cast<char>(symbol(i)));
    return out;
  }

  /// The first 1 - f of the tokens (training) and the last f (validation), f in [0, 1).
  [[nodiscard]] std::pair<std::span<const std::int64_t>, std::span<const std::int64_t>> split(double f) const {
    if (!(f >= 0.0 && f < 1.0))
      throw value_error("locus: a validation fraction must be in [0, 1), got " + std::to_string(f));
    const auto n = ids_.size();
    const auto v = static_cast<std::size_t>(static_cast<double>(n) * f);
    const std::span<const std::int64_t> all(ids_);
    return {all.first(n - v), all.last(v)};
  }

 private:
  text_corpus(std::string bytes, std::string source) : source_(std::move(source)) {
    if (bytes.empty()) throw value_error("locus: text corpus '" + source_ + "' is empty");
    std::array<bool, 256> seen{};
    for (const char c : bytes) seen[static_cast<unsigned char>(c)] = true;
    index_of_.fill(-1);
    for (int b = 0; b < 256; ++b)
      if (seen[static_cast<std::size_t>(b)]) {
        index_of_[static_cast<std::size_t>(b)] = static_cast<std::int64_t>(symbols_.size());
        symbols_.push_back(static_cast<unsigned char>(b));
      }
    ids_.reserve(bytes.size());
    for (const char c : bytes) ids_.push_back(index_of_[static_cast<unsigned char>(c)]);
  }

  static void append_file(const std::filesystem::path& f, std::string& out) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw io_error("locus: text corpus file '" + f.string() + "' cannot be opened");
    const std::size_t start = out.size();
    out.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) throw io_error("locus: text corpus file '" + f.string() + "' could not be read to its end");
    for (std::size_t i = start; i < out.size(); ++i)
      if (out[i] == '\0')
        throw io_error("locus: text corpus file '" + f.string() + "' has a NUL byte at offset " +
                       std::to_string(i - start) + "; it is not text (a binary file?)");
  }

  std::string source_;
  std::vector<unsigned char> symbols_;
  std::array<std::int64_t, 256> index_of_{};
  std::vector<std::int64_t> ids_;
};

namespace detail {
inline void check_windows(std::size_t tokens, index_t batch, index_t context) {
  if (batch <= 0) throw value_error("locus: text windows need a positive batch size, got " + std::to_string(batch));
  if (context <= 0)
    throw value_error("locus: text windows need a positive context length, got " + std::to_string(context));
  if (static_cast<std::size_t>(context) + 1 > tokens)
    throw value_error("locus: a context of " + std::to_string(context) + " tokens needs at least " +
                      std::to_string(context + 1) + " tokens (a window and the token after it), but the text has " +
                      std::to_string(tokens));
}
inline text_batch window_batch(std::span<const std::int64_t> tokens, const std::vector<std::size_t>& starts,
                               index_t context) {
  const auto b = static_cast<index_t>(starts.size());
  text_batch out{tensor<std::int64_t, cpu, 2>(extents<2>{b, context}), tensor<std::int64_t, cpu, 1>(extents<1>{b * context})};
  for (index_t r = 0; r < b; ++r) {
    const std::int64_t* src = tokens.data() + starts[static_cast<std::size_t>(r)];
    std::copy(src, src + context, out.x.data_handle() + r * context);
    std::copy(src + 1, src + 1 + context, out.y.data_handle() + r * context);
  }
  return out;
}
}  // namespace detail

/// Random windows of a token span (see the header). The span must outlive it.
class token_windows {
 public:
  token_windows(std::span<const std::int64_t> tokens, index_t batch, index_t context, std::uint64_t seed)
      : tokens_(tokens), batch_(batch), context_(context), seed_(seed) {
    detail::check_windows(tokens.size(), batch, context);
  }
  /// The next batch: batch_size() windows at offsets from Philox(seed, draw).
  text_batch next() {
    const auto range = static_cast<std::uint64_t>(tokens_.size() - static_cast<std::size_t>(context_));  // offsets
    std::vector<std::size_t> starts(static_cast<std::size_t>(batch_));
    for (auto& s : starts) {
      const auto r = ::locus::detail::philox4x32(seed_, draws_++, 0);
      const std::uint64_t u = (static_cast<std::uint64_t>(r.v[0]) << 32) | r.v[1];
      s = static_cast<std::size_t>(u % range);  // (a bias below range / 2^64: none that matters)
    }
    return detail::window_batch(tokens_, starts, context_);
  }
  [[nodiscard]] index_t batch_size() const noexcept { return batch_; }
  [[nodiscard]] index_t context() const noexcept { return context_; }
  /// Windows drawn so far (a resumed run sets it back: set_draws).
  [[nodiscard]] std::uint64_t draws() const noexcept { return draws_; }
  void set_draws(std::uint64_t d) noexcept { draws_ = d; }

 private:
  std::span<const std::int64_t> tokens_;
  index_t batch_, context_;
  std::uint64_t seed_, draws_ = 0;
};

/// The consecutive windows of a token span, each once, in batches of `batch` (the last
/// may be smaller; at most max_batches when > 0): an evaluation's batches.
inline std::vector<text_batch> windows_in_order(std::span<const std::int64_t> tokens, index_t batch, index_t context,
                                                index_t max_batches = 0) {
  detail::check_windows(tokens.size(), batch, context);
  const std::size_t windows = (tokens.size() - 1) / static_cast<std::size_t>(context);
  std::vector<text_batch> out;
  std::vector<std::size_t> starts;
  for (std::size_t w = 0; w < windows; ++w) {
    starts.push_back(w * static_cast<std::size_t>(context));
    if (static_cast<index_t>(starts.size()) == batch || w + 1 == windows) {
      out.push_back(detail::window_batch(tokens, starts, context));
      starts.clear();
      if (max_batches > 0 && static_cast<index_t>(out.size()) == max_batches) break;
    }
  }
  return out;
}

}  // namespace locus::data
