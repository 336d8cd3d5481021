// Device identity on a machine without a GPU (issue 29): every cuda tensor and view
// carries its GPU, and the check every cuda operation makes before launching (operands
// and destination on the current GPU) is exercised here over views that claim GPUs,
// without touching their memory. Expressions, GEMMs and reductions on real cuda memory
// are in tests/cuda/test_devices.cu; allocations on two GPUs in tests/fake_cuda.
#include <doctest/doctest.h>

#include <string>

#include <locus/locus.hpp>

#include "host_devices.hpp"

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("host tensors and views have no GPU") {
  locus::tensor<float, locus::cpu, 2> t({2, 3});
  CHECK(t.device_index() == -1);
  CHECK(t.view().device_index() == -1);
  CHECK(t.slice(0, 1).device_index() == -1);
  locus::tensor<float, locus::cpu, 2> empty;
  CHECK(empty.device_index() == -1);
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
