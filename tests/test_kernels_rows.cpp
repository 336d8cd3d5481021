// Host tests of the row kernels cuda runs a warp or a block per row (issue 13): the online
// maximum and sum of softmax and cross-entropy, their merge in the device's order (a
// warp's butterfly, then the warps of a block in order), and the results end to end on
// the host, all against double-precision references, on rows a hostile user would
// write: length 1, 50257 classes, huge and tiny logits, -inf, +inf, NaN, empty batches.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <locus/locus.hpp>
#include <locus/nn/kernels.hpp>
#include <locus/nn/loss.hpp>

namespace {

namespace ld = locus::detail;
using locus::index_t;
using state = ld::online_softmax<float>;
constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

/// What the device computes for a row: `threads` threads reading j = t, t + threads, ...,
/// each warp merged by a butterfly (lane l with l ^ 16, 8, 4, 2, 1), then the warps in order.
/// Checks that every lane of a warp ends with the same bits.
state device_order(const std::vector<float>& row, int threads) {
  std::vector<state> lane(static_cast<std::size_t>(threads), state::start());
  for (int t = 0; t < threads; ++t)
    for (std::size_t j = static_cast<std::size_t>(t); j < row.size(); j += static_cast<std::size_t>(threads))
      lane[static_cast<std::size_t>(t)].add(row[j]);
  for (int w = 0; w < threads / 32; ++w) {
    state* l = lane.data() + 32 * w;
    for (int off = 16; off > 0; off >>= 1) {
      std::vector<state> next(l, l + 32);
      for (int i = 0; i < 32; ++i) next[static_cast<std::size_t>(i)] = state::merge(l[i], l[i ^ off]);
      std::copy(next.begin(), next.end(), l);
    }
    for (int i = 1; i < 32; ++i) {
      const bool same = std::memcmp(&l[i].m, &l[0].m, 4) == 0 && std::memcmp(&l[i].s, &l[0].s, 4) == 0;
      if (!same) FAIL_CHECK("lane " << i << " of warp " << w << " differs after the butterfly");
    }
  }
  state all = lane[0];
  for (int w = 1; w < threads / 32; ++w) all = state::merge(all, lane[static_cast<std::size_t>(32 * w)]);
  return all;
}

/// max and sum of exp(x - max) in double; NaN sum where the rows' outputs must be NaN.
std::pair<double, double> reference(const std::vector<float>& row) {
  double m = -INFINITY;
  bool nan = false;
  for (float v : row) {
    nan |= std::isnan(v);
    m = std::max(m, static_cast<double>(v));
  }
  if (nan || !std::isfinite(m)) return {m, NAN};
  double s = 0;
  for (float v : row) s += std::exp(static_cast<double>(v) - m);
  return {m, s};
}

std::vector<std::vector<float>> adversarial_rows() {
  std::vector<std::vector<float>> rows;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  auto random_row = [&](std::size_t n, float shift) {
    std::vector<float> r(n);
    for (auto& v : r) v = nd(rng) + shift;
    return r;
  };
  rows.push_back({3.0f});                                   // length 1
  rows.push_back({-inf});                                   // length 1, -inf: NaN
  rows.push_back({1.0f, 2.0f});
  rows.push_back(random_row(10, 0.0f));                     // the main job's 10 classes
  rows.push_back(random_row(31, 1000.0f));                  // exp would overflow unshifted
  rows.push_back(random_row(33, -1000.0f));                 // and underflow
  rows.push_back(random_row(1024, 0.0f));
  rows.push_back(random_row(1025, 0.0f));
  rows.push_back(random_row(50257, 0.0f));                  // a vocabulary
  std::vector<float> ascending(5000);                       // the maximum grows at every step
  for (std::size_t j = 0; j < ascending.size(); ++j) ascending[j] = static_cast<float>(j) * 0.01f;
  rows.push_back(ascending);
  std::vector<float> huge = random_row(300, 0.0f);
  huge[17] = 3e38f;
  huge[200] = -3e38f;
  rows.push_back(huge);                                     // one dominant logit
  std::vector<float> with_ninf = random_row(100, 0.0f);
  with_ninf[0] = with_ninf[50] = -inf;                      // masked positions: probability 0
  rows.push_back(with_ninf);
  rows.push_back(std::vector<float>(64, -inf));             // every value -inf: NaN
  std::vector<float> with_pinf = random_row(70, 0.0f);
  with_pinf[69] = inf;                                      // +inf: NaN (exp(inf - inf))
  rows.push_back(with_pinf);
  std::vector<float> with_nan = random_row(2000, 0.0f);
  with_nan[1999] = qnan;                                    // NaN in the last lane's tail
  rows.push_back(with_nan);
  std::vector<float> tied(96, 5.0f);                        // all equal
  rows.push_back(tied);
  return rows;
}

}  // namespace

TEST_CASE("kernels: the online max and sum equal a double reference sequentially, per warp and per block") {
  for (const auto& row : adversarial_rows()) {
    INFO("row of " << row.size());
    const auto [m_ref, s_ref] = reference(row);
    for (int threads : {32, 512}) {
      INFO("threads " << threads);
      const state st = device_order(row, threads);
      const double s = st.sum();
      if (std::isnan(s_ref)) {
        CHECK(std::isnan(s));
        continue;
      }
      CHECK(static_cast<double>(st.m) == m_ref);
      // f32 sums of exp: an ulp per term a lane adds or rescales (the lanes' sums are
      // short: that is why the host, one long sequence, uses two passes instead)
      const double tol = 0x1p-24 * (4.0 * static_cast<double>(row.size()) / threads + 64) * s_ref;
      CHECK(std::abs(s - s_ref) <= tol);
    }
  }
}

TEST_CASE("kernels: softmax and log_softmax of adversarial rows match a double reference along both axes") {
  for (const auto& row : adversarial_rows()) {
    const auto n = static_cast<index_t>(row.size());
    INFO("row of " << n);
    // three copies of the row: [3, n] along axis 1, and its transpose along axis 0
    std::vector<float> three;
    for (int r = 0; r < 3; ++r) three.insert(three.end(), row.begin(), row.end());
    auto x = locus::from_host<locus::cpu>(three, {3, n});
    auto xt = locus::eval(locus::transpose(x) * 1.0f);  // [n, 3], contiguous
    const auto ref = reference(row);
    const double m = ref.first, s = ref.second;  // named copies: clang 14 cannot capture bindings
    auto check = [&](const auto& sm, const auto& ls, bool transposed) {
      auto hs = locus::to<locus::cpu>(sm);
      auto hl = locus::to<locus::cpu>(ls);
      for (index_t r = 0; r < 3; ++r)
        for (index_t j = 0; j < n; ++j) {
          const index_t k = transposed ? j * 3 + r : r * n + j;
          const double got_s = hs.data_handle()[k], got_l = hl.data_handle()[k];
          if (std::isnan(s)) {
            if (!std::isnan(got_s) || !std::isnan(got_l)) {
              FAIL_CHECK("element " << j << " of a NaN row: " << got_s << ", " << got_l);
              return;
            }
            continue;
          }
          const double lp = (static_cast<double>(row[static_cast<std::size_t>(j)]) - m) - std::log(s);
          // z = x - max is rounded to f32 (an ulp of |z|), then exp and the division: the
          // probability within a few ulps of |z|, the log-probability within ulps of |lp|
          const double tol_l = 4e-7 * std::max(1.0, std::abs(lp));
          const bool ok_l = lp < -3.4028234663852886e38 ? got_l == -INFINITY : std::abs(got_l - lp) <= tol_l;
          const bool ok_s = lp == -INFINITY ? got_s == 0.0 : std::abs(got_s - std::exp(lp)) <= (4e-7 * std::max(1.0, std::abs(lp)) + 1e-6) * std::exp(lp) + 1e-37;
          if (!ok_s || !ok_l) {
            FAIL_CHECK("element " << j << (transposed ? " (axis 0)" : " (axis 1)") << ": softmax " << got_s
                                  << " want " << std::exp(lp) << ", log_softmax " << got_l << " want " << lp);
            return;
          }
        }
    };
    check(locus::softmax(x, 1), locus::log_softmax(x, 1), false);
    check(locus::softmax(xt, 0), locus::log_softmax(xt, 0), true);
  }
  // an empty batch: nothing to do, the shape kept
  auto e = locus::zeros<float, locus::cpu>({0, 7});
  CHECK(locus::softmax(e, 1).numel() == 0);
  CHECK(locus::log_softmax(e, 0).shape()[1] == 7);
}

namespace {

/// Cross-entropy of one row in double: loss and gradient of the mean over `n` rows.
struct ce_ref {
  double loss;
  std::vector<double> grad;
};
ce_ref ce_reference(const std::vector<float>& row, std::int64_t label, double eps, index_t n) {
  const auto [m, s] = reference(row);
  const double k = static_cast<double>(row.size());
  const double lse = std::log(s);
  ce_ref r{0, {}};
  double sum_logp = 0;
  for (float v : row) sum_logp += (static_cast<double>(v) - m) - lse;
  const double logp_y = (static_cast<double>(row[static_cast<std::size_t>(label)]) - m) - lse;
  r.loss = eps > 0 ? -(1 - eps) * logp_y - eps / k * sum_logp : -logp_y;  // as torch: no smoothing term
  for (std::size_t j = 0; j < row.size(); ++j) {
    const double p = std::exp((static_cast<double>(row[j]) - m) - lse);
    const double target = (static_cast<std::int64_t>(j) == label ? 1 - eps : 0) + eps / k;
    r.grad.push_back((p - target) / static_cast<double>(n));
  }
  return r;
}

}  // namespace

TEST_CASE("kernels: cross-entropy of adversarial rows matches a double reference, on the host and in the device's order") {
  for (const auto& row : adversarial_rows()) {
    const auto k = static_cast<index_t>(row.size());
    INFO("classes " << k);
    const bool nan_row = std::isnan(reference(row).second);
    for (double eps : {0.0, 0.1}) {
      INFO("label smoothing " << eps);
      // two rows, labels at both ends
      std::vector<float> logits(row);
      logits.insert(logits.end(), row.begin(), row.end());
      const std::vector<std::int64_t> labels{0, k - 1};
      auto x = locus::from_host<locus::cpu>(logits, {2, k});
      auto y = locus::from_host<locus::cpu>(labels, {2});
      locus::nn::cross_entropy_state<locus::cpu, locus::amp::fp32> ce(
          locus::nn::cross_entropy{.label_smoothing = static_cast<float>(eps)});
      const double loss = locus::to<locus::cpu>(ce.forward(std::as_const(x).view(), std::as_const(y).view())).item();
      auto g = locus::to<locus::cpu>(locus::eval(ce.grad()));
      if (nan_row) {
        CHECK(std::isnan(loss));
        for (index_t j = 0; j < k; ++j) CHECK(std::isnan(g.data_handle()[j]));
        continue;
      }
      const ce_ref r0 = ce_reference(row, 0, eps, 2), r1 = ce_reference(row, k - 1, eps, 2);
      const double want = (r0.loss + r1.loss) / 2;
      auto loss_ok = [&](double got) {
        return std::isinf(want) ? got == want : std::abs(got - want) <= 1e-5 * std::max(1.0, std::abs(want));
      };
      INFO("loss " << loss << " want " << want);
      if (std::abs(want) < 1e37) CHECK(loss_ok(loss));  // the mean sums f32 row losses in f32 blocks
      for (index_t j = 0; j < k; ++j) {
        const double w0 = r0.grad[static_cast<std::size_t>(j)], w1 = r1.grad[static_cast<std::size_t>(j)];
        if (!(std::abs(g.data_handle()[j] - w0) <= 1e-6 * std::max(1e-3, std::abs(w0)) + 1e-9) ||
            !(std::abs(g.data_handle()[k + j] - w1) <= 1e-6 * std::max(1e-3, std::abs(w1)) + 1e-9)) {
          FAIL_CHECK("gradient at " << j << ": " << g.data_handle()[j] << ", " << g.data_handle()[k + j] << " want "
                                    << w0 << ", " << w1);
          break;
        }
      }
      // The device's order: 32 or 512 threads per row, merged as the warps and blocks merge.
      using K = ld::cross_entropy_kernel<float, std::int64_t, float>;
      for (int threads : {32, 512}) {
        INFO("threads " << threads);
        std::vector<float> row_loss(2, -1.0f), correct(2, -1.0f), grad(static_cast<std::size_t>(2 * k), -1.0f);
        std::int64_t bad[3] = {0, 0, 0};
        const K kern{x.data_handle(), y.data_handle(), grad.data(), row_loss.data(), correct.data(), bad, nullptr,
                     2, k, static_cast<float>(eps), 1.0f, -1};
        for (index_t i = 0; i < 2; ++i) {
          std::vector<K::state> lane;
          for (int t = 0; t < threads; ++t) lane.push_back(kern.part(i, t, threads));
          for (int w = 0; w < threads / 32; ++w)
            for (int off = 16; off > 0; off >>= 1) {
              std::vector<K::state> next(lane.begin() + 32 * w, lane.begin() + 32 * w + 32);
              for (int l = 0; l < 32; ++l)
                next[static_cast<std::size_t>(l)] = K::state::merge(lane[static_cast<std::size_t>(32 * w + l)],
                                                                    lane[static_cast<std::size_t>(32 * w + (l ^ off))]);
              std::copy(next.begin(), next.end(), lane.begin() + 32 * w);
            }
          K::state st = lane[0];
          for (int w = 1; w < threads / 32; ++w) st = K::state::merge(st, lane[static_cast<std::size_t>(32 * w)]);
          kern.finish_row(i, labels[static_cast<std::size_t>(i)], st);
          for (int t = 0; t < threads; ++t) kern.write_grad(i, labels[static_cast<std::size_t>(i)], true, st, t, threads);
        }
        const double dev_loss = (static_cast<double>(row_loss[0]) + static_cast<double>(row_loss[1])) / 2;
        INFO("device-order loss " << dev_loss << " want " << want << " rows " << row_loss[0] << " " << row_loss[1] << " ref " << r0.loss << " " << r1.loss);
        CHECK(loss_ok(dev_loss));
        // accuracy: the first maximum
        const auto first_max = static_cast<std::int64_t>(std::max_element(row.begin(), row.end()) - row.begin());
        CHECK(correct[0] == (first_max == 0 ? 1.0f : 0.0f));
        CHECK(correct[1] == (first_max == k - 1 ? 1.0f : 0.0f));
        for (index_t j = 0; j < 2 * k; ++j) {
          const double w = (j < k ? r0 : r1).grad[static_cast<std::size_t>(j % k)];
          // f32 partial sums of up to k / threads terms per lane: log s within ~1e-5
          if (!(std::abs(grad[static_cast<std::size_t>(j)] - w) <= 1e-5 * std::max(1e-3, std::abs(w)) + 1e-9)) {
            FAIL_CHECK("device-order gradient at " << j << ": " << grad[static_cast<std::size_t>(j)] << " want " << w);
            break;
          }
        }
        CHECK(bad[0] == 0);
      }
    }
  }
}

TEST_CASE("kernels: cross-entropy of one class and of a bad label") {
  using CE = locus::nn::cross_entropy_state<locus::cpu, locus::amp::fp32>;
  {  // one class: loss 0, gradient 0 (p = 1 = target)
    auto x = locus::from_host<locus::cpu>(std::vector<float>{123.0f, -5.0f}, {2, 1});
    auto y = locus::from_host<locus::cpu>(std::vector<std::int64_t>{0, 0}, {2});
    CE ce(locus::nn::cross_entropy{});
    CHECK(locus::to<locus::cpu>(ce.forward(std::as_const(x).view(), std::as_const(y).view())).item() == 0.0f);
    auto g = locus::to<locus::cpu>(locus::eval(ce.grad()));
    CHECK(g.data_handle()[0] == 0.0f);
    CHECK(g.data_handle()[1] == 0.0f);
  }
  {  // a label outside [0, k): index_error naming the sample; its row is zero loss and gradient
    auto x = locus::from_host<locus::cpu>(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    auto y = locus::from_host<locus::cpu>(std::vector<std::int64_t>{1, 3}, {2});
    CE ce(locus::nn::cross_entropy{});
    CHECK_THROWS_AS((void)ce.forward(std::as_const(x).view(), std::as_const(y).view()), locus::index_error);
  }
}
