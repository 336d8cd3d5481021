// safetensors files (the format of Hugging Face's `safetensors` package, which PyTorch
// reads with safetensors.torch.load_file): an 8-byte little-endian header length, a
// JSON header {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
// ..., "__metadata__": {"key": "value"}}, then the raw little-endian data.
//
//   locus::io::writer w;
//   w.add("0.weight", model_weight_view);          // any device: copied to the host
//   w.metadata("epoch", "3");
//   w.save("ckpt.safetensors");                     // atomic: temporary file, fsync, rename
//
//   auto a = locus::io::load<locus::cuda>("ckpt.safetensors");  // map_location as a type
//   tensor_view<const float, locus::cuda, 2> w0 = a.get<float, 2>("0.weight");
//
// A missing, truncated or corrupt file, or a tensor of another dtype or rank than asked
// for, throws locus::io_error naming the file and what is wrong (for a typed request:
// the tensor, its dtype and shape, and the dtype or rank asked for). The reader is written
// for hostile files (load() lists what a file must be): nothing in it recurses over
// the file's JSON (nesting is bounded before parsing, values in messages are never
// serialised), no buffer is sized by a claim the file cannot back (a regular file's
// size bounds every claim, a FIFO or device is read as its bytes arrive), and no byte
// is handed out that reading as its dtype would make undefined (BOOL is 0 or 1). Keep
// the archive in a variable while its views live: get() and flat() of a temporary do
// not compile. Needs nlohmann-json (Debian: nlohmann-json3-dev; CMake target locus::json).
//
// Integrity: every file locus writes carries the CRC32C of each tensor's bytes in its
// __metadata__, as "locus.crc32c.<tensor name>": "<8 lowercase hex digits>" (metadata
// is strings to strings, so the Python package and PyTorch read the file as before).
// load() verifies each one after reading and before anything is handed out: a mismatch
// is an io_error naming the file and the tensor. A file with no such keys (written by
// another program) loads unverified; one with a malformed key, a key for a tensor the
// file does not hold, or checksums for some tensors and not others is corrupt. The
// header has its own CRC32C, "locus.header_crc32c": over every other metadata key and
// value and every tensor's name, dtype and shape, so a flipped bit in the epoch, the
// learning rate or a shape of a checkpoint is refused as well (a file with tensor
// checksums and without it is corrupt). A file whose "format" is locus's own
// "locus-model-2" or "locus-checkpoint-2" must carry the checksums (stripping them is
// refused); "-1" files, written before checksums, load unverified.
//
// Length (over 600 lines): the writer and the reader of one format, with the header's
// validation (each hostile-file check beside the field it checks).
#pragma once

#if !defined(LOCUS_HAS_JSON) || !LOCUS_HAS_JSON
#error "locus: locus/io/safetensors.hpp needs nlohmann-json, but LOCUS_HAS_JSON is not 1: install nlohmann-json3-dev and link locus::locus (CMake finds it as locus::json), or define LOCUS_HAS_JSON=1 with <nlohmann/json.hpp> on the include path"
#endif

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../ops/expr.hpp"
#include "crc32c.hpp"
#include "../tensor/tensor.hpp"
#include "../transfer/copy.hpp"

namespace locus::io {

/// The __metadata__ key prefix of a tensor's CRC32C (see the header comment).
inline constexpr std::string_view checksum_key_prefix = "locus.crc32c.";
/// The __metadata__ key of the header's CRC32C: every other metadata key and value and
/// every tensor's name, dtype and shape (see the header comment).
inline constexpr std::string_view header_checksum_key = "locus.header_crc32c";

namespace detail {
/// The header's checksum: over the metadata (sorted by key, without the checksum keys)
/// and the tensors (sorted by name) as name, dtype and shape, each field ended by a NUL.
template <class Meta, class Tensors, class DtypeOf, class ShapeOf>
std::uint32_t header_crc(const Meta& meta, const Tensors& tensors, DtypeOf dtype_of, ShapeOf shape_of) {
  std::string text;
  for (const auto& [k, v] : meta) {
    if (k.compare(0, checksum_key_prefix.size(), checksum_key_prefix) == 0 || k == header_checksum_key) continue;
    text += k;
    text += '\0';
    text += v;
    text += '\0';
  }
  text += '\1';  // the tensors follow
  for (const auto& [name, t] : tensors) {
    text += name;
    text += '\0';
    text += dtype_of(t);
    text += '\0';
    for (const auto e : shape_of(t)) {
      text += std::to_string(e);
      text += ',';
    }
    text += '\0';
  }
  return crc32c(text.data(), text.size());
}
/// Creates the directories above `path` (nn::save, save_checkpoint); an io_error naming
/// the directory and the reason when that fails (a regular file in the way, no
/// permission), instead of std::filesystem's own exception.
inline void make_parent_directories(const std::filesystem::path& path) {
  if (!path.has_parent_path()) return;
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec)
    throw ::locus::io_error("locus: cannot create the directory '" + path.parent_path().string() + "' for '" +
                            path.string() + "': " + ec.message());
}
inline std::string crc_hex(std::uint32_t c) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", c);
  return buf;
}
/// 8 lowercase hex digits, as crc_hex writes them; false for anything else.
inline bool parse_crc_hex(const std::string& s, std::uint32_t& out) noexcept {
  if (s.size() != 8) return false;
  std::uint32_t v = 0;
  for (char ch : s) {
    unsigned d;
    if (ch >= '0' && ch <= '9') d = static_cast<unsigned>(ch - '0');
    else if (ch >= 'a' && ch <= 'f') d = static_cast<unsigned>(ch - 'a' + 10);
    else return false;
    v = v << 4 | d;
  }
  out = v;
  return true;
}
template <class T>
constexpr const char* st_dtype() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return "F32";
  else if constexpr (std::is_same_v<U, double>) return "F64";
  else if constexpr (std::is_same_v<U, std::int32_t>) return "I32";
  else if constexpr (std::is_same_v<U, std::int64_t>) return "I64";
  else if constexpr (std::is_same_v<U, std::uint8_t>) return "U8";
  else if constexpr (std::is_same_v<U, bool>) return "BOOL";
  else if constexpr (std::is_same_v<U, ::locus::f16>) return "F16";
  else if constexpr (std::is_same_v<U, ::locus::bf16>) return "BF16";
  else return "";
}

/// The C++ type locus reads a safetensors dtype as ("" for the dtypes it only carries).
inline const char* st_cpp_type(const std::string& d) {
  if (d == "F32") return "float";
  if (d == "F64") return "double";
  if (d == "F16") return "locus::f16";
  if (d == "BF16") return "locus::bf16";
  if (d == "I32") return "std::int32_t";
  if (d == "I64") return "std::int64_t";
  if (d == "U8") return "std::uint8_t";
  if (d == "BOOL") return "bool";
  return "";
}

/// Bits per element of a safetensors dtype, 0 for one the format does not have. Every
/// dtype the Python safetensors package writes (0.8: safetensors.serialize) is known, so
/// its files open even where locus has no C++ type for a tensor's dtype (C64, the F8
/// variants, the sub-byte F4 and F6, whose tensors must end on a byte boundary).
inline unsigned st_dtype_bits(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64" || d == "C64") return 64;
  if (d == "F32" || d == "I32" || d == "U32") return 32;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 16;
  if (d == "U8" || d == "I8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2" || d == "F8_E4M3FNUZ" ||
      d == "F8_E5M2FNUZ" || d == "F8_E8M0")
    return 8;
  if (d == "F6_E2M3" || d == "F6_E3M2") return 6;
  if (d == "F4") return 4;
  return 0;
}

inline std::string shape_text(const std::vector<index_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}
}  // namespace detail

/// What a file says about one tensor.
struct tensor_info {
  std::string dtype;  ///< safetensors spelling: F32, BF16, I64, ...
  std::vector<index_t> shape;
  std::size_t offset = 0;  ///< where its bytes start in the archive's device buffer
  std::size_t bytes = 0;

  [[nodiscard]] std::string shape_string() const { return detail::shape_text(shape); }
};

/// Collects tensors (from any device) and metadata, and writes them as one file.
class writer {
 public:
  /// Adds a tensor or view under `name` (copied to the host now).
  template <TensorLike X>
  void add(const std::string& name, const X& x) {
    using tr = locus::detail::tensor_traits<std::remove_cvref_t<X>>;
    using T = typename tr::value_type;
    static_assert(detail::st_dtype<T>()[0] != '\0', "locus: safetensors stores f32, f64, f16, bf16, i32, i64, u8 and bool");
    if (name == "__metadata__" || name.empty())
      throw ::locus::value_error("locus: '" + name + "' is not a valid safetensors tensor name");
    if (items_.count(name))
      throw ::locus::value_error("locus: io::writer already holds a tensor named '" + name +
                                 "'; a file holds one tensor per name (the first would be lost): choose another name");
    const auto h = to<cpu>(locus::detail::as_view_const(x));
    item it;
    it.dtype = detail::st_dtype<T>();
    for (std::size_t a = 0; a < tr::rank; ++a) it.shape.push_back(h.shape()[a]);
    it.data.resize(h.size_bytes());
    if (h.size_bytes()) std::memcpy(it.data.data(), h.data_handle(), h.size_bytes());
    items_[name] = std::move(it);
  }
  /// A string in the header's __metadata__. Keys beginning "locus.crc32c." are the
  /// tensors' checksums, which save() writes itself: a value_error.
  void metadata(const std::string& key, const std::string& value) {
    if (key.compare(0, checksum_key_prefix.size(), checksum_key_prefix) == 0 || key == header_checksum_key)
      throw ::locus::value_error("locus: metadata key '" + key + "' is reserved: keys beginning '" +
                                 std::string(checksum_key_prefix) +
                                 "' hold the tensors' checksums, which save() writes; choose another key");
    meta_[key] = value;
  }

  /// Writes the file atomically: a temporary file in the same directory, flushed to
  /// disk, then renamed over `path`, and the directory flushed so that the rename is
  /// durable too. A crash or kill leaves the previous file intact; the temporary file a
  /// killed writer left (`path.tmp.PID`, PID no longer running) is removed by the next
  /// save to the same path.
  void save(const std::filesystem::path& path) const {
    remove_stale_temporaries(path);
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    std::map<std::string, std::string> meta = meta_;
    for (const auto& [name, it] : items_)
      meta[std::string(checksum_key_prefix) + name] = detail::crc_hex(crc32c(it.data.data(), it.data.size()));
    meta[std::string(header_checksum_key)] = detail::crc_hex(detail::header_crc(
        meta_, items_, [](const item& i) -> const std::string& { return i.dtype; },
        [](const item& i) -> const std::vector<index_t>& { return i.shape; }));
    header["__metadata__"] = meta;
    std::size_t offset = 0;
    for (const auto& [name, it] : items_) {
      header[name] = {{"dtype", it.dtype}, {"shape", it.shape}, {"data_offsets", {offset, offset + it.data.size()}}};
      offset += it.data.size();
    }
    std::string text = header.dump();
    while ((8 + text.size()) % 8 != 0) text.push_back(' ');  // data starts 8-byte aligned
    const std::uint64_t n = text.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));

    const std::filesystem::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw io_error("locus: cannot create '" + tmp.string() + "': " + std::strerror(errno));
    auto fail = [&](const char* what) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      std::filesystem::remove(tmp);
      throw io_error("locus: " + std::string(what) + " '" + tmp.string() + "': " + why);
    };
    auto put = [&](const void* p, std::size_t k) {
      const char* c = static_cast<const char*>(p);
      while (k > 0) {
        const ssize_t w = ::write(fd, c, k);
        if (w < 0) {
          if (errno == EINTR) continue;
          fail("writing");
        }
        c += w;
        k -= static_cast<std::size_t>(w);
      }
    };
    put(len, 8);
    put(text.data(), text.size());
    for (const auto& [name, it] : items_) put(it.data.data(), it.data.size());
    if (::fsync(fd) != 0) fail("flushing");
    if (::close(fd) != 0) {
      std::filesystem::remove(tmp);
      throw io_error("locus: closing '" + tmp.string() + "': " + std::strerror(errno));
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
      std::filesystem::remove(tmp);
      throw io_error("locus: cannot rename '" + tmp.string() + "' to '" + path.string() + "': " + ec.message());
    }
    // the rename lives in the directory: flush it (best effort: some file systems refuse)
    const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      (void)::close(dfd);
    }
  }

  /// Removes `path.tmp.PID` files whose writer (PID) has exited: what a kill during a
  /// save leaves behind. A live writer's temporary file is left alone.
  static void remove_stale_temporaries(const std::filesystem::path& path) {
    const std::string prefix = path.filename().string() + ".tmp.";
    const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
    std::error_code ec;
    std::filesystem::directory_iterator it(dir, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string digits = name.substr(prefix.size());
      if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      const auto pid = static_cast<pid_t>(std::stol(digits));
      if (pid <= 0 || pid == ::getpid()) continue;
      if (::kill(pid, 0) != 0 && errno == ESRCH) {
        std::error_code rm;
        std::filesystem::remove(it->path(), rm);
      }
    }
  }

 private:
  struct item {
    std::string dtype;
    std::vector<index_t> shape;
    std::vector<unsigned char> data;
  };
  std::map<std::string, item> items_;
  std::map<std::string, std::string> meta_;
};

namespace detail {
/// Text from a file for a message: control bytes escaped (\xNN), at most 80 bytes
/// (a name or value of a hostile file may hold NULs, newlines or megabytes).
inline std::string printable(std::string_view s) {
  std::string out;
  const std::size_t keep = s.size() > 80 ? 80 : s.size();
  for (std::size_t i = 0; i < keep; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (keep < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

/// A JSON value for a message, never serialised recursively: scalars as JSON, strings
/// through printable(), arrays and objects by their size.
inline std::string describe(const nlohmann::json& j) {
  if (j.is_string()) return "\"" + printable(j.get_ref<const std::string&>()) + "\"";
  if (j.is_array()) return "an array of " + std::to_string(j.size()) + " elements";
  if (j.is_object()) return "an object of " + std::to_string(j.size()) + " members";
  return j.dump();  // a number, a bool or null: no recursion
}

/// The largest header io::load reads (the safetensors library's own limit, 100 MB).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;
/// The deepest nesting of arrays and objects io::load parses. A valid header nests 3
/// deep (header, tensor, shape); the limit keeps hostile files (100000 levels) away
/// from anything recursive.
inline constexpr int max_header_depth = 16;

/// Where the header nests deeper than max_header_depth (its byte offset), or npos. A
/// scan of the raw bytes, brackets counted outside strings, before any parsing.
inline std::size_t too_deep_at(std::string_view text) noexcept {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_header_depth) return i;
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced text is the parser's to reject
    }
  }
  return std::string_view::npos;
}

/// A file read through its descriptor: the size of a regular file is known (fstat);
/// a FIFO, a character device or a socket is read as its bytes arrive.
class file_source {
 public:
  explicit file_source(std::string path) : path_(std::move(path)) {
    do fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) throw io_error("locus: cannot open checkpoint '" + path_ + "': " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int e = errno;
      ::close(fd_);
      throw io_error("locus: cannot read the size of '" + path_ + "': " + std::strerror(e));
    }
    // A size is known for a regular file; an empty one reads as a stream, so /proc's
    // files (size 0, yet with content) do too.
    regular_ = S_ISREG(st.st_mode) && st.st_size > 0;
    size_ = regular_ ? static_cast<std::uint64_t>(st.st_size) : 0;
  }
  file_source(const file_source&) = delete;
  file_source& operator=(const file_source&) = delete;
  ~file_source() { ::close(fd_); }

  /// Whether size() is the file's size (a non-empty regular file).
  [[nodiscard]] bool regular() const noexcept { return regular_; }
  /// The file's size when regular() (0 otherwise).
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }

  /// Reads up to n bytes (fewer only at the end of the file).
  std::size_t read(void* dst, std::size_t n) {
    auto* out = static_cast<unsigned char*>(dst);
    std::size_t done = 0;
    while (done < n) {
      const std::size_t want = n - done < (std::size_t{1} << 30) ? n - done : (std::size_t{1} << 30);
      const ssize_t got = ::read(fd_, out + done, want);
      if (got < 0) {
        if (errno == EINTR) continue;
        throw io_error("locus: reading '" + path_ + "' failed: " + std::strerror(errno));
      }
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  }

  /// Exactly n bytes or fewer at the end of the file, into a buffer that grows only as
  /// bytes arrive: a FIFO that claims 16 GiB and sends 10 bytes costs 64 KiB.
  std::vector<unsigned char> read_bounded(std::uint64_t n) {
    std::vector<unsigned char> out;
    if (regular_) {  // n was checked against the file's size
      out.resize(static_cast<std::size_t>(n));
      out.resize(read(out.data(), out.size()));
      return out;
    }
    std::uint64_t chunk = 1u << 16;
    while (out.size() < n) {
      const std::size_t at = out.size();
      const auto want = static_cast<std::size_t>(n - at < chunk ? n - at : chunk);
      out.resize(at + want);
      const std::size_t got = read(out.data() + at, want);
      out.resize(at + got);
      if (got < want) break;
      if (chunk < (std::uint64_t{1} << 26)) chunk *= 2;
    }
    return out;
  }

  /// Whether the file ends here (no byte follows).
  bool at_end() {
    unsigned char c = 0;
    return read(&c, 1) == 0;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool regular_ = false;
  std::uint64_t size_ = 0;
};
}  // namespace detail

/// The tensors of one file, on device D.
///
/// Keep the archive in a variable while its views are used: get() and flat() of a
/// temporary (`io::load<D>(p).get<float, 2>("w")`) do not compile, since the views
/// would point into memory freed at the end of the statement. The members that return
/// references give a temporary's values by value instead.
template <Device D>
class archive {
 public:
  [[nodiscard]] bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  [[nodiscard]] const tensor_info& info(const std::string& name) const& {
    auto it = entries_.find(name);
    if (it == entries_.end())
      throw io_error("locus: '" + path_ + "' holds no tensor named '" + detail::printable(name) + "'");
    return it->second;
  }
  [[nodiscard]] tensor_info info(const std::string& name) const&& { return info(name); }
  [[nodiscard]] const std::map<std::string, tensor_info>& entries() const& noexcept { return entries_; }
  [[nodiscard]] std::map<std::string, tensor_info> entries() const&& { return entries_; }
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const& noexcept { return meta_; }
  [[nodiscard]] std::map<std::string, std::string> metadata() const&& { return meta_; }
  [[nodiscard]] std::string metadata(const std::string& key) const {
    auto it = meta_.find(key);
    if (it == meta_.end())
      throw io_error("locus: '" + path_ + "' has no metadata entry '" + detail::printable(key) + "'");
    return it->second;
  }
  [[nodiscard]] const std::string& path() const& noexcept { return path_; }
  [[nodiscard]] std::string path() const&& { return path_; }
  /// How many tensors load() verified against their CRC32C (0: the file has no
  /// checksums, e.g. another program wrote it).
  [[nodiscard]] std::size_t verified_tensors() const noexcept { return verified_; }

  /// Tensor `name` as a flat view on D, whatever its rank; io_error if it has another dtype.
  template <class T>
  [[nodiscard]] tensor_view<const T, D, 1> flat(const std::string& name) const& {
    const tensor_info& e = info(name);
    check_dtype<T>(name, e);
    return {::locus::detail::raw_view_key{}, reinterpret_cast<const T*>(data_.data_handle() + e.offset),
            extents<1>{static_cast<index_t>(e.bytes / sizeof(T))}};
  }
  template <class T>
  tensor_view<const T, D, 1> flat(const std::string&) const&& {
    static_assert(locus::detail::always_false<T>,
                  "locus: flat() of a temporary archive would return a view into memory freed at the end of "
                  "the statement; keep the loaded file in a variable: auto a = locus::io::load<D>(path); "
                  "auto w = a.flat<T>(name);");
    return {};
  }

  /// Tensor `name` as a view on D; io_error if it has another dtype or rank.
  template <class T, std::size_t R>
  [[nodiscard]] tensor_view<const T, D, R> get(const std::string& name) const& {
    const tensor_info& e = info(name);
    check_dtype<T>(name, e);
    if (e.shape.size() != R)
      throw io_error("locus: tensor '" + detail::printable(name) + "' in '" + path_ + "' has rank " +
                     std::to_string(e.shape.size()) + " (" + detail::printable(e.dtype) + " " + e.shape_string() +
                     "), but rank " + std::to_string(R) + " was asked for (get<" + detail::st_cpp_type(e.dtype) +
                     ", " + std::to_string(R) + ">); ask for rank " + std::to_string(e.shape.size()) +
                     " and reshape() the view");
    extents<R> s{};
    for (std::size_t a = 0; a < R; ++a) s[a] = e.shape[a];
    return {::locus::detail::raw_view_key{}, reinterpret_cast<const T*>(data_.data_handle() + e.offset), s};
  }
  template <class T, std::size_t R>
  tensor_view<const T, D, R> get(const std::string&) const&& {
    static_assert(locus::detail::always_false<T>,
                  "locus: get() of a temporary archive would return a view into memory freed at the end of "
                  "the statement; keep the loaded file in a variable: auto a = locus::io::load<D>(path); "
                  "auto w = a.get<T, R>(name);");
    return {};
  }

 private:
  template <Device D2>
  friend archive<D2> load(const std::filesystem::path& path);

  template <class T>
  void check_dtype(const std::string& name, const tensor_info& e) const {
    if (e.dtype != detail::st_dtype<T>()) {
      const std::string own = detail::st_cpp_type(e.dtype);
      throw io_error("locus: tensor '" + detail::printable(name) + "' in '" + path_ + "' is " +
                     detail::printable(e.dtype) + " " + e.shape_string() + ", but " + detail::st_dtype<T>() + " (" +
                     detail::st_cpp_type(detail::st_dtype<T>()) + ") was asked for; " +
                     (own.empty() ? "locus has no C++ type for " + e.dtype + " (info() describes the tensor)"
                                  : "ask for " + own + " and convert after loading (locus::cast)"));
    }
  }

  std::string path_;
  std::map<std::string, tensor_info> entries_;
  std::map<std::string, std::string> meta_;
  tensor<std::uint8_t, D, 1> data_;
  std::size_t verified_ = 0;
};

/// Reads a safetensors file and places its tensors on D (map_location as a type).
///
/// What a file must be, else io_error naming it: a header length of at most 100 MB
/// that fits the file; a JSON object nested at most 16 deep with no key twice in one
/// object; string metadata; per tensor a known dtype (every one the safetensors package
/// writes; get() and flat() read F32, F64, F16, BF16, I32, I64, U8 and BOOL), non-negative
/// integer extents and [begin, end] offsets whose span is the shape's byte count (of the
/// sub-byte F4 and F6, a whole number of bytes); tensors that tile
/// the data section exactly (no overlaps, no holes, nothing after the last; empty
/// tensors anywhere inside it); BOOL elements 0 or 1. A regular file's claims are
/// checked against its size before anything is allocated; any other file (a FIFO, a
/// device) is read as its bytes arrive, with buffers no larger than what came.
template <Device D>
archive<D> load(const std::filesystem::path& path) {
  archive<D> a;
  a.path_ = path.string();
  detail::file_source f(a.path_);
  auto corrupt = [&](const std::string& what) { return io_error("locus: '" + a.path_ + "' is corrupt: " + what); };

  unsigned char len[8];
  const std::size_t got_len = f.read(len, 8);
  if (got_len < 8)
    throw io_error("locus: '" + a.path_ + "' is truncated: " + std::to_string(got_len) +
                   " bytes, too short for a safetensors header length");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(len[i]) << (8 * i);
  if (n == 0) throw corrupt("its header length is 0; expected a JSON header of at least 2 bytes ({})");
  if (f.regular() && n > f.size() - 8)
    throw io_error("locus: '" + a.path_ + "' is truncated or corrupt: its header claims " + std::to_string(n) +
                   " bytes but only " + std::to_string(f.size() - 8) + " follow");
  if (n > detail::max_header_bytes)
    throw corrupt("its header claims " + std::to_string(n) + " bytes, more than the " +
                  std::to_string(detail::max_header_bytes) + " a safetensors header may have");
  const std::vector<unsigned char> raw_header = f.read_bounded(n);
  if (raw_header.size() < n)
    throw io_error("locus: '" + a.path_ + "' is truncated: its header claims " + std::to_string(n) +
                   " bytes but only " + std::to_string(raw_header.size()) + " follow");
  const std::string_view text(reinterpret_cast<const char*>(raw_header.data()), raw_header.size());
  if (const std::size_t at = detail::too_deep_at(text); at != std::string_view::npos)
    throw corrupt("its header nests JSON arrays and objects more than " + std::to_string(detail::max_header_depth) +
                  " deep (at byte " + std::to_string(at) + " of the header); a safetensors header nests 3 deep");

  nlohmann::json header;
  try {
    // Rejects a key that appears twice in one object (nlohmann would keep the last):
    // which of two "w" entries is the tensor is not for the reader to guess.
    std::vector<std::set<std::string>> keys;  // per open object
    header = nlohmann::json::parse(text, [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& j) {
      using E = nlohmann::json::parse_event_t;
      if (ev == E::object_start) {
        keys.emplace_back();
      } else if (ev == E::object_end) {
        if (!keys.empty()) keys.pop_back();
      } else if (ev == E::key && !keys.empty()) {
        const auto& k = j.get_ref<const std::string&>();
        if (!keys.back().insert(k).second)
          throw corrupt("its header has the key \"" + detail::printable(k) + "\" twice in one object");
      }
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    throw corrupt(std::string("its header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) throw corrupt("its header is " + detail::describe(header) + ", not a JSON object");

  struct span {
    std::uint64_t begin, end;
    const std::string* name;
    tensor_info* info;
  };
  std::vector<span> spans;
  try {
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string tname = detail::printable(it.key());
      const auto& v = it.value();
      if (it.key() == "__metadata__") {
        if (!v.is_object()) throw corrupt("its __metadata__ is " + detail::describe(v) + ", expected an object of strings");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string())
            throw corrupt("__metadata__ '" + detail::printable(m.key()) + "' is " + detail::describe(m.value()) +
                          ", expected a string (safetensors metadata maps strings to strings)");
          a.meta_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      if (!v.is_object())
        throw corrupt("tensor '" + tname + "' is described by " + detail::describe(v) +
                      ", expected an object with dtype, shape and data_offsets");
      for (const char* field : {"dtype", "shape", "data_offsets"})
        if (!v.contains(field)) throw corrupt("tensor '" + tname + "' has no " + field);
      const auto& dtype = v["dtype"];
      if (!dtype.is_string()) throw corrupt("tensor '" + tname + "' has dtype " + detail::describe(dtype) + ", expected a string");
      tensor_info e;
      e.dtype = dtype.get<std::string>();
      const unsigned bits = detail::st_dtype_bits(e.dtype);
      if (bits == 0)
        throw io_error("locus: '" + a.path_ + "': tensor '" + tname + "' has unknown dtype " +
                       detail::printable(e.dtype) +
                       " (safetensors has BOOL, U8, I8, F8_E4M3, F8_E5M2, F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0, F6_E2M3, "
                       "F6_E3M2, F4, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64, C64)");
      // Integers only: nlohmann's get<int64_t>() of 1e30 is a float conversion out of
      // range (undefined behaviour), and of 2^63 a wrap to a negative number.
      auto integer = [&](const nlohmann::json& j, const char* what) -> std::uint64_t {
        if (j.is_number_unsigned()) return j.get<std::uint64_t>();
        if (j.is_number_integer()) {
          const auto x = j.get<std::int64_t>();
          if (x < 0) throw corrupt("tensor '" + tname + "' has a negative " + what + " (" + std::to_string(x) + ")");
          return static_cast<std::uint64_t>(x);
        }
        throw corrupt("tensor '" + tname + "' has " + what + " " + detail::describe(j) +
                      ", expected a non-negative integer");
      };
      const auto& shape = v["shape"];
      if (!shape.is_array())
        throw corrupt("tensor '" + tname + "' has shape " + detail::describe(shape) + ", expected an array of extents");
      std::uint64_t count = 1;
      for (const auto& d : shape) {
        const std::uint64_t x = integer(d, "extent");
        if (x > static_cast<std::uint64_t>(std::numeric_limits<index_t>::max()))
          throw corrupt("tensor '" + tname + "' has an extent too large for any file (" + std::to_string(x) + ")");
        e.shape.push_back(static_cast<index_t>(x));
        // count * bits is compared with the data section's size below: an overflow
        // here would let a corrupt shape pass with a small product.
        if (x != 0 && count > (std::numeric_limits<std::uint64_t>::max() / bits) / x)
          throw corrupt("tensor '" + tname + "' has a shape too large for any file");
        count *= x;
      }
      if (count * bits % 8 != 0)
        throw corrupt("tensor '" + tname + "' of shape " + e.shape_string() + " and dtype " + e.dtype + " holds " +
                      std::to_string(count) + " elements of " + std::to_string(bits) +
                      " bits, which do not end on a byte boundary");
      const std::uint64_t need = count * bits / 8;
      const auto& offsets = v["data_offsets"];
      if (!offsets.is_array() || offsets.size() != 2)
        throw corrupt("tensor '" + tname + "' has data_offsets " + detail::describe(offsets) +
                      ", expected [begin, end]");
      const std::uint64_t begin = integer(offsets[0], "data offset");
      const std::uint64_t end = integer(offsets[1], "data offset");
      const std::uint64_t limit = f.regular() ? f.size() - 8 - n : std::numeric_limits<std::uint64_t>::max();
      if (begin > end || end > limit)
        throw io_error("locus: '" + a.path_ + "' is truncated or corrupt: tensor '" + tname + "' spans bytes [" +
                       std::to_string(begin) + ", " + std::to_string(end) + ") of a " + std::to_string(limit) +
                       "-byte data section");
      if (end - begin != need)
        throw corrupt("tensor '" + tname + "' of shape " + e.shape_string() + " and dtype " + e.dtype + " needs " +
                      std::to_string(need) + " bytes but spans " + std::to_string(end - begin));
      e.bytes = static_cast<std::size_t>(end - begin);
      auto& slot = a.entries_[it.key()] = std::move(e);
      spans.push_back({begin, end, &it.key(), &slot});
    }
  } catch (const nlohmann::json::exception& e) {
    throw corrupt(e.what());
  }
  // The tensors tile the data section: no two share bytes (without this, a small file
  // of many tensors spanning the same bytes would make the buffer below, one copy per
  // tensor, as large as tensors x data section), no byte belongs to none, nothing
  // follows the last (the safetensors library refuses all three).
  std::sort(spans.begin(), spans.end(),
            [](const span& x, const span& y) { return x.begin != y.begin ? x.begin < y.begin : x.end < y.end; });
  auto range = [](const span& s) { return "[" + std::to_string(s.begin) + ", " + std::to_string(s.end) + ")"; };
  std::uint64_t data_size = 0;  // where the last tensor ends: the data section's size
  {
    std::uint64_t& at = data_size;
    const span* last = nullptr;
    for (const span& s : spans) {
      if (s.begin == s.end) continue;  // an empty tensor holds no bytes
      if (last && s.begin < at)
        throw corrupt("tensors '" + detail::printable(*last->name) + "' (bytes " + range(*last) + ") and '" +
                      detail::printable(*s.name) + "' (bytes " + range(s) + ") overlap");
      if (s.begin > at)
        throw corrupt("bytes [" + std::to_string(at) + ", " + std::to_string(s.begin) +
                      ") of the data section belong to no tensor (the next, '" + detail::printable(*s.name) +
                      "', starts at " + std::to_string(s.begin) + "); expected tensors that cover it without gaps");
      at = s.end;
      last = &s;
    }
    if (f.regular() && at != f.size() - 8 - n)
      throw corrupt("the last " + std::to_string(f.size() - 8 - n - at) + " bytes of its " +
                    std::to_string(f.size() - 8 - n) + "-byte data section belong to no tensor (they end at byte " +
                    std::to_string(at) + "); expected the file to end with its last tensor");
    for (const span& s : spans)
      if (s.begin == s.end && s.begin > at)
        throw corrupt("empty tensor '" + detail::printable(*s.name) + "' is placed at byte " +
                      std::to_string(s.begin) + ", past the " + std::to_string(at) +
                      "-byte data section its other tensors cover");
  }

  // Lay every tensor out 64-byte aligned in one host buffer, then one copy to D. A
  // file of unknown size is read first (as it arrives), so a header's claims never
  // size a buffer.
  std::vector<unsigned char> arrived;
  if (!f.regular()) {
    arrived = f.read_bounded(data_size);
    if (arrived.size() < data_size)
      throw io_error("locus: '" + a.path_ + "' is truncated: its tensors need a " + std::to_string(data_size) +
                     "-byte data section but only " + std::to_string(arrived.size()) + " bytes follow the header");
  }
  std::size_t total = 0;
  for (span& s : spans) {
    s.info->offset = total;
    total += (s.info->bytes + 63) / 64 * 64;
  }
  tensor<std::uint8_t, cpu, 1> host(extents<1>{static_cast<index_t>(total)});
  for (const span& s : spans) {  // in file order: one sequential read
    if (s.begin == s.end) continue;
    unsigned char* dst = host.data_handle() + s.info->offset;
    if (f.regular()) {
      if (f.read(dst, s.info->bytes) != s.info->bytes)
        throw io_error("locus: '" + a.path_ + "' is truncated: it ended inside tensor '" + detail::printable(*s.name) +
                       "' (the file shrank while it was read?)");
    } else {
      std::memcpy(dst, arrived.data() + s.begin, s.info->bytes);
    }
  }
  if (!f.at_end())
    throw corrupt("bytes follow the " + std::to_string(data_size) +
                  "-byte data section its tensors cover; expected the file to end with its last tensor");
  // Checksums (see the header comment): every one verified before anything is handed out.
  {
    std::size_t checked = 0;
    const auto hk = a.meta_.find(std::string(header_checksum_key));
    bool any_tensor_sum = false;
    for (const auto& [key, value] : a.meta_)
      any_tensor_sum = any_tensor_sum || key.compare(0, checksum_key_prefix.size(), checksum_key_prefix) == 0;
    if (any_tensor_sum && hk == a.meta_.end())
      throw corrupt("it holds tensor checksums but no header checksum ('" + std::string(header_checksum_key) +
                    "'): its metadata was edited or damaged after locus wrote it");
    if (hk != a.meta_.end()) {
      std::uint32_t stored = 0;
      if (!detail::parse_crc_hex(hk->second, stored))
        throw corrupt("its header checksum is '" + detail::printable(hk->second) + "', not 8 lowercase hex digits");
      const std::uint32_t computed = detail::header_crc(
          a.meta_, a.entries_, [](const tensor_info& i) -> const std::string& { return i.dtype; },
          [](const tensor_info& i) -> const std::vector<index_t>& { return i.shape; });
      if (computed != stored)
        throw corrupt("its header (metadata, tensor names, dtypes or shapes) does not match its CRC32C checksum "
                      "(stored " + hk->second + ", computed " + detail::crc_hex(computed) +
                      "): it changed after locus wrote it (a disk, copy or memory error, or an edit); use another "
                      "copy of the file or an earlier checkpoint");
    }
    for (const auto& [key, value] : a.meta_) {
      if (key.compare(0, checksum_key_prefix.size(), checksum_key_prefix) != 0) continue;
      const std::string tname = key.substr(checksum_key_prefix.size());
      auto e = a.entries_.find(tname);
      if (e == a.entries_.end())
        throw corrupt("its metadata holds a checksum for a tensor '" + detail::printable(tname) +
                      "' that the file does not hold");
      std::uint32_t stored = 0;
      if (!detail::parse_crc_hex(value, stored))
        throw corrupt("the checksum of tensor '" + detail::printable(tname) + "' is '" + detail::printable(value) +
                      "', not 8 lowercase hex digits");
      const std::uint32_t computed = crc32c(host.data_handle() + e->second.offset, e->second.bytes);
      if (computed != stored)
        throw corrupt("tensor '" + detail::printable(tname) + "' does not match its CRC32C checksum (stored " + value +
                      ", computed " + detail::crc_hex(computed) +
                      "): its bytes changed after locus wrote them (a disk, copy or memory error); use another "
                      "copy of the file or an earlier checkpoint");
      ++checked;
    }
    if (checked != 0 && checked != a.entries_.size())
      for (const auto& [name, e] : a.entries_)
        if (!a.meta_.count(std::string(checksum_key_prefix) + name))
          throw corrupt("tensor '" + detail::printable(name) + "' has no checksum although " + std::to_string(checked) +
                        " of its other tensors have one (a tensor added or renamed after locus wrote the file?)");
    // A format of locus's that carries checksums, without any: they were stripped.
    if (checked == 0 && !a.entries_.empty())
      if (const auto f = a.meta_.find("format");
          f != a.meta_.end() && (f->second == "locus-model-2" || f->second == "locus-checkpoint-2"))
        throw corrupt("it says format '" + f->second +
                      "', which locus writes with a CRC32C for every tensor, but it holds none: its checksums were "
                      "removed after locus wrote it");
    a.verified_ = checked;
  }
  // A bool is 0 or 1: reading any other byte as a bool is undefined behaviour.
  for (const span& s : spans) {
    if (s.info->dtype != "BOOL") continue;
    const unsigned char* p = host.data_handle() + s.info->offset;
    for (std::size_t i = 0; i < s.info->bytes; ++i)
      if (p[i] > 1)
        throw corrupt("BOOL tensor '" + detail::printable(*s.name) + "' holds byte " + std::to_string(p[i]) +
                      " at element " + std::to_string(i) + "; a BOOL element is 0 (false) or 1 (true)");
  }
  if constexpr (std::is_same_v<D, cpu>) a.data_ = std::move(host);
  else a.data_ = to<D>(host);
  return a;
}

}  // namespace locus::io
