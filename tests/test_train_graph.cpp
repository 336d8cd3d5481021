// Host suite for issue 13's launch and graph-mode seams: launch failures become
// locus::cuda_error, the trainer's cuda_graph option is refused on a host trainer, the
// cuBLASLt plan cache's key tells apart what it must, and launch_n_then runs last()
// once after every element.
#include <doctest/doctest.h>

#include <limits>
#include <new>
#define LOCUS_TRANSLATE_THRUST_ERRORS 1  // the thrust::system_error translation, tested on the host
#include <thrust/system/error_code.h>
#include <thrust/system_error.h>

#include <locus/locus.hpp>
#include <locus/train.hpp>
#if LOCUS_HAS_CUDA
#include <locus/backend/cuda/cublaslt.hpp>
#endif

namespace {
using locus::index_t;

struct counting_then {
  int* calls;
  int* seen_at_last;
  int* last_calls;
  void operator()(index_t) const { ++*calls; }
  void last() const {
    *seen_at_last = *calls;
    ++*last_calls;
  }
};
}  // namespace

TEST_CASE("launch errors: thrust::system_error, bad_alloc and others become locus::cuda_error with code and text") {
  using locus::detail::translate_launch_errors;
  try {
    translate_launch_errors("thrust::for_each_n", "f.cpp", 12, [] {
      throw thrust::system_error(thrust::error_code(98, thrust::generic_category()), "launch went wrong");
    });
    FAIL("no exception");
  } catch (const locus::cuda_error& e) {
    CHECK(e.code() == 98);
    const std::string w = e.what();
    CHECK(w.find("locus: CUDA call failed: thrust::for_each_n") != std::string::npos);
    CHECK(w.find("f.cpp") != std::string::npos);
    CHECK(w.find("launch went wrong") != std::string::npos);
  }
  CHECK_THROWS_AS(translate_launch_errors("x", "f.cpp", 1, [] { throw std::bad_alloc(); }), locus::cuda_error);
  try {
    translate_launch_errors("x", "f.cpp", 1, [] { throw std::bad_alloc(); });
  } catch (const locus::cuda_error& e) {
    CHECK(e.code() == locus::detail::launch_alloc_code);
  }
  try {
    translate_launch_errors("x", "f.cpp", 1, [] { throw std::runtime_error("odd"); });
  } catch (const locus::cuda_error& e) {
    CHECK(e.code() == locus::detail::launch_failure_code);
    CHECK(std::string(e.what()).find("odd") != std::string::npos);
  }
  // locus's own errors pass unchanged (not wrapped as cuda_error)
  CHECK_THROWS_AS(translate_launch_errors("x", "f.cpp", 1, [] { throw locus::shape_error("locus: s"); }),
                  locus::shape_error);
  try {
    translate_launch_errors("x", "f.cpp", 1, [] { throw locus::shape_error("locus: s"); });
  } catch (const locus::cuda_error&) {
    FAIL("a locus error was rewrapped");
  } catch (const locus::shape_error& e) {
    CHECK(std::string(e.what()) == "locus: s");
  }
  // a value passes through
  CHECK(translate_launch_errors("x", "f.cpp", 1, [] { return 5; }) == 5);
}

TEST_CASE("launch_n_then: last() runs once, after every element, also for n = 0") {
  for (index_t n : {index_t{0}, index_t{1}, index_t{7}, index_t{1} << 16}) {
    CAPTURE(n);
    int calls = 0, seen = -1, lasts = 0;
    locus::detail::launch_n_then<locus::cpu>(n, counting_then{&calls, &seen, &lasts}, nullptr);
    CHECK(calls == n);
    CHECK(seen == n);
    CHECK(lasts == 1);
  }
  CHECK(locus::detail::then_blocks(0) == 1);
  CHECK(locus::detail::then_blocks(1) == 1);
  CHECK(locus::detail::then_blocks(256) == 1);
  CHECK(locus::detail::then_blocks(257) == 2);
  CHECK(locus::detail::then_blocks(std::numeric_limits<index_t>::max()) == locus::detail::then_max_blocks);
}

TEST_CASE("trainer: cuda_graph = true on a host trainer is a locus::value_error at construction") {
  namespace nn = locus::nn;
  nn::sequential m(nn::linear<locus::cpu, locus::amp::fp32>(4, 3));
  locus::optim::adamw<locus::cpu> opt(m.parameters());
  using T = locus::train::trainer<decltype(m), decltype(opt), nn::cross_entropy>;
  try {
    T t(m, opt, nn::cross_entropy{}, {.cuda_graph = true});
    FAIL("constructed");
  } catch (const locus::value_error& e) {
    CHECK(std::string(e.what()).find("cuda_graph = true needs a trainer on cuda") != std::string::npos);
  }
  // the control: without the option it builds and steps
  T t(m, opt, nn::cross_entropy{}, {.cuda_graph = false});
  auto x = locus::zeros<float, locus::cpu>({2, 4});
  auto y = locus::zeros<std::int64_t, locus::cpu>({2});
  t.step(x, y);
  CHECK(t.optimizer_steps() == 1);
  CHECK(nn::sequential<nn::linear<locus::cpu, locus::amp::fp32>>::has_dropout == false);
  CHECK(nn::sequential<nn::linear<locus::cpu, locus::amp::fp32>, nn::dropout<locus::cpu, locus::amp::fp32>>::has_dropout);
}

TEST_CASE("trainer: cuda_graph = true with an unfused step (check_finite = false, no scaler) is refused") {
  // The unfused optimizer step takes the learning rate as a kernel argument: a replayed
  // graph would keep the captured step's rate (a schedule would stop at its first value).
  namespace nn = locus::nn;
  nn::sequential m(nn::linear<locus::cpu, locus::amp::fp32>(4, 3));
  locus::optim::adamw<locus::cpu> opt(m.parameters());
  using T = locus::train::trainer<decltype(m), decltype(opt), nn::cross_entropy>;
  bool refused = false;
  try {
    T t(m, opt, nn::cross_entropy{}, {.cuda_graph = true, .check_finite = false});
  } catch (const locus::value_error& e) {
    refused = true;
    const std::string w = e.what();
    CHECK(w.find("check_finite = false") != std::string::npos);
    CHECK(w.find("learning rate") != std::string::npos);
    CHECK(w.find("keep check_finite = true") != std::string::npos);
  }
  CHECK(refused);
  // check_finite = false without graph mode is fine, and so is the fused graph request
  // (refused on this host trainer for the other reason only).
  T plain(m, opt, nn::cross_entropy{}, {.cuda_graph = false, .check_finite = false});
  auto x = locus::zeros<float, locus::cpu>({2, 4});
  auto y = locus::zeros<std::int64_t, locus::cpu>({2});
  plain.step(x, y);
  CHECK(plain.optimizer_steps() == 1);
  try {
    T t(m, opt, nn::cross_entropy{}, {.cuda_graph = true, .check_finite = true});
    FAIL("constructed");
  } catch (const locus::value_error& e) {
    CHECK(std::string(e.what()).find("needs a trainer on cuda") != std::string::npos);
  }
}

#if LOCUS_HAS_CUDA
TEST_CASE("cuBLASLt plan cache: the key tells apart every property a plan depends on, and only those") {
  using locus::detail::cublaslt_gemm_args;
  using locus::detail::make_gemm_key;
  alignas(256) static float buf[4096];
  cublaslt_gemm_args g{};
  g.ab_type = CUDA_R_16BF;
  g.d_type = CUDA_R_16BF;
  g.compute = CUBLAS_COMPUTE_32F;
  g.scale = CUDA_R_32F;
  g.batch = 1;
  g.m = 128;
  g.n = 512;
  g.k = 784;
  g.a = buf;
  g.la = {false, 784};
  g.b = buf;
  g.lb = {true, 784};
  g.d = buf;
  g.ldd = 512;
  const auto k0 = make_gemm_key(g, 0, 1 << 25);
  CHECK(make_gemm_key(g, 0, 1 << 25) == k0);
  // the same problem with other data at the same alignment: the same plan
  auto same = g;
  same.a = buf + 64;  // 256 bytes on
  same.d = buf + 128;
  CHECK(make_gemm_key(same, 0, 1 << 25) == k0);
  // batch strides are ignored without a batch
  same.a_bs = 999;
  CHECK(make_gemm_key(same, 0, 1 << 25) == k0);
  // the bias pointer itself is not part of the key; having one is
  auto biased = g;
  biased.bias = buf;
  auto biased2 = biased;
  biased2.bias = buf + 64;
  CHECK(make_gemm_key(biased, 0, 1 << 25) != k0);
  CHECK(make_gemm_key(biased, 0, 1 << 25) == make_gemm_key(biased2, 0, 1 << 25));
  auto differs = [&](auto edit) {
    auto h = g;
    edit(h);
    return make_gemm_key(h, 0, 1 << 25) != k0;
  };
  CHECK(make_gemm_key(g, 1, 1 << 25) != k0);  // device
  CHECK(make_gemm_key(g, 0, 0) != k0);        // workspace
  CHECK(differs([](auto& h) { h.m = 96; }));  // an epoch's last batch
  CHECK(differs([](auto& h) { h.n = 256; }));
  CHECK(differs([](auto& h) { h.k = 512; }));
  CHECK(differs([](auto& h) { h.la.trans = true; }));
  CHECK(differs([](auto& h) { h.lb.trans = false; }));
  CHECK(differs([](auto& h) { h.la.ld = 800; }));
  CHECK(differs([](auto& h) { h.ldd = 520; }));
  CHECK(differs([](auto& h) { h.ab_type = CUDA_R_16F; }));
  CHECK(differs([](auto& h) { h.d_type = CUDA_R_32F; }));
  CHECK(differs([](auto& h) { h.epilogue = CUBLASLT_EPILOGUE_RELU_BIAS; }));
  CHECK(differs([&](auto& h) { h.a = buf + 1; }));  // 4-byte alignment
  CHECK(differs([](auto& h) {
    h.batch = 3;
    h.a_bs = 10;
  }));
  auto b3 = g;
  b3.batch = 3;
  b3.a_bs = 10;
  auto b3s = b3;
  b3s.a_bs = 20;
  CHECK(make_gemm_key(b3, 0, 1) != make_gemm_key(b3s, 0, 1));
  // the hash is a function of the key
  CHECK(locus::detail::gemm_key_hash{}(k0) == locus::detail::gemm_key_hash{}(make_gemm_key(g, 0, 1 << 25)));
  CHECK(locus::detail::gemm_key_hash{}(k0) != locus::detail::gemm_key_hash{}(make_gemm_key(g, 1, 1 << 25)));
}
#endif
