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
// and scalar forms agree bit for bit. The width follows the user's -m flags (-march=native
// gives AVX-512 where the CPU has it); x86-64 without flags gets SSE's four lanes.
#pragma once

#include <cmath>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <xmmintrin.h>
#elif defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace locus::detail::simd {

#if defined(__AVX512F__)
#define LOCUS_SIMD_WIDTH 16
#elif defined(__AVX__)
#define LOCUS_SIMD_WIDTH 8
#elif defined(__SSE2__) || (defined(__ARM_NEON) && defined(__aarch64__))
#define LOCUS_SIMD_WIDTH 4
#else
#define LOCUS_SIMD_WIDTH 1
#endif

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
/// never set).
inline vecf sqrt(vecf x) noexcept {
#if defined(__AVX512F__)
  return reinterpret_cast<vecf>(_mm512_sqrt_ps(reinterpret_cast<__m512>(x)));
#elif defined(__AVX__)
  return reinterpret_cast<vecf>(_mm256_sqrt_ps(reinterpret_cast<__m256>(x)));
#elif defined(__SSE2__)
  return reinterpret_cast<vecf>(_mm_sqrt_ps(reinterpret_cast<__m128>(x)));
#elif defined(__ARM_NEON) && defined(__aarch64__)
  return reinterpret_cast<vecf>(vsqrtq_f32(reinterpret_cast<float32x4_t>(x)));
#else
  return std::sqrt(x);
#endif
}

}  // namespace locus::detail::simd
