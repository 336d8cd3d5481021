// Host SIMD: one vector of floats as wide as the compiler was told the CPU is (AVX-512,
// AVX, SSE on x86-64; NEON on AArch64; one lane elsewhere), with the element-wise
// arithmetic of GCC's vector extensions and a correctly rounded square root.
//
// Why it exists: the host loops of training are meant to be vectorised by the compiler,
// and are, except where a loop calls std::sqrt: with errno semantics (the default;
// -fno-math-errno is a user's choice, not a library's) GCC and clang emit a branch to
// sqrtf for negative inputs and then refuse to vectorise the loop. Such a loop (AdamW's
// update) is written over vecf instead. Each lane computes exactly what the scalar code
// computes (IEEE single-precision +, -, *, / and sqrt, in the same order), so the vector
// and scalar forms agree bit for bit, as long as the compiler treats both alike: not
// under -ffast-math (which may turn a vector division into a reciprocal estimate), and
// not where FMA contraction (-ffp-contract=fast, GCC's default when the target has FMA)
// fuses one form and not the other. The width follows the user's -m flags (-march=native
// gives AVX-512 where the CPU has it); x86-64 without flags gets SSE's four lanes, and
// the loops that are bound by arithmetic rather than memory (AdamW's square root and
// division) also get a second body for AVX-512F, chosen at run time when the CPU has it
// (simd512 below: PyTorch's CPU-capability dispatch, for one loop). That body is compiled
// without FMA contraction, so it gives the scalar code's bits too.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

// No intrinsics headers on x86 (<immintrin.h> alone costs a third of a second per user
// file): the square roots are the compilers' builtins. nvcc's front end is not asked to
// parse vector types at all (core/half.hpp does the same): under nvcc the width is 1.
#if defined(__CUDACC__)
#define LOCUS_SIMD_WIDTH 1
#elif defined(__AVX512F__) && (defined(__GNUC__) || defined(__clang__))
#define LOCUS_SIMD_WIDTH 16
#elif defined(__AVX__) && (defined(__GNUC__) || defined(__clang__))
#define LOCUS_SIMD_WIDTH 8
#elif (defined(__SSE2__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define LOCUS_SIMD_WIDTH 4
#elif defined(__ARM_NEON) && defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_neon.h>
#define LOCUS_SIMD_WIDTH 4
#else
#define LOCUS_SIMD_WIDTH 1
#endif

// Files compiled with different -m flags instantiate the vector loops with different
// bodies: each width lives in its own inline namespace (LOCUS_SIMD_NAMESPACE), so they
// are different functions to the linker and never replace one another.
#if LOCUS_SIMD_WIDTH == 16
#define LOCUS_SIMD_NAMESPACE simd_w16
#elif LOCUS_SIMD_WIDTH == 8
#define LOCUS_SIMD_NAMESPACE simd_w8
#elif LOCUS_SIMD_WIDTH == 4
#define LOCUS_SIMD_NAMESPACE simd_w4
#else
#define LOCUS_SIMD_NAMESPACE simd_w1
#endif

namespace locus::detail::simd {
inline namespace LOCUS_SIMD_NAMESPACE {

/// Floats in one vecf.
inline constexpr int width = LOCUS_SIMD_WIDTH;

#if LOCUS_SIMD_WIDTH > 1
/// width floats; + - * / with vectors or scalars act lane by lane.
typedef float vecf __attribute__((vector_size(sizeof(float) * LOCUS_SIMD_WIDTH)));
#else
typedef float vecf;
#endif

/// width floats from p (any alignment).
inline vecf load(const float* p) noexcept {
  vecf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// width floats to p (any alignment).
inline void store(float* p, vecf v) noexcept { std::memcpy(p, &v, sizeof v); }

/// Lane l of v.
inline float lane(vecf v, int l) noexcept {
#if LOCUS_SIMD_WIDTH > 1
  return v[l];
#else
  (void)l;
  return v;
#endif
}

/// The correctly rounded square root of every lane (NaN for negative lanes; errno is
/// never set by the vector forms).
inline vecf sqrt(vecf x) noexcept {
#if LOCUS_SIMD_WIDTH == 16 && defined(__clang__)
  return __builtin_ia32_sqrtps512(x, 4);  // 4: _MM_FROUND_CUR_DIRECTION
#elif LOCUS_SIMD_WIDTH == 16
  return __builtin_ia32_sqrtps512_mask(x, x, static_cast<unsigned short>(0xffff), 4);
#elif LOCUS_SIMD_WIDTH == 8
  return __builtin_ia32_sqrtps256(x);
#elif LOCUS_SIMD_WIDTH == 4 && defined(__aarch64__)
  return reinterpret_cast<vecf>(vsqrtq_f32(reinterpret_cast<float32x4_t>(x)));
#elif LOCUS_SIMD_WIDTH == 4
  return __builtin_ia32_sqrtps(x);
#else
  return std::sqrt(x);
#endif
}

/// Every subnormal lane (|x| < FLT_MIN, not 0) made +0; NaN, infinities and normal
/// lanes unchanged. Comparisons only: no arithmetic on the subnormal (an arithmetic
/// operation on one costs a microcode assist of about a hundred cycles on x86).
/// detail::flush_subnormal (nn/kernels.hpp) is the scalar form and says why.
inline vecf flush_subnormal(vecf x) noexcept {
  constexpr float tiny = 1.17549435e-38f;  // FLT_MIN, the smallest normal float
#if LOCUS_SIMD_WIDTH > 1
  const vecf hi = vecf{} + tiny, lo = vecf{} - tiny;
  return ((x < hi) & (x > lo)) ? vecf{} : x;
#else
  return x < tiny && x > -tiny ? 0.0f : x;
#endif
}

/// Every lane limited to [-c, c] (c > 0), as torch.clamp(g, -c, c): NaN lanes stay NaN,
/// -0.0 stays -0.0 (the same comparisons as the scalar clamp_abs in nn/kernels.hpp).
inline vecf clamp_abs(vecf x, float c) noexcept {
#if LOCUS_SIMD_WIDTH > 1
  const vecf hi = vecf{} + c, lo = vecf{} - c;
  x = x > hi ? hi : x;
  return x < lo ? lo : x;
#else
  x = x > c ? c : x;
  return x < -c ? -c : x;
#endif
}

}  // namespace LOCUS_SIMD_NAMESPACE
}  // namespace locus::detail::simd


// Eight lanes whatever the target's width (lanes8f, lanes8d): GCC's vector extensions
// lower them to two SSE or one AVX operation. For loops whose lanes must not depend on
// the -m flags (sums that give the same bits in every build: lane u takes the elements
// j = u mod 8). Only locals and references (passing a 32-byte vector by value changes
// the ABI without AVX); nvcc's front end is not given vector types.
#if !defined(__CUDACC__) && (defined(__GNUC__) || defined(__clang__))
#define LOCUS_HOST_LANES8 1
namespace locus::detail {
typedef float lanes8f __attribute__((vector_size(32)));
typedef double lanes8d __attribute__((vector_size(64)));
template <class V>
struct lanes8_of {};
template <>
struct lanes8_of<float> {
  using type = lanes8f;
};
template <>
struct lanes8_of<double> {
  using type = lanes8d;
};
template <class V>
inline constexpr bool has_lanes8 = std::is_same_v<V, float> || std::is_same_v<V, double>;

/// v = p[0..8) (any alignment).
template <class L, class V>
inline void load8(L& v, const V* p) noexcept {
  std::memcpy(&v, p, sizeof v);
}
/// p[0..8) = v (any alignment).
template <class L, class V>
inline void store8(V* p, const L& v) noexcept {
  std::memcpy(p, &v, sizeof v);
}
}  // namespace locus::detail
#endif

// The run-time AVX-512F body: x86-64 with GCC or clang, when the file itself was compiled
// for less (with -mavx512f the static width is already 16).
#if LOCUS_SIMD_WIDTH < 16 && !defined(__CUDACC__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOCUS_SIMD_AVX512_DISPATCH 1
// The AVX-512F body contracts a * b + c into FMA exactly when the file's own code can:
// a file compiled without FMA (no -mfma, no -march with it) never fuses, so the body is
// compiled without contraction (clang: `#pragma clang fp contract(off)` in its body, GCC:
// per function); a file with FMA keeps its own contraction setting in the body too, as
// the compiled-width loop does.
#if defined(__FMA__)
#define LOCUS_TARGET_AVX512 __attribute__((target("avx512f")))
#define LOCUS_NO_CONTRACT
#elif defined(__clang__)
#define LOCUS_TARGET_AVX512 __attribute__((target("avx512f")))
#define LOCUS_NO_CONTRACT _Pragma("clang fp contract(off)")
#else
#define LOCUS_TARGET_AVX512 __attribute__((target("avx512f"), optimize("fp-contract=off")))
#define LOCUS_NO_CONTRACT
#endif

namespace locus::detail::simd512 {

inline constexpr int width = 16;
typedef float vecf __attribute__((vector_size(64)));

/// Whether this CPU runs AVX-512F with the OS saving its registers (asked once).
/// LOCUS_HOST_SIMD=base in the environment keeps the compiled width (for comparisons).
inline bool available() noexcept {
  static const bool v = [] {
    const char* e = std::getenv("LOCUS_HOST_SIMD");
    if (e && std::strcmp(e, "base") == 0) return false;
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return v;
}

LOCUS_TARGET_AVX512 inline vecf load(const float* p) noexcept {
  vecf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
LOCUS_TARGET_AVX512 inline void store(float* p, vecf v) noexcept { std::memcpy(p, &v, sizeof v); }
LOCUS_TARGET_AVX512 inline vecf sqrt(vecf x) noexcept {
#if defined(__clang__)
  return __builtin_ia32_sqrtps512(x, 4);
#else
  return __builtin_ia32_sqrtps512_mask(x, x, static_cast<unsigned short>(0xffff), 4);
#endif
}

LOCUS_TARGET_AVX512 inline vecf flush_subnormal(vecf x) noexcept {
  constexpr float tiny = 1.17549435e-38f;
  const vecf hi = vecf{} + tiny, lo = vecf{} - tiny;
  return ((x < hi) & (x > lo)) ? vecf{} : x;
}

LOCUS_TARGET_AVX512 inline vecf clamp_abs(vecf x, float c) noexcept {
  const vecf hi = vecf{} + c, lo = vecf{} - c;
  x = x > hi ? hi : x;
  return x < lo ? lo : x;
}

/// The sum of x[0..n) in f64 with sixteen lanes, exactly as the reductions' generic host
/// block forms it (ops/reduce.hpp, host_reduce): lane l sums the elements i with
/// i % 16 == l of the whole sixteens, in order; the tail goes into lane 0; then lanes
/// l and l + w are added for w = 8, 4, 2, 1. The same additions in the same order, so
/// the same bits; the sixteen lanes are two registers of eight doubles instead of eight
/// of two (SSE2), which made the f32 sum compute-bound below the memory's speed.
LOCUS_TARGET_AVX512 inline double sum_block_f64(const float* x, std::int64_t n) noexcept {
  typedef double vecd8 __attribute__((vector_size(64)));
  typedef float vecf8 __attribute__((vector_size(32)));
  vecd8 a0 = {}, a1 = {};  // lanes 0-7 and 8-15
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    vecf8 lo, hi;
    std::memcpy(&lo, x + i, sizeof lo);
    std::memcpy(&hi, x + i + 8, sizeof hi);
    a0 += __builtin_convertvector(lo, vecd8);
    a1 += __builtin_convertvector(hi, vecd8);
  }
  double lanes[16];
  std::memcpy(lanes, &a0, sizeof a0);
  std::memcpy(lanes + 8, &a1, sizeof a1);
  for (; i < n; ++i) lanes[0] += static_cast<double>(x[i]);
  for (int w = 8; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  return lanes[0];
}

}  // namespace locus::detail::simd512
#endif
