// Host GEMMs: oneDNN's dnnl_sgemm for f32 when the build found oneDNN, BLAS
// (cblas_sgemm / cblas_dgemm, OpenBLAS in practice) when it found one, and a
// cache-blocked, OpenMP-parallel fallback otherwise. Also the description every GEMM
// backend shares: how a strided matrix maps onto a BLAS layout (row-major or
// transposed, with a leading dimension) without being copied.
//
// LOCUS_HAS_BLAS is set to 1 by the CMake target when FindBLAS found a library with a
// CBLAS interface, LOCUS_HAS_ONEDNN when it found oneDNN built on OpenMP
// (cmake/locus-dependencies.cmake). Which one runs f32 products is a run-time choice:
// locus::set_host_gemm(locus::host_gemm::blas), or LOCUS_HOST_GEMM=onednn|blas|fallback
// in the environment; the default is the fastest built in (oneDNN, then BLAS: measured
// on the training step's shapes, bench/RESULTS.md). f64 products always go to BLAS
// (oneDNN has no f64 GEMM) or the fallback. detail::gemm_fallback is callable in every
// build, so its tests run everywhere.
#pragma once

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../tensor/tensor.hpp"

#ifndef LOCUS_HAS_BLAS
#define LOCUS_HAS_BLAS 0
#endif

#ifndef LOCUS_HAS_ONEDNN
#define LOCUS_HAS_ONEDNN 0
#endif

#if LOCUS_HAS_BLAS
#include <cblas.h>
#endif
#if LOCUS_HAS_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

namespace locus {

/// The library behind f32 GEMMs on host devices (locus::set_host_gemm).
enum class host_gemm {
  fallback,  ///< locus's own blocked GEMM (every build)
  blas,      ///< cblas_sgemm (builds with LOCUS_HAS_BLAS)
  onednn,    ///< oneDNN's dnnl_sgemm (builds with LOCUS_HAS_ONEDNN)
};

/// The name of a host GEMM library: "fallback", "blas" or "onednn".
constexpr const char* name_of(host_gemm g) noexcept {
  return g == host_gemm::onednn ? "onednn" : g == host_gemm::blas ? "blas" : g == host_gemm::fallback ? "fallback" : "unknown";
}

/// Whether this build has library g.
constexpr bool host_gemm_available(host_gemm g) noexcept {
  return g == host_gemm::fallback || (g == host_gemm::blas && LOCUS_HAS_BLAS) ||
         (g == host_gemm::onednn && LOCUS_HAS_ONEDNN);
}

namespace detail {

/// The fastest host GEMM this build has: oneDNN on x86-64 (its JIT GEMM kernels are
/// x86-64 only; elsewhere its sgemm is a reference loop), then BLAS.
constexpr host_gemm best_host_gemm() noexcept {
#if defined(__x86_64__) || defined(_M_X64)
  if (LOCUS_HAS_ONEDNN) return host_gemm::onednn;
#endif
  return LOCUS_HAS_BLAS ? host_gemm::blas : host_gemm::fallback;
}

/// The library named by s ("onednn", "blas" or "fallback"), or -1 for any other text.
constexpr int parse_host_gemm(const char* s) noexcept {
  for (host_gemm g : {host_gemm::fallback, host_gemm::blas, host_gemm::onednn}) {
    const char* n = name_of(g);
    int i = 0;
    while (s[i] != 0 && s[i] == n[i]) ++i;
    if (s[i] == 0 && n[i] == 0) return static_cast<int>(g);
  }
  return -1;
}

/// The choice: LOCUS_HOST_GEMM when it names a library this build has, the fastest
/// built in when it is unset or empty, and -1 when it names nothing usable (then
/// current_host_gemm() throws until set_host_gemm() overrides it). Never throws itself.
inline std::atomic<int>& host_gemm_choice() noexcept {
  static std::atomic<int> choice = [] {
    const char* env = std::getenv("LOCUS_HOST_GEMM");
    if (!env || !*env) return static_cast<int>(best_host_gemm());
    const int g = parse_host_gemm(env);
    return g >= 0 && host_gemm_available(static_cast<host_gemm>(g)) ? g : -1;
  }();
  return choice;
}

[[noreturn, gnu::cold]] inline void throw_bad_host_gemm_env() {
  const char* env = std::getenv("LOCUS_HOST_GEMM");
  throw_value_error("locus: LOCUS_HOST_GEMM=%s is not a host GEMM library of this build; use%s%s fallback "
                    "(or call locus::set_host_gemm)",
                    env ? env : "", LOCUS_HAS_ONEDNN ? " onednn," : "", LOCUS_HAS_BLAS ? " blas," : "");
}

}  // namespace detail

/// The library f32 GEMMs on host devices use now. Throws value_error when
/// LOCUS_HOST_GEMM names no library of this build and set_host_gemm() was not called.
inline host_gemm current_host_gemm() {
  const int g = detail::host_gemm_choice().load(std::memory_order_relaxed);
  if (g < 0) detail::throw_bad_host_gemm_env();
  return static_cast<host_gemm>(g);
}

/// Makes g the library of f32 host GEMMs from now on, for every thread (products
/// already running finish with the old one). Throws value_error when this build
/// does not have g.
inline void set_host_gemm(host_gemm g) {
  if (!host_gemm_available(g))
    detail::throw_value_error("locus: set_host_gemm(%s): this build has no %s (it has%s%s fallback)", name_of(g),
                              name_of(g), LOCUS_HAS_ONEDNN ? " onednn," : "", LOCUS_HAS_BLAS ? " blas," : "");
  detail::host_gemm_choice().store(static_cast<int>(g), std::memory_order_relaxed);
}

}  // namespace locus

namespace locus::detail {

// min and max of extents, without <algorithm> (a quarter second of parsing per user file).
constexpr index_t imin(index_t a, index_t b) noexcept { return b < a ? b : a; }
constexpr index_t imax(index_t a, index_t b) noexcept { return a < b ? b : a; }


inline constexpr bool has_blas = LOCUS_HAS_BLAS != 0;
inline constexpr bool has_onednn = LOCUS_HAS_ONEDNN != 0;

// ---- operands ------------------------------------------------------------------------

/// One operand of a (batched) GEMM: element (b, i, j) lives at p[b * bs + i * rs + j * cs].
template <class T>
struct gemm_operand {
  T* p = nullptr;
  index_t bs = 0, rs = 0, cs = 0;
};

/// A rows x cols matrix as a row-major BLAS sees it: stored row-major with leading
/// dimension ld (trans = false), or stored column-major, i.e. the transpose of a
/// row-major cols x rows matrix with leading dimension ld (trans = true).
struct blas_layout {
  bool trans = false;
  index_t ld = 0;
};

/// The BLAS layout of a rows x cols matrix with strides (rs, cs), or nothing when the
/// matrix must be copied first (neither stride is 1, a stride is negative or zero, or
/// rows overlap). Extents of 1 make their stride irrelevant.
inline std::optional<blas_layout> blas_layout_of(index_t rows, index_t cols, index_t rs,
                                                 index_t cs) noexcept {
  const index_t r1 = imax(rows, 1), c1 = imax(cols, 1);
  if (cs == 1 || cols <= 1) {
    const index_t ld = rows <= 1 ? c1 : rs;
    if (ld >= c1) return blas_layout{false, ld};
  }
  if (rs == 1 || rows <= 1) {
    const index_t ld = cols <= 1 ? r1 : cs;
    if (ld >= r1) return blas_layout{true, ld};
  }
  return std::nullopt;
}

// ---- the fallback: cache-blocked, parallel over blocks of rows -------------------------

/// Register tile (MR x NR), row block (one parallel task) and depth block.
inline constexpr index_t gemm_mr = 4;
inline constexpr index_t gemm_nr = 8;
inline constexpr index_t gemm_mc = 64;
inline constexpr index_t gemm_kc = 256;

/// C[0:MR, 0:NR] += A[0:MR, 0:kb] * B[0:kb, 0:NR]; the tile of C is held in registers
/// across the depth loop. B has unit column stride.
template <class T>
inline void gemm_micro_full(index_t kb, const T* a, index_t a_rs, index_t a_cs,
                            const T* __restrict__ b, index_t ldb, T* __restrict__ c, index_t ldc) {
  T acc[gemm_mr][gemm_nr];
  for (index_t r = 0; r < gemm_mr; ++r)
    for (index_t j = 0; j < gemm_nr; ++j) acc[r][j] = c[r * ldc + j];
  for (index_t p = 0; p < kb; ++p) {
    const T* bp = b + p * ldb;
    const T a0 = a[p * a_cs], a1 = a[a_rs + p * a_cs], a2 = a[2 * a_rs + p * a_cs],
            a3 = a[3 * a_rs + p * a_cs];
    for (index_t j = 0; j < gemm_nr; ++j) {
      const T bv = bp[j];
      acc[0][j] += a0 * bv;
      acc[1][j] += a1 * bv;
      acc[2][j] += a2 * bv;
      acc[3][j] += a3 * bv;
    }
  }
  for (index_t r = 0; r < gemm_mr; ++r)
    for (index_t j = 0; j < gemm_nr; ++j) c[r * ldc + j] = acc[r][j];
}

/// The same for a partial tile at the edges (mb <= MR rows, nb <= NR columns).
template <class T>
inline void gemm_micro_edge(index_t mb, index_t nb, index_t kb, const T* a, index_t a_rs,
                            index_t a_cs, const T* b, index_t ldb, T* c, index_t ldc) {
  for (index_t r = 0; r < mb; ++r) {
    T acc[gemm_nr];
    for (index_t j = 0; j < nb; ++j) acc[j] = c[r * ldc + j];
    for (index_t p = 0; p < kb; ++p) {
      const T av = a[r * a_rs + p * a_cs];
      const T* bp = b + p * ldb;
      for (index_t j = 0; j < nb; ++j) acc[j] += av * bp[j];
    }
    for (index_t j = 0; j < nb; ++j) c[r * ldc + j] = acc[j];
  }
}

/// One parallel task: rows [block * MC, block * MC + MC) of C = A * B.
template <class T>
struct gemm_fallback_rows {
  index_t m, n, k;
  const T* a;
  index_t a_rs, a_cs;
  const T* b;  // unit column stride
  index_t ldb;
  T* c;  // unit column stride
  index_t ldc;
  bool accumulate;  // C += A * B instead of C = A * B

  void operator()(index_t block) const {
    const index_t i0 = block * gemm_mc, i1 = imin(m, i0 + gemm_mc);
    if (!accumulate)
      for (index_t i = i0; i < i1; ++i)
        for (index_t j = 0; j < n; ++j) c[i * ldc + j] = T(0);
    for (index_t k0 = 0; k0 < k; k0 += gemm_kc) {
      const index_t kb = imin(gemm_kc, k - k0);
      for (index_t j0 = 0; j0 < n; j0 += gemm_nr) {
        const index_t nb = imin(gemm_nr, n - j0);
        const T* bp = b + k0 * ldb + j0;
        for (index_t i = i0; i < i1; i += gemm_mr) {
          const index_t mb = imin(gemm_mr, i1 - i);
          const T* ap = a + i * a_rs + k0 * a_cs;
          T* cp = c + i * ldc + j0;
          if (mb == gemm_mr && nb == gemm_nr)
            gemm_micro_full(kb, ap, a_rs, a_cs, bp, ldb, cp, ldc);
          else
            gemm_micro_edge(mb, nb, kb, ap, a_rs, a_cs, bp, ldb, cp, ldc);
        }
      }
    }
  }
};

/// C = A * B for an m x k matrix A with strides (a_rs, a_cs), a k x n matrix B with
/// strides (b_rs, b_cs) and an m x n matrix C with row stride ldc and unit column
/// stride (C += A * B with accumulate); accumulates in T. Correct for every layout, several times slower than a
/// tuned BLAS: the path taken without BLAS, and tested in every build.
template <class T>
void gemm_fallback(index_t m, index_t n, index_t k, const T* a, index_t a_rs, index_t a_cs,
                   const T* b, index_t b_rs, index_t b_cs, T* c, index_t ldc,
                   bool accumulate = false) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "locus: the fallback GEMM computes in f32 or f64");
  if (m <= 0 || n <= 0) return;
  // B is read along rows; give it unit column stride (one copy, O(k n)).
  tensor<T, cpu, 2> packed;
  if (b_cs != 1 && n > 1 && k > 0) {
    packed = tensor<T, cpu, 2>(extents<2>{k, n});
    T* dst = packed.data_handle();
    for (index_t p = 0; p < k; ++p)
      for (index_t j = 0; j < n; ++j) dst[p * n + j] = b[p * b_rs + j * b_cs];
    b = dst;
    b_rs = n;
  }
  const gemm_fallback_rows<T> task{m, n, k, a, a_rs, a_cs, b, b_rs, c, ldc, accumulate};
  const index_t blocks = (m + gemm_mc - 1) / gemm_mc;
#if defined(_OPENMP)
  const bool parallel = blocks > 1 && m * n * imax(k, 1) >= (index_t{1} << 18);
  _Pragma("omp parallel for schedule(dynamic, 1) if(parallel)")
  for (index_t blk = 0; blk < blocks; ++blk) task(blk);
#else
  for (index_t blk = 0; blk < blocks; ++blk) task(blk);
#endif
}

// ---- BLAS --------------------------------------------------------------------------------

#if LOCUS_HAS_BLAS
inline void blas_gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda,
                      const float* b, int ldb, float* c, int ldc, bool accumulate) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}
inline void blas_gemm(bool ta, bool tb, int m, int n, int k, const double* a, int lda,
                      const double* b, int ldb, double* c, int ldc, bool accumulate) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, 1.0, a, lda, b, ldb, accumulate ? 1.0 : 0.0, c, ldc);
}
#endif

inline int blas_int(index_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw shape_error(std::string("locus: matmul ") + what + " " + std::to_string(v) +
                      " does not fit the 32-bit integers BLAS takes");
  return static_cast<int>(v);
}

/// A batch x rows x cols operand copied to contiguous host memory.
template <class T>
tensor<T, cpu, 3> contiguous_host_copy(const gemm_operand<const T>& x, index_t batch, index_t rows,
                                       index_t cols) {
  tensor<T, cpu, 3> out(extents<3>{batch, rows, cols});
  strided_host_copy(x.p, out.shape(), extents<3>{x.bs, x.rs, x.cs}, out.data_handle(),
                    out.strides());
  return out;
}

/// C[b] = A[b] * B[b] (C[b] += with accumulate) for b in [0, batch) on the host, in T (f32 or f64). A and B may
/// have any strides; C has unit column stride and non-overlapping rows. BLAS when the
/// build has it (operands that map onto a BLAS layout are passed as they are, others are
/// copied to contiguous memory first), the blocked fallback otherwise.
template <class T>
void host_gemm(index_t batch, index_t m, index_t n, index_t k, gemm_operand<const T> a,
               gemm_operand<const T> b, gemm_operand<T> c, bool accumulate = false) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "locus: host GEMMs compute in f32 or f64");
  if (batch <= 0 || m <= 0 || n <= 0) return;
#if LOCUS_HAS_BLAS || LOCUS_HAS_ONEDNN
  using lib_t = ::locus::host_gemm;
  const lib_t lib = std::is_same_v<T, float> ? current_host_gemm() : has_blas ? lib_t::blas : lib_t::fallback;
  if (k > 0 && lib != lib_t::fallback) {
    std::optional<blas_layout> la = blas_layout_of(m, k, a.rs, a.cs);
    std::optional<blas_layout> lb = blas_layout_of(k, n, b.rs, b.cs);
    tensor<T, cpu, 3> a_copy, b_copy;
    if (!la) {
      a_copy = contiguous_host_copy(a, batch, m, k);
      a = {a_copy.data_handle(), m * k, k, 1};
      la = blas_layout{false, k};
    }
    if (!lb) {
      b_copy = contiguous_host_copy(b, batch, k, n);
      b = {b_copy.data_handle(), k * n, n, 1};
      lb = blas_layout{false, n};
    }
    const index_t ldc = m <= 1 ? n : c.rs;
#if LOCUS_HAS_ONEDNN
    if constexpr (std::is_same_v<T, float>) {
      if (lib == lib_t::onednn) {
        for (index_t bi = 0; bi < batch; ++bi) {
          const dnnl_status_t st =
              dnnl_sgemm(la->trans ? 'T' : 'N', lb->trans ? 'T' : 'N', m, n, k, 1.0f, a.p + bi * a.bs, la->ld,
                         b.p + bi * b.bs, lb->ld, accumulate ? 1.0f : 0.0f, c.p + bi * c.bs, ldc);
          if (st == dnnl_out_of_memory)
            throw out_of_memory("cpu", 0, 0, 0, 0, "oneDNN's dnnl_sgemm could not allocate its packing buffers");
          if (st != dnnl_success)
            throw_value_error("locus: oneDNN's dnnl_sgemm failed with status %d (host matmul %lld x %lld x %lld)",
                              static_cast<int>(st), static_cast<long long>(m), static_cast<long long>(n),
                              static_cast<long long>(k));
        }
        return;
      }
    }
#endif
#if LOCUS_HAS_BLAS
    const int im = blas_int(m, "extent"), in = blas_int(n, "extent"), ik = blas_int(k, "extent");
    const int lda = blas_int(la->ld, "leading dimension"), ldb = blas_int(lb->ld, "leading dimension"),
              ldc_i = blas_int(ldc, "leading dimension");
    for (index_t bi = 0; bi < batch; ++bi)
      blas_gemm(la->trans, lb->trans, im, in, ik, a.p + bi * a.bs, lda, b.p + bi * b.bs, ldb,
                c.p + bi * c.bs, ldc_i, accumulate);
    return;
#endif
  }
#endif
  for (index_t bi = 0; bi < batch; ++bi)
    gemm_fallback(m, n, k, a.p + bi * a.bs, a.rs, a.cs, b.p + bi * b.bs, b.rs, b.cs,
                  c.p + bi * c.bs, c.rs, accumulate);
}

}  // namespace locus::detail
