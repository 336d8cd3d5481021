// CRC32C (Castagnoli, the iSCSI polynomial 0x1EDC6F41, reflected 0x82F63B78): the
// checksum locus writes for every tensor of a safetensors file and verifies on every
// load, so that a flipped bit on disk or in a copy is an io_error instead of a weight
// that trains on silently.
//
// x86-64 with SSE4.2 (every x86-64 CPU since 2008): the crc32 instruction, chosen at run
// time, three independent streams over the buffer's thirds combined at the end (the
// instruction has a latency of 3 cycles and a throughput of 1, so one stream would use a
// third of it). Elsewhere, and in files nvcc compiles (its front end does not take the
// target attribute): slicing-by-8 tables. The two builds of these functions live in
// different inline namespaces, so translation units built either way never share a body.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define LOCUS_CRC32C_X86 1
#else
#define LOCUS_CRC32C_X86 0
#endif

namespace locus::io {

namespace detail {

inline constexpr std::uint32_t crc32c_poly = 0x82F63B78u;  // reflected 0x1EDC6F41

/// table[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
constexpr std::array<std::array<std::uint32_t, 256>, 8> make_crc32c_tables() {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (crc32c_poly & (0u - (c & 1u)));
    t[0][b] = c;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}
inline constexpr auto crc32c_tables = make_crc32c_tables();

/// The table-driven update of a raw (not inverted) CRC state.
inline std::uint32_t crc32c_update_sw(std::uint32_t crc, const unsigned char* p, std::size_t n) noexcept {
  const auto& t = crc32c_tables;
  while (n >= 8) {
    const std::uint32_t lo = crc ^ (static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
                                    static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24);
    crc = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
          t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFFu];
  return crc;
}

/// Multiplication in GF(2)[x] modulo the (reflected) polynomial, and x^(8 n) mod P:
/// what shifting a CRC state past n zero bytes multiplies it by. Used to combine the
/// hardware path's three streams.
inline std::uint32_t crc32c_gf_mul(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t r = 0;
  for (int i = 0; i < 32; ++i) {
    r ^= b & (0u - (a >> 31));  // reflected: the top bit of a is x^0
    a <<= 1;
    b = (b >> 1) ^ (crc32c_poly & (0u - (b & 1u)));
  }
  return r;
}
/// x^(8 n) mod P in the reflected representation (x^0 is 0x80000000).
inline std::uint32_t crc32c_shift_factor(std::size_t n) noexcept {
  std::uint32_t result = 0x80000000u;  // x^0
  std::uint32_t power = 0x00800000u;   // x^8
  for (; n; n >>= 1) {
    if (n & 1) result = crc32c_gf_mul(result, power);
    power = crc32c_gf_mul(power, power);
  }
  return result;
}

#if LOCUS_CRC32C_X86
inline namespace crc32c_x86 {
[[gnu::target("sse4.2")]] inline std::uint32_t crc32c_stream(std::uint32_t crc, const unsigned char* p,
                                                             std::size_t n) noexcept {
  std::uint64_t c = crc;
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
  }
  std::uint32_t c32 = static_cast<std::uint32_t>(c);
  for (; n; --n) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}

/// Three streams over three equal parts (their latencies overlap), combined: the state
/// after part A then part B is shift(state_A, |B|) ^ state_B(started at 0).
[[gnu::target("sse4.2")]] inline std::uint32_t crc32c_update_hw(std::uint32_t crc, const unsigned char* p,
                                                                std::size_t n) noexcept {
  constexpr std::size_t min_split = 3 * 4096;  // below this the combination costs more than it saves
  if (n < min_split) return crc32c_stream(crc, p, n);
  const std::size_t part = n / 3 / 8 * 8;
  std::uint64_t a = crc, b = 0, c = 0;
  const unsigned char* pa = p;
  const unsigned char* pb = p + part;
  const unsigned char* pc = p + 2 * part;
  for (std::size_t i = 0; i < part; i += 8) {
    std::uint64_t va, vb, vc;
    std::memcpy(&va, pa + i, 8);
    std::memcpy(&vb, pb + i, 8);
    std::memcpy(&vc, pc + i, 8);
    a = __builtin_ia32_crc32di(a, va);
    b = __builtin_ia32_crc32di(b, vb);
    c = __builtin_ia32_crc32di(c, vc);
  }
  const std::uint32_t shift = crc32c_shift_factor(part);
  std::uint32_t s = crc32c_gf_mul(static_cast<std::uint32_t>(a), shift) ^ static_cast<std::uint32_t>(b);
  s = crc32c_gf_mul(s, shift) ^ static_cast<std::uint32_t>(c);
  return crc32c_stream(s, p + 3 * part, n - 3 * part);
}

inline bool crc32c_hardware() noexcept {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
inline std::uint32_t crc32c_update(std::uint32_t crc, const unsigned char* p, std::size_t n) noexcept {
  return crc32c_hardware() ? crc32c_update_hw(crc, p, n) : crc32c_update_sw(crc, p, n);
}
}  // namespace crc32c_x86
#else
inline namespace crc32c_portable {
inline bool crc32c_hardware() noexcept { return false; }
inline std::uint32_t crc32c_update(std::uint32_t crc, const unsigned char* p, std::size_t n) noexcept {
  return crc32c_update_sw(crc, p, n);
}
}  // namespace crc32c_portable
#endif
}  // namespace detail

/// CRC32C of n bytes (the standard check value: crc32c("123456789") == 0xE3069283).
/// `previous` continues a checksum over data given in pieces: crc32c(b, nb, crc32c(a, na))
/// == crc32c of a followed by b.
inline std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t previous = 0) noexcept {
  return ~detail::crc32c_update(~previous, static_cast<const unsigned char*>(data), n);
}

/// Whether this build and CPU compute CRC32C with the crc32 instruction.
inline bool crc32c_uses_hardware() noexcept { return detail::crc32c_hardware(); }

}  // namespace locus::io
