// CUDA suite: the device-generic bodies for cuda, compiled by nvcc, plus cuda-only
// checks (the caching allocator's stream awareness, environment details).
#define LOCUS_TEST_DEVICES locus::cuda
#include "generic/tensor_cases.hpp"
#include "generic/expr_cases.hpp"

TEST_CASE("the environment names the device and pinned memory is page-locked") {
  const auto env = locus::environment();
  REQUIRE(env.device_count >= 1);
  CHECK(env.cuda_status == "ok");
  CHECK(env.driver_version >= env.runtime_version / 1000 * 1000);
  CHECK(env.pinned_page_locked);
  CHECK_FALSE(locus::memory_stats<locus::pinned>().fallback);
}

TEST_CASE("zeros works from a memset and reads back as zero bytes") {
  auto z = locus::zeros<locus::bf16, locus::cuda>({1000});
  auto h = locus::to<locus::cpu>(z);
  for (auto v : h.span()) CHECK(v.bits == 0);
}
