// Host suite for matmul: the device-generic bodies for cpu and pinned, plus what only
// the host has: the blocked fallback GEMM called directly (it is the path of builds
// without BLAS, and is tested in every build), a large f32 product through BLAS, strided
// destinations, and transpose's view semantics.
#include "host_devices.hpp"
#include "generic/matmul_cases.hpp"

#include <algorithm>
#include <random>
#include <utility>

namespace {

using locus::index_t;

/// Puts the host GEMM library back as it was, however the test ends.
struct host_gemm_restore {
  locus::host_gemm before = locus::current_host_gemm();
  ~host_gemm_restore() { locus::set_host_gemm(before); }
};

/// Double reference of C = A B for raw strided operands.
template <class T>
std::vector<double> raw_reference(index_t m, index_t n, index_t k, const T* a, index_t a_rs,
                                  index_t a_cs, const T* b, index_t b_rs, index_t b_cs) {
  std::vector<double> c(static_cast<std::size_t>(m * n));
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double s = 0;
      for (index_t p = 0; p < k; ++p)
        s += static_cast<double>(a[i * a_rs + p * a_cs]) * static_cast<double>(b[p * b_rs + j * b_cs]);
      c[static_cast<std::size_t>(i * n + j)] = s;
    }
  return c;
}

/// The m x n result held in a buffer with row stride ldc, as a dense vector.
template <class T>
std::vector<double> dense(const T* c, index_t m, index_t n, index_t ldc) {
  std::vector<double> out;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) out.push_back(static_cast<double>(c[i * ldc + j]));
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("matmul fallback: gemm_fallback matches a double reference for every layout", T, float, double) {
  using locus_matmul_test::rel_error;
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  const index_t shapes[][3] = {{127, 255, 63}, {67, 1, 5}, {1, 300, 17}, {130, 70, 300}, {4, 8, 1}, {5, 9, 0}};
  std::uint64_t seed = 500;
  for (const auto& s : shapes) {
    const index_t m = s[0], n = s[1], k = s[2];
    CAPTURE(m);
    CAPTURE(n);
    CAPTURE(k);
    // Storage large enough for every layout below.
    auto abuf = locus::randn<T, locus::cpu>({2 * (m + 1) * (k + 1)}, seed++);
    auto bbuf = locus::randn<T, locus::cpu>({2 * (k + 1) * (n + 1)}, seed++);
    const T* A = abuf.data();
    const T* B = bbuf.data();
    struct layout {
      const char* name;
      index_t a_rs, a_cs, b_rs, b_cs;
    };
    const layout layouts[] = {
        {"row-major", k, 1, n, 1},
        {"A transposed", 1, m, n, 1},
        {"B transposed", k, 1, 1, k},
        {"both transposed", 1, m, 1, k},
        {"padded rows", k + 1, 1, n + 1, 1},
        {"B column-strided (packed first)", k, 1, 2 * n, 2},
    };
    for (const auto& l : layouts) {
      CAPTURE(l.name);
      const index_t ldc = n + 3;
      std::vector<T> c(static_cast<std::size_t>(std::max<index_t>(m * ldc, 1)), T(-7));
      locus::detail::gemm_fallback<T>(m, n, k, A, l.a_rs, l.a_cs, B, l.b_rs, l.b_cs, c.data(), ldc);
      const auto got = dense(c.data(), m, n, ldc);
      const auto ref = raw_reference(m, n, k, A, l.a_rs, l.a_cs, B, l.b_rs, l.b_cs);
      if (k == 0) {
        for (double v : got) CHECK(v == 0.0);
      } else {
        CHECK(rel_error(got, ref) <= tol);
      }
      // The padding between rows is never written.
      for (index_t i = 0; i < m; ++i)
        for (index_t j = n; j < ldc && i * ldc + j < static_cast<index_t>(c.size()); ++j)
          CHECK(c[static_cast<std::size_t>(i * ldc + j)] == T(-7));
    }
  }
}

TEST_CASE("matmul fallback: a large product runs in parallel row blocks and stays accurate") {
  using locus_matmul_test::rel_error;
  const index_t m = 300, n = 257, k = 520;
  auto a = locus::randn<float, locus::cpu>({m, k}, 601);
  auto b = locus::randn<float, locus::cpu>({k, n}, 602);
  auto c = locus::empty<float, locus::cpu>({m, n});
  locus::detail::gemm_fallback<float>(m, n, k, a.data(), k, 1, b.data(), n, 1, c.data(), n);
  const auto ref = raw_reference(m, n, k, a.data(), k, 1, b.data(), n, 1);
  CHECK(rel_error(dense(c.data(), m, n, n), ref) <= 1e-5);
}

TEST_CASE("matmul: f32 2048x2048x2048 through BLAS and oneDNN matches a sampled double reference" *
          doctest::skip(!locus::detail::has_blas && !locus::detail::has_onednn)) {
  using locus_matmul_test::rel_error;
  const index_t n = 2048;
  auto a = locus::randn<float, locus::cpu>({n, n}, 701);
  auto b = locus::randn<float, locus::cpu>({n, n}, 702);
  const host_gemm_restore restore;
  for (locus::host_gemm lib : {locus::host_gemm::blas, locus::host_gemm::onednn}) {
  if (!locus::host_gemm_available(lib)) continue;
  CAPTURE(locus::name_of(lib));
  locus::set_host_gemm(lib);
  auto c = locus::matmul(a, locus::transpose(b));  // the layout linear() uses
  // Every element of 4 rows and 4 columns, and 1000 elements at random.
  std::vector<std::pair<index_t, index_t>> at;
  for (index_t r : {index_t{0}, index_t{1024}, index_t{1337}, n - 1})
    for (index_t j = 0; j < n; ++j) {
      at.push_back({r, j});
      at.push_back({j, r});
    }
  std::mt19937_64 rng(703);
  for (int i = 0; i < 1000; ++i)
    at.push_back({static_cast<index_t>(rng() % n), static_cast<index_t>(rng() % n)});
  std::vector<double> got, ref;
  for (const auto& [i, j] : at) {
    double s = 0;
    const float* ai = a.data() + i * n;
    const float* bj = b.data() + j * n;
    for (index_t p = 0; p < n; ++p) s += static_cast<double>(ai[p]) * static_cast<double>(bj[p]);
    ref.push_back(s);
    got.push_back(c(i, j));
  }
  CHECK(rel_error(got, ref) <= 1e-5);
  }
}

TEST_CASE("transpose: a view with swapped shape and strides over the same memory") {
  auto t = locus::arange<float, locus::cpu>(12);
  auto m = t.reshape({3, 4});
  auto v = locus::transpose(m);
  static_assert(std::is_same_v<decltype(v), locus::tensor_view<float, locus::cpu, 2>>);
  CHECK(v.shape() == locus::extents<2>{4, 3});
  CHECK(v.strides() == locus::extents<2>{1, 4});
  CHECK(v.data_handle() == t.data_handle());
  CHECK_FALSE(v.is_contiguous());
  for (index_t i = 0; i < 3; ++i)
    for (index_t j = 0; j < 4; ++j) CHECK(v(j, i) == m(i, j));
  v(2, 1) = -1.0f;  // writes through to the tensor
  CHECK(m(1, 2) == -1.0f);
  // Twice is the identity; a const tensor gives a view of const elements.
  auto vv = locus::transpose(v);
  CHECK(vv.shape() == m.shape());
  CHECK(vv.strides() == m.strides());
  const auto owned = locus::ones<double, locus::cpu>({2, 5});
  auto cv = locus::transpose(owned);
  static_assert(std::is_same_v<decltype(cv), locus::tensor_view<const double, locus::cpu, 2>>);
  CHECK(cv.shape() == locus::extents<2>{5, 2});
  // Rank 3: the last two axes.
  auto cube = locus::arange<float, locus::cpu>(24);
  auto c3 = cube.reshape({2, 3, 4});
  auto t3 = locus::transpose(c3);
  CHECK(t3.shape() == locus::extents<3>{2, 4, 3});
  CHECK(t3(1, 3, 2) == c3(1, 2, 3));
  // A copy of the transposed view is the materialised transpose.
  auto dense_t = locus::to<locus::cpu>(v);
  CHECK(dense_t.is_contiguous());
  CHECK(dense_t(3, 2) == m(2, 3));
}

TEST_CASE("linear_into and matmul_into with strided host destinations") {
  using namespace locus_matmul_test;
  const index_t n = 9, k = 14, m = 6;
  auto x = locus::randn<float, locus::cpu>({n, k}, 801);
  auto w = locus::randn<float, locus::cpu>({m, k}, 802);
  auto b = locus::randn<float, locus::cpu>({m}, 803);
  const auto ref = linear_reference(doubles(x), doubles(w), doubles(b), n, m, k, locus::activation::gelu);
  // The destination is the transpose of an [m, n] tensor: column stride n, not 1.
  auto yt = locus::zeros<float, locus::cpu>({m, n});
  locus::linear_into(locus::transpose(yt), x, w, b, locus::activation::gelu);
  std::vector<double> got;
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < m; ++j) got.push_back(yt(j, i));
  CHECK(rel_error(got, ref) <= 1e-5);
  // A column block of a wider tensor: row stride 2m (BLAS ldc), columns left of it untouched.
  auto wide = locus::full<float, locus::cpu>({n, 2 * m}, 5.0f);
  locus::tensor_view<float, locus::cpu, 2> right = locus::unsafe_view<locus::cpu>(wide.data() + m, {n, m}, {2 * m, 1});
  locus::linear_into(right, x, w, b, locus::activation::gelu);
  got.clear();
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < m; ++j) {
      got.push_back(wide(i, m + j));
      CHECK(wide(i, j) == 5.0f);
    }
  CHECK(rel_error(got, ref) <= 1e-5);
  // bf16 inputs with a strided (broadcast-free) bias view: every other element.
  auto bias2 = locus::randn<float, locus::cpu>({2 * m}, 804);
  locus::tensor_view<const float, locus::cpu, 1> every_other = locus::unsafe_view<locus::cpu>(bias2.data(), {m}, {2});
  auto y = locus::linear(x, w, every_other, locus::activation::relu);
  std::vector<double> bvals;
  for (index_t j = 0; j < m; ++j) bvals.push_back(every_other(j));
  CHECK(rel_error(doubles(y), linear_reference(doubles(x), doubles(w), bvals, n, m, k, locus::activation::relu)) <= 1e-5);
}

TEST_CASE("matmul: f32 precision setting round-trips and defaults to full f32") {
  CHECK(locus::float32_matmul_precision() == locus::matmul_precision::highest);
  locus::set_float32_matmul_precision(locus::matmul_precision::high);
  CHECK(locus::float32_matmul_precision() == locus::matmul_precision::high);
  // Host GEMMs ignore it (there is no TF32 on the CPU): still full f32.
  auto a = locus::randn<float, locus::cpu>({40, 50}, 901);
  auto b = locus::randn<float, locus::cpu>({50, 30}, 902);
  CHECK(locus_matmul_test::rel_error(locus_matmul_test::doubles(locus::matmul(a, b)),
                                     locus_matmul_test::reference(std::as_const(a).view(), std::as_const(b).view())) <= 1e-5);
  locus::set_float32_matmul_precision(locus::matmul_precision::highest);
}

// Every host GEMM library this build has, on every operand layout, batched, with
// accumulate, into a padded destination: against double precision.
TEST_CASE("host GEMM libraries: each one this build has matches a double reference on every layout") {
  using locus_matmul_test::rel_error;
  const host_gemm_restore restore;
  const locus::host_gemm before = restore.before;
  if (!std::getenv("LOCUS_HOST_GEMM")) CHECK(before == locus::detail::best_host_gemm());  // the fastest built in
  for (locus::host_gemm lib : {locus::host_gemm::fallback, locus::host_gemm::blas, locus::host_gemm::onednn}) {
    if (!locus::host_gemm_available(lib)) continue;
    CAPTURE(locus::name_of(lib));
    locus::set_host_gemm(lib);
    CHECK(locus::current_host_gemm() == lib);
    const index_t shapes[][3] = {{128, 256, 784}, {256, 784, 128}, {67, 1, 5}, {1, 300, 17}, {33, 10, 1}};
    std::uint64_t seed = 900;
    for (const auto& s : shapes) {
      const index_t m = s[0], n = s[1], k = s[2];
      CAPTURE(m);
      CAPTURE(n);
      CAPTURE(k);
      auto a = locus::randn<float, locus::cpu>({m, k}, seed++);
      auto at = locus::randn<float, locus::cpu>({k, m}, seed++);  // used as its transpose
      auto b = locus::randn<float, locus::cpu>({k, n}, seed++);
      auto bt = locus::randn<float, locus::cpu>({n, k}, seed++);
      const auto ref_nn = raw_reference(m, n, k, a.data(), k, 1, b.data(), n, 1);
      const auto ref_tn = raw_reference(m, n, k, at.data(), 1, m, b.data(), n, 1);
      const auto ref_nt = raw_reference(m, n, k, a.data(), k, 1, bt.data(), 1, k);
      const auto ref_tt = raw_reference(m, n, k, at.data(), 1, m, bt.data(), 1, k);
      CHECK(rel_error(locus_matmul_test::doubles(locus::matmul(a, b)), ref_nn) <= 1e-5);
      CHECK(rel_error(locus_matmul_test::doubles(locus::matmul(locus::transpose(at), b)), ref_tn) <= 1e-5);
      CHECK(rel_error(locus_matmul_test::doubles(locus::matmul(a, locus::transpose(bt))), ref_nt) <= 1e-5);
      CHECK(rel_error(locus_matmul_test::doubles(locus::matmul(locus::transpose(at), locus::transpose(bt))), ref_tt) <=
            1e-5);
      // accumulate into rows [2, 2 + m) of a padded buffer: c += a b, the rows around untouched
      auto big = locus::full<float, locus::cpu>({m + 4, n}, 0.5f);
      auto inside = big.slice(2, 2 + m);
      locus::matmul_into(inside, a, b, locus::accumulate);
      std::vector<double> ref_acc = ref_nn;
      for (double& v : ref_acc) v += 0.5;
      CHECK(rel_error(dense(big.data() + 2 * n, m, n, n), ref_acc) <= 1e-5);
      int outside = 0;
      for (index_t j = 0; j < n; ++j)
        for (index_t i : {index_t{0}, index_t{1}, m + 2, m + 3}) outside += big(i, j) != 0.5f;
      CHECK(outside == 0);
    }
    // batched, rank 3
    auto x = locus::randn<float, locus::cpu>({3, 40, 29}, 950);
    auto y = locus::randn<float, locus::cpu>({3, 29, 17}, 951);
    auto z = locus::matmul(x, y);
    for (index_t bi = 0; bi < 3; ++bi) {
      const auto ref = raw_reference(40, 17, 29, x.data() + bi * 40 * 29, 29, 1, y.data() + bi * 29 * 17, 17, 1);
      CHECK(rel_error(dense(z.data() + bi * 40 * 17, 40, 17, 17), ref) <= 1e-5);
    }
  }
}

TEST_CASE("host GEMM libraries: asking for one this build lacks is an error that names what it has") {
  CHECK(locus::host_gemm_available(locus::host_gemm::fallback));
  CHECK(std::string(locus::name_of(locus::host_gemm::onednn)) == "onednn");
  for (locus::host_gemm lib : {locus::host_gemm::blas, locus::host_gemm::onednn}) {
    if (locus::host_gemm_available(lib)) continue;
    const locus::host_gemm before = locus::current_host_gemm();
    CHECK_THROWS_WITH_AS(locus::set_host_gemm(lib), doctest::Contains("this build has no"), locus::value_error);
    CHECK(locus::current_host_gemm() == before);
  }
  // an out-of-range value is no library either
  CHECK_FALSE(locus::host_gemm_available(static_cast<locus::host_gemm>(7)));
  CHECK(std::string(locus::name_of(static_cast<locus::host_gemm>(7))) == "unknown");
  // LOCUS_HOST_GEMM's parser: exact names only
  CHECK(locus::detail::parse_host_gemm("onednn") == static_cast<int>(locus::host_gemm::onednn));
  CHECK(locus::detail::parse_host_gemm("blas") == static_cast<int>(locus::host_gemm::blas));
  CHECK(locus::detail::parse_host_gemm("fallback") == static_cast<int>(locus::host_gemm::fallback));
  for (const char* bad : {"", "OpenBLAS", "BLAS", "onednn ", "blasx", "bla", "mkl"}) {
    CAPTURE(bad);
    CHECK(locus::detail::parse_host_gemm(bad) == -1);
  }
}

TEST_CASE("host GEMM libraries: an unusable LOCUS_HOST_GEMM is an error at the first host GEMM, cured by set_host_gemm") {
  const host_gemm_restore restore;
  // what host_gemm_choice() holds after reading LOCUS_HOST_GEMM=nonsense
  locus::detail::host_gemm_choice().store(-1);
  CHECK_THROWS_WITH_AS(locus::current_host_gemm(), doctest::Contains("is not a host GEMM library of this build"),
                       locus::value_error);
  auto a = locus::randn<float, locus::cpu>({4, 3}, 1);
  auto b = locus::randn<float, locus::cpu>({3, 2}, 2);
  CHECK_THROWS_AS(locus::matmul(a, b), locus::value_error);
  locus::set_host_gemm(locus::host_gemm::fallback);  // the program's own choice wins
  CHECK(locus::current_host_gemm() == locus::host_gemm::fallback);
  const auto c = locus::matmul(a, b);
  double s = 0;
  for (index_t p = 0; p < 3; ++p) s += static_cast<double>(a(1, p)) * b(p, 1);
  CHECK(c(1, 1) == doctest::Approx(s).epsilon(1e-6));
}
