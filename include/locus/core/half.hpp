// The 16-bit floating-point storage types: locus::f16 (IEEE 754 binary16) and
// locus::bf16 (bfloat16, the upper half of a binary32), with exact widening to float,
// correctly rounded narrowing (to nearest, ties to even; NaN stays a quiet NaN with its
// sign, overflow goes to infinity, subnormals are kept) from float and from double, and
// IEEE-style equality. The scalar conversions are integer bit manipulation (no _Float16)
// on the host and in constant evaluation; device code converts f32 <-> f16 (and f32 ->
// bf16 on sm_80+) with the cvt instruction, which rounds the same way, and takes the
// portable result only for NaN (the instruction's NaN is canonical), so every device
// gives the same bits for every input (the CUDA suite checks all 2^32 floats). Bulk host conversions
// (locus::detail::convert_n) use F16C / AVX2 when the running x86-64 CPU has them,
// chosen at run time without global -m flags, and otherwise an auto-vectorisable
// branch-free loop; every path gives bit-identical results to the scalar functions.
// The short aliases locus::f32, f64, i32, i64 and u8 are defined here too.
#pragma once

#include "config.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

// x86-64 run-time dispatch needs GCC/clang builtins and target attributes; it is host
// code of g++/clang++ translation units only. It uses GCC vector extensions and the two
// F16C builtins rather than <immintrin.h>, which alone costs a third of a typical
// user file's compile time. nvcc translation units use the portable loop (its front
// end is not asked to parse vector builtins); the two variants live in different
// inline namespaces, so they never collide at link time.
#if (defined(__x86_64__) || defined(_M_X64)) && !defined(__CUDACC__) && \
    (defined(__GNUC__) || defined(__clang__))
#  define LOCUS_HALF_HAS_X86_DISPATCH 1
#else
#  define LOCUS_HALF_HAS_X86_DISPATCH 0
#endif

namespace locus {

using f32 = float;
using f64 = double;
using i32 = std::int32_t;
using i64 = std::int64_t;
using u8 = std::uint8_t;

namespace detail {

// __builtin_bit_cast rather than std::bit_cast: std::bit_cast is a host-only function
// for nvcc (callable from device code only with --expt-relaxed-constexpr), the builtin
// works in __host__ __device__ constexpr functions under g++, clang++ and nvcc.
LOCUS_HOST_DEVICE constexpr std::uint32_t f32_to_bits(float f) noexcept {
  return __builtin_bit_cast(std::uint32_t, f);
}
LOCUS_HOST_DEVICE constexpr float f32_from_bits(std::uint32_t u) noexcept {
  return __builtin_bit_cast(float, u);
}
LOCUS_HOST_DEVICE constexpr std::uint64_t f64_to_bits(double d) noexcept {
  return __builtin_bit_cast(std::uint64_t, d);
}

/// Rounds the binary floating-point number with encoding `x` (SE exponent bits, SM
/// fraction bits, held in the unsigned type U) to the narrower format with TE exponent
/// bits and TM fraction bits (TM < SM, target bias <= source bias), to nearest with
/// ties to even, and returns the target encoding. NaN gives a quiet NaN with the same
/// sign and the top fraction bits of the payload; values at or beyond the midpoint
/// between the largest finite target number and the next power of two give infinity;
/// target subnormals are produced exactly. Branch-free (selects only), so loops over it
/// vectorise.
template <class U, int SE, int SM, int TE, int TM>
LOCUS_HOST_DEVICE constexpr std::uint16_t round_to_narrow(U x) noexcept {
  static_assert(std::is_unsigned_v<U> && sizeof(U) * 8 == 1 + SE + SM);
  static_assert(TM < SM && 1 + TE + TM == 16 && TE <= SE);
  constexpr int SB = (1 << (SE - 1)) - 1;  // source exponent bias
  constexpr int TB = (1 << (TE - 1)) - 1;  // target exponent bias
  constexpr int D = SM - TM;               // fraction bits dropped for normal numbers
  constexpr U one = 1;
  constexpr U sign_mask = one << (SE + SM);
  constexpr U inf_bits = ((one << SE) - 1) << SM;
  constexpr U frac_mask = (one << SM) - 1;
  // Smallest source magnitude that rounds to target infinity: the midpoint between the
  // largest finite target number (biased exponent 2*TB, fraction all ones) and 2^(TB+1).
  constexpr U overflow_bits =
      (static_cast<U>(TB + SB) << SM) | (((one << TM) - 1) << D) | (one << (D - 1));
  // Smallest target normal number, 2^(1-TB), in source encoding.
  constexpr U normal_bits = static_cast<U>(1 - TB + SB) << SM;
  // For a source number of biased exponent e (at least 1), value / (target subnormal
  // quantum 2^(1-TB-TM)) = significand * 2^-(shift_base - e).
  constexpr U shift_base = static_cast<U>(SB + SM + 1 - TB - TM);
  constexpr U max_shift = SM + 2;  // significand < 2^(SM+1): shifting this far gives 0

  const std::uint32_t sign = static_cast<std::uint32_t>(x >> (SE + SM)) << (TE + TM);
  const U a = x & ~sign_mask;

  // Normal result: add just under half an ulp plus the kept lsb (ties to even), drop D
  // bits, rebias. A carry out of the fraction correctly bumps the exponent.
  const U normal = ((a + ((one << (D - 1)) - 1) + ((a >> D) & one)) >> D) -
                   (static_cast<U>(SB - TB) << TM);

  // Subnormal (or zero, or smallest-normal after rounding up) result.
  const U e = a >> SM;
  const U e_eff = e != 0 ? e : one;
  const U m = (a & frac_mask) | (e != 0 ? (one << SM) : U{0});
  // In the subnormal range 1 <= shift <= max_shift. Elsewhere (result unused) it may be
  // 0 or wrap around: clamp so that no shift below is out of range.
  U shift = shift_base - e_eff;
  shift = shift - 1 >= max_shift ? max_shift : shift;
  const U half = one << (shift - 1);
  const U sub = (m + (half - 1) + ((m >> shift) & one)) >> shift;

  const U nan = (static_cast<U>((1 << TE) - 1) << TM) | (one << (TM - 1)) |
                ((a >> D) & ((one << TM) - 1));
  const U inf = static_cast<U>((1 << TE) - 1) << TM;

  const U r = a > inf_bits ? nan : a >= overflow_bits ? inf : a < normal_bits ? sub : normal;
  return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(r));
}

/// binary32 encoding -> binary16 encoding, correctly rounded: the portable integer form
/// (host code, constant evaluation, and the reference the device path is tested against).
LOCUS_HOST_DEVICE constexpr std::uint16_t f32_bits_to_f16_bits_portable(std::uint32_t x) noexcept {
  return round_to_narrow<std::uint32_t, 8, 23, 5, 10>(x);
}
/// binary32 encoding -> binary16 encoding, correctly rounded. Device code uses the
/// conversion instruction cvt.rn.f16.f32 (round to nearest, ties to even, like the
/// portable form; no .ftz, so subnormals are kept); it gives the canonical NaN 0x7fff,
/// so a NaN takes the portable result (sign and payload kept, quiet bit set): the same
/// bits on every device, for every input.
LOCUS_HOST_DEVICE constexpr std::uint16_t f32_bits_to_f16_bits(std::uint32_t x) noexcept {
#if defined(__CUDA_ARCH__)
  if (!std::is_constant_evaluated()) {
    unsigned short r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(__uint_as_float(x)));
    const unsigned short nan = static_cast<unsigned short>(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu));
    return (x & 0x7fffffffu) > 0x7f800000u ? nan : r;
  }
#endif
  return f32_bits_to_f16_bits_portable(x);
}
/// binary64 encoding -> binary16 encoding, correctly rounded (directly, no double rounding).
LOCUS_HOST_DEVICE constexpr std::uint16_t f64_bits_to_f16_bits(std::uint64_t x) noexcept {
  return round_to_narrow<std::uint64_t, 11, 52, 5, 10>(x);
}
/// binary32 encoding -> bfloat16 encoding, correctly rounded. Same exponent range, so
/// this is "add just under half an ulp plus the lsb, keep the top 16 bits"; the carry
/// handles subnormals, the binade change and overflow to infinity. (Portable form.)
LOCUS_HOST_DEVICE constexpr std::uint16_t f32_bits_to_bf16_bits_portable(std::uint32_t x) noexcept {
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (x >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
/// binary32 encoding -> bfloat16 encoding, correctly rounded. Device code for sm_80 and
/// later uses cvt.rn.bf16.f32 (round to nearest even, subnormals kept), a NaN taking the
/// portable result (the instruction gives 0x7fff); older GPUs use the portable form.
LOCUS_HOST_DEVICE constexpr std::uint16_t f32_bits_to_bf16_bits(std::uint32_t x) noexcept {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (!std::is_constant_evaluated()) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(__uint_as_float(x)));
    const unsigned short nan = static_cast<unsigned short>((x >> 16) | 0x0040u);
    return (x & 0x7fffffffu) > 0x7f800000u ? nan : r;
  }
#endif
  return f32_bits_to_bf16_bits_portable(x);
}
/// binary64 encoding -> bfloat16 encoding, correctly rounded (directly, no double rounding).
LOCUS_HOST_DEVICE constexpr std::uint16_t f64_bits_to_bf16_bits(std::uint64_t x) noexcept {
  return round_to_narrow<std::uint64_t, 11, 52, 8, 7>(x);
}

/// binary16 encoding -> binary32 encoding, exact. A NaN keeps its sign and payload and
/// gets the quiet bit set (as the F16C instruction does). (Portable form.)
LOCUS_HOST_DEVICE constexpr std::uint32_t f16_bits_to_f32_bits_portable(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  const std::uint32_t m = h & 0x3ffu;
  const std::uint32_t normal = ((e + 112u) << 23) | (m << 13);
  const std::uint32_t inf_nan = 0x7f800000u | (m << 13) | (m != 0 ? 0x00400000u : 0u);
  // Subnormal m * 2^-24 (m in [1, 1023]): shift m left by k until bit 10 is set, in
  // constant-shift steps of 8, 4, 2, 1 (selects only, so loops vectorise even without
  // per-lane variable shifts); then the value is 1.f * 2^(-14-k).
  std::uint32_t mn = m;
  std::uint32_t k = 0;
  k += mn < (1u << 3) ? 8u : 0u;
  mn = mn < (1u << 3) ? mn << 8 : mn;
  k += mn < (1u << 7) ? 4u : 0u;
  mn = mn < (1u << 7) ? mn << 4 : mn;
  k += mn < (1u << 9) ? 2u : 0u;
  mn = mn < (1u << 9) ? mn << 2 : mn;
  k += mn < (1u << 10) ? 1u : 0u;
  mn = mn < (1u << 10) ? mn << 1 : mn;
  const std::uint32_t sub = m != 0 ? ((113u - k) << 23) | ((mn & 0x3ffu) << 13) : 0u;
  return sign | (e == 0x1fu ? inf_nan : e == 0 ? sub : normal);
}
/// binary16 encoding -> binary32 encoding, exact. Device code uses cvt.f32.f16 (exact),
/// a NaN taking the portable result (sign and payload kept, quiet bit set).
LOCUS_HOST_DEVICE constexpr std::uint32_t f16_bits_to_f32_bits(std::uint16_t h) noexcept {
#if defined(__CUDA_ARCH__)
  if (!std::is_constant_evaluated()) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(h)));
    const std::uint32_t nan = (static_cast<std::uint32_t>(h & 0x8000u) << 16) | 0x7fc00000u |
                              (static_cast<std::uint32_t>(h & 0x3ffu) << 13);
    return (h & 0x7fffu) > 0x7c00u ? nan : __float_as_uint(f);
  }
#endif
  return f16_bits_to_f32_bits_portable(h);
}
/// bfloat16 encoding -> binary32 encoding, exact (a NaN keeps all its bits): a shift,
/// on every device.
LOCUS_HOST_DEVICE constexpr std::uint32_t bf16_bits_to_f32_bits(std::uint16_t b) noexcept {
  return static_cast<std::uint32_t>(b) << 16;
}

}  // namespace detail

/// IEEE 754 binary16: 1 sign bit, 5 exponent bits (bias 15), 10 fraction bits.
/// A storage type: convert to float for arithmetic.
struct f16 {
  std::uint16_t bits{};

  f16() = default;
  /// Correctly rounded (to nearest, ties to even).
  LOCUS_HOST_DEVICE constexpr explicit f16(float f) noexcept
      : bits(detail::f32_bits_to_f16_bits(detail::f32_to_bits(f))) {}
  /// Correctly rounded directly from the double (not via float, so no double rounding).
  LOCUS_HOST_DEVICE constexpr explicit f16(double d) noexcept
      : bits(detail::f64_bits_to_f16_bits(detail::f64_to_bits(d))) {}

  LOCUS_HOST_DEVICE static constexpr f16 from_bits(std::uint16_t b) noexcept {
    f16 h;
    h.bits = b;
    return h;
  }

  /// Exact.
  LOCUS_HOST_DEVICE constexpr explicit operator float() const noexcept {
    return detail::f32_from_bits(detail::f16_bits_to_f32_bits(bits));
  }
  /// Exact.
  LOCUS_HOST_DEVICE constexpr explicit operator double() const noexcept {
    return static_cast<double>(static_cast<float>(*this));
  }

  /// Numeric equality: NaN != anything (itself included), +0 == -0. (`!=` is the
  /// negation, synthesised by C++20.)
  LOCUS_HOST_DEVICE friend constexpr bool operator==(f16 a, f16 b) noexcept {
    const bool a_nan = (a.bits & 0x7fffu) > 0x7c00u;
    return !a_nan && (a.bits == b.bits || ((a.bits | b.bits) & 0x7fffu) == 0);
  }
};

/// bfloat16: 1 sign bit, 8 exponent bits (bias 127), 7 fraction bits; the upper half
/// of a binary32. A storage type: convert to float for arithmetic.
struct bf16 {
  std::uint16_t bits{};

  bf16() = default;
  /// Correctly rounded (to nearest, ties to even).
  LOCUS_HOST_DEVICE constexpr explicit bf16(float f) noexcept
      : bits(detail::f32_bits_to_bf16_bits(detail::f32_to_bits(f))) {}
  /// Correctly rounded directly from the double (not via float, so no double rounding).
  LOCUS_HOST_DEVICE constexpr explicit bf16(double d) noexcept
      : bits(detail::f64_bits_to_bf16_bits(detail::f64_to_bits(d))) {}

  LOCUS_HOST_DEVICE static constexpr bf16 from_bits(std::uint16_t b) noexcept {
    bf16 h;
    h.bits = b;
    return h;
  }

  /// Exact.
  LOCUS_HOST_DEVICE constexpr explicit operator float() const noexcept {
    return detail::f32_from_bits(detail::bf16_bits_to_f32_bits(bits));
  }
  /// Exact.
  LOCUS_HOST_DEVICE constexpr explicit operator double() const noexcept {
    return static_cast<double>(static_cast<float>(*this));
  }

  /// Numeric equality: NaN != anything (itself included), +0 == -0.
  LOCUS_HOST_DEVICE friend constexpr bool operator==(bf16 a, bf16 b) noexcept {
    const bool a_nan = (a.bits & 0x7fffu) > 0x7f80u;
    return !a_nan && (a.bits == b.bits || ((a.bits | b.bits) & 0x7fffu) == 0);
  }
};

static_assert(sizeof(f16) == 2 && alignof(f16) == 2);
static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2);
static_assert(std::is_trivially_copyable_v<f16> && std::is_standard_layout_v<f16>);
static_assert(std::is_trivially_copyable_v<bf16> && std::is_standard_layout_v<bf16>);

LOCUS_HOST_DEVICE constexpr float to_float(f16 h) noexcept { return static_cast<float>(h); }
LOCUS_HOST_DEVICE constexpr float to_float(bf16 b) noexcept { return static_cast<float>(b); }
LOCUS_HOST_DEVICE constexpr f16 to_f16(float f) noexcept { return f16(f); }
LOCUS_HOST_DEVICE constexpr f16 to_f16(double d) noexcept { return f16(d); }
LOCUS_HOST_DEVICE constexpr bf16 to_bf16(float f) noexcept { return bf16(f); }
LOCUS_HOST_DEVICE constexpr bf16 to_bf16(double d) noexcept { return bf16(d); }

namespace detail {
#if LOCUS_HALF_HAS_X86_DISPATCH
inline namespace bulk_x86 {
#else
inline namespace bulk_portable {
#endif

// ---------------------------------------------------------------------------------
// Bulk host conversions. All paths are bit-identical to the scalar functions above.

/// Applies `op` element-wise in blocks of a fixed length (a loop GCC vectorises even at
/// -O2, whose cost model wants a trip count that is a multiple of the vector width),
/// then the tail one by one.
template <class Src, class Dst, class Op>
inline void convert_blocked(const Src* src, Dst* dst, std::size_t n, Op op) noexcept {
  constexpr std::size_t block = 32;
  const std::size_t full = n - n % block;
  for (std::size_t i = 0; i < full; i += block) {
    for (std::size_t j = 0; j < block; ++j) dst[i + j] = op(src[i + j]);
  }
  for (std::size_t i = full; i < n; ++i) dst[i] = op(src[i]);
}

/// Portable bulk conversions (no instruction-set dispatch): the scalar bit tricks in an
/// auto-vectorisable loop. Used where no faster path applies; exposed for tests. The
/// float -> f16 loop needs per-lane variable shifts (subnormal results) to vectorise:
/// AVX2, NEON, SVE have them; plain SSE2 does not, and there it runs scalar (but x86-64
/// CPUs without F16C, the only ones that take this path, are pre-2012).
inline void convert_n_portable(const float* src, f16* dst, std::size_t n) noexcept {
  convert_blocked(src, dst, n, [](float f) { return f16(f); });
}
inline void convert_n_portable(const f16* src, float* dst, std::size_t n) noexcept {
  convert_blocked(src, dst, n, [](f16 h) { return static_cast<float>(h); });
}
inline void convert_n_portable(const float* src, bf16* dst, std::size_t n) noexcept {
  convert_blocked(src, dst, n, [](float f) { return bf16(f); });
}
inline void convert_n_portable(const bf16* src, float* dst, std::size_t n) noexcept {
  convert_blocked(src, dst, n, [](bf16 b) { return static_cast<float>(b); });
}

#if LOCUS_HALF_HAS_X86_DISPATCH

struct x86_features {
  bool f16c = false;  // AVX + F16C, with the OS saving YMM state
  bool avx2 = false;  // AVX2, with the OS saving YMM state
};

/// Reads CPUID / XGETBV directly (__builtin_cpu_supports lacks "f16c" in older clang,
/// and <cpuid.h> would leak unprefixed macros into every includer).
inline x86_features detect_x86_features() noexcept {
  const auto cpuid = [](unsigned leaf, unsigned sub, unsigned (&r)[4]) {
    __asm__ __volatile__("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3])
                         : "a"(leaf), "c"(sub));
  };
  unsigned r[4];
  cpuid(0, 0, r);
  const unsigned max_leaf = r[0];
  if (max_leaf < 1) return {};
  cpuid(1, 0, r);
  const bool osxsave = (r[2] >> 27) & 1u;
  const bool avx = (r[2] >> 28) & 1u;
  const bool f16c = (r[2] >> 29) & 1u;
  if (!osxsave || !avx) return {};
  unsigned xcr0_lo, xcr0_hi;
  __asm__ __volatile__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0u));
  if ((xcr0_lo & 0x6u) != 0x6u) return {};  // XMM and YMM state enabled by the OS
  bool avx2 = false;
  if (max_leaf >= 7) {
    cpuid(7, 0, r);
    avx2 = (r[1] >> 5) & 1u;
  }
  x86_features out;
  out.f16c = f16c;
  out.avx2 = avx2;
  return out;
}
inline const x86_features& x86_cpu() noexcept {
  static const x86_features features = detect_x86_features();
  return features;
}

/// True when the running CPU (and OS) supports AVX and F16C. Checked once.
inline bool has_f16c() noexcept { return x86_cpu().f16c; }
/// True when the running CPU (and OS) supports AVX2. Checked once.
inline bool has_avx2() noexcept { return x86_cpu().avx2; }

// Vector types of the GCC/clang vector extension (what <immintrin.h> builds on).
typedef float locus_v8f __attribute__((vector_size(32)));
typedef short locus_v8s __attribute__((vector_size(16)));
typedef unsigned locus_v8u __attribute__((vector_size(32)));
typedef unsigned short locus_v8us __attribute__((vector_size(16)));

/// F16C paths; call only when has_f16c().
__attribute__((target("avx,f16c"))) inline void convert_n_f16c(const float* src, f16* dst,
                                                               std::size_t n) noexcept {
  const std::size_t full = n - n % 8;
  for (std::size_t i = 0; i < full; i += 8) {
    locus_v8f v;
    __builtin_memcpy(&v, src + i, sizeof v);
    // imm 0x08: round to nearest even, suppress exceptions (_MM_FROUND_TO_NEAREST_INT |
    // _MM_FROUND_NO_EXC)
    const locus_v8s h = __builtin_ia32_vcvtps2ph256(v, 0x08);
    __builtin_memcpy(static_cast<void*>(dst + i), &h, sizeof h);
  }
  for (std::size_t i = full; i < n; ++i) dst[i] = f16(src[i]);
}
__attribute__((target("avx,f16c"))) inline void convert_n_f16c(const f16* src, float* dst,
                                                               std::size_t n) noexcept {
  const std::size_t full = n - n % 8;
  for (std::size_t i = 0; i < full; i += 8) {
    locus_v8s h;
    __builtin_memcpy(&h, src + i, sizeof h);
    const locus_v8f v = __builtin_ia32_vcvtph2ps256(h);
    __builtin_memcpy(dst + i, &v, sizeof v);
  }
  for (std::size_t i = full; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

typedef int locus_v8i __attribute__((vector_size(32)));
typedef short locus_v16s __attribute__((vector_size(32)));
typedef long long locus_v4ll __attribute__((vector_size(32)));

/// The bfloat16 encodings of eight floats (as bits), one per 32-bit lane (<= 0xffff):
/// rounded to nearest even; NaN stays a quiet NaN with its sign.
__attribute__((target("avx2"))) inline locus_v8u round8_bf16_avx2(locus_v8u x) noexcept {
  const locus_v8u lsb = (x >> 16) & 1u;
  const locus_v8u rounded = (x + 0x7fffu + lsb) >> 16;
  const locus_v8u nan = (x >> 16) | 0x0040u;
  const locus_v8u is_nan = (locus_v8u)((x & 0x7fffffffu) > 0x7f800000u);  // all ones or 0
  return (is_nan & nan) | (~is_nan & rounded);
}

/// Eight floats (as bits) -> eight bfloat16 encodings.
__attribute__((target("avx2"))) inline locus_v8us narrow8_bf16_avx2(locus_v8u x) noexcept {
  return __builtin_convertvector(round8_bf16_avx2(x), locus_v8us);
}

/// AVX2 bfloat16 paths; call only when has_avx2().
__attribute__((target("avx2"))) inline void convert_n_avx2(const float* src, bf16* dst,
                                                           std::size_t n) noexcept {
  // Sixteen at a time: two vectors of rounded encodings packed to 16 bits in one
  // instruction (vpackusdw: exact, every lane is <= 0xffff), lanes put back in order with
  // vpermq.
  const std::size_t full16 = n - n % 16;
  for (std::size_t i = 0; i < full16; i += 16) {
    locus_v8u a, b;
    __builtin_memcpy(&a, src + i, sizeof a);
    __builtin_memcpy(&b, src + i + 8, sizeof b);
    const locus_v16s packed = (locus_v16s)__builtin_ia32_packusdw256((locus_v8i)round8_bf16_avx2(a),
                                                                     (locus_v8i)round8_bf16_avx2(b));
    const locus_v4ll ordered = __builtin_ia32_permdi256((locus_v4ll)packed, 0xD8);
    __builtin_memcpy(static_cast<void*>(dst + i), &ordered, sizeof ordered);
  }
  const std::size_t full = n - n % 8;
  for (std::size_t i = full16; i < full; i += 8) {
    locus_v8u x;
    __builtin_memcpy(&x, src + i, sizeof x);
    const locus_v8us h = narrow8_bf16_avx2(x);
    __builtin_memcpy(static_cast<void*>(dst + i), &h, sizeof h);
  }
  for (std::size_t i = full; i < n; ++i) dst[i] = bf16(src[i]);
}
__attribute__((target("avx2"))) inline void convert_n_avx2(const bf16* src, float* dst,
                                                           std::size_t n) noexcept {
  const std::size_t full = n - n % 8;
  for (std::size_t i = 0; i < full; i += 8) {
    locus_v8us b;
    __builtin_memcpy(&b, src + i, sizeof b);
    const locus_v8u w = __builtin_convertvector(b, locus_v8u) << 16;
    __builtin_memcpy(dst + i, &w, sizeof w);
  }
  for (std::size_t i = full; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

#else

/// No run-time dispatch in this build (not x86-64 GCC/clang host code).
inline bool has_f16c() noexcept { return false; }
inline bool has_avx2() noexcept { return false; }

#endif

/// Bulk conversions: dst[i] = convert(src[i]) for i < n, bit-identical to the scalar
/// conversions. The ranges must not overlap.
inline void convert_n(const float* src, f16* dst, std::size_t n) noexcept {
#if LOCUS_HALF_HAS_X86_DISPATCH
  if (has_f16c()) return convert_n_f16c(src, dst, n);
#endif
  convert_n_portable(src, dst, n);
}
inline void convert_n(const f16* src, float* dst, std::size_t n) noexcept {
#if LOCUS_HALF_HAS_X86_DISPATCH
  if (has_f16c()) return convert_n_f16c(src, dst, n);
#endif
  convert_n_portable(src, dst, n);
}
inline void convert_n(const float* src, bf16* dst, std::size_t n) noexcept {
#if LOCUS_HALF_HAS_X86_DISPATCH
  if (has_avx2()) return convert_n_avx2(src, dst, n);
#endif
  convert_n_portable(src, dst, n);
}
inline void convert_n(const bf16* src, float* dst, std::size_t n) noexcept {
#if LOCUS_HALF_HAS_X86_DISPATCH
  if (has_avx2()) return convert_n_avx2(src, dst, n);
#endif
  convert_n_portable(src, dst, n);
}

}  // inline namespace bulk_*
}  // namespace detail
}  // namespace locus
