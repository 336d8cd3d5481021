// IDX files (the format of MNIST and Fashion-MNIST), plain or gzip-compressed, into
// cpu tensors; and idx_dataset, an images file paired with a labels file.
//
//   auto images = locus::data::read_idx<locus::u8, 3>("train-images-idx3-ubyte.gz");
//   locus::data::idx_dataset train("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz");
//   auto x = train.images_normalized();   // float [N, rows, cols], x / 255
//   auto y = train.labels();              // i64 [N]
//
// An IDX file is a 4-byte magic number (two zero bytes, the element type code, the
// rank), one big-endian u32 extent per axis, then the elements, big-endian, row-major.
// locus reads element types u8 (0x08), i32 (0x0C), f32 (0x0D) and f64 (0x0E); the
// dtype and rank asked for must be the file's (compile-time T and R, run-time check).
//
// A file starting with the gzip magic (1f 8b) is inflated with zlib, so link with zlib
// (find_package(ZLIB), ZLIB::ZLIB); any other file is read as plain IDX. Every failure
// is a locus::io_error that names the file and what was expected: a missing file, a
// wrong magic number, another element type or rank, a truncated file, a corrupt gzip
// stream, bytes after the data or after the gzip stream (another gzip member may
// follow, as gzip allows; nothing else). The parser never reads past the end of its
// input, and it refuses a header announcing more data than a regular file can hold
// before allocating anything; a FIFO or a device is read as its bytes arrive, into a
// buffer no larger than what came.
//
// read_idx_from_memory parses a buffer with the same code (the fuzz target
// tests/fuzz/fuzz_idx.cpp drives it).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/config.hpp"
#include "../core/device.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/shape.hpp"
#include "../tensor/tensor.hpp"

namespace locus::data {

namespace detail {

using locus::detail::always_false;

/// IDX element type codes.
template <class T>
inline constexpr unsigned idx_code = 0;
template <>
inline constexpr unsigned idx_code<std::uint8_t> = 0x08;
template <>
inline constexpr unsigned idx_code<std::int32_t> = 0x0C;
template <>
inline constexpr unsigned idx_code<float> = 0x0D;
template <>
inline constexpr unsigned idx_code<double> = 0x0E;

inline const char* idx_type_name(unsigned code) noexcept {
  switch (code) {
    case 0x08: return "u8";
    case 0x09: return "i8";
    case 0x0B: return "i16";
    case 0x0C: return "i32";
    case 0x0D: return "f32";
    case 0x0E: return "f64";
    default: return nullptr;
  }
}

inline std::string hex(unsigned v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*X", digits, v);
  return buf;
}

template <class T>
constexpr bool require_idx_dtype() {
  static_assert(idx_code<T> != 0 || always_false<T>,
                "locus: IDX files hold u8, i8, i16, i32, f32 or f64 elements, and locus reads "
                "u8, i32, f32 and f64; read the file as one of those (e.g. locus::data::read_idx<locus::u8, R>) "
                "and convert with locus::cast<T>");
  return idx_code<T> != 0;
}

/// Bytes from a buffer. remaining() is exact.
class memory_reader {
 public:
  explicit memory_reader(std::span<const std::byte> bytes) noexcept : bytes_(bytes) {}
  std::size_t read(void* dst, std::size_t n) {
    const std::size_t k = n < bytes_.size() - pos_ ? n : bytes_.size() - pos_;
    if (k) std::memcpy(dst, bytes_.data() + pos_, k);
    pos_ += k;
    return k;
  }
  /// At most this many bytes can still be read.
  [[nodiscard]] std::uint64_t max_remaining() const noexcept { return bytes_.size() - pos_; }
  [[nodiscard]] static constexpr bool bounded() noexcept { return true; }
  /// Says how max_remaining() was obtained, for messages.
  [[nodiscard]] std::string remaining_note() const {
    return "only " + std::to_string(max_remaining()) + " bytes follow";
  }

 private:
  std::span<const std::byte> bytes_;
  std::size_t pos_ = 0;
};

/// Bytes from a file, plain or gzip-compressed (the first two bytes 1f 8b), through
/// its descriptor and zlib's inflate. A regular file's size bounds what it can hold;
/// a FIFO or a device is read as its bytes arrive (bounded() is false). After a gzip
/// stream only another gzip member may follow: anything else (garbage appended to a
/// .gz file, which gzread would skip) is an io_error.
class file_reader {
 public:
  explicit file_reader(const std::filesystem::path& path) : name_(path.string()) {
    do fd_ = ::open(name_.c_str(), O_RDONLY | O_CLOEXEC);
    while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0)
      throw io_error("locus: cannot open IDX file '" + name_ + "': " + std::strerror(errno) +
                     "; expected a readable IDX file, plain or gzip-compressed");
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      bounded_ = true;
      file_size_ = static_cast<std::uint64_t>(st.st_size);
    }
    try {
      fill_to(2);
      gzip_ = in_len_ - in_pos_ >= 2 && buf_[in_pos_] == 0x1f && buf_[in_pos_ + 1] == 0x8b;
      if (gzip_ && inflateInit2(&z_, 15 + 16) != Z_OK)  // gzip only: the magic said so
        throw io_error("locus: '" + name_ + "': zlib could not start inflating (out of memory?)");
    } catch (...) {
      ::close(fd_);
      throw;
    }
  }
  file_reader(const file_reader&) = delete;
  file_reader& operator=(const file_reader&) = delete;
  ~file_reader() {
    if (gzip_) (void)inflateEnd(&z_);
    ::close(fd_);
  }

  std::size_t read(void* dst, std::size_t n) {
    auto* out = static_cast<unsigned char*>(dst);
    const std::size_t done = gzip_ ? inflate_into(out, n) : copy_into(out, n);
    consumed_ += done;
    return done;
  }

  /// Whether max_remaining() bounds the input (a regular file); otherwise data is
  /// buffered as it arrives, never sized by the header.
  [[nodiscard]] bool bounded() const noexcept { return bounded_; }
  /// An upper bound on what can still be read: the file's size for a plain file,
  /// 1032 times it for a gzip file (deflate's largest expansion); no bound for a
  /// FIFO or a device.
  [[nodiscard]] std::uint64_t max_remaining() const noexcept {
    if (!bounded_) return std::numeric_limits<std::uint64_t>::max();
    if (!gzip_) return file_size_ > consumed_ ? file_size_ - consumed_ : 0;
    const std::uint64_t cap = std::numeric_limits<std::uint64_t>::max() / 1032;
    return file_size_ > cap ? std::numeric_limits<std::uint64_t>::max() : file_size_ * 1032;
  }
  [[nodiscard]] std::string remaining_note() const {
    if (!gzip_) return "only " + std::to_string(max_remaining()) + " bytes follow";
    return "the " + std::to_string(file_size_) + "-byte gzip file cannot hold that many";
  }

 private:
  static constexpr std::size_t buffer_size = std::size_t{1} << 17;

  /// Reads more input into the buffer; false at the end of the file.
  bool fill() {
    if (in_pos_ == in_len_) in_pos_ = in_len_ = 0;
    if (in_len_ == buf_.size()) return true;
    for (;;) {
      const ssize_t got = ::read(fd_, buf_.data() + in_len_, buf_.size() - in_len_);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) read_error();
      in_len_ += static_cast<std::size_t>(got);
      return got > 0;
    }
  }
  /// At least k bytes in the buffer, unless the file ends first.
  void fill_to(std::size_t k) {
    if (in_pos_ > 0 && in_len_ - in_pos_ < k) {  // keep the unread bytes at the front
      std::memmove(buf_.data(), buf_.data() + in_pos_, in_len_ - in_pos_);
      in_len_ -= in_pos_;
      in_pos_ = 0;
    }
    while (in_len_ - in_pos_ < k && fill()) {
    }
  }

  std::size_t copy_into(unsigned char* out, std::size_t n) {
    std::size_t done = std::min(n, in_len_ - in_pos_);
    if (done) std::memcpy(out, buf_.data() + in_pos_, done);
    in_pos_ += done;
    while (done < n) {  // the rest straight from the file
      const std::size_t want = n - done < (std::size_t{1} << 30) ? n - done : (std::size_t{1} << 30);
      const ssize_t got = ::read(fd_, out + done, want);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) read_error();
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  }

  std::size_t inflate_into(unsigned char* out, std::size_t n) {
    std::size_t done = 0;
    while (done < n) {
      if (member_done_) {  // the end of the file, or another gzip member
        fill_to(2);
        const std::size_t left = in_len_ - in_pos_;
        if (left == 0) break;
        if (left < 2 || buf_[in_pos_] != 0x1f || buf_[in_pos_ + 1] != 0x8b)
          throw io_error("locus: '" + name_ + "' has bytes after the end of its gzip stream that are not another "
                         "gzip member; expected the file to end with the stream");
        (void)inflateReset(&z_);
        member_done_ = false;
      }
      if (in_pos_ == in_len_ && !fill())
        throw io_error("locus: '" + name_ + "' is truncated: the gzip stream ends early; expected a complete "
                       "gzip-compressed IDX file");
      const std::size_t want = n - done < (std::size_t{1} << 30) ? n - done : (std::size_t{1} << 30);
      z_.next_in = buf_.data() + in_pos_;
      z_.avail_in = static_cast<uInt>(in_len_ - in_pos_);
      z_.next_out = out + done;
      z_.avail_out = static_cast<uInt>(want);
      const int r = inflate(&z_, Z_NO_FLUSH);
      in_pos_ = in_len_ - z_.avail_in;
      done += want - z_.avail_out;
      if (r == Z_STREAM_END) {
        member_done_ = true;
      } else if (r == Z_BUF_ERROR && z_.avail_in == 0) {
        // no progress without more input: the next turn reads it
      } else if (r != Z_OK) {
        if (r == Z_MEM_ERROR) throw io_error("locus: '" + name_ + "': zlib ran out of memory inflating it");
        throw io_error("locus: '" + name_ + "': corrupt gzip stream (zlib: " +
                       std::string(z_.msg ? z_.msg : "unknown error") +
                       "); expected a valid gzip-compressed or plain IDX file");
      }
    }
    return done;
  }

  [[noreturn]] void read_error() const {
    throw io_error("locus: '" + name_ + "': read error (" + std::strerror(errno) +
                   "); expected a valid gzip-compressed or plain IDX file");
  }

  std::string name_;
  int fd_ = -1;
  bool bounded_ = false, gzip_ = false, member_done_ = false;
  std::uint64_t file_size_ = 0, consumed_ = 0;
  std::vector<unsigned char> buf_ = std::vector<unsigned char>(buffer_size);  // not on the stack
  std::size_t in_pos_ = 0, in_len_ = 0;
  z_stream z_{};
};

/// The IDX parser, over any reader (memory_reader, gz_reader).
template <class T, std::size_t R, class Reader>
tensor<T, cpu, R> parse_idx(Reader& in, const std::string& name) {
  unsigned char magic[4] = {0, 0, 0, 0};
  const std::size_t got_magic = in.read(magic, 4);
  if (got_magic < 4)
    throw io_error("locus: '" + name + "' is truncated: expected a 4-byte IDX magic number, found " +
                   std::to_string(got_magic) + " bytes");
  const unsigned code = magic[2], rank = magic[3];
  const unsigned value = (unsigned{magic[0]} << 24) | (unsigned{magic[1]} << 16) | (code << 8) | rank;
  const char* type_name = idx_type_name(code);
  if (magic[0] != 0 || magic[1] != 0 || !type_name)
    throw io_error("locus: '" + name + "' is not an IDX file: its magic number is " + hex(value, 8) +
                   "; expected " + hex((idx_code<T> << 8) | static_cast<unsigned>(R), 8) +
                   " (two zero bytes, the element type code, the rank)");
  if (code != idx_code<T>)
    throw io_error("locus: '" + name + "' holds " + type_name + " elements (IDX type " + hex(code, 2) +
                   "), expected " + std::string(dtype_name<T>) + " (" + hex(idx_code<T>, 2) +
                   "); read it with the element type it holds");
  if (rank != R)
    throw io_error("locus: '" + name + "' holds a rank-" + std::to_string(rank) +
                   " array, expected rank " + std::to_string(R) + "; read it with read_idx<T, " +
                   std::to_string(rank) + ">");

  extents<R> shape{};
  unsigned char dims[4 * (R == 0 ? 1 : R)] = {};
  const std::size_t got_dims = in.read(dims, 4 * R);
  if (got_dims < 4 * R)
    throw io_error("locus: '" + name + "' is truncated: expected " + std::to_string(4 * R) +
                   " bytes of extents (rank " + std::to_string(R) + "), found " +
                   std::to_string(got_dims));
  for (std::size_t a = 0; a < R; ++a)
    shape[a] = static_cast<index_t>((std::uint32_t{dims[4 * a]} << 24) | (std::uint32_t{dims[4 * a + 1]} << 16) |
                                    (std::uint32_t{dims[4 * a + 2]} << 8) | std::uint32_t{dims[4 * a + 3]});

  // Element count and byte size, refused before allocating when they cannot fit or
  // cannot be in the input.
  // The product of the non-zero extents bounds every partial product of the shape,
  // so no element count computed later (even with a zero extent) can overflow.
  constexpr std::uint64_t max_numel = (std::uint64_t{1} << 62) / sizeof(T);
  std::uint64_t nonzero = 1;
  bool has_zero = false;
  for (std::size_t a = 0; a < R; ++a) {
    const auto e = static_cast<std::uint64_t>(shape[a]);
    if (e == 0) {
      has_zero = true;
    } else if (nonzero > max_numel / e) {
      throw io_error("locus: '" + name + "' is not a valid IDX file: its header announces shape " +
                     locus::detail::shape_string(shape) + " of " + std::string(dtype_name<T>) +
                     ", more than 2^62 bytes; expected extents whose product is the number of "
                     "elements that follow");
    } else {
      nonzero *= e;
    }
  }
  const std::uint64_t numel = has_zero ? 0 : nonzero;
  const std::uint64_t bytes = numel * sizeof(T);
  if (bytes > in.max_remaining())
    throw io_error("locus: '" + name + "' is truncated: its header announces shape " +
                   locus::detail::shape_string(shape) + " of " + std::string(dtype_name<T>) + " (" +
                   std::to_string(bytes) + " bytes of data), but " + in.remaining_note());

  tensor<T, cpu, R> out;
  std::size_t got = 0;
  if (in.bounded()) {  // the input can hold `bytes`: allocate, then read
    out = tensor<T, cpu, R>(shape);
    got = bytes ? in.read(out.data_handle(), static_cast<std::size_t>(bytes)) : 0;
  } else {
    // A FIFO or a device may claim anything: buffer what arrives (the buffer grows with
    // it), and make the tensor once all of it is there.
    std::vector<unsigned char> arrived;
    std::uint64_t chunk = 1u << 16;
    while (arrived.size() < bytes) {
      const std::size_t at = arrived.size();
      const auto want = static_cast<std::size_t>(bytes - at < chunk ? bytes - at : chunk);
      arrived.resize(at + want);
      const std::size_t k = in.read(arrived.data() + at, want);
      arrived.resize(at + k);
      if (k < want) break;
      if (chunk < (std::uint64_t{1} << 26)) chunk *= 2;
    }
    got = arrived.size();
    if (got == bytes) {
      out = tensor<T, cpu, R>(shape);
      if (got) std::memcpy(out.data_handle(), arrived.data(), got);
    }
  }
  if (got < bytes)
    throw io_error("locus: '" + name + "' is truncated: expected " + std::to_string(bytes) +
                   " bytes of data for shape " + locus::detail::shape_string(shape) + ", found only " +
                   std::to_string(got));
  unsigned char extra = 0;
  if (in.read(&extra, 1) != 0)
    throw io_error("locus: '" + name + "' has bytes after the " + std::to_string(bytes) +
                   " bytes of data its header announces (shape " + locus::detail::shape_string(shape) +
                   "); expected the file to end there");

  if constexpr (sizeof(T) > 1 && std::endian::native == std::endian::little) {
    auto* p = reinterpret_cast<unsigned char*>(out.data_handle());
    for (std::uint64_t i = 0; i < numel; ++i, p += sizeof(T))
      for (std::size_t k = 0; k < sizeof(T) / 2; ++k) std::swap(p[k], p[sizeof(T) - 1 - k]);
  }
  return out;
}

}  // namespace detail

/// Reads one IDX file (plain or gzip-compressed) into a cpu tensor of rank R. A file
/// of another element type or rank, or a broken one, is io_error naming the file.
template <Dtype T, std::size_t R>
tensor<T, cpu, R> read_idx(const std::filesystem::path& path) {
  if constexpr (detail::require_idx_dtype<T>()) {
    detail::file_reader in(path);
    return detail::parse_idx<T, R>(in, path.string());
  } else {
    return {};
  }
}

/// Parses an IDX image held in memory (not compressed). `name` appears in messages.
template <Dtype T, std::size_t R>
tensor<T, cpu, R> read_idx_from_memory(std::span<const std::byte> bytes,
                                       std::string_view name = "<memory>") {
  if constexpr (detail::require_idx_dtype<T>()) {
    detail::memory_reader in(bytes);
    return detail::parse_idx<T, R>(in, std::string(name));
  } else {
    return {};
  }
}

/// An images file ([N, rows, cols] u8) paired with a labels file ([N] u8), as in
/// MNIST and Fashion-MNIST. Images come out as u8 or normalised float (x / 255),
/// labels as i64. Move-only (it owns the tensors).
class idx_dataset {
 public:
  /// Reads both files; their counts must match (io_error naming both otherwise).
  idx_dataset(const std::filesystem::path& images, const std::filesystem::path& labels)
      : images_(read_idx<std::uint8_t, 3>(images)) {
    auto raw = read_idx<std::uint8_t, 1>(labels);
    if (raw.extent(0) != images_.extent(0))
      throw io_error("locus: '" + images.string() + "' holds " + std::to_string(images_.extent(0)) +
                     " images but '" + labels.string() + "' holds " + std::to_string(raw.extent(0)) +
                     " labels; expected one label per image (a mismatched pair of files?)");
    labels_ = tensor<std::int64_t, cpu, 1>(raw.shape());
    const std::uint8_t* s = raw.data_handle();
    std::int64_t* d = labels_.data_handle();
    for (index_t i = 0; i < raw.numel(); ++i) d[i] = s[i];
  }

  /// From tensors already in memory (a test, a generated dataset); counts must match
  /// (shape_error otherwise).
  idx_dataset(tensor<std::uint8_t, cpu, 3> images, tensor<std::int64_t, cpu, 1> labels)
      : images_(std::move(images)), labels_(std::move(labels)) {
    if (images_.extent(0) != labels_.extent(0))
      throw shape_error("locus: idx_dataset of " + std::to_string(images_.extent(0)) +
                        " images and " + std::to_string(labels_.extent(0)) +
                        " labels; expected one label per image");
  }

  /// `{dir}/{prefix}-images-idx3-ubyte[.gz]` and `{dir}/{prefix}-labels-idx1-ubyte[.gz]`,
  /// the MNIST file names (prefix "train" or "t10k"); the .gz file when both exist.
  static idx_dataset from_directory(const std::filesystem::path& dir, std::string_view prefix) {
    auto pick = [&](const std::string& stem) {
      auto gz = dir / (stem + ".gz");
      return std::filesystem::exists(gz) ? gz : dir / stem;
    };
    const std::string p(prefix);
    return idx_dataset(pick(p + "-images-idx3-ubyte"), pick(p + "-labels-idx1-ubyte"));
  }

  [[nodiscard]] index_t size() const noexcept { return images_.shape()[0]; }
  [[nodiscard]] index_t rows() const noexcept { return images_.shape()[1]; }
  [[nodiscard]] index_t cols() const noexcept { return images_.shape()[2]; }
  /// rows * cols: the length of one flattened image.
  [[nodiscard]] index_t features() const noexcept { return rows() * cols(); }

  /// The images as stored, u8 [N, rows, cols].
  [[nodiscard]] tensor_view<const std::uint8_t, cpu, 3> images() const& noexcept { return images_.view(); }
  // Prevents: a view into a temporary dataset (idx_dataset(...).images()).
  template <class U = std::uint8_t>
  tensor_view<const U, cpu, 3> images() const&& {
    static_assert(locus::detail::always_false<U>,
                  "locus: images() of a temporary dataset would dangle: the dataset is freed at the end "
                  "of the statement; keep it in a variable first: auto ds = ...; then ds.images()");
    return {};
  }
  /// The images as float in [0, 1] (x / 255), a new tensor [N, rows, cols].
  [[nodiscard]] tensor<float, cpu, 3> images_normalized() const {
    tensor<float, cpu, 3> out(images_.shape());
    normalize(images_.data_handle(), out.data_handle(), images_.numel());
    return out;
  }
  /// The labels, i64 [N].
  [[nodiscard]] tensor_view<const std::int64_t, cpu, 1> labels() const& noexcept { return labels_.view(); }
  template <class U = std::int64_t>
  tensor_view<const U, cpu, 1> labels() const&& {
    static_assert(locus::detail::always_false<U>,
                  "locus: labels() of a temporary dataset would dangle: the dataset is freed at the end "
                  "of the statement; keep it in a variable first: auto ds = ...; then ds.labels()");
    return {};
  }

  /// Sample i for data::loader: writes its features() normalised pixels to x and
  /// returns its label.
  std::int64_t load(index_t i, std::span<float> x) const {
    if (i < 0 || i >= size() || static_cast<index_t>(x.size()) != features())
      throw index_error("locus: idx_dataset::load(" + std::to_string(i) + ") of " +
                        std::to_string(size()) + " samples into " + std::to_string(x.size()) +
                        " floats; expected an index in range and " + std::to_string(features()) +
                        " floats");
    normalize(images_.data_handle() + i * features(), x.data(), features());
    return labels_.data_handle()[i];
  }

 private:
  // x / 255 exactly (a division, not a multiplication by 1/255, which differs in the
  // last bit for some x), through a table.
  static void normalize(const std::uint8_t* s, float* d, index_t n) noexcept {
    static const auto table = [] {
      std::array<float, 256> t{};
      for (int v = 0; v < 256; ++v) t[static_cast<std::size_t>(v)] = static_cast<float>(v) / 255.0f;
      return t;
    }();
    for (index_t k = 0; k < n; ++k) d[k] = table[s[k]];
  }

  tensor<std::uint8_t, cpu, 3> images_;
  tensor<std::int64_t, cpu, 1> labels_;
};

}  // namespace locus::data
