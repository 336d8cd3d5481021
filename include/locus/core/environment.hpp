// What this process can use, found out up front: whether CUDA was compiled in, the
// runtime and driver versions (or the reason there is no driver: "CUDA driver version
// is insufficient for CUDA runtime version" is reported here, not discovered
// mid-run), the devices with their names, compute capabilities and memory, and
// whether pinned memory is really page-locked. cuda_available() is the one-bit answer.
//
// No GPU context is created. A context costs about 0.5 GB of device memory, and a job
// that calls environment() at start (every rank of a multi-GPU job) must not leave one
// on every GPU. The devices are listed through the driver API (cuDeviceGetName,
// cuDeviceTotalMem, cuDeviceGetAttribute: device queries that need cuInit, not a
// context), reached through cudaGetDriverEntryPointByVersion so that nothing links
// libcuda directly. Free memory is reported only for a device whose primary context
// already exists (cuDevicePrimaryCtxGetState): that context is made current for the
// one cuMemGetInfo call and then popped; for the others free_memory_known is false.
// Whether pinned memory is page-locked is found out by allocating a small pinned
// block (cudaHostAlloc needs a context) only where that creates none: without a
// usable device, or when the current device's context already exists; otherwise
// pinned_page_locked says what a usable driver gives (page-locked) and pinned_probed
// is false.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include "config.hpp"
#include "../memory/allocator.hpp"

#if LOCUS_HAS_CUDA
#include "../backend/cuda/runtime.hpp"
#endif

namespace locus {

struct cuda_device_info {
  int index = 0;
  std::string name;
  int compute_major = 0, compute_minor = 0;
  std::size_t total_memory_bytes = 0;
  std::size_t free_memory_bytes = 0;  ///< 0 unless free_memory_known
  bool free_memory_known = false;     ///< the device's context existed (see the header)
  int multiprocessors = 0;
};

struct environment_report {
  bool cuda_compiled = LOCUS_HAS_CUDA != 0;
  int runtime_version = 0;   ///< e.g. 13000 for 13.0; 0 without CUDA
  int driver_version = 0;    ///< 0 when there is no driver
  std::string cuda_status;   ///< "ok", or why CUDA cannot be used
  int device_count = 0;
  std::vector<cuda_device_info> devices;
  bool pinned_page_locked = false;  ///< pinned memory is page-locked (not the fallback)
  bool pinned_probed = false;       ///< pinned_page_locked was found by an allocation
  bool openmp = false;
  int host_threads = 1;
  std::string omp_wait_policy;  ///< OMP_WAIT_POLICY as set, or empty when unset
  double load_average = -1.0;   ///< the 1-minute load average, or -1 when unknown

  /// Whether OpenMP threads will spin while the machine is busy (more runnable
  /// processes than hardware threads): then libgomp's spinning waits steal the cores
  /// from the threads doing work, and training runs several times slower.
  [[nodiscard]] bool spinning_on_busy_machine() const noexcept {
    const bool passive = omp_wait_policy == "PASSIVE" || omp_wait_policy == "passive";
    return openmp && !passive && load_average > static_cast<double>(host_threads);
  }

  [[nodiscard]] bool cuda_usable() const noexcept { return device_count > 0; }
  [[nodiscard]] std::string to_string() const;
};

namespace detail {
inline std::string version_string(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

#if LOCUS_HAS_CUDA
/// The driver API functions environment() uses, as function pointers: loaded from the
/// driver (load_cu_driver), or made-up ones in the host suite (the seam). The types
/// are spelled without <cuda.h> (a large header in every user file): CUresult is an
/// int-sized enum (0 = success), CUdevice an int, CUcontext a pointer.
struct cu_driver {
  int (*device_get)(int*, int) = nullptr;                          // cuDeviceGet
  int (*device_get_name)(char*, int, int) = nullptr;               // cuDeviceGetName
  int (*device_total_mem)(std::size_t*, int) = nullptr;            // cuDeviceTotalMem_v2
  int (*device_get_attribute)(int*, int, int) = nullptr;           // cuDeviceGetAttribute
  int (*primary_ctx_get_state)(int, unsigned*, int*) = nullptr;    // cuDevicePrimaryCtxGetState
  int (*primary_ctx_retain)(void**, int) = nullptr;                // cuDevicePrimaryCtxRetain
  int (*primary_ctx_release)(int) = nullptr;                       // cuDevicePrimaryCtxRelease_v2
  int (*ctx_push_current)(void*) = nullptr;                        // cuCtxPushCurrent_v2
  int (*ctx_pop_current)(void**) = nullptr;                        // cuCtxPopCurrent_v2
  int (*mem_get_info)(std::size_t*, std::size_t*) = nullptr;       // cuMemGetInfo_v2

  [[nodiscard]] bool complete() const noexcept {
    return device_get && device_get_name && device_total_mem && device_get_attribute &&
           primary_ctx_get_state && primary_ctx_retain && primary_ctx_release && ctx_push_current &&
           ctx_pop_current && mem_get_info;
  }
};

inline constexpr int cu_attribute_multiprocessors = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
inline constexpr int cu_attribute_cc_major = 75;         // ..._COMPUTE_CAPABILITY_MAJOR
inline constexpr int cu_attribute_cc_minor = 76;         // ..._COMPUTE_CAPABILITY_MINOR

/// The driver's functions (the CUDA 12.0 versions of each symbol); an incomplete
/// table when the driver cannot give them.
inline cu_driver load_cu_driver() {
  cu_driver d;
  const auto get = [](const char* name, auto& fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t st = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t st = cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &found);
#endif
    if (st != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  get("cuDeviceGet", d.device_get);
  get("cuDeviceGetName", d.device_get_name);
  get("cuDeviceTotalMem", d.device_total_mem);
  get("cuDeviceGetAttribute", d.device_get_attribute);
  get("cuDevicePrimaryCtxGetState", d.primary_ctx_get_state);
  get("cuDevicePrimaryCtxRetain", d.primary_ctx_retain);
  get("cuDevicePrimaryCtxRelease", d.primary_ctx_release);
  get("cuCtxPushCurrent", d.ctx_push_current);
  get("cuCtxPopCurrent", d.ctx_pop_current);
  get("cuMemGetInfo", d.mem_get_info);
  return d;
}

/// Device `ordinal` described by the runtime's cudaGetDeviceProperties (free memory
/// unknown); false when the runtime refuses. environment()'s fallback for a driver
/// without the entry points, and preflight's one-device query.
inline bool describe_device_runtime(int ordinal, cuda_device_info& d) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, ordinal) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  d.index = ordinal;
  d.name = p.name;
  d.compute_major = p.major;
  d.compute_minor = p.minor;
  d.total_memory_bytes = p.totalGlobalMem;
  d.multiprocessors = p.multiProcessorCount;
  return true;
}

/// Whether device `ordinal`'s primary context exists (false when the driver cannot say).
inline bool primary_context_active(const cu_driver& drv, int ordinal) {
  int dev = 0, active = 0;
  unsigned flags = 0;
  return drv.complete() && drv.device_get(&dev, ordinal) == 0 &&
         drv.primary_ctx_get_state(dev, &flags, &active) == 0 && active != 0;
}

/// Device `ordinal` described through the driver table, creating no context; false
/// when the driver refuses a query.
inline bool describe_device(const cu_driver& drv, int ordinal, cuda_device_info& out) {
  if (!drv.complete()) return false;
  int dev = 0;
  if (drv.device_get(&dev, ordinal) != 0) return false;
  char name[256] = {};
  std::size_t total = 0;
  int major = 0, minor = 0, sms = 0;
  if (drv.device_get_name(name, static_cast<int>(sizeof name) - 1, dev) != 0 ||
      drv.device_total_mem(&total, dev) != 0 ||
      drv.device_get_attribute(&major, cu_attribute_cc_major, dev) != 0 ||
      drv.device_get_attribute(&minor, cu_attribute_cc_minor, dev) != 0 ||
      drv.device_get_attribute(&sms, cu_attribute_multiprocessors, dev) != 0)
    return false;
  out.index = ordinal;
  out.name = name;
  out.compute_major = major;
  out.compute_minor = minor;
  out.total_memory_bytes = total;
  out.multiprocessors = sms;
  out.free_memory_bytes = 0;
  out.free_memory_known = false;
  unsigned flags = 0;
  int active = 0;
  if (drv.primary_ctx_get_state(dev, &flags, &active) == 0 && active != 0) {
    // Retaining a context that exists only counts a reference; push it for one query.
    void* ctx = nullptr;
    if (drv.primary_ctx_retain(&ctx, dev) == 0) {
      if (drv.ctx_push_current(ctx) == 0) {
        std::size_t fr = 0, tot = 0;
        if (drv.mem_get_info(&fr, &tot) == 0) {
          out.free_memory_bytes = fr;
          out.free_memory_known = true;
        }
        void* popped = nullptr;
        (void)drv.ctx_pop_current(&popped);
      }
      (void)drv.primary_ctx_release(dev);
    }
  }
  return true;
}
#endif
}  // namespace detail

/// Queries the CUDA runtime and driver (when compiled in), creating no GPU context
/// (see the header). Never throws for a missing driver or device: that is reported in
/// cuda_status.
inline environment_report environment() {
  environment_report r;
#if defined(_OPENMP)
  r.openmp = true;
#endif
#if defined(__unix__) || defined(__APPLE__)
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  r.host_threads = cpus > 0 ? static_cast<int>(cpus) : 1;
  double load[1];
  if (::getloadavg(load, 1) == 1) r.load_average = load[0];
#endif
  if (const char* w = std::getenv("OMP_WAIT_POLICY")) r.omp_wait_policy = w;
#if LOCUS_HAS_CUDA
  (void)cudaRuntimeGetVersion(&r.runtime_version);
  (void)cudaDriverGetVersion(&r.driver_version);
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess) {
    (void)cudaGetLastError();
    r.cuda_status = cudaGetErrorString(st);
    n = 0;
  } else if (n == 0) {
    r.cuda_status = "no CUDA device found";
  } else {
    r.cuda_status = "ok";
  }
  const detail::cu_driver drv = n > 0 ? detail::load_cu_driver() : detail::cu_driver{};
  for (int i = 0; i < n; ++i) {
    cuda_device_info d;
    if (!drv.complete()) {
      // A driver without these entry points: the runtime's device query (it reads
      // device attributes; free memory stays unknown).
      if (!detail::describe_device_runtime(i, d)) continue;
    } else if (!detail::describe_device(drv, i, d)) {
      continue;
    }
    r.devices.push_back(std::move(d));
  }
  r.device_count = static_cast<int>(r.devices.size());
  if (r.device_count < n)
    r.cuda_status = "the driver did not describe " + std::to_string(n - r.device_count) + " of " +
                    std::to_string(n) + " devices (cuDeviceGet* through cudaGetDriverEntryPointByVersion)";
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) {
    (void)cudaGetLastError();
    current = 0;
  }
  if (r.device_count == 0 || detail::primary_context_active(drv, current)) {
    // Find out whether page-locking works by asking for one small page-locked block
    // (this creates no context: there is no device, or the current one has its
    // context). Directly, not through allocator_for<pinned>(): environment() is
    // compiled into every file, the caching allocator need not be (compile time).
    // The pinned allocator falls back to pageable memory on the same failure.
    void* p = nullptr;
    const cudaError_t st = cudaHostAlloc(&p, 1, cudaHostAllocDefault);
    if (st == cudaSuccess) {
      (void)cudaFreeHost(p);
    } else {
      (void)cudaGetLastError();
    }
    r.pinned_page_locked = st == cudaSuccess;
    r.pinned_probed = true;
  } else {
    r.pinned_page_locked = true;  // what cudaHostAlloc gives with a usable driver
  }
#else
  r.cuda_status = "CUDA not compiled in (LOCUS_ENABLE_CUDA=0)";
#endif
  return r;
}

inline std::string environment_report::to_string() const {
  // Plain string building: <sstream> would add a second to every user's compile.
  const auto line = [](std::string& o, const char* label, const std::string& value) {
    o += "  ";
    o += label;
    o += value;
    o += '\n';
  };
  std::string o = "locus " + std::to_string(LOCUS_VERSION_MAJOR) + '.' +
                  std::to_string(LOCUS_VERSION_MINOR) + '.' + std::to_string(LOCUS_VERSION_PATCH) + '\n';
  line(o, "host:            ", std::to_string(host_threads) + " hardware threads, OpenMP " + (openmp ? "on" : "off"));
  if (openmp) {
    char load[32] = "unknown";
    if (load_average >= 0) std::snprintf(load, sizeof load, "%.2f", load_average);
    line(o, "OpenMP waits:    ",
         (omp_wait_policy.empty() ? std::string("OMP_WAIT_POLICY unset (libgomp spins, then sleeps)")
                                  : "OMP_WAIT_POLICY=" + omp_wait_policy) +
             ", load average " + load);
    if (spinning_on_busy_machine())
      line(o, "warning:         ",
           "the machine is busy and OpenMP threads spin while they wait, which slows training several "
           "times; run with OMP_WAIT_POLICY=PASSIVE (scripts/run-main sets it)");
  }
  line(o, "CUDA compiled:   ", cuda_compiled ? "yes" : "no");
  if (cuda_compiled) {
    line(o, "CUDA runtime:    ", detail::version_string(runtime_version));
    line(o, "CUDA driver:     ", driver_version > 0 ? detail::version_string(driver_version) : "none");
    line(o, "CUDA status:     ", cuda_status);
    line(o, "CUDA devices:    ", std::to_string(device_count));
    for (const auto& d : devices) {
      o += "    [" + std::to_string(d.index) + "] " + d.name + ", compute capability " +
           std::to_string(d.compute_major) + '.' + std::to_string(d.compute_minor) + ", " +
           std::to_string(d.multiprocessors) + " SMs, " +
           out_of_memory::format_bytes(d.total_memory_bytes) + " total, " +
           (d.free_memory_known ? out_of_memory::format_bytes(d.free_memory_bytes) + " free\n"
                                : std::string("free memory not queried (no context yet)\n"));
    }
    line(o, "pinned memory:   ", !pinned_page_locked ? "fallback to pageable host memory (no usable driver)"
                               : pinned_probed     ? "page-locked (cudaHostAlloc)"
                                                   : "page-locked (cudaHostAlloc; not probed: no context yet)");
  } else {
    line(o, "CUDA status:     ", cuda_status);
  }
  line(o, "best device:     ", cuda_usable() ? "cuda" : "cpu");
  return o;
}

/// Streams the report (any stream type with operator<< for std::string).
template <class Stream>
  requires requires(Stream& os, const std::string& s) { os << s; }
Stream& operator<<(Stream& os, const environment_report& r) {
  os << r.to_string();
  return os;
}

/// Whether a CUDA device can be used by this process (checked once, then cached).
inline bool cuda_available() {
#if LOCUS_HAS_CUDA
  static const bool available = [] {
    int n = 0;
    const cudaError_t st = cudaGetDeviceCount(&n);
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return n > 0;
  }();
  return available;
#else
  return false;
#endif
}

}  // namespace locus
