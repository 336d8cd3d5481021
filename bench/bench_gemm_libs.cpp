// bench_gemm_libs: which CPU GEMM library is fastest on the exact GEMMs of an MLP
// training step (issue 19: "the floor is the fastest GEMM available for these shapes").
// For the bench model 784-256-128-10 and the main job's 784-512-256-10 at batch 32, 128
// and 512, one iteration runs every GEMM of one step with the step's shapes and
// transposes (forward Y = X W^T per layer, dW = dY^T X per layer, dX = dY W for every
// layer but the first), row-major f32, through
//   * OpenBLAS (the OpenMP build locus links by default): cblas_sgemm,
//   * BLIS (Debian's libblis-openmp-dev): bli_sgemm, the typed API with strides,
//   * oneDNN (Debian's libdnnl-dev, what PyTorch uses for CPU matmuls): dnnl_sgemm.
// Each library is loaded with dlopen(RTLD_LOCAL | RTLD_DEEPBIND), so that their
// exported BLAS symbols (BLIS exports cblas_* too) cannot bind to one another; a library
// that is not installed reports "not installed" instead of a time. Before timing, each
// library's outputs of one step are compared with OpenBLAS's (max relative error printed
// in the label; a disagreement above 1e-4 skips that library with an error).
// Threads: OMP_NUM_THREADS (all three use OpenMP here); openblas_set_num_threads and
// bli_thread_set_num_threads are called with the same number.
//
//   bench_gemm_libs [Google Benchmark options]
#include <benchmark/benchmark.h>

#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

// ---- the three libraries, through dlopen -----------------------------------------------
using cblas_sgemm_t = void (*)(int layout, int ta, int tb, int m, int n, int k, float alpha, const float* a, int lda,
                               const float* b, int ldb, float beta, float* c, int ldc);
using set_threads_int_t = void (*)(int);
// BLIS 0.9's typed API with 64-bit dim_t/inc_t (Debian builds BLIS_INT_TYPE_SIZE 64);
// trans_t: BLIS_NO_TRANSPOSE 0, BLIS_TRANSPOSE 1 << 3.
using bli_sgemm_t = void (*)(int ta, int tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* alpha,
                             const float* a, std::int64_t rsa, std::int64_t csa, const float* b, std::int64_t rsb,
                             std::int64_t csb, const float* beta, float* c, std::int64_t rsc, std::int64_t csc);
using bli_set_threads_t = void (*)(std::int64_t);
using dnnl_sgemm_t = int (*)(char ta, char tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                             const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                             std::int64_t ldc);

void* open_first(std::initializer_list<const char*> names, std::string& which) {
  for (const char* n : names) {
    if (void* h = dlopen(n, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)) {
      which = n;
      return h;
    }
  }
  return nullptr;
}

int threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

struct libs {
  cblas_sgemm_t openblas = nullptr;
  bli_sgemm_t blis = nullptr;
  dnnl_sgemm_t dnnl = nullptr;
  std::string openblas_so, blis_so, dnnl_so;
  libs() {
    if (void* h = open_first({"/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0", "libopenblas.so.0"},
                             openblas_so)) {
      openblas = reinterpret_cast<cblas_sgemm_t>(dlsym(h, "cblas_sgemm"));
      if (auto f = reinterpret_cast<set_threads_int_t>(dlsym(h, "openblas_set_num_threads"))) f(threads());
    }
    if (void* h = open_first({"/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4", "libblis.so.4"}, blis_so)) {
      blis = reinterpret_cast<bli_sgemm_t>(dlsym(h, "bli_sgemm"));
      if (auto f = reinterpret_cast<bli_set_threads_t>(dlsym(h, "bli_thread_set_num_threads"))) f(threads());
    }
    if (void* h = open_first({"libdnnl.so.3", "libdnnl.so.2"}, dnnl_so))
      dnnl = reinterpret_cast<dnnl_sgemm_t>(dlsym(h, "dnnl_sgemm"));
  }
};

libs& lib() {
  static libs l;
  return l;
}

// ---- one GEMM, row-major: C[m,n] = op(A) op(B), op = transpose when t ------------------
enum class which { openblas, blis, dnnl };

void gemm(which w, bool ta, bool tb, int m, int n, int k, const float* a, const float* b, float* c) {
  const int lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
  switch (w) {
    case which::openblas:
      lib().openblas(101 /* CblasRowMajor */, ta ? 112 : 111, tb ? 112 : 111, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c,
                     ldc);
      break;
    case which::blis: {
      const float one = 1.0f, zero = 0.0f;
      // Row-major storage: row stride = leading dimension, column stride 1.
      lib().blis(ta ? 8 : 0, tb ? 8 : 0, m, n, k, &one, a, lda, 1, b, ldb, 1, &zero, c, ldc, 1);
      break;
    }
    case which::dnnl:
      lib().dnnl(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
      break;
  }
}

// ---- the step's GEMMs -----------------------------------------------------------------
struct step_buffers {
  std::vector<int> w;
  int batch;
  std::vector<std::vector<float>> act, grad, weight, dweight;
  step_buffers(int b, int model) : w(model == 0 ? std::vector<int>{784, 256, 128, 10} : std::vector<int>{784, 512, 256, 10}), batch(b) {
    std::mt19937 rng(1234);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto fill = [&](std::size_t n) {
      std::vector<float> v(n);
      for (auto& x : v) x = nd(rng);
      return v;
    };
    for (std::size_t l = 0; l < w.size(); ++l) {
      act.push_back(fill(static_cast<std::size_t>(b) * w[l]));
      grad.push_back(fill(static_cast<std::size_t>(b) * w[l]));
    }
    for (std::size_t l = 0; l + 1 < w.size(); ++l) {
      weight.push_back(fill(static_cast<std::size_t>(w[l + 1]) * w[l]));
      dweight.push_back(std::vector<float>(static_cast<std::size_t>(w[l + 1]) * w[l]));
    }
  }
  void run(which lb) {
    const std::size_t layers = w.size() - 1;
    for (std::size_t l = 0; l < layers; ++l)  // act[l+1] = act[l] W^T
      gemm(lb, false, true, batch, w[l + 1], w[l], act[l].data(), weight[l].data(), act[l + 1].data());
    for (std::size_t l = layers; l-- > 0;) {
      gemm(lb, true, false, w[l + 1], w[l], batch, grad[l + 1].data(), act[l].data(), dweight[l].data());
      if (l > 0) gemm(lb, false, false, batch, w[l], w[l + 1], grad[l + 1].data(), weight[l].data(), grad[l].data());
    }
  }
  double flop() const {
    double f = 0;
    for (std::size_t l = 0; l + 1 < w.size(); ++l)
      f += (l > 0 ? 6.0 : 4.0) * static_cast<double>(batch) * w[l] * w[l + 1];
    return f;
  }
};

/// Max relative difference of every output of one step against OpenBLAS's, from the
/// same inputs (activations after layer 0 and gradients below the top are outputs too).
double disagreement(which lb, int b, int model) {
  step_buffers ref(b, model), got(b, model);
  ref.run(which::openblas);
  got.run(lb);
  double worst = 0;
  auto cmp = [&](const std::vector<float>& x, const std::vector<float>& y) {
    double scale = 0, diff = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      scale = std::fmax(scale, std::fabs(static_cast<double>(x[i])));
      diff = std::fmax(diff, std::fabs(static_cast<double>(x[i]) - y[i]));
    }
    worst = std::fmax(worst, scale > 0 ? diff / scale : diff);
  };
  for (std::size_t l = 1; l < ref.act.size(); ++l) cmp(ref.act[l], got.act[l]);
  for (std::size_t l = 0; l < ref.dweight.size(); ++l) cmp(ref.dweight[l], got.dweight[l]);
  for (std::size_t l = 1; l + 1 < ref.grad.size(); ++l) cmp(ref.grad[l], got.grad[l]);
  return worst;
}

void BM_step_gemms(benchmark::State& state, which lb) {
  const int b = static_cast<int>(state.range(0)), model = static_cast<int>(state.range(1));
  const bool have = lb == which::openblas ? lib().openblas != nullptr
                    : lb == which::blis   ? lib().blis != nullptr
                                          : lib().dnnl != nullptr;
  if (!have) {
    state.SkipWithError(lb == which::blis   ? "BLIS not installed (apt-get install libblis-openmp-dev)"
                        : lb == which::dnnl ? "oneDNN not installed (apt-get install libdnnl-dev)"
                                            : "OpenBLAS (OpenMP build) not installed");
    return;
  }
  if (!lib().openblas) {
    state.SkipWithError("no OpenBLAS to check the results against");
    return;
  }
  const double err = disagreement(lb, b, model);
  if (!(err <= 1e-4)) {
    state.SkipWithError(("results differ from OpenBLAS's by " + std::to_string(err)).c_str());
    return;
  }
  step_buffers buf(b, model);
  buf.run(lb);  // warm-up: each library's thread pool and packing buffers
  for (auto _ : state) {
    buf.run(lb);
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(buf.flop(), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::OneK::kIs1000);
  char label[64];
  std::snprintf(label, sizeof label, "max rel. diff vs OpenBLAS %.1e", err);
  state.SetLabel(label);
}

void BM_openblas(benchmark::State& s) { BM_step_gemms(s, which::openblas); }
void BM_blis(benchmark::State& s) { BM_step_gemms(s, which::blis); }
void BM_onednn(benchmark::State& s) { BM_step_gemms(s, which::dnnl); }

}  // namespace

BENCHMARK(BM_openblas)->ArgsProduct({{32, 128, 512}, {0, 1}})->ArgNames({"batch", "model"})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_blis)->ArgsProduct({{32, 128, 512}, {0, 1}})->ArgNames({"batch", "model"})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_onednn)->ArgsProduct({{32, 128, 512}, {0, 1}})->ArgNames({"batch", "model"})->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("openblas", lib().openblas ? lib().openblas_so : "not installed");
  benchmark::AddCustomContext("blis", lib().blis ? lib().blis_so : "not installed");
  benchmark::AddCustomContext("onednn", lib().dnnl ? lib().dnnl_so : "not installed");
  benchmark::AddCustomContext("threads", std::to_string(threads()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
