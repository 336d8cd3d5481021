// locus::dist under `mpirun -np 2` (tests/CMakeLists.txt registers it): the collectives
// against values every rank can compute alone, data-parallel training against single-
// process training, NaN on one rank, checkpoints written by rank 0 and resumed by all,
// and (LOCUS_DIST_TEST_FAIL=throw|die|hang, run by tests/dist/expect_failure.cmake) a
// rank that fails: the job must end with that rank's message, not hang.
//
// --solo (no launcher): a world of one, first without MPI, then over MPI (LOCUS_DIST=mpi,
// a singleton).
//
// Every rank runs every test case in the same order (the collectives inside them pair
// up); main() combines the ranks' results, so a failure on either rank fails the test.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <locus/data/loader.hpp>
#include <locus/data/tensor_dataset.hpp>
#include <locus/dist.hpp>
#include <locus/nn/module.hpp>
#include <locus/nn/param.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace {

using locus::cpu;
using locus::index_t;
namespace nn = locus::nn;
namespace dist = locus::dist;

dist::environment* g_env = nullptr;

dist::communicator<cpu>& world() {
  static dist::communicator<cpu> c(*g_env);
  return c;
}

/// Every rank's copy of v (as doubles), rank-major: what the ranks hold side by side.
template <class TC, std::size_t R>
std::vector<std::vector<double>> gathered(const locus::tensor_view<TC, cpu, R>& v) {
  using T = std::remove_const_t<TC>;
  auto& c = world();
  const auto flat = locus::to<cpu>(v);
  locus::tensor<T, cpu, 1> one(locus::extents<1>{flat.numel()});
  for (index_t i = 0; i < flat.numel(); ++i) one(i) = flat.data_handle()[i];
  locus::tensor<T, cpu, 1> all(locus::extents<1>{flat.numel() * c.world_size()});
  c.all_gather(one, all);
  std::vector<std::vector<double>> out(static_cast<std::size_t>(c.world_size()));
  for (int r = 0; r < c.world_size(); ++r)
    for (index_t i = 0; i < flat.numel(); ++i)
      out[static_cast<std::size_t>(r)].push_back(static_cast<double>(all(r * flat.numel() + i)));
  return out;
}

bool bit_identical_across_ranks(const locus::tensor_view<const float, cpu, 1>& v) {
  const auto g = gathered(v);
  for (std::size_t r = 1; r < g.size(); ++r)
    for (std::size_t i = 0; i < g[0].size(); ++i)
      if (std::memcmp(&g[r][i], &g[0][i], sizeof(double)) != 0) return false;
  return true;
}

using P = locus::amp::fp32;
auto make_model(std::uint64_t seed) {
  nn::sequential m(nn::linear<cpu, P>(20, 32), nn::relu<cpu, P>(), nn::linear<cpu, P>(32, 5));
  m.reset_parameters(seed);
  return m;
}

/// A learnable synthetic task: 20 normal features, the label the argmax of a fixed
/// linear map of them.
struct task {
  locus::tensor<float, cpu, 2> x;
  locus::tensor<std::int64_t, cpu, 1> y;
};
task make_task(index_t n, std::uint64_t seed) {
  task t{locus::randn<float, cpu>({n, 20}, seed), locus::zeros<std::int64_t, cpu>({n})};
  for (index_t i = 0; i < n; ++i) {
    double best = -1e300;
    for (int k = 0; k < 5; ++k) {
      double s = 0;
      for (index_t j = 0; j < 20; ++j) s += t.x(i, j) * std::sin(1.0 + k * 20 + static_cast<double>(j));
      if (s > best) {
        best = s;
        t.y(i) = k;
      }
    }
  }
  return t;
}

/// Collectives on rank-0 (scalar) tensors, as PyTorch allows them (all_reduce of a scalar
/// loss): the values every rank can compute alone, for any world size (2 ranks under
/// mpirun; one, with and without MPI, in --solo). Returns the number of failed checks
/// (doctest's CHECKs are not usable outside a test case, so --solo counts its own).
int scalar_collectives(dist::communicator<cpu>& c) {
  int bad = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "rank %d: scalar collectives: FAILED: %s\n", c.rank(), what);
      ++bad;
    }
  };
  const int r = c.rank(), n = c.world_size();
  const double ranks_sum = n * (n + 1) / 2.0;  // of r + 1 over the ranks

  auto s = locus::full<float, cpu>(locus::extents<0>{}, static_cast<float>(r + 1));
  c.all_reduce(s);
  expect(s.item() == static_cast<float>(ranks_sum), "all_reduce (sum) of a scalar");
  s.view()() = static_cast<float>(r + 1);
  c.all_reduce(s.view(), dist::reduce_op::average);  // a view of a scalar
  expect(s.item() == static_cast<float>(ranks_sum / n), "all_reduce (average) of a scalar view");
  auto i = locus::full<std::int64_t, cpu>(locus::extents<0>{}, std::int64_t{1} << 40);
  c.all_reduce(i);
  expect(i.item() == n * (std::int64_t{1} << 40), "all_reduce of an i64 scalar");

  auto b = locus::full<double, cpu>(locus::extents<0>{}, 10.0 * r + 7.0);
  c.broadcast(b, n - 1);
  expect(b.item() == 10.0 * (n - 1) + 7.0, "broadcast of a scalar from the last rank");

  // the ranks' scalars side by side, in rank order
  auto mine = locus::full<float, cpu>(locus::extents<0>{}, static_cast<float>(r + 1));
  auto all = locus::zeros<float, cpu>({n});
  c.all_gather(mine, all);
  for (int k = 0; k < n; ++k) expect(all(k) == static_cast<float>(k + 1), "all_gather of scalars in rank order");
  auto wrong = locus::zeros<float, cpu>({n + 1});
  bool threw = false;
  try {
    c.all_gather(mine, wrong);
  } catch (const locus::shape_error&) {
    threw = true;
  }
  expect(threw, "all_gather of scalars into world_size + 1 elements is a shape_error");

  // started and completed later (data_parallel's buckets)
  auto st = locus::full<float, cpu>(locus::extents<0>{}, static_cast<float>(r + 1));
  c.all_reduce_start(st, dist::reduce_op::average);
  c.wait();
  expect(st.item() == static_cast<float>(ranks_sum / n), "all_reduce_start of a scalar");
  return bad;
}

}  // namespace

TEST_CASE("dist: the world is the launcher's (2 ranks), ranks distinct") {
  auto& c = world();
  REQUIRE(c.world_size() == 2);
  CHECK(g_env->uses_mpi());
  CHECK(c.sum(1.0) == 2.0);
  CHECK(c.sum(static_cast<double>(c.rank())) == 1.0);
  CHECK(c.min(static_cast<double>(c.rank())) == 0.0);
  CHECK(c.max(static_cast<double>(c.rank())) == 1.0);
}

TEST_CASE("dist: all_reduce sum and average of f32, f64, i32, i64, strided views, empty tensors") {
  auto& c = world();
  const int r = c.rank();
  auto f = locus::zeros<float, cpu>({3, 4});
  auto d = locus::zeros<double, cpu>({7});
  auto i32 = locus::zeros<std::int32_t, cpu>({5});
  auto i64 = locus::zeros<std::int64_t, cpu>({2});
  for (index_t i = 0; i < 12; ++i) f.data()[i] = static_cast<float>(i * (r + 1)) + 0.25f;
  for (index_t i = 0; i < 7; ++i) d(i) = 1e-300 * (r + 1) + i;
  for (index_t i = 0; i < 5; ++i) i32(i) = (r == 0 ? 1 : -1) * (1 << 30) + static_cast<std::int32_t>(i);
  // near the i64 extremes: the sum still fits
  i64(0) = r == 0 ? std::numeric_limits<std::int64_t>::max() - 5 : 5;
  i64(1) = r == 0 ? std::numeric_limits<std::int64_t>::min() + 7 : -7;
  c.all_reduce(f);
  c.all_reduce(d, dist::reduce_op::average);
  c.all_reduce(i32);
  c.all_reduce(i64);
  for (index_t i = 0; i < 12; ++i) CHECK(f.data()[i] == static_cast<float>(i) * 3.0f + 0.5f);
  for (index_t i = 0; i < 7; ++i) CHECK(d(i) == doctest::Approx(1.5e-300 + static_cast<double>(i)));
  for (index_t i = 0; i < 5; ++i) CHECK(i32(i) == 2 * static_cast<std::int32_t>(i));
  CHECK(i64(0) == std::numeric_limits<std::int64_t>::max());
  CHECK(i64(1) == std::numeric_limits<std::int64_t>::min());

  // a strided view (every other column): reduced through a contiguous copy, the other
  // columns untouched
  auto m = locus::zeros<float, cpu>({2, 6});
  for (index_t i = 0; i < 12; ++i) m.data()[i] = static_cast<float>(r + 1);
  auto cols = locus::unsafe_view<cpu>(m.data(), locus::extents<2>{2, 3}, locus::extents<2>{6, 2});
  c.all_reduce(cols, dist::reduce_op::average);
  for (index_t i = 0; i < 2; ++i)
    for (index_t j = 0; j < 6; ++j) CHECK(m(i, j) == (j % 2 == 0 ? 1.5f : static_cast<float>(r + 1)));

  auto empty = locus::zeros<float, cpu>({0, 3});
  c.all_reduce(empty);  // nothing to do, nothing read
  CHECK(empty.numel() == 0);

  // NaN and infinity travel like any value
  auto nanv = locus::zeros<float, cpu>({2});
  nanv(0) = r == 1 ? std::numeric_limits<float>::quiet_NaN() : 1.0f;
  nanv(1) = r == 0 ? std::numeric_limits<float>::infinity() : 1.0f;
  c.all_reduce(nanv);
  CHECK(std::isnan(nanv(0)));
  CHECK(std::isinf(nanv(1)));
}

#if LOCUS_HAS_CUDA
TEST_CASE("dist: communicator<pinned> reduces, broadcasts and gathers pinned tensors (MPI on host memory)") {
  dist::communicator<locus::pinned> c(*g_env);
  const int r = c.rank();
  auto t = locus::full<float, locus::pinned>({5}, static_cast<float>(r + 1));
  c.all_reduce(t, dist::reduce_op::average);
  for (index_t i = 0; i < 5; ++i) CHECK(t(i) == 1.5f);
  auto b = locus::full<std::int64_t, locus::pinned>({2}, 10 * r);
  c.broadcast(b, 1);
  CHECK(b(0) == 10);
  auto whole = locus::zeros<float, locus::pinned>({10});
  c.all_gather(t, whole);
  CHECK(whole(9) == 1.5f);
}
#endif

TEST_CASE("dist: collectives on rank-0 (scalar) tensors: all_reduce, broadcast, all_gather into [world_size], all_reduce_start") {
  auto& c = world();
  CHECK(scalar_collectives(c) == 0);
  // a scalar on one rank and a vector on the other: different element counts, refused on
  // both ranks (the same shape_error as any count mismatch), and the next call pairs up
  auto s = locus::full<float, cpu>(locus::extents<0>{}, 1.0f);
  auto v = locus::full<float, cpu>({2}, 1.0f);
  if (c.rank() == 0) CHECK_THROWS_AS(c.all_reduce(s), locus::shape_error);
  else CHECK_THROWS_AS(c.all_reduce(v), locus::shape_error);
  // ranks that disagree on the gather's output: every rank throws, none waits
  auto out = locus::zeros<float, cpu>({c.rank() == 0 ? 2 : 1});
  CHECK_THROWS_AS(c.all_gather(s, out), locus::shape_error);
  c.all_reduce(s);
  CHECK(s.item() == 2.0f);
}

TEST_CASE("dist: different element counts are a shape_error on every rank, and the next collective still pairs up") {
  auto& c = world();
  auto t = locus::zeros<float, cpu>({c.rank() == 0 ? 4 : 5});
  CHECK_THROWS_AS(c.all_reduce(t), locus::shape_error);
  CHECK_THROWS_AS(c.broadcast(t, 0), locus::shape_error);
  auto ok = locus::ones<float, cpu>({3});
  c.all_reduce(ok);
  CHECK(ok(0) == 2.0f);
  CHECK_THROWS_AS(c.broadcast(ok, 2), locus::value_error);   // no rank 2
  CHECK_THROWS_AS(c.broadcast(ok, -1), locus::value_error);
}

TEST_CASE("dist: broadcast from either root, all_gather in rank order, barrier") {
  auto& c = world();
  const int r = c.rank();
  auto b = locus::zeros<std::int64_t, cpu>({3});
  for (index_t i = 0; i < 3; ++i) b(i) = 100 * r + i;
  c.broadcast(b, 1);
  for (index_t i = 0; i < 3; ++i) CHECK(b(i) == 100 + i);
  auto h = locus::full<locus::bf16, cpu>({2}, locus::bf16(static_cast<float>(r) + 0.5f));
  c.broadcast(h, 0);  // any dtype broadcasts (bytes)
  CHECK(static_cast<float>(h(0)) == 0.5f);

  auto part = locus::full<float, cpu>({2, 3}, static_cast<float>(r + 1));
  auto whole = locus::zeros<float, cpu>({4, 3});
  c.all_gather(part, whole);
  for (index_t i = 0; i < 4; ++i)
    for (index_t j = 0; j < 3; ++j) CHECK(whole(i, j) == (i < 2 ? 1.0f : 2.0f));
  auto wrong = locus::zeros<float, cpu>({3, 3});
  CHECK_THROWS_AS(c.all_gather(part, wrong), locus::shape_error);
  c.barrier();
}

TEST_CASE("data_parallel: ranks seeded differently start equal and stay bit-identical, and 2 x B equals 1 x 2B") {
  auto& c = world();
  const int r = c.rank();
  constexpr index_t B = 16;
  const task data = make_task(8 * 2 * B, 99);  // the same on every rank

  auto model = make_model(1000 + static_cast<std::uint64_t>(r));  // a different init per rank
  locus::optim::adamw<cpu> opt(model.parameters(), {.lr = 1e-2});
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  CHECK_FALSE(bit_identical_across_ranks(std::as_const(model.parameters()).master()));
  dist::data_parallel dp(c, t);
  CHECK(bit_identical_across_ranks(std::as_const(model.parameters()).master()));

  // the reference: one process, batch 2B, starting from rank 0's initial weights
  auto ref = make_model(1000);
  locus::optim::adamw<cpu> ref_opt(ref.parameters(), {.lr = 1e-2});
  locus::train::trainer rt(ref, ref_opt, nn::cross_entropy{});

  for (index_t s = 0; s < 8; ++s) {
    const index_t base = s * 2 * B;
    t.step(data.x.slice(base + r * B, base + r * B + B), data.y.slice(base + r * B, base + r * B + B));
    rt.step(data.x.slice(base, base + 2 * B), data.y.slice(base, base + 2 * B));
  }
  t.flush();
  rt.flush();
  CHECK(dp.syncs() == 8);
  CHECK(bit_identical_across_ranks(std::as_const(model.parameters()).master()));
  const auto a = locus::to<cpu>(std::as_const(model.parameters()).master());
  const auto b = locus::to<cpu>(std::as_const(ref.parameters()).master());
  const auto initial = make_model(1000);  // a temporary model's parameters() does not compile
  const auto a0 = locus::to<cpu>(initial.parameters().master());
  double worst = 0, moved = 0;
  for (index_t i = 0; i < a.numel(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a(i)) - b(i)));
    moved = std::max(moved, std::abs(static_cast<double>(b(i)) - a0(i)));
  }
  CHECK(moved > 1e-2);
  CHECK(worst <= 1e-5);  // summation order differs: float tolerance
}

TEST_CASE("data_parallel: buckets reduced during backward give the bits of one all-reduce after it") {
  auto& c = world();
  const int r = c.rank();
  const task data = make_task(96, 40 + static_cast<std::uint64_t>(r));  // each rank its own data
  auto a = make_model(3), b = make_model(3), d = make_model(3);
  locus::optim::adamw<cpu> oa(a.parameters(), {.lr = 1e-2}), ob(b.parameters(), {.lr = 1e-2}),
      od(d.parameters(), {.lr = 1e-2});
  locus::train::trainer ta(a, oa, nn::cross_entropy{}), tb(b, ob, nn::cross_entropy{}),
      td(d, od, nn::cross_entropy{}, {.accumulate = 2});
  dist::data_parallel one(c, ta);
  dist::data_parallel buckets(c, tb, {.bucket_bytes = 1});  // every layer its own bucket
  dist::data_parallel acc(c, td, {.bucket_bytes = 256});    // with accumulation
  for (index_t s = 0; s < 6; ++s) {
    ta.step(data.x.slice(16 * s, 16 * s + 16), data.y.slice(16 * s, 16 * s + 16));
    tb.step(data.x.slice(16 * s, 16 * s + 16), data.y.slice(16 * s, 16 * s + 16));
    td.step(data.x.slice(16 * s, 16 * s + 16), data.y.slice(16 * s, 16 * s + 16));
  }
  const auto wa = locus::to<cpu>(std::as_const(a.parameters()).master());
  const auto wb = locus::to<cpu>(std::as_const(b.parameters()).master());
  CHECK(std::memcmp(wa.data_handle(), wb.data_handle(), wa.size_bytes()) == 0);
  CHECK(bit_identical_across_ranks(std::as_const(b.parameters()).master()));
  CHECK(bit_identical_across_ranks(std::as_const(d.parameters()).master()));
  CHECK(buckets.syncs() == 6);
  CHECK(buckets.buckets() == 12);  // both linear layers, every step: reduced during backward
  CHECK(acc.syncs() == 3);
  CHECK(acc.buckets() == 6);       // only the optimizer steps' backward
  CHECK(one.buckets() == 0);
}

namespace {
namespace ag = locus::ag;
template <class D, class Pol>
struct dp_inner : nn::module<D, Pol> {
  nn::layer<nn::linear<D, Pol>> fc{this, "fc", 32, 32};
  nn::layer<nn::relu<D, Pol>> relu{this, "relu"};
  auto forward(const typename dp_inner::template var<2>& x) { return relu(fc(x)); }
};
// A module with a skip connection, a checkpointed child, a parameter used twice and its
// head declared first (called last): buckets must start only where gradients are final.
template <class D, class Pol>
struct dp_net : nn::module<D, Pol> {
  nn::layer<nn::linear<D, Pol>> head{this, "head", 32, 5};
  nn::param<D, Pol, 1> gain{this, "gain", {32}, nn::param_init::uniform(0.5, 1.5)};
  nn::layer<nn::linear<D, Pol>> stem{this, "stem", 20, 32};
  nn::child<dp_inner<D, Pol>> block{this, "block"};
  auto forward(const typename dp_net::template var<2>& x) {
    const auto h = stem(x) * gain.on(x);
    return head((nn::checkpoint(block, h) + h) * gain.on(x));
  }
};
}  // namespace

TEST_CASE("data_parallel: a module's buckets (skip connection, checkpointed child, a parameter used twice) give the "
          "bits of one all-reduce after backward") {
  auto& c = world();
  const task data = make_task(96, 70 + static_cast<std::uint64_t>(c.rank()));  // each rank its own data
  nn::model<dp_net<cpu, P>> a, b, d;
  a.reset_parameters(4);
  b.reset_parameters(4);
  d.reset_parameters(4);
  locus::optim::adamw<cpu> oa(a.parameters(), {.lr = 1e-2}), ob(b.parameters(), {.lr = 1e-2}),
      od(d.parameters(), {.lr = 1e-2});
  locus::train::trainer ta(a, oa, nn::cross_entropy{}), tb(b, ob, nn::cross_entropy{}),
      td(d, od, nn::cross_entropy{}, {.accumulate = 2});
  dist::data_parallel one(c, ta);
  dist::data_parallel buckets(c, tb, {.bucket_bytes = 1});  // a bucket whenever more is final
  dist::data_parallel acc(c, td, {.bucket_bytes = 512});
  for (index_t s = 0; s < 6; ++s) {
    const auto x = data.x.slice(16 * s, 16 * s + 16);
    const auto y = data.y.slice(16 * s, 16 * s + 16);
    ta.step(x, y);
    tb.step(x, y);
    td.step(x, y);
  }
  const auto wa = locus::to<cpu>(std::as_const(a.parameters()).master());
  const auto wb = locus::to<cpu>(std::as_const(b.parameters()).master());
  CHECK(std::memcmp(wa.data_handle(), wb.data_handle(), wa.size_bytes()) == 0);
  CHECK(bit_identical_across_ranks(std::as_const(a.parameters()).master()));
  CHECK(bit_identical_across_ranks(std::as_const(b.parameters()).master()));
  CHECK(bit_identical_across_ranks(std::as_const(d.parameters()).master()));
  CHECK(buckets.syncs() == 6);
  // head (offset 0) is final first but reported with the rest; the block, stem and gain
  // before it: at least two buckets every step
  CHECK(buckets.buckets() >= 12);
  CHECK(acc.syncs() == 3);
  CHECK(acc.buckets() >= 3);
  CHECK(one.buckets() == 0);
}

namespace {
bool g_backward_throws = false;
/// relu whose backward runs out of memory on demand (a layer failing mid-backward).
template <class D, class Pol>
struct failing_relu : nn::relu<D, Pol> {
  using view = typename nn::relu<D, Pol>::view;
  view backward(const view& gy, bool b = true) {
    if (g_backward_throws) throw locus::out_of_memory("cpu", 1 << 20, 0, 0, 0, "test: backward ran out of memory");
    return nn::relu<D, Pol>::backward(gy, b);
  }
};
}  // namespace

TEST_CASE("data_parallel: an epoch whose last optimizer step is a flush of fewer micro-batches still averages") {
  auto& c = world();
  const int r = c.rank();
  task data = make_task(48, 60 + static_cast<std::uint64_t>(r));  // 3 batches of 16: 2 steps with accumulate 2
  locus::data::tensor_dataset set(std::move(data.x), std::move(data.y));
  locus::data::loader<cpu, locus::data::tensor_dataset> batches(set, {.batch_size = 16});
  auto m = make_model(12);
  locus::optim::adamw<cpu> opt(m.parameters(), {.lr = 1e-2});
  locus::train::trainer t(m, opt, nn::cross_entropy{}, {.accumulate = 2});
  dist::data_parallel dp(c, t);
  dp.train_epoch(batches);
  CHECK(t.optimizer_steps() == 2);
  CHECK(dp.syncs() == 2);  // the flush too
  CHECK(bit_identical_across_ranks(std::as_const(m.parameters()).master()));
}

TEST_CASE("data_parallel: a backward that fails on every rank leaves buckets and weights as one all-reduce does") {
  auto& c = world();
  const int r = c.rank();
  const task data = make_task(64, 11 + static_cast<std::uint64_t>(r));
  auto mk = [] {
    nn::sequential m(nn::linear<cpu, P>(20, 32), nn::relu<cpu, P>(), failing_relu<cpu, P>(), nn::linear<cpu, P>(32, 5));
    m.reset_parameters(1);
    return m;
  };
  auto a = mk(), b = mk();
  locus::optim::sgd<cpu> oa(a.parameters(), {.lr = 0.1}), ob(b.parameters(), {.lr = 0.1});
  locus::train::trainer ta(a, oa, nn::cross_entropy{}), tb(b, ob, nn::cross_entropy{});
  dist::data_parallel one(c, ta), bk(c, tb, {.bucket_bytes = 1});
  int caught = 0;
  for (index_t s = 0; s < 4; ++s) {
    g_backward_throws = s == 1;  // after the last layer's bucket started
    const auto x = data.x.slice(16 * s, 16 * s + 16);
    const auto y = data.y.slice(16 * s, 16 * s + 16);
    try {
      ta.step(x, y);
    } catch (const locus::out_of_memory&) {
      ++caught;
    }
    try {
      tb.step(x, y);
    } catch (const locus::out_of_memory&) {
      ++caught;
    }
  }
  g_backward_throws = false;
  CHECK(caught == 2);
  const auto wa = locus::to<cpu>(std::as_const(a.parameters()).master());
  const auto wb = locus::to<cpu>(std::as_const(b.parameters()).master());
  CHECK(std::memcmp(wa.data_handle(), wb.data_handle(), wa.size_bytes()) == 0);
  CHECK(bit_identical_across_ranks(std::as_const(b.parameters()).master()));
}

TEST_CASE("dist: ranks that disagree on a broadcast's root or on all_gather's output all throw, none waits") {
  auto& c = world();
  auto t = locus::zeros<float, cpu>({3});
  CHECK_THROWS_AS(c.broadcast(t, c.rank()), locus::value_error);
  auto part = locus::zeros<float, cpu>({2});
  auto out = locus::zeros<float, cpu>({c.rank() == 0 ? 4 : 3});  // rank 1's is wrong
  CHECK_THROWS_AS(c.all_gather(part, out), locus::shape_error);
  c.all_reduce(t);  // the next collective still pairs up
  c.barrier();
}

TEST_CASE("data_parallel: gradient accumulation communicates only on the optimizer step") {
  auto& c = world();
  const task data = make_task(64, 5 + static_cast<std::uint64_t>(c.rank()));  // each rank its own data
  auto model = make_model(7);
  locus::optim::sgd<cpu> opt(model.parameters(), {.lr = 0.1});
  locus::train::trainer t(model, opt, nn::cross_entropy{}, {.accumulate = 4});
  dist::data_parallel dp(c, t);
  for (index_t k = 0; k < 8; ++k) t.step(data.x.slice(8 * k, 8 * k + 8), data.y.slice(8 * k, 8 * k + 8));
  CHECK(t.optimizer_steps() == 2);
  CHECK(dp.syncs() == 2);
  CHECK(bit_identical_across_ranks(std::as_const(model.parameters()).master()));
}

TEST_CASE("data_parallel: a NaN on one rank only: the grad scaler skips the step on every rank, and the fp32 guard stops every rank") {
  auto& c = world();
  const int r = c.rank();
  {
    using PF = locus::amp::fp16_mixed;
    nn::sequential m(nn::linear<cpu, PF>(20, 8), nn::relu<cpu, PF>(), nn::linear<cpu, PF>(8, 5));
    m.reset_parameters(3);
    locus::optim::adamw<cpu> opt(m.parameters(), {.lr = 1e-2});
    locus::amp::grad_scaler<cpu> scaler;
    locus::train::trainer t(m, opt, nn::cross_entropy{}, scaler);
    dist::data_parallel dp(c, t);
    task data = make_task(32, 11);
    t.step(data.x.slice(0, 16), data.y.slice(0, 16));
    t.flush();
    const auto before = locus::to<cpu>(std::as_const(m.parameters()).master());
    if (r == 1) data.x(20, 3) = std::numeric_limits<float>::quiet_NaN();  // rank 1's batch only
    t.step(data.x.slice(16, 32), data.y.slice(16, 32));
    t.flush();
    const auto after = locus::to<cpu>(std::as_const(m.parameters()).master());
    bool same = true;
    for (index_t i = 0; i < before.numel(); ++i) same = same && std::memcmp(&before(i), &after(i), 4) == 0;
    CHECK(same);  // skipped on this rank (either rank)
    CHECK(t.optimizer_steps() == 2);
    CHECK(bit_identical_across_ranks(std::as_const(m.parameters()).master()));
  }
  {
    auto m = make_model(4);
    locus::optim::adamw<cpu> opt(m.parameters(), {.lr = 1e-2});
    locus::train::trainer t(m, opt, nn::cross_entropy{});
    dist::data_parallel dp(c, t);
    task data = make_task(16, 12);
    if (r == 0) data.x(3, 0) = std::numeric_limits<float>::infinity();
    CHECK_THROWS_AS(t.step(data.x, data.y), locus::train::non_finite_error);  // on both ranks
  }
}

TEST_CASE("data_parallel: loaders with different batch counts are refused on every rank before any step") {
  auto& c = world();
  const int r = c.rank();
  task data = make_task(r == 0 ? 64 : 48, 13);
  locus::data::tensor_dataset set(std::move(data.x), std::move(data.y));
  locus::data::loader<cpu, locus::data::tensor_dataset> batches(set, {.batch_size = 16});
  auto m = make_model(5);
  locus::optim::sgd<cpu> opt(m.parameters(), {.lr = 0.1});
  locus::train::trainer t(m, opt, nn::cross_entropy{});
  dist::data_parallel dp(c, t);
  CHECK_THROWS_AS(dp.train_epoch(batches), locus::shape_error);
  CHECK(t.optimizer_steps() == 0);
}

TEST_CASE("data_parallel: rank 0 writes the checkpoint, both ranks resume it, and the curve is the one without a stop") {
  auto& c = world();
  const int r = c.rank();
  const task all = make_task(256, 21);
  auto shard = [&](int rank) {
    locus::tensor<float, cpu, 2> x(locus::extents<2>{128, 20});
    locus::tensor<std::int64_t, cpu, 1> y(locus::extents<1>{128});
    locus::copy(all.x.slice(rank * 128, rank * 128 + 128), x);
    locus::copy(all.y.slice(rank * 128, rank * 128 + 128), y);
    return locus::data::tensor_dataset(std::move(x), std::move(y));
  };
  const auto set = shard(r);
  const locus::data::loader_options lo{.batch_size = 16, .shuffle = true, .seed = 3};
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("locus_dist_" + std::to_string(::getppid()));
  if (c.is_root()) std::filesystem::create_directories(dir);
  c.barrier();
  const auto path = dir / "ckpt.safetensors";

  auto train = [&](int first_epoch, int epochs, auto& dp) {
    locus::data::loader<cpu, locus::data::tensor_dataset> batches(set, lo);
    std::vector<double> losses;
    for (int e = first_epoch; e < first_epoch + epochs; ++e) losses.push_back(dp.train_epoch(batches, {.epoch = e}).loss);
    return losses;
  };
  std::vector<double> straight, resumed;
  std::vector<double> w_straight, w_resumed;
  {
    auto m = make_model(8 + static_cast<std::uint64_t>(r));
    locus::optim::adamw<cpu> opt(m.parameters(), {.lr = 1e-2});
    locus::train::trainer t(m, opt, nn::cross_entropy{});
    dist::data_parallel dp(c, t);
    straight = train(0, 3, dp);
    const auto w = locus::to<cpu>(std::as_const(m.parameters()).master());
    for (const float v : w.span()) w_straight.push_back(v);
  }
  {
    auto m = make_model(8 + static_cast<std::uint64_t>(r));
    locus::optim::adamw<cpu> opt(m.parameters(), {.lr = 1e-2});
    locus::train::trainer t(m, opt, nn::cross_entropy{});
    dist::data_parallel dp(c, t);
    resumed = train(0, 1, dp);
    dp.save_checkpoint(path, 1);
  }
  {
    auto m = make_model(500 + static_cast<std::uint64_t>(r));  // other weights: the checkpoint must replace them
    locus::optim::adamw<cpu> opt(m.parameters(), {.lr = 1e-2});
    locus::train::trainer t(m, opt, nn::cross_entropy{});
    const std::int64_t epoch = locus::train::resume(path, t);
    CHECK(epoch == 1);
    dist::data_parallel dp(c, t);
    for (const double l : train(1, 2, dp)) resumed.push_back(l);
    const auto w = locus::to<cpu>(std::as_const(m.parameters()).master());
    for (const float v : w.span()) w_resumed.push_back(v);
    CHECK(bit_identical_across_ranks(std::as_const(m.parameters()).master()));
  }
  REQUIRE(straight.size() == resumed.size());
  for (std::size_t i = 0; i < straight.size(); ++i) CHECK(straight[i] == resumed[i]);  // bit for bit
  CHECK(w_straight == w_resumed);
  CHECK(straight.back() < straight.front());
  c.barrier();
  if (c.is_root()) std::filesystem::remove_all(dir);
}

TEST_CASE("data_parallel: evaluation figures are the whole test set's") {
  auto& c = world();
  const int r = c.rank();
  const task all = make_task(96, 31);
  auto m = make_model(9);
  locus::optim::sgd<cpu> opt(m.parameters(), {.lr = 0.1});
  locus::train::trainer t(m, opt, nn::cross_entropy{});
  dist::data_parallel dp(c, t);
  // the reference on every rank: the whole set in one process
  locus::tensor<float, cpu, 2> x_all = locus::to<cpu>(all.x);
  locus::tensor<std::int64_t, cpu, 1> y_all = locus::to<cpu>(all.y);
  locus::data::tensor_dataset whole(std::move(x_all), std::move(y_all));
  locus::data::loader<cpu, locus::data::tensor_dataset> one(whole, {.batch_size = 32});
  const auto ref = t.evaluate(one);
  locus::data::loader<cpu, locus::data::tensor_dataset> mine(whole, {.batch_size = 32, .rank = r, .world_size = 2});
  const auto got = dp.evaluate(mine);
  CHECK(got.samples == 96);
  CHECK(got.accuracy == doctest::Approx(ref.accuracy).epsilon(1e-12));
  CHECK(got.loss == doctest::Approx(ref.loss).epsilon(1e-6));
}

namespace {

/// Without a launcher: no MPI_Init, a world of one, collectives that change nothing, and
/// data-parallel training bit for bit the plain trainer's.
int solo_without_mpi() {
  int bad = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "test_dist --solo: FAILED: %s\n", what);
      ++bad;
    }
  };
  dist::environment env;
  expect(!env.uses_mpi(), "MPI is not initialised without a launcher");
  int inited = 1;
  MPI_Initialized(&inited);
  expect(inited == 0, "MPI_Initialized says no");
  dist::communicator<cpu> c(env);
  expect(c.rank() == 0 && c.world_size() == 1, "rank 0 of 1");
  auto t = locus::full<float, cpu>({4}, 2.5f);
  c.all_reduce(t, dist::reduce_op::average);
  c.broadcast(t, 0);
  expect(t(0) == 2.5f && t(3) == 2.5f, "collectives are the identity");
  auto whole = locus::zeros<float, cpu>({4});
  c.all_gather(t, whole);
  expect(whole(2) == 2.5f, "all_gather copies");
  expect(c.sum(3.0) == 3.0, "sum of one value");
  c.barrier();
  bad += scalar_collectives(c);

  const task data = make_task(64, 1);
  auto a = make_model(2), b = make_model(2);
  locus::optim::adamw<cpu> oa(a.parameters(), {.lr = 1e-2}), ob(b.parameters(), {.lr = 1e-2});
  locus::train::trainer ta(a, oa, nn::cross_entropy{}), tb(b, ob, nn::cross_entropy{});
  dist::data_parallel dp(c, ta);
  for (index_t s = 0; s < 4; ++s) {
    ta.step(data.x.slice(16 * s, 16 * s + 16), data.y.slice(16 * s, 16 * s + 16));
    tb.step(data.x.slice(16 * s, 16 * s + 16), data.y.slice(16 * s, 16 * s + 16));
  }
  ta.flush();
  tb.flush();
  const auto wa = locus::to<cpu>(std::as_const(a.parameters()).master());
  const auto wb = locus::to<cpu>(std::as_const(b.parameters()).master());
  expect(std::memcmp(wa.data_handle(), wb.data_handle(), wa.size_bytes()) == 0,
         "data_parallel on one rank equals the plain trainer bit for bit");
  return bad;
}

/// LOCUS_DIST=mpi without a launcher: MPI initialised as a singleton, a world of one over
/// MPI (the communicator duplicates MPI_COMM_WORLD); the scalar collectives again, the
/// identity in a world of one as without MPI.
int solo_over_mpi() {
  int bad = 0;
  setenv("LOCUS_DIST", "mpi", 1);
  {
    dist::environment env;
    if (!env.uses_mpi() || env.world_size() != 1) {
      std::fprintf(stderr, "test_dist --solo: FAILED: LOCUS_DIST=mpi gives a world of one over MPI\n");
      ++bad;
    }
    dist::communicator<cpu> c(env);
    bad += scalar_collectives(c);
  }
  unsetenv("LOCUS_DIST");
  return bad;
}

int solo() {
  const int bad = solo_without_mpi() + solo_over_mpi();
  std::printf("test_dist --solo: %s\n", bad ? "FAILED" : "passed");
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* fail = std::getenv("LOCUS_DIST_TEST_FAIL");
  const std::string mode = fail ? fail : "";
  if (!mode.empty()) {
    // A small training loop in which rank 1 fails at its third step.
    return dist::run(argc, argv, [&](dist::environment& env) -> int {
      dist::communicator<cpu> c(env);
      auto m = make_model(1);
      locus::optim::sgd<cpu> opt(m.parameters(), {.lr = 0.1});
      locus::train::trainer t(m, opt, nn::cross_entropy{});
      dist::data_parallel dp(c, t);
      const task data = make_task(64, 2);
      for (index_t s = 0; s < 1000; ++s) {
        if (c.rank() == 1 && s == 2) {
          if (mode == "throw") throw locus::io_error("locus: test: rank 1 could not read its shard");
          if (mode == "die") std::_Exit(3);
          if (mode == "hang") std::this_thread::sleep_for(std::chrono::hours(1));
          if (mode == "return") return 5;  // gives up without an exception
        }
        t.step(data.x.slice(0, 16), data.y.slice(0, 16));
      }
      return 0;
    });
  }

  if (argc > 1 && std::string(argv[1]) == "--solo") return solo();
  dist::environment env(argc, argv);
  g_env = &env;
  doctest::Context ctx(argc, argv);
  if (env.rank() != 0) ctx.setOption("out", "/dev/null");  // one report (failures still count)
  const int rc = ctx.run();
  int failed = 0;
  {
    auto& c = world();
    failed = static_cast<int>(c.sum(rc != 0 ? 1.0 : 0.0));
  }
  if (env.rank() == 0 && failed) std::fprintf(stderr, "locus: test_dist: %d rank(s) failed\n", failed);
  if (ctx.shouldExit()) return rc;
  return failed ? 1 : 0;
}

TEST_CASE("data_parallel: each rank draws its own dropout masks by default, and the option keeps rank 0's everywhere") {
  auto& c = world();
  const int r = c.rank();
  const auto x = locus::ones<float, cpu>({16, 20});
  // The masks, read through a forward: dropout after a linear layer of ones.
  const auto masks = [&](bool same) {
    nn::sequential m(nn::linear<cpu, P>(20, 64), nn::dropout<cpu, P>(0.5f, 77));
    m.reset_parameters(5);
    locus::optim::adamw<cpu> opt(m.parameters());
    locus::train::trainer t(m, opt, nn::cross_entropy{});
    dist::data_parallel dp(c, t, {.same_dropout_on_every_rank = same});
    CHECK(m.get<1>().rank_stream() == (same ? 0u : static_cast<std::uint64_t>(r)));
    const auto y = m.forward(x.view());
    std::vector<float> keep;
    for (index_t i = 0; i < y.numel(); ++i) keep.push_back(y.data_handle()[i] == 0.0f ? 0.0f : 1.0f);
    return keep;
  };
  const auto own = masks(false), same = masks(true);
  // rank 0's masks equal those of a model outside data_parallel (a world of one draws
  // what it drew before), computed here with the dropout kernel's key and counter
  nn::sequential solo(nn::linear<cpu, P>(20, 64), nn::dropout<cpu, P>(0.5f, 77));
  solo.reset_parameters(5);
  const auto ys = solo.forward(x.view());
  std::vector<float> solo_keep;
  for (index_t i = 0; i < ys.numel(); ++i) solo_keep.push_back(ys.data_handle()[i] == 0.0f ? 0.0f : 1.0f);
  CHECK(same == solo_keep);
  if (r == 0) CHECK(own == solo_keep);
  // across ranks: the default masks differ between ranks, the option's are equal
  locus::tensor<float, cpu, 1> mine({static_cast<index_t>(own.size())}), mine_same({static_cast<index_t>(own.size())});
  for (std::size_t i = 0; i < own.size(); ++i) {
    mine(static_cast<index_t>(i)) = own[i];
    mine_same(static_cast<index_t>(i)) = same[i];
  }
  const index_t n = mine.numel();
  locus::tensor<float, cpu, 1> all({n * c.world_size()}), all_same({n * c.world_size()});
  c.all_gather(mine, all);
  c.all_gather(mine_same, all_same);
  for (int k = 1; k < c.world_size(); ++k) {
    index_t differ = 0, differ_same = 0;
    for (index_t i = 0; i < n; ++i) {
      differ += all(k * n + i) != all(i);
      differ_same += all_same(k * n + i) != all_same(i);
    }
    CHECK(differ > n / 4);  // independent masks at p = 0.5 differ in about half the places
    CHECK(differ_same == 0);
  }
}
