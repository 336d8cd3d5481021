// GEMMs on `cuda` through cuBLASLt: f32, f64, f16 and bf16 inputs, f32 accumulation
// for the 32- and 16-bit types (f64 for f64), fused bias / ReLU / GELU (tanh) epilogues,
// strided batches. These are host API calls: this header compiles in files g++ or
// clang++ compile; only locus's own epilogue fallback kernel needs nvcc.
//
// Row-major tensors meet column-major cuBLASLt by the transpose identity: the
// row-major m x n product C = A B is, read column-major, the n x m matrix
// C^T = B^T A^T, so B is passed as cuBLASLt's first operand and A as its second, with
// no data movement. In that swapped view the output has n rows, so the bias vector
// (one value per output row of D, broadcast along its columns) is one value per output
// column of C, which is what a linear layer's bias is.
//
// Per device: one cached handle (created on first use under a lock, never destroyed:
// tensors with static storage may call in during exit), and a workspace taken from the
// caching allocator on the current stream for each call. Per host thread: a cache,
// keyed by the whole problem (gemm_key: device, dtypes, shape, transposes, leading
// dimensions, batch strides, epilogue, whether there is a bias, the operands'
// alignments and the workspace size), of the three layouts, the matmul descriptor with
// its transposes and epilogue set, and the algorithm the heuristic picked (or that it
// has none). A call that hits builds nothing and takes no lock: one hash lookup, the
// bias pointer set on the descriptor when there is one, and cublasLtMatmul. Per thread,
// because the bias pointer is set on the cached descriptor before each call.
#pragma once

#include "../../core/config.hpp"

#if !LOCUS_HAS_CUDA
#error "locus: backend/cuda/cublaslt.hpp needs a build with CUDA (LOCUS_ENABLE_CUDA=1)"
#endif

#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "../../core/dtype.hpp"
#include "../../core/error.hpp"
#include "../../memory/allocator.hpp"
#include "../blas.hpp"
#include "runtime.hpp"

/// Checks a cuBLAS / cuBLASLt call; throws locus::cuda_error with the call, file, line,
/// status code and cuBLAS's own text.
#define LOCUS_CUBLAS_CHECK(call)                                                        \
  do {                                                                                  \
    const cublasStatus_t locus_cublas_check_status_ = (call);                           \
    if (locus_cublas_check_status_ != CUBLAS_STATUS_SUCCESS)                            \
      throw ::locus::cuda_error(#call, __FILE__, __LINE__,                              \
                                static_cast<int>(locus_cublas_check_status_),           \
                                ::cublasLtGetStatusString(locus_cublas_check_status_)); \
  } while (false)

namespace locus::detail {

#if defined(LOCUS_COUNT_LAUNCHES)
/// cuBLASLt GEMMs run so far (bench builds only).
inline unsigned long long& gemm_count() noexcept {
  static unsigned long long n = 0;
  return n;
}
inline void count_gemm() noexcept { ++gemm_count(); }
#else
inline void count_gemm() noexcept {}
#endif

template <class T>
constexpr cudaDataType_t cublaslt_type() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<U, double>) return CUDA_R_64F;
  else if constexpr (std::is_same_v<U, f16>) return CUDA_R_16F;
  else if constexpr (std::is_same_v<U, bf16>) return CUDA_R_16BF;
  else {
    static_assert(always_false<T>, "locus: cuBLASLt GEMMs take f32, f64, f16 or bf16");
    return CUDA_R_32F;
  }
}

/// What cuBLASLt keeps per device.
struct cublaslt_device_state {
  cublasLtHandle_t handle = nullptr;
  std::size_t workspace_bytes = 0;
};

/// The state of one device, created on first use. Entries are never moved or freed, so
/// the reference stays valid while other threads add devices.
inline const cublaslt_device_state& cublaslt_state(int device) {
  static std::mutex mutex;
  static auto* states = new std::vector<std::unique_ptr<cublaslt_device_state>>();
  std::lock_guard lock(mutex);
  if (device < 0) device = 0;
  if (states->size() <= static_cast<std::size_t>(device)) states->resize(device + 1);
  auto& slot = (*states)[device];
  if (!slot) slot = std::make_unique<cublaslt_device_state>();
  cublaslt_device_state& s = *slot;
  if (!s.handle) {
    int major = 0;
    LOCUS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    // NVIDIA's guidance: 32 MiB of workspace lets Hopper and later pick their best
    // kernels; 4 MiB is enough before that.
    s.workspace_bytes = major >= 9 ? (std::size_t{32} << 20) : (std::size_t{4} << 20);
    LOCUS_CUBLAS_CHECK(cublasLtCreate(&s.handle));
  }
  return s;
}

/// The cuBLASLt handle of the current device.
inline cublasLtHandle_t cublaslt_handle() { return cublaslt_state(current_device()).handle; }

/// Largest power of two (at most 256) that divides the address: cuBLASLt's heuristic
/// assumes 256-byte alignment unless told otherwise, and views may start anywhere.
inline std::uint32_t pointer_alignment(const void* p) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

// RAII owners of the cuBLASLt descriptors (destruction errors are ignored).
struct lt_layout {
  cublasLtMatrixLayout_t h = nullptr;
  lt_layout(cudaDataType_t type, std::uint64_t rows, std::uint64_t cols, std::int64_t ld,
            int batch, std::int64_t batch_stride) {
    LOCUS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&h, type, rows, cols, ld));
    if (batch > 1) {
      try {
        LOCUS_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                            &batch, sizeof batch));
        LOCUS_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride, sizeof batch_stride));
      } catch (...) {
        (void)cublasLtMatrixLayoutDestroy(h);
        throw;
      }
    }
  }
  lt_layout(const lt_layout&) = delete;
  lt_layout& operator=(const lt_layout&) = delete;
  ~lt_layout() {
    if (h) (void)cublasLtMatrixLayoutDestroy(h);
  }
};

struct lt_matmul_desc {
  cublasLtMatmulDesc_t h = nullptr;
  lt_matmul_desc(cublasComputeType_t compute, cudaDataType_t scale) {
    LOCUS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&h, compute, scale));
  }
  lt_matmul_desc(const lt_matmul_desc&) = delete;
  lt_matmul_desc& operator=(const lt_matmul_desc&) = delete;
  ~lt_matmul_desc() {
    if (h) (void)cublasLtMatmulDescDestroy(h);
  }
  template <class V>
  void set(cublasLtMatmulDescAttributes_t attr, const V& v) {
    LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(h, attr, &v, sizeof v));
  }
};

struct lt_preference {
  cublasLtMatmulPreference_t h = nullptr;
  lt_preference() { LOCUS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&h)); }
  lt_preference(const lt_preference&) = delete;
  lt_preference& operator=(const lt_preference&) = delete;
  ~lt_preference() {
    if (h) (void)cublasLtMatmulPreferenceDestroy(h);
  }
  template <class V>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const V& v) {
    LOCUS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(h, attr, &v, sizeof v));
  }
};

/// A workspace from the caching allocator, returned when the call has been enqueued
/// (the allocator only hands it to later work on the same stream). Without memory to
/// spare it is empty and cuBLASLt picks an algorithm that needs none.
struct lt_workspace {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit lt_workspace(std::size_t want) {
    try {
      p = allocator_for<cuda>().allocate(want);
      bytes = want;
    } catch (const out_of_memory&) {
      p = nullptr;
      bytes = 0;
    }
  }
  lt_workspace(const lt_workspace&) = delete;
  lt_workspace& operator=(const lt_workspace&) = delete;
  ~lt_workspace() {
    if (p) allocator_for<cuda>().deallocate(p);
  }
};

/// One batched row-major GEMM D[b] = epilogue(A[b] B[b]) as locus describes it; the
/// operands' layouts come from blas_layout_of (see blas.hpp).
struct cublaslt_gemm_args {
  cudaDataType_t ab_type;  // A and B share a dtype
  cudaDataType_t d_type;
  cublasComputeType_t compute;
  cudaDataType_t scale;
  index_t batch, m, n, k;
  const void* a;
  blas_layout la;
  index_t a_bs;
  const void* b;
  blas_layout lb;
  index_t b_bs;
  void* d;
  index_t ldd, d_bs;  // unit column stride
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // n values of dtype d_type, unit stride
  bool accumulate = false;     // D = A B + D (beta 1)
};

/// What identifies a GEMM for the descriptor cache: every value the layouts, the
/// descriptor and the heuristic depend on (not the data pointers, only their
/// alignments; not the bias pointer, only whether there is one).
using gemm_key = std::array<std::int64_t, 24>;

/// The key of `g` on `device` with a workspace of `ws_bytes` (a pure function: the
/// host suite checks what it tells apart).
inline gemm_key make_gemm_key(const cublaslt_gemm_args& g, int device, std::size_t ws_bytes) noexcept {
  return gemm_key{device,
                  static_cast<std::int64_t>(g.ab_type),
                  static_cast<std::int64_t>(g.d_type),
                  static_cast<std::int64_t>(g.compute),
                  static_cast<std::int64_t>(g.scale),
                  g.batch,
                  g.m,
                  g.n,
                  g.k,
                  g.la.trans ? 1 : 0,
                  g.la.ld,
                  g.batch > 1 ? g.a_bs : 0,
                  g.lb.trans ? 1 : 0,
                  g.lb.ld,
                  g.batch > 1 ? g.b_bs : 0,
                  g.ldd,
                  g.batch > 1 ? g.d_bs : 0,
                  static_cast<std::int64_t>(g.epilogue),
                  g.bias ? 1 : 0,
                  pointer_alignment(g.b),
                  pointer_alignment(g.a),
                  pointer_alignment(g.d),
                  g.bias ? pointer_alignment(g.bias) : 0,
                  static_cast<std::int64_t>(ws_bytes)};
}

/// FNV-1a over the key's words.
struct gemm_key_hash {
  std::size_t operator()(const gemm_key& k) const noexcept {
    std::uint64_t h = 1469598103934665603ull;
    for (const std::int64_t w : k) {
      h ^= static_cast<std::uint64_t>(w);
      h *= 1099511628211ull;
    }
    return static_cast<std::size_t>(h);
  }
};

/// A cached GEMM: its layouts and descriptor, and the algorithm (nullopt: cuBLASLt has
/// none, so the caller's unfused path runs without asking again).
struct gemm_plan {
  std::unique_ptr<lt_layout> first, second, out;
  std::unique_ptr<lt_matmul_desc> desc;
  std::optional<cublasLtMatmulAlgo_t> algo;
};

/// This thread's plans.
inline std::unordered_map<gemm_key, gemm_plan, gemm_key_hash>& gemm_plans() {
  thread_local std::unordered_map<gemm_key, gemm_plan, gemm_key_hash> plans;
  return plans;
}

/// Builds the plan of `g` (layouts, descriptor, heuristic).
inline gemm_plan make_gemm_plan(const cublaslt_gemm_args& g, const cublaslt_device_state& st, std::size_t ws_bytes) {
  const int batch = static_cast<int>(g.batch);
  // Swapped operands: cuBLASLt's A is our B, its B is our A; D is n x m column-major.
  // A row-major k x n matrix with ld is a column-major n x k one (op N); a transposed
  // one (stored n x k row-major) is a column-major k x n one (op T).
  const auto n64 = static_cast<std::uint64_t>(g.n), m64 = static_cast<std::uint64_t>(g.m),
             k64 = static_cast<std::uint64_t>(g.k);
  const cublasOperation_t op_first = g.lb.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = g.la.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  gemm_plan p;
  p.first = std::make_unique<lt_layout>(g.ab_type, g.lb.trans ? k64 : n64, g.lb.trans ? n64 : k64, g.lb.ld, batch,
                                        g.b_bs);
  p.second = std::make_unique<lt_layout>(g.ab_type, g.la.trans ? m64 : k64, g.la.trans ? k64 : m64, g.la.ld, batch,
                                         g.a_bs);
  p.out = std::make_unique<lt_layout>(g.d_type, n64, m64, g.ldd, batch, g.d_bs);
  p.desc = std::make_unique<lt_matmul_desc>(g.compute, g.scale);
  p.desc->set(CUBLASLT_MATMUL_DESC_TRANSA, static_cast<std::int32_t>(op_first));
  p.desc->set(CUBLASLT_MATMUL_DESC_TRANSB, static_cast<std::int32_t>(op_second));
  p.desc->set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<std::uint32_t>(g.epilogue));
  if (g.bias) p.desc->set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);

  lt_preference pref;
  const std::uint32_t al_d = pointer_alignment(g.d);
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(ws_bytes));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, pointer_alignment(g.b));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, pointer_alignment(g.a));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_d);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d);
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(st.handle, p.desc->h, p.first->h, p.second->h, p.out->h,
                                                          p.out->h, pref.h, 1, &result, &count);
  // No algorithm: NOT_SUPPORTED, or no result. With an epilogue, any refusal of the
  // heuristic (some versions answer INVALID_VALUE for shapes an epilogue cannot take,
  // e.g. a single row) means the same: the caller runs the unfused path instead.
  const bool none = s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && count == 0) ||
                    (s != CUBLAS_STATUS_SUCCESS && g.epilogue != CUBLASLT_EPILOGUE_DEFAULT);
  if (!none) {
    LOCUS_CUBLAS_CHECK(s);
    p.algo = result.algo;
  }
  return p;
}

/// Runs the GEMM on the current device and stream. Returns false, having run nothing,
/// when cuBLASLt has no algorithm for this problem (for example an epilogue it does not
/// offer for these dtypes); every other failure throws cuda_error.
inline bool cublaslt_gemm(const cublaslt_gemm_args& g) {
  if (g.batch > INT32_MAX)
    throw shape_error("locus: matmul batch of " + std::to_string(g.batch) +
                      " exceeds what cuBLASLt takes (2^31 - 1)");
  const int device = current_device();
  thread_local int last_device = -1;
  thread_local const cublaslt_device_state* last_state = nullptr;
  if (device != last_device) {  // the state's lock only when the device changes
    last_state = &cublaslt_state(device);
    last_device = device;
  }
  const cublaslt_device_state& st = *last_state;
  lt_workspace ws(st.workspace_bytes);
  const gemm_key key = make_gemm_key(g, device, ws.bytes);
  auto& plans = gemm_plans();
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_gemm_plan(g, st, ws.bytes)).first;
  gemm_plan& p = it->second;
  if (!p.algo) return false;
  if (g.bias) p.desc->set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);

  const float alpha32 = 1.0f, beta32 = g.accumulate ? 1.0f : 0.0f;
  const double alpha64 = 1.0, beta64 = g.accumulate ? 1.0 : 0.0;
  const bool f64 = g.scale == CUDA_R_64F;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : static_cast<const void*>(&alpha32);
  const void* beta = f64 ? static_cast<const void*>(&beta64) : static_cast<const void*>(&beta32);
  count_gemm();
  LOCUS_CUBLAS_CHECK(cublasLtMatmul(st.handle, p.desc->h, alpha, g.b, p.first->h, g.a, p.second->h, beta, g.d,
                                    p.out->h, g.d, p.out->h, &*p.algo, ws.p, ws.bytes, current_stream()));
  return true;
}

}  // namespace locus::detail
