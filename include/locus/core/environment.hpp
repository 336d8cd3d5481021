// What this process can use, found out up front: whether CUDA was compiled in, the
// runtime and driver versions (or the reason there is no driver: "CUDA driver version
// is insufficient for CUDA runtime version" is reported here, not discovered
// mid-run), the devices with their names, compute capabilities and memory, and
// whether pinned memory is really page-locked. cuda_available() is the one-bit answer.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
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
  std::size_t free_memory_bytes = 0;
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
  bool openmp = false;
  int host_threads = 1;

  [[nodiscard]] bool cuda_usable() const noexcept { return device_count > 0; }
  [[nodiscard]] std::string to_string() const;
};

namespace detail {
inline std::string version_string(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
}  // namespace detail

/// Queries the CUDA runtime and driver (when compiled in). Never throws for a missing
/// driver or device: that is reported in cuda_status.
inline environment_report environment() {
  environment_report r;
#if defined(_OPENMP)
  r.openmp = true;
#endif
#if defined(__unix__) || defined(__APPLE__)
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  r.host_threads = cpus > 0 ? static_cast<int>(cpus) : 1;
#endif
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
  r.device_count = n;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    cuda_device_info d;
    d.index = i;
    d.name = p.name;
    d.compute_major = p.major;
    d.compute_minor = p.minor;
    d.total_memory_bytes = p.totalGlobalMem;
    d.multiprocessors = p.multiProcessorCount;
    int prev = 0;
    if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(i) == cudaSuccess) {
      std::size_t fr = 0, tot = 0;
      if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) d.free_memory_bytes = fr;
      (void)cudaSetDevice(prev);
    }
    (void)cudaGetLastError();
    r.devices.push_back(std::move(d));
  }
  {
    // Find out whether page-locking works by asking for one small pinned block.
    auto& a = detail::allocator_for<pinned>();
    void* p = a.allocate(1);
    a.deallocate(p);
    r.pinned_page_locked = !a.stats().fallback;
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
           out_of_memory::format_bytes(d.free_memory_bytes) + " free\n";
    }
    line(o, "pinned memory:   ", pinned_page_locked ? "page-locked (cudaHostAlloc)"
                                                    : "fallback to pageable host memory (no usable driver)");
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
