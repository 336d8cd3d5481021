// Tests that edit a checkpoint's metadata on purpose (to reach the checks behind the
// header's checksum: a number that is not one, a policy of another trainer) sign the
// edited header again, with locus's own formula (io::detail::header_crc, documented in
// io/safetensors.hpp and recomputed independently in tests/python/read_safetensors.py).
// Without it every such edit is refused first as a header checksum mismatch, which
// tests/test_hostile_review.cpp covers.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <locus/io/safetensors.hpp>

namespace locus_test {

struct header_tensor {
  std::string dtype;
  std::vector<locus::index_t> shape;
};

/// Sets __metadata__["locus.header_crc32c"] of header h to its checksum.
inline void resign(nlohmann::json& h) {
  std::map<std::string, std::string> meta;
  if (h.contains("__metadata__"))
    for (const auto& [k, v] : h["__metadata__"].items())
      if (v.is_string()) meta[k] = v.get<std::string>();
  std::map<std::string, header_tensor> tensors;
  for (const auto& [k, v] : h.items()) {
    if (k == "__metadata__") continue;
    tensors[k] = {v["dtype"].get<std::string>(), v["shape"].get<std::vector<locus::index_t>>()};
  }
  const auto crc = locus::io::detail::header_crc(
      meta, tensors, [](const header_tensor& t) -> const std::string& { return t.dtype; },
      [](const header_tensor& t) -> const std::vector<locus::index_t>& { return t.shape; });
  h["__metadata__"][std::string(locus::io::header_checksum_key)] = locus::io::detail::crc_hex(crc);
}

/// The file's bytes with its header signed again (the data section unchanged).
inline std::string resign_bytes(const std::string& bytes) {
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t{static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)])} << (8 * i);
  auto h = nlohmann::ordered_json::parse(bytes.substr(8, n));
  nlohmann::json plain = nlohmann::json::parse(bytes.substr(8, n));
  resign(plain);
  h["__metadata__"][std::string(locus::io::header_checksum_key)] =
      plain["__metadata__"][std::string(locus::io::header_checksum_key)];
  std::string text = h.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(text.size() >> (8 * i));
  return out + text + bytes.substr(8 + n);
}

}  // namespace locus_test
