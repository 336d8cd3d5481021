// CUDA suite, issue 14's NCCL path on one rank (no launcher: NCCL still runs every
// collective, over a communicator of one): all_reduce (sum, average; f32, bf16, i64;
// a strided view), broadcast, all_gather, the element-count check, all_reduce_start, and
// data_parallel around a cuda trainer equal bit for bit to the plain trainer. With
// several GPUs and a launcher the same collectives span them (tests/dist covers the
// ranks' logic over MPI on the CPU). Skipped, with the reason, without a GPU
// (tests/cuda/main.cu); compiled only where NCCL is found (LOCUS_HAS_NCCL).
#include <doctest/doctest.h>

#if defined(LOCUS_HAS_NCCL) && LOCUS_HAS_NCCL

#include <cstring>
#include <vector>

#include <locus/dist.hpp>
#include <locus/train.hpp>

namespace {
using CU = locus::cuda;  // (::cuda is CCCL's namespace)
using locus::index_t;
namespace nn = locus::nn;
namespace dist = locus::dist;

template <class T, std::size_t R>
std::vector<double> host(const locus::tensor<T, CU, R>& t) {
  const auto h = locus::to<locus::cpu>(t);
  std::vector<double> v;
  for (const auto& x : h.span()) v.push_back(static_cast<double>(locus::detail::load(x)));
  return v;
}
}  // namespace

TEST_CASE("dist on cuda: NCCL collectives over one rank leave the values and check their arguments") {
  dist::environment env;
  REQUIRE(env.world_size() == 1);
  dist::communicator<CU> c(env);
  auto f = locus::to<CU>(locus::full<float, locus::cpu>({3, 4}, 1.5f));
  c.all_reduce(f);
  c.all_reduce(f, dist::reduce_op::average);
  for (const double v : host(f)) CHECK(v == 1.5);
  auto b = locus::to<CU>(locus::full<locus::bf16, locus::cpu>({5}, locus::bf16(0.75f)));
  c.all_reduce(b, dist::reduce_op::average);  // NCCL sums bf16 itself
  for (const double v : host(b)) CHECK(v == 0.75);
  auto i = locus::to<CU>(locus::full<std::int64_t, locus::cpu>({2}, std::int64_t{1} << 40));
  c.all_reduce(i);
  for (const double v : host(i)) CHECK(v == static_cast<double>(std::int64_t{1} << 40));
  // every other column: through a contiguous copy and back
  auto m = locus::to<CU>(locus::full<float, locus::cpu>({2, 6}, 2.0f));
  auto cols = locus::unsafe_view<CU>(m.data_handle(), locus::extents<2>{2, 3}, locus::extents<2>{6, 2});
  c.all_reduce(cols);
  for (const double v : host(m)) CHECK(v == 2.0);
  c.broadcast(f, 0);
  CHECK_THROWS_AS(c.broadcast(f, 1), locus::value_error);
  auto whole = locus::zeros<float, CU>({3, 4});
  c.all_gather(f, whole);
  for (const double v : host(whole)) CHECK(v == 1.5);
  auto wrong = locus::zeros<float, CU>({4, 4});
  CHECK_THROWS_AS(c.all_gather(f, wrong), locus::shape_error);
  auto flat = locus::to<CU>(locus::full<float, locus::cpu>({7}, 3.0f));
  c.all_reduce_start(flat.view(), dist::reduce_op::average);
  c.wait();
  for (const double v : host(flat)) CHECK(v == 3.0);
  c.barrier();
}

TEST_CASE("dist on cuda: a collective over a tensor of another GPU is a device_error before NCCL runs") {
  dist::environment env;
  dist::communicator<CU> c(env);
  CHECK(c.device_index() == locus::current_device());
  auto f = locus::to<CU>(locus::full<float, locus::cpu>({3, 4}, 1.5f));
  const int other = c.device_index() + 1;
  auto elsewhere = locus::detail::raw_view<CU>(f.data_handle(), f.shape(), other);  // claims another GPU
  const auto refused = [&](auto&& call) {
    try {
      call();
      FAIL("no device_error");
    } catch (const locus::device_error& e) {
      CHECK(e.first_gpu() == c.device_index());
      CHECK(e.second_gpu() == other);
    }
  };
  refused([&] { c.all_reduce(elsewhere); });
  refused([&] { c.broadcast(elsewhere, 0); });
  refused([&] { c.all_reduce_start(elsewhere); });
  auto whole = locus::zeros<float, CU>({3, 4});
  refused([&] { c.all_gather(elsewhere, whole); });
  for (const double v : host(f)) CHECK(v == 1.5);  // nothing ran
  c.all_reduce(f);  // its own GPU's tensor: fine
}

TEST_CASE("dist on cuda: data_parallel over one NCCL rank trains bit for bit as the plain trainer") {
  using P = locus::amp::bf16_mixed;
  auto make = [] {
    nn::sequential m(nn::linear<CU, P>(32, 24), nn::relu<CU, P>(), nn::linear<CU, P>(24, 5));
    m.reset_parameters(4);
    return m;
  };
  dist::environment env;
  dist::communicator<CU> c(env);
  auto a = make(), b = make();
  locus::optim::adamw<CU> oa(a.parameters(), {.lr = 1e-2}), ob(b.parameters(), {.lr = 1e-2});
  locus::train::trainer ta(a, oa, nn::cross_entropy{}), tb(b, ob, nn::cross_entropy{});
  dist::data_parallel dp(c, ta, {.bucket_bytes = 256});
  const auto x = locus::randn<float, CU>({64, 32}, 9);
  auto yh = locus::zeros<std::int64_t, locus::cpu>({64});
  for (index_t k = 0; k < 64; ++k) yh(k) = (k * 3) % 5;
  const auto y = locus::to<CU>(yh);
  for (index_t s = 0; s < 4; ++s) {
    ta.step(x.slice(16 * s, 16 * s + 16), y.slice(16 * s, 16 * s + 16));
    tb.step(x.slice(16 * s, 16 * s + 16), y.slice(16 * s, 16 * s + 16));
  }
  ta.flush();
  tb.flush();
  CHECK(dp.syncs() == 4);
  CHECK(dp.buckets() > 0);
  const auto wa = locus::to<locus::cpu>(std::as_const(a.parameters()).master());
  const auto wb = locus::to<locus::cpu>(std::as_const(b.parameters()).master());
  CHECK(std::memcmp(wa.data_handle(), wb.data_handle(), wa.size_bytes()) == 0);
}

#endif
