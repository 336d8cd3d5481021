// Host suite: locus::preflight, the GPU against the program before the first launch.
// The cards come from a fake CUDA driver: the driver API table environment() reads
// (detail::cu_driver) filled with made-up functions that describe cards of other
// generations (a Pascal P100, a Turing T4, an H200, a card newer than the build), fed
// through the same detail::describe_device that describes real cards. Each preflight
// failure (architectures, bf16 on an older card, an old driver, a GPU that is not there)
// is checked for its type, its CUDA error code and the fix its message names.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include <locus/locus.hpp>
#include <locus/amp/policy.hpp>

#if LOCUS_HAS_CUDA
namespace {

struct fake_card {
  const char* name;
  int major, minor, sms;
  std::size_t memory;
};
// The cards the fake driver reports (index = ordinal).
std::vector<fake_card> g_cards;

int fake_device_get(int* dev, int ordinal) {
  if (ordinal < 0 || ordinal >= static_cast<int>(g_cards.size())) return 101;  // CUDA_ERROR_INVALID_DEVICE
  *dev = ordinal;
  return 0;
}
int fake_name(char* out, int len, int dev) {
  std::strncpy(out, g_cards[static_cast<std::size_t>(dev)].name, static_cast<std::size_t>(len));
  return 0;
}
int fake_total_mem(std::size_t* bytes, int dev) {
  *bytes = g_cards[static_cast<std::size_t>(dev)].memory;
  return 0;
}
int fake_attribute(int* v, int attr, int dev) {
  const auto& c = g_cards[static_cast<std::size_t>(dev)];
  if (attr == locus::detail::cu_attribute_cc_major) *v = c.major;
  else if (attr == locus::detail::cu_attribute_cc_minor) *v = c.minor;
  else if (attr == locus::detail::cu_attribute_multiprocessors) *v = c.sms;
  else return 1;
  return 0;
}
int fake_ctx_state(int, unsigned* flags, int* active) {
  *flags = 0;
  *active = 0;  // no context: free memory stays unknown, nothing else is asked
  return 0;
}
int fake_retain(void**, int) { return 1; }
int fake_release(int) { return 0; }
int fake_push(void*) { return 1; }
int fake_pop(void**) { return 1; }
int fake_mem_info(std::size_t*, std::size_t*) { return 1; }

locus::detail::cu_driver fake_driver() {
  locus::detail::cu_driver d;
  d.device_get = fake_device_get;
  d.device_get_name = fake_name;
  d.device_total_mem = fake_total_mem;
  d.device_get_attribute = fake_attribute;
  d.primary_ctx_get_state = fake_ctx_state;
  d.primary_ctx_retain = fake_retain;
  d.primary_ctx_release = fake_release;
  d.ctx_push_current = fake_push;
  d.ctx_pop_current = fake_pop;
  d.mem_get_info = fake_mem_info;
  return d;
}

/// The report environment() makes for these cards, a runtime and a driver version.
locus::environment_report machine(std::vector<fake_card> cards, int runtime = 13000, int driver = 13000) {
  g_cards = std::move(cards);
  const auto drv = fake_driver();
  REQUIRE(drv.complete());
  locus::environment_report r;
  r.cuda_compiled = true;
  r.runtime_version = runtime;
  r.driver_version = driver;
  r.cuda_status = driver > 0 ? "ok" : "CUDA driver version is insufficient for CUDA runtime version";
  for (int i = 0; i < static_cast<int>(g_cards.size()); ++i) {
    locus::cuda_device_info d;
    REQUIRE(locus::detail::describe_device(drv, i, d));
    r.devices.push_back(d);
  }
  r.device_count = static_cast<int>(r.devices.size());
  return r;
}

const fake_card p100{"Tesla P100-PCIE-16GB", 6, 0, 56, 16ull << 30};
const fake_card t4{"Tesla T4", 7, 5, 40, 15ull << 30};
const fake_card a10{"NVIDIA A10", 8, 6, 72, 24ull << 30};
const fake_card h200{"NVIDIA H200", 9, 0, 132, 141ull << 30};
const fake_card future{"NVIDIA future card", 12, 0, 188, 96ull << 30};

template <class F>
std::string cuda_message(F&& f, int expected_code) {
  try {
    f();
  } catch (const locus::cuda_error& e) {
    CHECK(e.code() == expected_code);
    return e.what();
  }
  FAIL("no cuda_error");
  return {};
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("preflight: the fake driver's cards are described as environment() describes real ones") {
  const auto env = machine({t4, h200});
  REQUIRE(env.devices.size() == 2);
  CHECK(env.devices[0].name == "Tesla T4");
  CHECK(env.devices[0].compute_major == 7);
  CHECK(env.devices[0].compute_minor == 5);
  CHECK(env.devices[1].multiprocessors == 132);
  CHECK_FALSE(env.devices[1].free_memory_known);
}

TEST_CASE("preflight: a card older than every compiled architecture is a cuda_error naming both and the CMake setting") {
  const auto env = machine({t4});
  const std::vector<int> archs{800, 900};
  const std::string m = cuda_message([&] { (void)locus::preflight_check(env, 0, locus::gpu_precision::fp32, archs); },
                                     209);
  CHECK(contains(m, "GPU 0 (Tesla T4, compute capability 7.5)"));
  CHECK(contains(m, "sm_80, sm_90"));
  CHECK(contains(m, "no kernel image is available"));
  CHECK(contains(m, "-DCMAKE_CUDA_ARCHITECTURES=\"75\""));
  CHECK(m.rfind("locus: ", 0) == 0);
}

TEST_CASE("preflight: a card between the architectures, or of their major version, runs from machine code") {
  const auto env = machine({a10, h200});
  const std::vector<int> archs{750, 800, 900};
  const auto a = locus::preflight_check(env, 0, locus::gpu_precision::bf16, archs);
  CHECK(a.compute_capability == 860);
  CHECK(a.name == "NVIDIA A10");
  CHECK(a.notes.empty());  // sm_80 machine code runs on 8.6
  const auto h = locus::preflight_check(env, 1, locus::gpu_precision::bf16, archs);
  CHECK(h.compute_capability == 900);
  CHECK(h.notes.empty());
}

TEST_CASE("preflight: a card newer than every architecture runs through PTX JIT, which is a note, not an error") {
  const auto env = machine({future});
  const std::vector<int> archs{900};
  const auto r = locus::preflight_check(env, 0, locus::gpu_precision::bf16, archs);
  REQUIRE(r.notes.size() == 1);
  CHECK(contains(r.notes[0], "PTX JIT"));
  CHECK(contains(r.notes[0], "add 120 to CMAKE_CUDA_ARCHITECTURES"));
  // A card of an older major than the build's newest but without its own machine code
  // (sm_90 only, card 8.6) is refused above; one of the same major below it as well.
  const auto env2 = machine({a10});
  const std::vector<int> only90{900};
  (void)cuda_message([&] { (void)locus::preflight_check(env2, 0, locus::gpu_precision::fp32, only90); }, 209);
}

TEST_CASE("preflight: bf16 on a card before Ampere is a cuda_error that names fp16 with a scaler") {
  const auto env = machine({t4});
  const std::vector<int> archs{750};
  const std::string m = cuda_message([&] { (void)locus::preflight_check(env, 0, locus::gpu_precision::bf16, archs); },
                                     801);
  CHECK(contains(m, "Tesla T4"));
  CHECK(contains(m, "8.0"));
  CHECK(contains(m, "fp16_mixed"));
  CHECK(contains(m, "grad_scaler"));
  CHECK(contains(m, "--precision fp16"));
  // The same card in fp16 and fp32: fine, with tensor cores.
  CHECK(locus::preflight_check(env, 0, locus::gpu_precision::fp16, archs).notes.empty());
  CHECK(locus::preflight_check(env, 0, locus::gpu_precision::fp32, archs).notes.empty());
  // The compute dtype of each policy maps to its precision.
  static_assert(locus::gpu_precision_of<locus::amp::bf16_mixed::compute> == locus::gpu_precision::bf16);
  static_assert(locus::gpu_precision_of<locus::amp::fp16_mixed::compute> == locus::gpu_precision::fp16);
  static_assert(locus::gpu_precision_of<locus::amp::fp32::compute> == locus::gpu_precision::fp32);
  static_assert(locus::gpu_precision_of<locus::amp::fp64::compute> == locus::gpu_precision::fp64);
}

TEST_CASE("preflight: the mixed precision for a card is bf16 from Ampere on, fp16 before (the main job's default)") {
  const auto env = machine({p100, t4, a10, h200});
  CHECK(locus::mixed_precision_for(env.devices[0]) == locus::gpu_precision::fp16);
  CHECK(locus::mixed_precision_for(env.devices[1]) == locus::gpu_precision::fp16);
  CHECK(locus::mixed_precision_for(env.devices[2]) == locus::gpu_precision::bf16);
  CHECK(locus::mixed_precision_for(env.devices[3]) == locus::gpu_precision::bf16);
  // and what it picks passes preflight on that card
  const std::vector<int> archs{600, 750, 800, 900};
  for (const auto& d : env.devices)
    CHECK_NOTHROW((void)locus::preflight_check(env, d.index, locus::mixed_precision_for(d), archs));
}

TEST_CASE("preflight: fp16 on a card without tensor cores runs, with a note") {
  const auto env = machine({p100}, 12000, 12000);
  const std::vector<int> archs{600};
  const auto r = locus::preflight_check(env, 0, locus::gpu_precision::fp16, archs);
  REQUIRE(r.notes.size() == 1);
  CHECK(contains(r.notes[0], "no tensor cores"));
  (void)cuda_message([&] { (void)locus::preflight_check(env, 0, locus::gpu_precision::bf16, archs); }, 801);
}

TEST_CASE("preflight: a driver for an older CUDA major version is a cuda_error naming the driver needed") {
  const auto env = machine({h200}, 13000, 12040);
  const std::vector<int> archs{900};
  const std::string m = cuda_message([&] { (void)locus::preflight_check(env, 0, locus::gpu_precision::fp32, archs); },
                                     35);
  CHECK(contains(m, "supports CUDA 12.4"));
  CHECK(contains(m, "built with CUDA 13.0"));
  CHECK(contains(m, "580.65.06"));
  CHECK(contains(m, "CUDA 12.x toolkit"));
  // No driver at all.
  const auto none = machine({}, 12080, 0);
  const std::string n = cuda_message([&] { (void)locus::preflight_check(none, 0, locus::gpu_precision::fp32, archs); },
                                     35);
  CHECK(contains(n, "no NVIDIA driver"));
  CHECK(contains(n, "525.60.13"));
  CHECK(contains(n, "--device cpu"));
}

TEST_CASE("preflight: an older minor driver of the same major runs, with a note about PTX") {
  const auto env = machine({h200}, 13020, 13000);
  const std::vector<int> archs{900};
  const auto r = locus::preflight_check(env, 0, locus::gpu_precision::bf16, archs);
  REQUIRE(r.notes.size() == 1);
  CHECK(contains(r.notes[0], "minor version compatibility"));
}

TEST_CASE("preflight: a GPU that is not there, a negative one, and no GPU at all are device_errors") {
  const auto env = machine({t4, h200});
  const std::vector<int> archs{750, 900};
  for (int gpu : {2, -1, 1 << 30}) {
    try {
      (void)locus::preflight_check(env, gpu, locus::gpu_precision::fp32, archs);
      FAIL("no device_error");
    } catch (const locus::device_error& e) {
      CHECK(e.first_gpu() == gpu);
      CHECK(contains(e.what(), "sees 2 GPUs, numbered 0 to 1"));
    }
  }
  auto hidden = machine({});
  hidden.cuda_status = "no CUDA device found";
  CHECK_THROWS_WITH_AS((void)locus::preflight_check(hidden, 0, locus::gpu_precision::fp32, archs),
                       doctest::Contains("sees 0 GPUs"), locus::device_error);
  auto no_cuda = machine({h200});
  no_cuda.cuda_compiled = false;
  CHECK_THROWS_WITH_AS((void)locus::preflight_check(no_cuda, 0, locus::gpu_precision::fp32, archs),
                       doctest::Contains("built without CUDA"), locus::device_error);
}

TEST_CASE("preflight: without a known architecture list the check says so instead of guessing") {
  const auto env = machine({h200});
  const auto r = locus::preflight_check(env, 0, locus::gpu_precision::bf16, {});
  REQUIRE(r.notes.size() == 1);
  CHECK(contains(r.notes[0], "not known here"));
  // This file is built by the host compiler: its list is empty unless CMake defined it.
#if !defined(__CUDA_ARCH_LIST__) && !defined(LOCUS_CUDA_ARCHITECTURES)
  CHECK(locus::detail::this_file_cuda_archs::values.empty());
#endif
}

TEST_CASE("preflight: on this machine's real runtime, a GPU it does not have is refused before anything runs") {
  if (locus::device_count() > 0) return;  // the CUDA suite covers machines with a GPU
  CHECK_THROWS_AS((void)locus::preflight<float>(0), locus::error);
  CHECK_THROWS_AS((void)locus::preflight<locus::bf16>(3), locus::error);
  CHECK_THROWS_AS((void)locus::preflight<float>(-7), locus::device_error);
}
#endif
