// CUDA suite: one operation, one GPU (issue 29). On any GPU machine: a view that claims
// another GPU than the current one (over real memory of this GPU, so nothing would crash
// if the check were missing) makes every kind of cuda operation a device_error before it
// launches, with the destination unchanged. On a machine with two GPUs: tensors really
// allocated on GPU 0 and GPU 1, the same refusals, to_device and peer copies checked
// against the host values (skipped, and reported so, with fewer than two GPUs).
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include <locus/locus.hpp>
#include <locus/train.hpp>

namespace {
using locus::index_t;

std::vector<float> host_values(const locus::tensor<float, locus::cuda, 2>& t) {
  const auto h = locus::to<locus::cpu>(t);
  return {h.data(), h.data() + h.numel()};
}

/// A view of t's memory that claims to live on GPU `gpu`.
locus::tensor_view<float, locus::cuda, 2> claiming(locus::tensor<float, locus::cuda, 2>& t, int gpu) {
  return locus::detail::raw_view<locus::cuda>(t.data_handle(), t.shape(), gpu);
}

template <class F>
void expect_device_error(F&& f, int a, int b) {
  try {
    f();
    FAIL("no device_error");
  } catch (const locus::device_error& e) {
    const std::string m = e.what();
    CHECK(m.find("GPU " + std::to_string(a)) != std::string::npos);
    CHECK(m.find("GPU " + std::to_string(b)) != std::string::npos);
  }
}
}  // namespace

TEST_CASE("cuda operations refuse an operand that lives on another GPU, before launching") {
  const int cur = locus::current_device();
  const int other = cur + 1;  // need not exist: the check comes first
  auto a = locus::randn<float, locus::cuda>({8, 8}, 1);
  auto b = locus::randn<float, locus::cuda>({8, 8}, 2);
  auto out = locus::zeros<float, locus::cuda>({8, 8});
  auto far = claiming(b, other);
  const auto before = host_values(out);

  CHECK(a.device_index() == cur);
  CHECK(a.view().device_index() == cur);
  expect_device_error([&] { out.view() = a + far; }, cur, other);               // expression
  expect_device_error([&] { out += locus::exp(far) * 2.0f; }, other, cur);      // compound, deep
  expect_device_error([&] { claiming(out, other) = a * 1.0f; }, other, cur);    // destination
  expect_device_error([&] { (void)locus::matmul(a, far); }, cur, other);        // GEMM
  expect_device_error([&] { locus::matmul_into(out, far, a); }, cur, other);
  expect_device_error([&] { (void)locus::linear(a, far); }, cur, other);
  expect_device_error([&] { (void)locus::sum(far); }, other, cur);              // reductions
  expect_device_error([&] { (void)locus::sum(far, 1); }, other, cur);
  expect_device_error([&] { (void)locus::max(a + far); }, cur, other);
  expect_device_error([&] { (void)locus::softmax(far, 1); }, other, cur);       // softmax
  expect_device_error([&] { (void)locus::log_softmax(a - far, 0); }, cur, other);
  CHECK(host_values(out) == before);  // nothing written

  // the same operations on one GPU run
  out.view() = a + b;
  const auto ha = host_values(a), hb = host_values(b), ho = host_values(out);
  for (std::size_t i = 0; i < ho.size(); ++i) CHECK(ho[i] == ha[i] + hb[i]);
}

TEST_CASE("two GPUs: tensors know their GPU, mixes are refused, to_device and peer copies move values" *
          doctest::skip(locus::device_count() < 2)) {
  auto h = locus::randn<float, locus::cpu>({64, 32}, 7);
  auto g0 = locus::to_device(h, 0);
  auto g1 = locus::to_device(h, 1);
  CHECK(g0.device_index() == 0);
  CHECK(g1.device_index() == 1);
  {
    const locus::device_guard on(1);
    auto fresh = locus::zeros<float, locus::cuda>({2, 2});
    CHECK(fresh.device_index() == 1);
    CHECK(locus::current_device() == 1);
  }
  const int cur = locus::current_device();
  REQUIRE(cur == 0);
  auto out = locus::zeros<float, locus::cuda>({64, 32});
  expect_device_error([&] { out.view() = g0 + g1; }, 0, 1);
  expect_device_error([&] { (void)locus::matmul(g0, locus::transpose(g1)); }, 0, 1);
  expect_device_error([&] { (void)locus::sum(g1); }, 1, 0);
  {
    const locus::device_guard on(1);
    CHECK(locus::sum(g1).device_index() == 1);  // on its own GPU it runs
  }
  // explicit moves between GPUs: to_device and copy (peer copies)
  auto back = locus::to_device(g1, 0);
  CHECK(back.device_index() == 0);
  const auto hv = locus::to<locus::cpu>(back);
  for (index_t i = 0; i < h.numel(); ++i) CHECK(hv.data()[i] == h.data()[i]);
  auto dst1 = locus::to_device(locus::zeros<float, locus::cpu>({64, 32}), 1);
  locus::copy(g0, dst1);
  const auto hd = locus::to<locus::cpu>(dst1);
  for (index_t i = 0; i < h.numel(); ++i) CHECK(hd.data()[i] == h.data()[i]);
}

TEST_CASE("a trainer on cuda refuses a batch of another GPU before it changes anything") {
  namespace nn = locus::nn;
  using D = locus::cuda;
  using P = locus::amp::fp32;
  nn::sequential model(nn::linear<D, P>(6, 8), nn::relu<D, P>(), nn::linear<D, P>(8, 3));
  locus::optim::adamw<D> opt(model.parameters(), {.lr = 1e-2});
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  auto x = locus::randn<float, D>({4, 6}, 3);
  const std::vector<std::int64_t> labels{0, 1, 2, 0};
  auto y = locus::from_host<D>(labels, {4});
  const int other = locus::current_device() + 1;
  const auto before = locus::to<locus::cpu>(model.parameters().master());
  const auto xv = locus::detail::raw_view<D>(x.data_handle(), x.shape(), other);
  expect_device_error([&] { t.step(xv, y); }, locus::current_device(), other);
  CHECK(t.optimizer_steps() == 0);
  const auto after = locus::to<locus::cpu>(model.parameters().master());
  for (index_t i = 0; i < before.numel(); ++i) CHECK(after(i) == before(i));
  t.step(x, y);  // the same batch on the model's GPU trains
  CHECK(t.optimizer_steps() == 1);
}

TEST_CASE("per-GPU memory statistics, limits and caches on the real allocator") {
  const int g = locus::current_device();
  locus::empty_cache<locus::cuda>(g);
  const auto before = locus::memory_stats<locus::cuda>(g);
  {
    auto t = locus::zeros<float, locus::cuda>({1 << 20});  // 4 MiB: a 20 MiB segment
    const auto during = locus::memory_stats<locus::cuda>(g);
    CHECK(during.allocated_bytes == before.allocated_bytes + (std::size_t{4} << 20));
    CHECK(during.reserved_bytes >= before.reserved_bytes + (std::size_t{4} << 20));
    CHECK(locus::memory_stats<locus::cuda>().allocated_bytes >= during.allocated_bytes);
  }
  CHECK(locus::memory_stats<locus::cuda>(g).allocated_bytes == before.allocated_bytes);
  locus::empty_cache<locus::cuda>(g);
  CHECK(locus::memory_stats<locus::cuda>(g).reserved_bytes <= before.reserved_bytes);
  locus::set_memory_limit<locus::cuda>(std::size_t{8} << 20, g);
  try {
    auto big = locus::empty<float, locus::cuda>({std::int64_t{4} << 20});  // 16 MiB
    FAIL("no out_of_memory");
  } catch (const locus::out_of_memory& e) {
    CHECK(e.device() == "cuda:" + std::to_string(g));
  }
  locus::set_memory_limit<locus::cuda>(std::numeric_limits<std::size_t>::max(), g);
  CHECK_THROWS_AS((void)locus::memory_stats<locus::cuda>(locus::device_count()), locus::device_error);
  CHECK_THROWS_AS(locus::empty_cache<locus::cuda>(-1), locus::device_error);
  CHECK(locus::memory_summary().find("cuda:" + std::to_string(g)) != std::string::npos);
}

TEST_CASE("a model moves to cuda and back with its parameters and buffers, bit for bit (sequential::to)") {
  namespace nn = locus::nn;
  using P = locus::amp::bf16_mixed;
  nn::sequential m(nn::conv2d<locus::cpu, P>(1, 3, 3, {.padding = 1}), nn::batch_norm2d<locus::cpu, P>(3),
                   nn::relu<locus::cpu, P>(), nn::flatten<locus::cpu, P>(), nn::linear<locus::cpu, P>(3 * 16, 2));
  m.reset_parameters(11);
  auto x = locus::rand<locus::bf16, locus::cpu>({4, 1, 4, 4}, 2, -1.0, 1.0);
  (void)m.forward(x.view());  // running statistics away from their initial values
  const auto g = m.to<locus::cuda>();
  CHECK(g.parameters().master().device_index() == locus::current_device());
  const auto back = g.to<locus::cpu>();
  const auto a = std::as_const(m).parameters().master();
  const auto b = back.parameters().master();
  for (index_t i = 0; i < a.numel(); ++i) CHECK(a.data_handle()[i] == b.data_handle()[i]);
  std::vector<float> ma, mb;
  m.for_each_buffer([&](const std::string&, auto v) {
    const auto h = locus::to<locus::cpu>(v);
    for (index_t i = 0; i < h.numel(); ++i) ma.push_back(static_cast<float>(h.data_handle()[i]));
  });
  back.for_each_buffer([&](const std::string&, auto v) {
    const auto h = locus::to<locus::cpu>(v);
    for (index_t i = 0; i < h.numel(); ++i) mb.push_back(static_cast<float>(h.data_handle()[i]));
  });
  CHECK(ma == mb);
  // and the cuda model infers what the cpu one does (bf16 kernels of two devices: close)
  const auto yc = locus::to<locus::cpu>(m.infer(x.view()));
  const auto xg = locus::to<locus::cuda>(x);
  const auto yg = locus::to<locus::cpu>(g.infer(xg.view()));
  for (index_t i = 0; i < yc.numel(); ++i)
    CHECK(static_cast<float>(yg.data_handle()[i]) ==
          doctest::Approx(static_cast<float>(yc.data_handle()[i])).epsilon(0.03));
  if (locus::device_count() >= 2) {  // to another GPU: built under its guard
    const int other = (locus::current_device() + 1) % locus::device_count();
    locus::device_guard on(other);
    const auto g1 = g.to<locus::cuda>();
    CHECK(g1.parameters().master().device_index() == other);
  }
}

TEST_CASE("preflight passes on this machine's GPU for the build's architectures, and the trainer ran it") {
  const auto r = locus::preflight<locus::bf16>();
  CHECK(r.compute_capability >= 800);
  CHECK(r.notes.empty());  // built for this card (native or its architecture)
  namespace nn = locus::nn;
  using D = locus::cuda;
  using P = locus::amp::bf16_mixed;
  nn::sequential model(nn::linear<D, P>(6, 8), nn::relu<D, P>(), nn::linear<D, P>(8, 3));
  locus::optim::adamw<D> opt(model.parameters(), {.lr = 1e-2});
  locus::amp::grad_scaler<D> scaler;
  locus::train::trainer t(model, opt, nn::cross_entropy{}, scaler);
  CHECK(t.preflight().compute_capability == r.compute_capability);
  CHECK(t.preflight().gpu == locus::current_device());
}
