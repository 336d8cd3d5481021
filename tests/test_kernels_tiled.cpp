// Host tests of the tiled column reductions that cuda runs (issue 13): the plan, the bias
// and activation gradient, and reductions along an axis that is not the innermost. The
// device's schedule (blocks, row groups, splits, their combination order) is run on the
// host through the same functions (run_tiled_host) and compared with double-precision
// references, on the shapes a hostile user would pick: 0 rows, 1 row, 1 column, widths
// that are not multiples of 32 or of the tile, long axes that split, huge values, NaN.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <locus/locus.hpp>
#include <locus/nn/kernels.hpp>

namespace {

namespace ld = locus::detail;
using locus::index_t;

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

struct shape2 {
  index_t rows, cols;
};
constexpr shape2 bias_shapes[] = {{0, 5},   {1, 1},    {1, 33},   {3, 1},     {128, 512}, {128, 256}, {128, 10},
                                  {17, 31}, {37, 100}, {4096, 3}, {5000, 65}, {2049, 70}, {100000, 2}};

}  // namespace

TEST_CASE("kernels: the column tile plan covers every row once, in whole row groups, within the grid limits") {
  for (index_t rows : {0, 1, 2, 15, 16, 17, 127, 128, 129, 1000, 4096, 65536, 1000000, 100000000}) {
    for (index_t cols : {1, 2, 10, 31, 32, 33, 256, 512, 50257}) {
      for (index_t outer : {1, 3, 1000}) {
        INFO(rows << " x " << cols << " outer " << outer);
        const ld::column_tiles p = ld::plan_column_tiles(rows, cols, outer);
        CHECK(p.tile_rows >= 1);
        CHECK(p.tile_rows <= ld::max_tile_rows);
        CHECK(p.tile_rows == (rows < 16 ? std::max<index_t>(rows, 1) : 16));
        CHECK(p.col_tiles * ld::tile_cols >= cols);
        CHECK((p.col_tiles - 1) * ld::tile_cols < cols);
        CHECK(p.rows_per_split % p.tile_rows == 0);
        CHECK(p.splits >= 1);
        CHECK(p.splits <= 65535);
        CHECK(p.splits * p.rows_per_split >= rows);
        if (rows > 0) CHECK((p.splits - 1) * p.rows_per_split < rows);  // no empty split
        if (p.splits > 1) CHECK(p.rows_per_split >= p.tile_rows * ld::tile_min_rows_per_thread);
      }
    }
  }
  // The main job's MLP (batch 128): one block row, no second pass.
  CHECK(ld::plan_column_tiles(128, 512).splits == 1);
  CHECK(ld::plan_column_tiles(128, 512).col_tiles == 16);
  CHECK(ld::plan_column_tiles(128, 10).col_tiles == 1);
  // Few columns and many rows: the rows are split so that the GPU fills.
  CHECK(ld::plan_column_tiles(1000000, 10).splits > 100);
}

namespace {

/// The double-precision bias gradient of a [rows, cols] gy (as stored) through act.
template <class T>
struct bias_case {
  index_t rows, cols;
  std::vector<T> gy, z, y;
  std::vector<float> db0;
};

template <class T>
bias_case<T> make_bias_case(index_t rows, index_t cols, std::uint64_t seed, double scale) {
  bias_case<T> c{rows, cols, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  const auto n = static_cast<std::size_t>(rows * cols);
  for (std::size_t i = 0; i < n; ++i) {
    c.gy.push_back(ld::store<T>(static_cast<float>(nd(rng) * scale)));
    const double zz = nd(rng) * 2.0;
    c.z.push_back(ld::store<T>(static_cast<float>(zz)));
    c.y.push_back(ld::store<T>(static_cast<float>(std::tanh(zz))));
  }
  for (index_t j = 0; j < cols; ++j) c.db0.push_back(static_cast<float>(j % 7) * 0.25f);
  return c;
}

template <class T>
void check_bias(const bias_case<T>& c, ld::act_kind kind, bool tiled, const char* what) {
  INFO(what << ": " << c.rows << " x " << c.cols << " act " << static_cast<int>(kind));
  const auto n = static_cast<std::size_t>(c.rows * c.cols);
  std::vector<T> dz(n, ld::store<T>(-7.0f));
  std::vector<float> db = c.db0;
  const bool uses_z = kind == ld::act_kind::gelu || kind == ld::act_kind::gelu_tanh;
  ld::bias_act_grad_kernel<T, float> k{c.gy.data(), uses_z ? c.z.data() : nullptr, uses_z ? nullptr : c.y.data(),
                                        kind == ld::act_kind::none ? nullptr : dz.data(), db.data(), c.rows, c.cols,
                                        kind};
  std::vector<float> partial;
  if (tiled) {
    k.plan = ld::plan_column_tiles(c.rows, c.cols);
    partial.resize(static_cast<std::size_t>(k.plan.splits * c.cols));
    k.partial = partial.data();
    k.run_tiled_host();
  } else {
    ld::run_bias_act_grad<locus::cpu>(k);
  }
  for (index_t j = 0; j < c.cols; ++j) {
    double ref = c.db0[static_cast<std::size_t>(j)], mag = std::abs(ref);
    bool nan = false;
    for (index_t i = 0; i < c.rows; ++i) {
      const auto e = static_cast<std::size_t>(i * c.cols + j);
      double g = static_cast<double>(ld::load(c.gy[e]));
      if (kind != ld::act_kind::none) {
        const double zz = static_cast<double>(ld::load(c.z[e])), yy = static_cast<double>(ld::load(c.y[e]));
        double d = 1;
        switch (kind) {
          case ld::act_kind::relu: d = yy > 0 ? 1 : 0; break;
          case ld::act_kind::tanh: d = 1 - yy * yy; break;
          case ld::act_kind::sigmoid: d = yy * (1 - yy); break;
          case ld::act_kind::gelu: d = 0.5 * std::erfc(-zz / std::sqrt(2.0)) + zz * std::exp(-0.5 * zz * zz) / std::sqrt(2 * M_PI); break;
          default: break;
        }
        const double want = g * d;
        const double got = static_cast<double>(ld::load(dz[e]));
        // dz is g * act' in f32 and stored in T: within an ulp of T (and of f32) of the reference
        const double ulp = std::is_same_v<T, float> ? 0x1p-22 : 0x1p-7;
        if (std::isnan(want) ? !std::isnan(got) : !(std::abs(got - want) <= ulp * (std::abs(want) + std::abs(g)) + 1e-30)) {
          FAIL_CHECK("dz[" << i << ", " << j << "] = " << got << ", want " << want);
          return;
        }
        g = got;  // the sum is of what the weights see
      }
      nan |= std::isnan(g);
      ref += g;
      mag += std::abs(g);
    }
    const double got = db[static_cast<std::size_t>(j)];
    if (nan) {
      CHECK(std::isnan(got));
      continue;
    }
    // f32 accumulation of at most rows terms: |error| <= rows * 2^-24 * sum |terms|
    const double tol = (static_cast<double>(c.rows) + 2) * 0x1p-23 * mag + 1e-30;
    if (!(std::abs(got - ref) <= tol)) {
      FAIL_CHECK("db[" << j << "] = " << got << ", want " << ref << " (tolerance " << tol << ")");
      return;
    }
  }
}

}  // namespace

TEST_CASE("kernels: the bias gradient matches a double reference on the host path and on the device's schedule") {
  const ld::act_kind kinds[] = {ld::act_kind::none, ld::act_kind::relu, ld::act_kind::tanh, ld::act_kind::sigmoid,
                                ld::act_kind::gelu};
  std::uint64_t seed = 1;
  for (const shape2 s : bias_shapes) {
    const auto cf = make_bias_case<float>(s.rows, s.cols, seed++, 1.0);
    const auto cb = make_bias_case<locus::bf16>(s.rows, s.cols, seed++, 1.0);
    for (ld::act_kind kind : kinds) {
      check_bias(cf, kind, false, "f32 host");
      check_bias(cf, kind, true, "f32 device schedule");
      check_bias(cb, kind, false, "bf16 host");
      check_bias(cb, kind, true, "bf16 device schedule");
    }
  }
  // Huge and mixed magnitudes, and a NaN that must stay in its own column.
  auto big = make_bias_case<float>(300, 40, 99, 1e30);
  big.gy[5 * 40 + 7] = std::numeric_limits<float>::quiet_NaN();
  for (bool tiled : {false, true}) {
    check_bias(big, ld::act_kind::none, tiled, "huge with a NaN");
    check_bias(big, ld::act_kind::relu, tiled, "huge with a NaN, relu");
  }
}

TEST_CASE("kernels: the bias gradient is the same bits every run, and splits are combined in a fixed order") {
  const auto c = make_bias_case<float>(100000, 3, 5, 1.0);
  const ld::column_tiles p = ld::plan_column_tiles(c.rows, c.cols);
  REQUIRE(p.splits > 1);
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    std::vector<float> db(3, 0.0f), partial(static_cast<std::size_t>(p.splits * 3));
    ld::bias_act_grad_kernel<float, float> k{c.gy.data(), nullptr, nullptr, nullptr, db.data(), c.rows, 3,
                                              ld::act_kind::none};
    k.plan = p;
    k.partial = partial.data();
    k.run_tiled_host();
    // the splits' partials, combined in split order, are what db received
    for (index_t j = 0; j < 3; ++j) {
      float v = partial[static_cast<std::size_t>(j)];
      for (index_t s = 1; s < p.splits; ++s) v += partial[static_cast<std::size_t>(s * 3 + j)];
      CHECK(bits(v) == bits(db[static_cast<std::size_t>(j)]));
    }
    if (run == 0) first = db;
    for (std::size_t j = 0; j < 3; ++j) CHECK(bits(db[j]) == bits(first[j]));
    // and the host path is deterministic too, for any OpenMP thread count
    std::vector<float> h1(3, 0.0f), h2(3, 0.0f);
    ld::bias_act_grad_kernel<float, float> k1 = k, k2 = k;
    k1.db = h1.data();
    k2.db = h2.data();
    ld::run_bias_act_grad<locus::cpu>(k1);
    ld::run_bias_act_grad<locus::cpu>(k2);
    for (std::size_t j = 0; j < 3; ++j) CHECK(bits(h1[j]) == bits(h2[j]));
  }
}

namespace {

using locus::detail::reduce_kind;

/// Double references of every reduction of [outer, len, inner] values along the middle.
struct column_ref {
  std::vector<double> sum, mean, max, min, var;
  std::vector<std::int64_t> argmax, argmin;
};
column_ref reference(const std::vector<double>& x, index_t outer, index_t len, index_t inner) {
  column_ref r;
  for (index_t o = 0; o < outer; ++o)
    for (index_t i = 0; i < inner; ++i) {
      double s = 0, mx = -INFINITY, mn = INFINITY;
      std::int64_t amx = -1, amn = -1;
      bool nan = false;
      for (index_t j = 0; j < len; ++j) {
        const double v = x[static_cast<std::size_t>((o * len + j) * inner + i)];
        s += v;
        if (std::isnan(v)) {
          if (!nan) amx = amn = j;
          nan = true;
        }
        if (!nan && (amx < 0 || v > mx)) mx = v, amx = j;
        if (!nan && (amn < 0 || v < mn)) mn = v, amn = j;
      }
      const double mean = s / static_cast<double>(len);
      double ss = 0;
      for (index_t j = 0; j < len; ++j) {
        const double d = x[static_cast<std::size_t>((o * len + j) * inner + i)] - mean;
        ss += d * d;
      }
      r.sum.push_back(s);
      r.mean.push_back(mean);
      r.max.push_back(nan ? NAN : mx);
      r.min.push_back(nan ? NAN : mn);
      r.argmax.push_back(amx);
      r.argmin.push_back(amn);
      r.var.push_back(ss / static_cast<double>(len - 1));
    }
  return r;
}

template <class T, class D, std::size_t R>
std::vector<double> doubles(const locus::tensor<T, D, R>& t) {
  auto h = locus::to<locus::cpu>(t);
  std::vector<double> out;
  for (const auto& v : h.span()) out.push_back(static_cast<double>(ld::load(v)));
  return out;
}

bool close(double got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::abs(got - want) <= tol * std::max(1.0, std::abs(want));
}

template <class T>
void check_tiled_axis(index_t outer, index_t len, index_t inner, bool with_nan, std::uint64_t seed) {
  INFO("[" << outer << ", " << len << ", " << inner << "] " << (with_nan ? "with NaN" : ""));
  auto x = locus::randn<T, locus::cpu>({outer, len, inner}, seed, 0.5, 3.0);
  if (with_nan && x.numel() > 2) {
    x.data_handle()[x.numel() / 2] = ld::store<T>(std::numeric_limits<float>::quiet_NaN());
  }
  const auto X = doubles(x);
  const column_ref r = reference(X, outer, len, inner);
  // the result is rounded to T once: an ulp of T (f64 and f32: accumulation in f64)
  const double tol = std::is_same_v<T, double>      ? 1e-12
                     : std::is_same_v<T, float>     ? 1e-6
                     : std::is_same_v<T, locus::f16> ? 0x1p-10
                                                    : 0x1p-7;
  const auto S = doubles(ld::reduce_axis_tiled<reduce_kind::sum>(x, 1));
  const auto M = doubles(ld::reduce_axis_tiled<reduce_kind::mean>(x, 1));
  const auto V = doubles(ld::reduce_axis_tiled<reduce_kind::var>(x, 1));
  REQUIRE(S.size() == r.sum.size());
  const bool has_len = len > 0;
  std::vector<double> MX, MN, AX, AN;
  if (has_len) {
    MX = doubles(ld::reduce_axis_tiled<reduce_kind::max>(x, 1));
    MN = doubles(ld::reduce_axis_tiled<reduce_kind::min>(x, 1));
    AX = doubles(ld::reduce_axis_tiled<reduce_kind::argmax>(x, 1));
    AN = doubles(ld::reduce_axis_tiled<reduce_kind::argmin>(x, 1));
  }
  // The public reductions on the host (a different schedule) agree within rounding.
  const auto S_pub = doubles(locus::sum(x, 1));
  for (std::size_t k = 0; k < S.size(); ++k) {
    INFO("output " << k);
    // sums: f64 accumulation per thread, f32/f16 rounding of the result only
    CHECK(close(S[k], r.sum[k], tol));
    CHECK(close(S[k], S_pub[k], std::max(tol, 1e-5)));
    CHECK(close(M[k], r.mean[k], tol));
    if (len > 1) CHECK(close(V[k], r.var[k], std::is_same_v<T, double> ? 1e-10 : std::max(tol, 1e-5)));
    if (has_len) {
      CHECK(close(MX[k], r.max[k], 0));
      CHECK(close(MN[k], r.min[k], 0));
      CHECK(AX[k] == static_cast<double>(r.argmax[k]));
      CHECK(AN[k] == static_cast<double>(r.argmin[k]));
    }
  }
  // The same bits every run.
  const auto S2 = doubles(ld::reduce_axis_tiled<reduce_kind::sum>(x, 1));
  for (std::size_t k = 0; k < S.size(); ++k) CHECK(std::memcmp(&S[k], &S2[k], sizeof(double)) == 0);
}

}  // namespace

TEST_CASE("kernels: tiled reductions along an axis match double references on adversarial shapes") {
  std::uint64_t seed = 10;
  for (const auto& s : std::vector<std::array<index_t, 3>>{{1, 1, 2},
                                                           {1, 7, 33},
                                                           {3, 1, 5},
                                                           {2, 16, 32},
                                                           {2, 17, 31},
                                                           {4, 129, 65},
                                                           {1, 20000, 3},
                                                           {5, 3000, 1 + 32},
                                                           {1, 100000, 2}}) {
    check_tiled_axis<float>(s[0], s[1], s[2], false, seed++);
    check_tiled_axis<double>(s[0], s[1], s[2], false, seed++);
    check_tiled_axis<float>(s[0], s[1], s[2], true, seed++);
  }
  check_tiled_axis<locus::bf16>(3, 513, 40, false, seed++);
  check_tiled_axis<locus::f16>(3, 513, 40, true, seed++);
}

TEST_CASE("kernels: tiled reductions of empty axes, empty outputs, strided views, integers and infinities") {
  // len 0: sum 0, mean NaN (as the public reductions)
  auto e = locus::zeros<float, locus::cpu>({3, 0, 4});
  const auto s = doubles(ld::reduce_axis_tiled<reduce_kind::sum>(e, 1));
  REQUIRE(s.size() == 12);
  for (double v : s) CHECK(v == 0.0);
  for (double v : doubles(ld::reduce_axis_tiled<reduce_kind::mean>(e, 1))) CHECK(std::isnan(v));
  // no output: nothing runs
  auto none = locus::zeros<float, locus::cpu>({3, 5, 0});
  CHECK(ld::reduce_axis_tiled<reduce_kind::sum>(none, 1).numel() == 0);
  // a strided (non-linear) operand: the transpose of a contiguous matrix, axis 0
  auto x = locus::randn<float, locus::cpu>({37, 70}, 3);
  auto xt = locus::transpose(x);  // [70, 37]
  const auto X = doubles(x);
  const auto got = doubles(ld::reduce_axis_tiled<reduce_kind::sum>(xt, 0));  // sums of x's rows
  REQUIRE(got.size() == 37);
  for (index_t r = 0; r < 37; ++r) {
    double ref = 0;
    for (index_t c = 0; c < 70; ++c) ref += X[static_cast<std::size_t>(r * 70 + c)];
    CHECK(close(got[static_cast<std::size_t>(r)], ref, 1e-6));
  }
  // an expression: sum(x * x) along axis 0 without a temporary
  const auto sq = doubles(ld::reduce_axis_tiled<reduce_kind::sum>(x * x, 0));
  for (index_t c = 0; c < 70; ++c) {
    double ref = 0;
    for (index_t r = 0; r < 37; ++r) {
      const float v = static_cast<float>(X[static_cast<std::size_t>(r * 70 + c)]);
      ref += static_cast<double>(v * v);
    }
    CHECK(close(sq[static_cast<std::size_t>(c)], ref, 1e-6));
  }
  // i64 sums are exact near 2^60 (i64 accumulation, never through double)
  std::vector<std::int64_t> big;
  for (int i = 0; i < 40 * 3; ++i) big.push_back((std::int64_t{1} << 60) / 64 + i);
  auto b = locus::from_host<locus::cpu>(big, {40, 3});
  auto bs = locus::to<locus::cpu>(ld::reduce_axis_tiled<reduce_kind::sum>(b, 0));
  for (index_t c = 0; c < 3; ++c) {
    std::int64_t ref = 0;
    for (index_t r = 0; r < 40; ++r) ref += big[static_cast<std::size_t>(r * 3 + c)];
    CHECK(bs.data_handle()[c] == ref);
  }
  // max of all -inf is -inf, min of all +inf is +inf; argmax of ties is the first
  std::vector<float> inf(6 * 2, -INFINITY);
  auto ni = locus::from_host<locus::cpu>(inf, {6, 2});
  for (double v : doubles(ld::reduce_axis_tiled<reduce_kind::max>(ni, 0))) CHECK(v == -INFINITY);
  for (double v : doubles(ld::reduce_axis_tiled<reduce_kind::argmax>(ni, 0))) CHECK(v == 0.0);
  std::vector<float> ties{1, 5, 5, 5, 2, 5, 5, 1};
  auto t = locus::from_host<locus::cpu>(ties, {4, 2});
  const auto am = doubles(ld::reduce_axis_tiled<reduce_kind::argmax>(t, 0));
  CHECK(am[0] == 1.0);
  CHECK(am[1] == 0.0);
}
