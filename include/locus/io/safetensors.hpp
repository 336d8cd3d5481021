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
// for, throws locus::io_error naming the file and what is wrong. Needs nlohmann-json
// (Debian: nlohmann-json3-dev; CMake target locus::json).
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
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../ops/expr.hpp"
#include "../tensor/tensor.hpp"
#include "../transfer/copy.hpp"

namespace locus::io {

namespace detail {
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

inline std::size_t st_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "U8" || d == "I8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
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
      throw std::invalid_argument("locus: '" + name + "' is not a valid safetensors tensor name");
    const auto h = to<cpu>(locus::detail::as_view_const(x));
    item it;
    it.dtype = detail::st_dtype<T>();
    for (std::size_t a = 0; a < tr::rank; ++a) it.shape.push_back(h.shape()[a]);
    it.data.resize(h.size_bytes());
    if (h.size_bytes()) std::memcpy(it.data.data(), h.data_handle(), h.size_bytes());
    items_[name] = std::move(it);
  }
  /// A string in the header's __metadata__.
  void metadata(const std::string& key, const std::string& value) { meta_[key] = value; }

  /// Writes the file atomically: a temporary file in the same directory, flushed to
  /// disk, then renamed over `path`. A crash leaves the previous file intact.
  void save(const std::filesystem::path& path) const {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!meta_.empty()) header["__metadata__"] = meta_;
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

/// The tensors of one file, on device D.
template <Device D>
class archive {
 public:
  [[nodiscard]] bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  [[nodiscard]] const tensor_info& info(const std::string& name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) throw io_error("locus: '" + path_ + "' holds no tensor named '" + name + "'");
    return it->second;
  }
  [[nodiscard]] const std::map<std::string, tensor_info>& entries() const noexcept { return entries_; }
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const noexcept { return meta_; }
  [[nodiscard]] std::string metadata(const std::string& key) const {
    auto it = meta_.find(key);
    if (it == meta_.end()) throw io_error("locus: '" + path_ + "' has no metadata entry '" + key + "'");
    return it->second;
  }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  /// Tensor `name` as a flat view on D, whatever its rank; io_error if it has another dtype.
  template <class T>
  [[nodiscard]] tensor_view<const T, D, 1> flat(const std::string& name) const {
    const tensor_info& e = info(name);
    if (e.dtype != detail::st_dtype<T>())
      throw io_error("locus: tensor '" + name + "' in '" + path_ + "' is " + e.dtype + ", not " +
                     detail::st_dtype<T>());
    return {reinterpret_cast<const T*>(data_.data_handle() + e.offset),
            extents<1>{static_cast<index_t>(e.bytes / sizeof(T))}};
  }

  /// Tensor `name` as a view on D; io_error if it has another dtype or rank.
  template <class T, std::size_t R>
  [[nodiscard]] tensor_view<const T, D, R> get(const std::string& name) const {
    const tensor_info& e = info(name);
    if (e.dtype != detail::st_dtype<T>())
      throw io_error("locus: tensor '" + name + "' in '" + path_ + "' is " + e.dtype + ", not " +
                     detail::st_dtype<T>());
    if (e.shape.size() != R)
      throw io_error("locus: tensor '" + name + "' in '" + path_ + "' has rank " + std::to_string(e.shape.size()) +
                     " (shape " + e.shape_string() + "), not " + std::to_string(R));
    extents<R> s{};
    for (std::size_t a = 0; a < R; ++a) s[a] = e.shape[a];
    return {reinterpret_cast<const T*>(data_.data_handle() + e.offset), s};
  }

 private:
  template <Device D2>
  friend archive<D2> load(const std::filesystem::path& path);

  std::string path_;
  std::map<std::string, tensor_info> entries_;
  std::map<std::string, std::string> meta_;
  tensor<std::uint8_t, D, 1> data_;
};

/// Reads a safetensors file and places its tensors on D (map_location as a type).
template <Device D>
archive<D> load(const std::filesystem::path& path) {
  archive<D> a;
  a.path_ = path.string();
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw io_error("locus: cannot open checkpoint '" + a.path_ + "': " + std::strerror(errno));
  struct closer {
    std::FILE* f;
    ~closer() { std::fclose(f); }
  } close_guard{f};
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw io_error("locus: cannot read the size of '" + a.path_ + "': " + ec.message());
  unsigned char len[8];
  if (size < 8 || std::fread(len, 1, 8, f) != 8)
    throw io_error("locus: '" + a.path_ + "' is truncated: " + std::to_string(size) +
                   " bytes, too short for a safetensors header length");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(len[i]) << (8 * i);
  if (n > size - 8)
    throw io_error("locus: '" + a.path_ + "' is truncated or corrupt: its header claims " + std::to_string(n) +
                   " bytes but only " + std::to_string(size - 8) + " follow");
  std::string text(n, '\0');
  if (std::fread(text.data(), 1, n, f) != n) throw io_error("locus: '" + a.path_ + "': reading the header failed");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw io_error("locus: '" + a.path_ + "' is corrupt: its header is not valid JSON (" + e.what() + ")");
  }
  if (!header.is_object()) throw io_error("locus: '" + a.path_ + "' is corrupt: its header is not a JSON object");
  const std::uint64_t data_size = size - 8 - n;

  // Lay every tensor out 64-byte aligned in one host buffer, then one copy to D.
  std::size_t total = 0;
  std::vector<std::pair<std::string, std::pair<std::uint64_t, std::uint64_t>>> spans;
  try {
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        for (auto m = it.value().begin(); m != it.value().end(); ++m)
          a.meta_[m.key()] = m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
        continue;
      }
      const auto& v = it.value();
      tensor_info e;
      e.dtype = v.at("dtype").get<std::string>();
      const std::size_t es = detail::st_dtype_size(e.dtype);
      if (es == 0) throw io_error("locus: '" + a.path_ + "': tensor '" + it.key() + "' has unknown dtype " + e.dtype);
      // Integers only: nlohmann's get<int64_t>() of 1e30 is a float conversion out of
      // range (undefined behaviour), and of 2^63 a wrap to a negative number.
      auto integer = [&](const nlohmann::json& j, const char* what) -> std::uint64_t {
        if (j.is_number_unsigned()) return j.get<std::uint64_t>();
        if (j.is_number_integer()) {
          const auto x = j.get<std::int64_t>();
          if (x < 0)
            throw io_error("locus: '" + a.path_ + "' is corrupt: tensor '" + it.key() + "' has a negative " + what +
                           " (" + std::to_string(x) + ")");
          return static_cast<std::uint64_t>(x);
        }
        throw io_error("locus: '" + a.path_ + "' is corrupt: tensor '" + it.key() + "' has " + what + " " + j.dump() +
                       ", expected a non-negative integer");
      };
      const auto& shape = v.at("shape");
      if (!shape.is_array())
        throw io_error("locus: '" + a.path_ + "' is corrupt: tensor '" + it.key() + "' has shape " + shape.dump() +
                       ", expected an array of extents");
      std::uint64_t count = 1;
      for (const auto& d : shape) {
        const std::uint64_t x = integer(d, "extent");
        if (x > static_cast<std::uint64_t>(std::numeric_limits<index_t>::max()))
          throw io_error("locus: '" + a.path_ + "' is corrupt: tensor '" + it.key() + "' has an extent too large " +
                         "for any file (" + std::to_string(x) + ")");
        e.shape.push_back(static_cast<index_t>(x));
        // count * es is compared with the data section's size below: an overflow here
        // would let a corrupt shape pass with a small product.
        if (x != 0 && count > (std::numeric_limits<std::uint64_t>::max() / es) / x)
          throw io_error("locus: '" + a.path_ + "' is corrupt: tensor '" + it.key() + "' has a shape too large " +
                         "for any file");
        count *= x;
      }
      const auto& offsets = v.at("data_offsets");
      if (!offsets.is_array() || offsets.size() != 2)
        throw io_error("locus: '" + a.path_ + "' is corrupt: tensor '" + it.key() + "' has data_offsets " +
                       offsets.dump() + ", expected [begin, end]");
      const std::uint64_t begin = integer(offsets[0], "data offset");
      const std::uint64_t end = integer(offsets[1], "data offset");
      if (begin > end || end > data_size)
        throw io_error("locus: '" + a.path_ + "' is truncated or corrupt: tensor '" + it.key() + "' spans bytes [" +
                       std::to_string(begin) + ", " + std::to_string(end) + ") of a " + std::to_string(data_size) +
                       "-byte data section");
      if (end - begin != count * es)
        throw io_error("locus: '" + a.path_ + "' is corrupt: tensor '" + it.key() + "' of shape " + e.shape_string() +
                       " and dtype " + e.dtype + " needs " + std::to_string(count * es) + " bytes but spans " +
                       std::to_string(end - begin));
      e.bytes = static_cast<std::size_t>(end - begin);
      e.offset = total;
      total += (e.bytes + 63) / 64 * 64;
      spans.push_back({it.key(), {begin, end}});
      a.entries_[it.key()] = std::move(e);
    }
  } catch (const nlohmann::json::exception& e) {
    throw io_error("locus: '" + a.path_ + "' is corrupt: " + std::string(e.what()));
  }
  // Tensors may not share bytes (the safetensors format forbids it): without this, a
  // small file of many tensors spanning the same bytes would make the buffer below
  // (one copy per tensor) as large as (tensors x data section).
  {
    std::vector<std::pair<std::pair<std::uint64_t, std::uint64_t>, const std::string*>> order;
    for (const auto& [name, span] : spans)
      if (span.second > span.first) order.push_back({span, &name});
    std::sort(order.begin(), order.end());
    for (std::size_t i = 1; i < order.size(); ++i)
      if (order[i].first.first < order[i - 1].first.second)
        throw io_error("locus: '" + a.path_ + "' is corrupt: tensors '" + *order[i - 1].second + "' (bytes [" +
                       std::to_string(order[i - 1].first.first) + ", " + std::to_string(order[i - 1].first.second) +
                       ")) and '" + *order[i].second + "' (bytes [" + std::to_string(order[i].first.first) + ", " +
                       std::to_string(order[i].first.second) + ")) overlap");
  }
  std::vector<unsigned char> raw(static_cast<std::size_t>(data_size));
  if (data_size && std::fread(raw.data(), 1, raw.size(), f) != raw.size())
    throw io_error("locus: '" + a.path_ + "': reading the data section failed");
  tensor<std::uint8_t, cpu, 1> host(extents<1>{static_cast<index_t>(total)});
  for (const auto& [name, span] : spans) {
    const tensor_info& e = a.entries_[name];
    if (e.bytes) std::memcpy(host.data_handle() + e.offset, raw.data() + span.first, e.bytes);
  }
  a.data_ = to<D>(host);
  return a;
}

}  // namespace locus::io
