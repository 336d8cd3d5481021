// The host-testable parts of locus's stream layer (issue 13): the per-device current
// stream table, the explicit default-stream handle, the choice of streams a host read
// waits for, and environment()'s device listing through the driver table, driven with
// made-up handles, devices and driver functions. The GPU behaviour itself is in
// tests/cuda/test_streams.cu.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <locus/locus.hpp>

#if LOCUS_HAS_CUDA
#include <locus/backend/cuda/runtime.hpp>
#include <locus/data/loader.hpp>

namespace {
cudaStream_t fake_stream(std::uintptr_t k) { return reinterpret_cast<cudaStream_t>(0x1000 + 16 * k); }
cudaEvent_t fake_event(std::uintptr_t k) { return reinterpret_cast<cudaEvent_t>(0x9000 + 16 * k); }
}  // namespace

TEST_CASE("the default stream is stored as cudaStreamLegacy, never as 0") {
  // 0 means the calling thread's own default stream under --default-stream per-thread.
  CHECK(locus::detail::default_stream() == cudaStreamLegacy);
  CHECK(locus::detail::default_stream() != nullptr);
  CHECK(locus::detail::current_streams().fallback() == cudaStreamLegacy);
}

TEST_CASE("per_device_slots: one value per device, the fallback elsewhere") {
  locus::detail::per_device_slots<cudaStream_t> slots(cudaStreamLegacy);
  CHECK(slots.get(0) == cudaStreamLegacy);
  CHECK(slots.get(7) == cudaStreamLegacy);
  CHECK(slots.get(-1) == cudaStreamLegacy);
  // Setting device 1 leaves device 0 (and 2) alone: the bug was one slot for all devices.
  CHECK(slots.exchange(1, fake_stream(1)) == cudaStreamLegacy);
  CHECK(slots.get(1) == fake_stream(1));
  CHECK(slots.get(0) == cudaStreamLegacy);
  CHECK(slots.get(2) == cudaStreamLegacy);
  CHECK(slots.exchange(0, fake_stream(0)) == cudaStreamLegacy);
  CHECK(slots.get(0) == fake_stream(0));
  CHECK(slots.get(1) == fake_stream(1));
  // Nested guards on one device restore in order.
  const cudaStream_t outer = slots.exchange(1, fake_stream(2));
  CHECK(outer == fake_stream(1));
  CHECK(slots.get(1) == fake_stream(2));
  CHECK(slots.exchange(1, outer) == fake_stream(2));
  CHECK(slots.get(1) == fake_stream(1));
  // A device index that is no GPU's is refused, and nothing changes.
  CHECK_THROWS_AS(slots.exchange(-1, fake_stream(3)), locus::value_error);
  CHECK_THROWS_AS(slots.exchange(locus::detail::per_device_slots<cudaStream_t>::max_devices, fake_stream(3)),
                  locus::value_error);
  CHECK(slots.get(0) == fake_stream(0));
  CHECK(slots.get(1) == fake_stream(1));
  // The largest index works.
  const int last = locus::detail::per_device_slots<cudaStream_t>::max_devices - 1;
  CHECK(slots.exchange(last, fake_stream(4)) == cudaStreamLegacy);
  CHECK(slots.get(last) == fake_stream(4));
  CHECK(slots.get(last - 1) == cudaStreamLegacy);
}

TEST_CASE("current streams are per thread: another thread sees the default") {
  auto& mine = locus::detail::current_streams();
  const cudaStream_t before = mine.exchange(0, fake_stream(5));
  cudaStream_t seen = fake_stream(99);
  std::thread([&] { seen = locus::detail::current_streams().get(0); }).join();
  CHECK(seen == cudaStreamLegacy);
  CHECK(mine.get(0) == fake_stream(5));
  // current_stream() reads the slot of the current device (device 0 here, with or
  // without a driver: without one, current_device_or_zero() says 0).
  if (!locus::cuda_available()) {
    CHECK(locus::detail::current_device_or_zero() == 0);
    CHECK(locus::detail::current_stream() == fake_stream(5));
  }
  mine.exchange(0, before);
  if (!locus::cuda_available()) CHECK(locus::detail::current_stream() == cudaStreamLegacy);
}

TEST_CASE("a host read waits for every other locus stream of the memory's device") {
  using locus::detail::registered_stream;
  const std::vector<registered_stream> all{{fake_stream(0), 0, fake_event(0)},
                                           {fake_stream(1), 1, fake_event(1)},
                                           {fake_stream(2), 0, fake_event(2)},
                                           {fake_stream(3), 0, fake_event(3)}};
  // Reading on the legacy stream of device 0: the three streams of device 0.
  CHECK(locus::detail::streams_to_wait_for(all, cudaStreamLegacy, 0) == std::vector<std::size_t>{0, 2, 3});
  // Reading on stream 2 (under its guard): the others of device 0, not itself.
  CHECK(locus::detail::streams_to_wait_for(all, fake_stream(2), 0) == std::vector<std::size_t>{0, 3});
  // Device 1: only its own stream; a read on that very stream waits for none.
  CHECK(locus::detail::streams_to_wait_for(all, cudaStreamLegacy, 1) == std::vector<std::size_t>{1});
  CHECK(locus::detail::streams_to_wait_for(all, fake_stream(1), 1).empty());
  CHECK(locus::detail::streams_to_wait_for(all, cudaStreamLegacy, 5).empty());
  CHECK(locus::detail::streams_to_wait_for({}, cudaStreamLegacy, 0).empty());
}

TEST_CASE("a host read skips the streams that are capturing a graph (a marker would join the capture)") {
  using locus::detail::registered_stream;
  const std::vector<registered_stream> all{{fake_stream(0), 0, fake_event(0)},
                                           {fake_stream(1), 0, fake_event(1)},
                                           {fake_stream(2), 0, fake_event(2)},
                                           {fake_stream(3), 1, fake_event(3)}};
  std::vector<cudaStream_t> asked;
  auto stream1_captures = [&](cudaStream_t s) {
    asked.push_back(s);
    return s == fake_stream(1);
  };
  CHECK(locus::detail::streams_to_wait_for(all, cudaStreamLegacy, 0, stream1_captures) ==
        std::vector<std::size_t>{0, 2});
  // Asked only about the candidates (device 0, not the reader): never about device 1's.
  CHECK(asked == std::vector<cudaStream_t>{fake_stream(0), fake_stream(1), fake_stream(2)});
  // Every stream capturing: none to wait for; the reader itself is never asked about.
  asked.clear();
  auto all_capture = [&](cudaStream_t s) {
    asked.push_back(s);
    return true;
  };
  CHECK(locus::detail::streams_to_wait_for(all, fake_stream(2), 0, all_capture).empty());
  CHECK(asked == std::vector<cudaStream_t>{fake_stream(0), fake_stream(1)});
  // None capturing: the same as the two-argument rule.
  CHECK(locus::detail::streams_to_wait_for(all, cudaStreamLegacy, 0, [](cudaStream_t) { return false; }) ==
        locus::detail::streams_to_wait_for(all, cudaStreamLegacy, 0));
  // No driver: the runtime's query fails, which counts as not
  // capturing (the marker's record then reports the error).
  if (!locus::cuda_available()) {
    CHECK_FALSE(locus::detail::stream_is_capturing(cudaStreamLegacy));
  }
}

TEST_CASE("stream_registry: add, remove, count per device, ordering calls only what it must") {
  locus::detail::stream_registry r;
  r.add(fake_stream(0), 0, fake_event(0));
  r.add(fake_stream(1), 1, fake_event(1));
  r.add(fake_stream(2), 0, fake_event(2));
  CHECK(r.count(0) == 2);
  CHECK(r.count(1) == 1);
  CHECK(r.remove(fake_stream(0)));
  CHECK_FALSE(r.remove(fake_stream(0)));  // once
  CHECK(r.count(0) == 1);
  CHECK(r.remove(fake_stream(2)));
  CHECK(r.count(0) == 0);
  // Reading on the legacy stream of device 0, which has no other locus stream now:
  // nothing to wait for, so no CUDA call is made (this passes without a driver).
  CHECK_NOTHROW(r.order_after_all(cudaStreamLegacy, 0));
  if (!locus::cuda_available()) {
    // Device 1 has a stream, so the read must record on it: without a driver that is a
    // cuda_error, not a silent skip.
    CHECK_THROWS_AS(r.order_after_all(cudaStreamLegacy, 1), locus::cuda_error);
  }
  // Concurrent adds and removes from several threads keep the count right.
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&r, t] {
      for (std::uintptr_t k = 0; k < 200; ++k) {
        r.add(fake_stream(1000 * static_cast<std::uintptr_t>(t + 1) + k), 3, fake_event(k));
        if (k % 2 == 1) CHECK(r.remove(fake_stream(1000 * static_cast<std::uintptr_t>(t + 1) + k)));
      }
    });
  for (auto& t : ts) t.join();
  CHECK(r.count(3) == 400);
}

// ---- environment(): the driver table -------------------------------------------------------

namespace {
// A made-up driver: two devices; device 1's primary context exists, device 0's not.
// Counts context calls, so the test sees that no context is created.
struct fake_driver {
  static inline int retains = 0, releases = 0, pushes = 0, pops = 0, mem_info = 0;
  static inline bool refuse_name = false;
  static void reset() { retains = releases = pushes = pops = mem_info = 0; refuse_name = false; }
  static int device_get(int* d, int ordinal) {
    if (ordinal < 0 || ordinal > 1) return 101;  // CUDA_ERROR_INVALID_DEVICE
    *d = 40 + ordinal;                             // a CUdevice is not the ordinal
    return 0;
  }
  static int name(char* out, int len, int dev) {
    if (refuse_name) return 1;
    const char* n = dev == 40 ? "Fake H200" : "Fake A100 80GB PCIe with a rather long name";
    std::strncpy(out, n, static_cast<std::size_t>(len));
    return 0;
  }
  static int total(std::size_t* b, int dev) {
    *b = dev == 40 ? (std::size_t{141} << 30) : (std::size_t{80} << 30);
    return 0;
  }
  static int attribute(int* v, int attr, int dev) {
    if (attr == locus::detail::cu_attribute_cc_major) *v = dev == 40 ? 9 : 8;
    else if (attr == locus::detail::cu_attribute_cc_minor) *v = 0;
    else if (attr == locus::detail::cu_attribute_multiprocessors) *v = dev == 40 ? 132 : 108;
    else return 1;
    return 0;
  }
  static int state(int dev, unsigned* flags, int* active) {
    *flags = 0;
    *active = dev == 41 ? 1 : 0;
    return 0;
  }
  static int retain(void** ctx, int dev) {
    ++retains;
    *ctx = reinterpret_cast<void*>(static_cast<std::uintptr_t>(dev) * 0x100);
    return 0;
  }
  static int release(int) { ++releases; return 0; }
  static int push(void*) { ++pushes; return 0; }
  static int pop(void** c) { ++pops; *c = nullptr; return 0; }
  static int meminfo(std::size_t* fr, std::size_t* tot) {
    ++mem_info;
    *fr = std::size_t{3} << 30;
    *tot = std::size_t{80} << 30;
    return 0;
  }
  static locus::detail::cu_driver table() {
    locus::detail::cu_driver d;
    d.device_get = device_get;
    d.device_get_name = name;
    d.device_total_mem = total;
    d.device_get_attribute = attribute;
    d.primary_ctx_get_state = state;
    d.primary_ctx_retain = retain;
    d.primary_ctx_release = release;
    d.ctx_push_current = push;
    d.ctx_pop_current = pop;
    d.mem_get_info = meminfo;
    return d;
  }
};
}  // namespace

TEST_CASE("devices are described through the driver table without creating a context") {
  fake_driver::reset();
  const auto drv = fake_driver::table();
  REQUIRE(drv.complete());
  locus::cuda_device_info d0, d1;
  REQUIRE(locus::detail::describe_device(drv, 0, d0));
  REQUIRE(locus::detail::describe_device(drv, 1, d1));
  CHECK(d0.index == 0);
  CHECK(d0.name == "Fake H200");
  CHECK(d0.compute_major == 9);
  CHECK(d0.compute_minor == 0);
  CHECK(d0.multiprocessors == 132);
  CHECK(d0.total_memory_bytes == (std::size_t{141} << 30));
  // Device 0 has no context: its free memory is not asked for (that would create one).
  CHECK_FALSE(d0.free_memory_known);
  CHECK(d0.free_memory_bytes == 0);
  CHECK(d1.index == 1);
  CHECK(d1.name == "Fake A100 80GB PCIe with a rather long name");
  CHECK(d1.compute_major == 8);
  CHECK(d1.multiprocessors == 108);
  CHECK(d1.free_memory_known);
  CHECK(d1.free_memory_bytes == (std::size_t{3} << 30));
  // Only device 1's existing context was touched, and every retain/push was undone.
  CHECK(fake_driver::retains == 1);
  CHECK(fake_driver::releases == 1);
  CHECK(fake_driver::pushes == 1);
  CHECK(fake_driver::pops == 1);
  CHECK(fake_driver::mem_info == 1);
  CHECK_FALSE(locus::detail::primary_context_active(drv, 0));
  CHECK(locus::detail::primary_context_active(drv, 1));
  CHECK_FALSE(locus::detail::primary_context_active(drv, 2));  // no such device
  // A device the driver does not know, a refused query, an incomplete table: false.
  locus::cuda_device_info none;
  CHECK_FALSE(locus::detail::describe_device(drv, 2, none));
  fake_driver::refuse_name = true;
  CHECK_FALSE(locus::detail::describe_device(drv, 0, none));
  fake_driver::refuse_name = false;
  auto partial = drv;
  partial.mem_get_info = nullptr;
  CHECK_FALSE(partial.complete());
  CHECK_FALSE(locus::detail::describe_device(partial, 0, none));
  CHECK_FALSE(locus::detail::primary_context_active(partial, 1));
  CHECK_FALSE(locus::detail::cu_driver{}.complete());
}

TEST_CASE("environment() without a driver: no devices, the reason, pinned probed (no context to create)") {
  if (locus::cuda_available()) return;  // this machine has a GPU: the cuda suite covers it
  const auto env = locus::environment();
  CHECK(env.device_count == 0);
  CHECK(env.devices.empty());
  CHECK(env.cuda_status != "ok");
  CHECK(env.pinned_probed);
  CHECK_FALSE(env.pinned_page_locked);
  CHECK(env.to_string().find("fallback to pageable host memory") != std::string::npos);
  // Asking again gives the same answers (nothing was left half-initialised).
  const auto again = locus::environment();
  CHECK(again.cuda_status == env.cuda_status);
  CHECK(again.device_count == 0);
}

TEST_CASE("a report lists free memory only where it was known") {
  locus::environment_report r;
  r.cuda_compiled = true;
  r.cuda_status = "ok";
  r.device_count = 2;
  locus::cuda_device_info a, b;
  a.index = 0;
  a.name = "A";
  a.compute_major = 9;
  a.total_memory_bytes = std::size_t{1} << 30;
  b = a;
  b.index = 1;
  b.name = "B";
  b.free_memory_known = true;
  b.free_memory_bytes = std::size_t{512} << 20;
  r.devices = {a, b};
  r.pinned_page_locked = true;
  const std::string text = r.to_string();
  CHECK(text.find("[0] A, compute capability 9.0, 0 SMs, 1.00 GiB total, free memory not queried") !=
        std::string::npos);
  CHECK(text.find("[1] B, compute capability 9.0, 0 SMs, 1.00 GiB total, 512") != std::string::npos);
  CHECK(text.find("not probed: no context yet") != std::string::npos);
}

TEST_CASE("loader<cuda> without a GPU fails in its constructor with cuda_error") {
  if (locus::cuda_available()) return;
  struct source {
    locus::index_t size() const { return 4; }
    locus::index_t features() const { return 2; }
    std::int64_t load(locus::index_t i, std::span<float> x) const {
      x[0] = x[1] = static_cast<float>(i);
      return i;
    }
  } src;
  CHECK_THROWS_AS((locus::data::loader<locus::cuda, source>(src, {.batch_size = 2})), locus::cuda_error);
}
#endif
