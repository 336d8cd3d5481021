// Device identity on a machine without a GPU (issue 29): every cuda tensor and view
// carries its GPU, and the check every cuda operation makes before launching (operands
// and destination on the current GPU) is exercised here over views that claim GPUs,
// without touching their memory. Expressions, GEMMs and reductions on real cuda memory
// are in tests/cuda/test_devices.cu; allocations on two GPUs through the caching
// allocator's mock in tests/test_allocator_cache.cpp; the preflight of cards through a
// fake driver in tests/test_preflight.cpp. Also here: a model moved between devices
// (sequential::to<D2>()), on the two host devices.
#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include <locus/locus.hpp>
#include <locus/nn/conv.hpp>
#include <locus/nn/layers.hpp>

#include "host_devices.hpp"

namespace {
[[maybe_unused]] bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
// The other host device a model moves to: pinned where the build has CUDA (the page-locked
// allocator), else cpu again (a copy on one device).
#if LOCUS_HAS_CUDA
using other_host = locus::pinned;
#else
using other_host = locus::cpu;
#endif
}  // namespace

TEST_CASE("host tensors and views have no GPU") {
  locus::tensor<float, locus::cpu, 2> t({2, 3});
  CHECK(t.device_index() == -1);
  CHECK(t.view().device_index() == -1);
  CHECK(t.slice(0, 1).device_index() == -1);
  locus::tensor<float, locus::cpu, 2> empty;
  CHECK(empty.device_index() == -1);
}

namespace {
template <class T, class D, std::size_t R>
std::vector<std::uint64_t> bits(const locus::tensor_view<T, D, R>& v) {
  const auto h = locus::to<locus::cpu>(v);
  std::vector<std::uint64_t> out;
  for (locus::index_t i = 0; i < h.numel(); ++i) {
    const auto x = h.data_handle()[i];
    if constexpr (sizeof(x) == 8) out.push_back(std::bit_cast<std::uint64_t>(x));
    else if constexpr (sizeof(x) == 4) out.push_back(std::bit_cast<std::uint32_t>(x));
    else out.push_back(std::bit_cast<std::uint16_t>(x));
  }
  return out;
}

/// A CNN with every kind of state: conv and linear parameters, batch norm's running
/// statistics and count, a dropout's stream.
template <class D, class P>
auto small_cnn() {
  namespace nn = locus::nn;
  return nn::sequential(nn::conv2d<D, P>(1, 3, 3, {.padding = 1}), nn::batch_norm2d<D, P>(3), nn::relu<D, P>(),
                        nn::max_pool2d<D, P>(2), nn::flatten<D, P>(), nn::dropout<D, P>(0.25f, 9),
                        nn::linear<D, P>(3 * 2 * 2, 4), nn::gelu<D, P>(), nn::linear<D, P>(4, 2));
}

template <class D2, class M>
void check_moved(const M& m) {
  using P = typename M::policy;
  const auto moved = m.template to<D2>();
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(moved)>::device, D2>);
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(moved)>::policy, P>);
  // the parameters, bit for bit, under their names; the compute copy made from them
  REQUIRE(moved.parameters().entries().size() == m.parameters().entries().size());
  for (std::size_t i = 0; i < m.parameters().entries().size(); ++i)
    CHECK(moved.parameters().entries()[i].name == m.parameters().entries()[i].name);
  CHECK(bits(moved.parameters().master()) == bits(m.parameters().master()));
  // the buffers, bit for bit
  std::vector<std::vector<std::uint64_t>> a, b;
  std::vector<std::string> an, bn;
  m.for_each_buffer([&](const std::string& n, auto v) { an.push_back(n), a.push_back(bits(v)); });
  moved.for_each_buffer([&](const std::string& n, auto v) { bn.push_back(n), b.push_back(bits(v)); });
  CHECK(an == bn);
  CHECK(a == b);
  CHECK(an.size() == 3);  // running_mean, running_var, num_batches_tracked
  CHECK(moved.seed() == m.seed());
  CHECK(moved.template get<5>().counter() == m.template get<5>().counter());
  // the same inference, bit for bit (the same host kernels)
  auto x = locus::rand<typename P::compute, locus::cpu>({5, 1, 4, 4}, 31, -1.0, 1.0);
  const auto y0 = m.infer(x.view());
  const auto xd = locus::to<D2>(x);
  const auto y1 = moved.infer(xd.view());
  CHECK(bits(std::as_const(y0).view()) == bits(std::as_const(y1).view()));
}
}  // namespace

TEST_CASE("a model moves between devices with its parameters, buffers, seed and dropout stream (sequential::to)") {
  using P = locus::amp::fp32;
  auto m = small_cnn<locus::cpu, P>();
  m.reset_parameters(17);
  // two training forwards: batch norm's running statistics and count, the dropout's
  // counter move away from their initial values
  auto x = locus::rand<float, locus::cpu>({6, 1, 4, 4}, 5, -2.0, 2.0);
  (void)m.forward(x.view());
  (void)m.forward(x.view());
  check_moved<other_host>(m);
  check_moved<locus::cpu>(m);  // to the same device: a copy
  // there and back
  const auto back = m.to<other_host>().to<locus::cpu>();
  CHECK(bits(back.parameters().master()) == bits(m.parameters().master()));
  // the original is unchanged and still trains
  CHECK_NOTHROW((void)m.forward(x.view()));
}

TEST_CASE("a mixed-precision model moves with its compute copy made from the master weights") {
  using P = locus::amp::bf16_mixed;
  auto m = small_cnn<locus::cpu, P>();
  m.reset_parameters(3);
  auto x = locus::rand<locus::bf16, locus::cpu>({6, 1, 4, 4}, 5, -2.0, 2.0);
  (void)m.forward(x.view());
  check_moved<other_host>(m);  // its bf16 inference reads the compute copy
}

#if LOCUS_HAS_CUDA
TEST_CASE("a view keeps its GPU through slices, reshapes, const views, transposes and moves") {
  float mem[12] = {};
  const auto v = locus::detail::raw_view<locus::cuda>(mem, locus::extents<2>{3, 4}, 1);
  CHECK(v.device_index() == 1);
  CHECK(v.slice(1, 2).device_index() == 1);
  CHECK(v.reshape({12}).device_index() == 1);
  const locus::tensor_view<const float, locus::cuda, 2> c = v;
  CHECK(c.device_index() == 1);
  CHECK(locus::transpose(v).device_index() == 1);
  CHECK(locus::detail::as_view_const(v).device_index() == 1);
  auto w = v;
  w = locus::detail::raw_view<locus::cuda>(mem, locus::extents<2>{3, 4}, 0);
  CHECK(w.device_index() == 0);
  // unsafe_view asks the runtime; memory it does not know (host memory here) is -1
  CHECK(locus::unsafe_view<locus::cuda>(mem, {12}).device_index() == -1);
}

TEST_CASE("operands on two GPUs, or on another GPU than the current one, are a device_error naming both") {
  float mem[8] = {};
  // Without a driver the current GPU reads as 0 (nothing can launch anyway).
  const int cur = locus::detail::allocation_gpu<locus::cuda>();
  REQUIRE(cur >= 0);
  const int other = cur + 1;
  const auto here = locus::detail::raw_view<locus::cuda>(mem, locus::extents<1>{4}, cur);
  const auto there = locus::detail::raw_view<locus::cuda>(mem + 4, locus::extents<1>{4}, other);
  const auto unknown = locus::detail::raw_view<locus::cuda>(mem + 4, locus::extents<1>{4}, -1);

  // the same GPU, and a view whose GPU is unknown, pass
  locus::detail::check_same_gpu<locus::cuda>("an addition", here, here, unknown);

  try {
    locus::detail::check_same_gpu<locus::cuda>("an addition", here, there);
    FAIL("no device_error");
  } catch (const locus::device_error& e) {
    const std::string m = e.what();
    CHECK(contains(m, "locus: an addition has operands on GPU " + std::to_string(cur) + " and on GPU " +
                          std::to_string(other)));
    CHECK(contains(m, "locus::to_device(t, "));
    CHECK(e.first_gpu() == cur);
    CHECK(e.second_gpu() == other);
  }
  try {
    locus::detail::check_same_gpu<locus::cuda>("softmax", there, there);
    FAIL("no device_error");
  } catch (const locus::device_error& e) {
    const std::string m = e.what();
    CHECK(contains(m, "locus: softmax: the operands live on GPU " + std::to_string(other) + ", but GPU " +
                          std::to_string(cur) + " is current"));
    CHECK(contains(m, "locus::device_guard g(" + std::to_string(other) + ")"));
  }
  // a device_error is a locus::error
  CHECK_THROWS_AS(locus::detail::check_same_gpu<locus::cuda>("x", there), locus::error);
  // host devices check nothing (their index is -1)
  locus::tensor<float, locus::cpu, 1> h({4});
  locus::detail::check_same_gpu<locus::cpu>("an addition", h.view(), h.view());
}

TEST_CASE("expression trees report every operand's GPU, however deep") {
  float mem[16] = {};
  const auto a = locus::detail::raw_view<locus::cuda>(mem, locus::extents<2>{2, 2}, 0);
  const auto b = locus::detail::raw_view<locus::cuda>(mem + 4, locus::extents<2>{2, 2}, 0);
  const auto c = locus::detail::raw_view<locus::cuda>(mem + 8, locus::extents<1>{2}, 3);
  // building the tree launches nothing; only its evaluation (in a .cu file) would
  const auto e = locus::relu(a * 2.0f + locus::exp(b)) - locus::where(a > b, a, c);
  locus::detail::gpu_seen s;
  e.collect_gpus(s);
  CHECK(s.first == 0);
  CHECK(s.other == 3);
  locus::detail::gpu_seen same;
  (a + b * 3.0f).collect_gpus(same);
  CHECK(same.first == 0);
  CHECK(same.other == -1);
}

TEST_CASE("a GPU index that does not exist is a device_error before anything changes") {
  const int n = locus::device_count();
  for (int bad : {-1, n, n + 5, 1 << 30}) {
    try {
      locus::device_guard g(bad);
      FAIL("no device_error for GPU " << bad);
    } catch (const locus::device_error& e) {
      const std::string m = e.what();
      CHECK(contains(m, "locus: device_guard names GPU " + std::to_string(bad)));
      if (n == 0) CHECK(contains(m, "sees no GPU"));
      else CHECK(contains(m, "which does not exist"));
    }
  }
  locus::tensor<float, locus::cpu, 2> t({2, 2});
  CHECK_THROWS_AS((void)locus::to_device(t, -1), locus::device_error);
  CHECK_THROWS_AS((void)locus::to_device(t, n), locus::device_error);
  if (n == 0) {
    // no driver here: GPU 0 does not exist either, and the message says why
    try {
      (void)locus::to_device(t, 0);
      FAIL("no device_error");
    } catch (const locus::device_error& e) {
      CHECK(contains(e.what(), "to_device names GPU 0, but this process sees no GPU"));
    }
  }
}
#endif
