// The environment report and the run-time device choice.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include <locus/locus.hpp>

namespace {
struct env_var {
  explicit env_var(const char* value) {
    if (value) ::setenv("LOCUS_DEVICE", value, 1);
    else ::unsetenv("LOCUS_DEVICE");
  }
  ~env_var() { ::unsetenv("LOCUS_DEVICE"); }
};
}  // namespace

TEST_CASE("environment() reports CUDA the driver (or why not) and the devices") {
  const auto env = locus::environment();
  CHECK(env.cuda_compiled == (LOCUS_HAS_CUDA != 0));
  CHECK(env.device_count == static_cast<int>(env.devices.size()));
  CHECK(env.cuda_usable() == locus::cuda_available());
  CHECK_FALSE(env.cuda_status.empty());
  if (!env.cuda_usable()) CHECK(env.cuda_status != "ok");
#if LOCUS_HAS_CUDA
  CHECK(env.runtime_version >= 12000);
#endif
  const std::string text = env.to_string();
  CHECK(text.find("CUDA compiled") != std::string::npos);
  CHECK(text.find(env.cuda_status) != std::string::npos);
  CHECK(text.find("best device") != std::string::npos);
  for (const auto& d : env.devices) {
    CHECK_FALSE(d.name.empty());
    CHECK(d.compute_major >= 3);
    CHECK(d.total_memory_bytes > 0);
  }
}

TEST_CASE("with_device instantiates the callable per device and calls the chosen one") {
  env_var clear(nullptr);
  auto name_of = [](auto dev) { return std::string(decltype(dev)::name); };
  CHECK(locus::with_device(locus::device_choice::cpu, name_of) == "cpu");
  CHECK(locus::with_device(locus::device_choice::automatic, name_of) ==
        (locus::cuda_available() ? "cuda" : "cpu"));
  if (!locus::cuda_available()) {
    CHECK_THROWS_AS((locus::with_device(locus::device_choice::cuda, name_of)), locus::error);
  }
  // A typed computation on whichever device was chosen.
  const double total = locus::with_device(locus::device_choice::cpu, [](auto dev) {
    using D = decltype(dev);
    auto t = locus::zeros<float, D>({4, 4});
    auto h = locus::to<locus::cpu>(t);
    double s = 0;
    for (float v : h.span()) s += v + 1.0;
    return s;
  });
  CHECK(total == 16.0);
}

TEST_CASE("LOCUS_DEVICE overrides the program's choice") {
  auto name_of = [](auto dev) { return std::string(decltype(dev)::name); };
  {
    env_var force("cpu");
    CHECK(locus::with_device(locus::device_choice::automatic, name_of) == "cpu");
    CHECK(locus::resolve_device(locus::device_choice::cuda) == locus::device_choice::cpu);
  }
  {
    env_var force("cuda");
    if (locus::cuda_available())
      CHECK(locus::with_device(locus::device_choice::cpu, name_of) == "cuda");
    else
      CHECK_THROWS_AS((locus::with_device(locus::device_choice::cpu, name_of)), locus::error);
  }
  {
    env_var bad("tpu");
    CHECK_THROWS_AS((locus::resolve_device(locus::device_choice::automatic)), locus::error);
  }
  CHECK(locus::parse_device_choice("auto") == locus::device_choice::automatic);
  CHECK_THROWS_AS((locus::parse_device_choice("gpu0")), locus::error);
}

#if LOCUS_HAS_CUDA
TEST_CASE("a failing CUDA call throws cuda_error naming the call, file, line and the runtime's text") {
  // An invalid device ordinal fails with or without a GPU.
  try {
    LOCUS_CUDA_CHECK(cudaSetDevice(-1));
    FAIL("no exception");
  } catch (const locus::cuda_error& e) {
    const std::string m = e.what();
    CHECK(m.rfind("locus: CUDA call failed: cudaSetDevice(-1) at ", 0) == 0);
    CHECK(m.find("test_environment.cpp:") != std::string::npos);
    CHECK(e.code() != 0);
    CHECK(m.find(cudaGetErrorString(static_cast<cudaError_t>(e.code()))) != std::string::npos);
  }
  // Without a usable GPU, allocating on cuda is such a failure too (not a crash, and not
  // an out_of_memory), and it leaves the allocator's statistics as they were.
  if (!locus::cuda_available()) {
    const auto before = locus::memory_stats<locus::cuda>();
    try {
      auto t = locus::empty<float, locus::cuda>({4});
      FAIL("no exception");
    } catch (const locus::cuda_error& e) {
      const std::string m = e.what();
      // The place that failed: cudaMalloc's resource, or the caching allocator above it.
      CHECK((m.find("memory/cuda_resources.hpp:") != std::string::npos ||
             m.find("memory/caching_allocator.hpp:") != std::string::npos));
      CHECK(m.find(cudaGetErrorString(static_cast<cudaError_t>(e.code()))) != std::string::npos);
    }
    const auto after = locus::memory_stats<locus::cuda>();
    CHECK(after.allocated_bytes == before.allocated_bytes);
    CHECK(after.reserved_bytes == before.reserved_bytes);
  }
}
#endif

TEST_CASE("environment() reports OpenMP's wait policy and the load, and warns when threads would spin on a busy machine") {
  auto env = locus::environment();
  double load[1];
  if (::getloadavg(load, 1) == 1) CHECK(env.load_average >= 0.0);
  const char* w = std::getenv("OMP_WAIT_POLICY");
  CHECK(env.omp_wait_policy == (w ? w : ""));
#if defined(_OPENMP)
  CHECK(env.to_string().find("OpenMP waits:") != std::string::npos);
  // the rule, on report values set by hand
  env.omp_wait_policy.clear();
  env.host_threads = 2;
  env.load_average = 5.0;
  CHECK(env.spinning_on_busy_machine());
  CHECK(env.to_string().find("run with OMP_WAIT_POLICY=PASSIVE") != std::string::npos);
  env.omp_wait_policy = "PASSIVE";
  CHECK_FALSE(env.spinning_on_busy_machine());
  CHECK(env.to_string().find("warning:") == std::string::npos);
  env.omp_wait_policy = "active";
  env.load_average = 1.5;  // calm: spinning is the faster setting
  CHECK_FALSE(env.spinning_on_busy_machine());
  env.load_average = -1.0;  // unknown
  CHECK_FALSE(env.spinning_on_busy_machine());
#endif
}
