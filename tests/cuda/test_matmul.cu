// CUDA suite: matmul, transpose and linear on cuda through cuBLASLt (the generic bodies),
// plus what only cuda has: a large f32 product at full f32 precision, the opt-in TF32
// mode, and the fused epilogues against the unfused result.
#define LOCUS_TEST_DEVICES locus::cuda
#include "generic/matmul_cases.hpp"

#include <random>
#include <utility>

TEST_CASE("cuda matmul: f32 2048x2048x2048 is full f32 by default and TF32 only on request") {
  using locus::index_t;
  using locus_matmul_test::rel_error;
  const index_t n = 2048;
  auto a = locus::randn<float, locus::cuda>({n, n}, 1701);
  auto b = locus::randn<float, locus::cuda>({n, n}, 1702);
  const auto ha = locus::to<locus::cpu>(a), hb = locus::to<locus::cpu>(b);
  std::vector<std::pair<index_t, index_t>> at;
  std::mt19937_64 rng(1703);
  for (int i = 0; i < 3000; ++i) at.push_back({static_cast<index_t>(rng() % n), static_cast<index_t>(rng() % n)});
  std::vector<double> ref;
  for (const auto& [i, j] : at) {
    double s = 0;
    for (index_t p = 0; p < n; ++p)
      s += static_cast<double>(ha.data()[i * n + p]) * static_cast<double>(hb.data()[p * n + j]);
    ref.push_back(s);
  }
  const auto sampled = [&](const locus::tensor<float, locus::cuda, 2>& c) {
    const auto hc = locus::to<locus::cpu>(c);
    std::vector<double> got;
    for (const auto& [i, j] : at) got.push_back(hc(i, j));
    return got;
  };
  REQUIRE(locus::float32_matmul_precision() == locus::matmul_precision::highest);
  const double full = rel_error(sampled(locus::matmul(a, b)), ref);
  CHECK(full <= 1e-5);
  locus::set_float32_matmul_precision(locus::matmul_precision::high);
  const double tf32 = rel_error(sampled(locus::matmul(a, b)), ref);
  locus::set_float32_matmul_precision(locus::matmul_precision::highest);
  CHECK(tf32 <= 1e-2);
  MESSAGE("relative error: f32 " << full << ", tf32 " << tf32);
}

TEST_CASE("cuda linear: fused cuBLASLt epilogues equal matmul followed by the activation") {
  using locus::index_t;
  using locus_matmul_test::rel_error;
  using locus_matmul_test::doubles;
  const index_t n = 256, k = 384, m = 512;  // sizes a real layer has
  auto x = locus::randn<locus::bf16, locus::cuda>({n, k}, 1801);
  auto w = locus::randn<locus::bf16, locus::cuda>({m, k}, 1802);
  auto b = locus::randn<float, locus::cuda>({m}, 1803);
  const auto X = doubles(x), W = doubles(w), B = doubles(b);
  for (auto act : {locus::activation::none, locus::activation::relu, locus::activation::gelu,
                   locus::activation::gelu_tanh}) {
    CAPTURE(locus_matmul_test::name_of(act));
    auto y = locus::linear<float>(x, w, b, act);
    CHECK(rel_error(doubles(y), locus_matmul_test::linear_reference(X, W, B, n, m, k, act)) <= 1e-5);
  }
  // A bias that is a strided view (copied to contiguous memory for the epilogue).
  auto b2 = locus::randn<float, locus::cuda>({2 * m}, 1804);
  locus::tensor_view<const float, locus::cuda, 1> every_other = locus::unsafe_view<locus::cuda>(b2.data_handle(), {m}, {2});
  const auto B2all = doubles(b2);
  std::vector<double> B2;
  for (index_t j = 0; j < m; ++j) B2.push_back(B2all[static_cast<std::size_t>(2 * j)]);
  CHECK(rel_error(doubles(locus::linear<float>(x, w, every_other, locus::activation::relu)),
                  locus_matmul_test::linear_reference(X, W, B2, n, m, k, locus::activation::relu)) <= 1e-5);
}
