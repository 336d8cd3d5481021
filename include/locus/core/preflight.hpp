// Preflight: the GPU against the program, before the first launch. The failures every
// GPU guide lists come at the first kernel, with a message that does not say what to
// change: "no kernel image is available for execution on the device" (the build's
// architectures do not include the card's), bf16 GEMMs on a card older than Ampere, "CUDA
// driver version is insufficient for CUDA runtime version". locus::preflight() finds each
// of them up front and names the fix:
//
//   locus::preflight<locus::bf16>(0);   // GPU 0 runs this program's kernels in bf16
//
// It is run by the trainer's constructor on cuda (for its model's GPU and compute
// dtype), and printed per GPU by the doctor example. preflight_check() is the rule
// itself, over an environment_report (locus::environment(), or one a test made up).
//
// The checks, in order (docs/gpus.md has the table of toolkits, drivers and cards):
// - a driver, and one for this runtime's CUDA major version: a driver for CUDA 12.x
//   cannot run a program built with CUDA 13 (cuda_error, cudaErrorInsufficientDriver,
//   naming the driver versions needed). An older minor version of the same major runs
//   (CUDA's minor version compatibility) and is reported as a note: PTX the newer
//   toolkit wrote cannot be JIT-compiled by it.
// - the GPU exists (device_error naming the GPUs there are).
// - the card's compute capability against the architectures compiled in (nvcc's
//   __CUDA_ARCH_LIST__ in the translation unit that calls preflight, or the
//   LOCUS_CUDA_ARCHITECTURES definition a host-compiled file gets from CMake): a card
//   older than every architecture of the build has no kernel image (cuda_error,
//   cudaErrorNoKernelImageForDevice, naming the card's architecture and the
//   CMAKE_CUDA_ARCHITECTURES to build with). A card of a newer major version than every
//   architecture runs through PTX JIT when the build embedded PTX (CMake's default for a
//   plain number such as 90): a note, since the first launch then compiles for minutes.
//   Where the list is unknown (a host-compiled file without the definition), a note.
// - the compute dtype against the card: bf16 needs compute capability 8.0 (cuBLASLt's
//   bf16 GEMMs, the bf16 arithmetic of the kernels): cuda_error, cudaErrorNotSupported,
//   naming fp16 with a grad scaler as the alternative; fp16 below 7.0 has no tensor
//   cores: a note (it runs, slower).
#pragma once

#include <algorithm>
#include <array>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "config.hpp"
#include "environment.hpp"
#include "error.hpp"
#include "half.hpp"

namespace locus {

/// The precision the GPU's kernels compute in (the policy's compute dtype).
enum class gpu_precision { fp32, fp64, fp16, bf16 };

template <class C>
inline constexpr gpu_precision gpu_precision_of = std::is_same_v<C, bf16>   ? gpu_precision::bf16
                                                  : std::is_same_v<C, f16>  ? gpu_precision::fp16
                                                  : std::is_same_v<C, double> ? gpu_precision::fp64
                                                                              : gpu_precision::fp32;

/// What preflight found for one GPU that is not an error.
struct preflight_result {
  int gpu = 0;
  std::string name;            ///< the card's name
  int compute_capability = 0;  ///< as nvcc writes architectures: 900 for 9.0, 860 for 8.6
  std::vector<std::string> notes;  ///< runs, but read this (PTX JIT, minor driver, no tensor cores)
};

namespace detail {
inline std::string arch_name(int a) { return "sm_" + std::to_string(a / 10); }
inline std::string capability_string(int a) { return std::to_string(a / 100) + "." + std::to_string((a / 10) % 10); }

/// The oldest Linux driver for a CUDA major version, as NVIDIA's release notes give it
/// (docs/gpus.md), or "" for one locus does not know.
inline const char* driver_for_major(int major) {
  switch (major) {
    case 11: return "450.80.02";
    case 12: return "525.60.13";
    case 13: return "580.65.06";
    default: return "";
  }
}

/// The architectures compiled into the translation unit, as a type (so that files with
/// other lists instantiate preflight separately): nvcc's __CUDA_ARCH_LIST__ (e.g. 750,900),
/// else LOCUS_CUDA_ARCHITECTURES (CMake sets it for host-compiled files), else none known.
template <int... A>
struct cuda_arch_list {
  static constexpr std::array<int, sizeof...(A)> values{A...};
};
#if defined(__CUDA_ARCH_LIST__)
using this_file_cuda_archs = cuda_arch_list<__CUDA_ARCH_LIST__>;
#elif defined(LOCUS_CUDA_ARCHITECTURES)
using this_file_cuda_archs = cuda_arch_list<LOCUS_CUDA_ARCHITECTURES>;
#else
using this_file_cuda_archs = cuda_arch_list<>;
#endif

inline std::string arch_list_string(std::span<const int> archs) {
  std::string s;
  for (std::size_t i = 0; i < archs.size(); ++i) s += (i ? ", " : "") + arch_name(archs[i]);
  return s;
}
}  // namespace detail

/// The preflight rule (see the header): GPU `gpu` of `env` runs kernels compiled for
/// `archs` (nvcc's numbers: 750, 900; empty: not known) in precision `p`. Throws a
/// cuda_error or device_error naming what to change; returns the notes otherwise.
inline preflight_result preflight_check(const environment_report& env, int gpu, gpu_precision p,
                                        std::span<const int> archs) {
  using detail::version_string;
  preflight_result r;
  r.gpu = gpu;
  if (!env.cuda_compiled)
    throw device_error("locus: preflight of GPU " + std::to_string(gpu) +
                       ": this program was built without CUDA (LOCUS_ENABLE_CUDA=0); rebuild with the CUDA toolkit");
  const int runtime_major = env.runtime_version / 1000;
  if (env.driver_version <= 0) {
    const std::string need = detail::driver_for_major(runtime_major);
    throw cuda_error("locus: preflight: no NVIDIA driver is loaded (" + env.cuda_status + "); this program's CUDA " +
                         version_string(env.runtime_version) + " runtime needs a driver for CUDA " +
                         std::to_string(runtime_major) + ".0 or newer" +
                         (need.empty() ? std::string() : " (Linux: " + need + " or newer)") +
                         "; install it, or run on the CPU (--device cpu, locus::cpu)",
                     35 /* cudaErrorInsufficientDriver */);
  }
  const int driver_major = env.driver_version / 1000;
  if (driver_major < runtime_major) {
    const std::string need = detail::driver_for_major(runtime_major);
    throw cuda_error("locus: preflight: the NVIDIA driver supports CUDA " + version_string(env.driver_version) +
                         " but this program was built with CUDA " + version_string(env.runtime_version) +
                         " (\"CUDA driver version is insufficient for CUDA runtime version\"); install a driver for "
                         "CUDA " + std::to_string(runtime_major) + ".0 or newer" +
                         (need.empty() ? std::string() : " (Linux: " + need + " or newer)") +
                         ", or build with a CUDA " + std::to_string(driver_major) +
                         ".x toolkit (docs/gpus.md lists the pairs)",
                     35 /* cudaErrorInsufficientDriver */);
  }
  if (env.driver_version < env.runtime_version)
    r.notes.push_back("the driver supports CUDA " + version_string(env.driver_version) + ", older than the " +
                      version_string(env.runtime_version) +
                      " runtime: it runs (minor version compatibility), but PTX from the newer toolkit cannot be "
                      "JIT-compiled; a driver for CUDA " + version_string(env.runtime_version) + " removes the limit");
  const cuda_device_info* dev = nullptr;
  for (const auto& d : env.devices)
    if (d.index == gpu) dev = &d;
  if (dev == nullptr || gpu < 0)
    throw device_error("locus: preflight of GPU " + std::to_string(gpu) + ", which does not exist: this process sees " +
                           std::to_string(env.device_count) + " GPU" + (env.device_count == 1 ? "" : "s") +
                           (env.device_count > 0 ? ", numbered 0 to " + std::to_string(env.device_count - 1) : "") +
                           " (" + env.cuda_status + "; CUDA_VISIBLE_DEVICES applies)",
                       gpu, -1);
  r.name = dev->name;
  const int cc = dev->compute_major * 100 + dev->compute_minor * 10;
  r.compute_capability = cc;
  const std::string card = "GPU " + std::to_string(gpu) + " (" + dev->name + ", compute capability " +
                           detail::capability_string(cc) + ")";
  if (archs.empty()) {
    r.notes.push_back("the architectures compiled into this program are not known here (a file the host compiler "
                      "built, without LOCUS_CUDA_ARCHITECTURES); the CUDA code's own preflight checks them");
  } else {
    const int oldest = *std::min_element(archs.begin(), archs.end());
    int newest_major = 0;
    bool same_major = false;
    for (int a : archs) {
      newest_major = std::max(newest_major, a / 100);
      same_major = same_major || (a / 100 == cc / 100 && a <= cc);
    }
    if (cc < oldest)
      throw cuda_error("locus: preflight: " + card + " cannot run this program: it was compiled for " +
                           detail::arch_list_string(archs) + " only, all newer than the card (at the first launch: "
                           "\"no kernel image is available for execution on the device\"); build with "
                           "-DCMAKE_CUDA_ARCHITECTURES=\"" + std::to_string(cc / 10) + "\" (or \"native\" for the "
                           "cards of this machine), or add " + std::to_string(cc / 10) +
                           " to the list; docs/gpus.md lists what each toolkit supports",
                       209 /* cudaErrorNoKernelImageForDevice */);
    if (!same_major)
      r.notes.push_back(card + " has no machine code in this build (" + detail::arch_list_string(archs) +
                        "): it runs only through PTX JIT, when the build embedded PTX, and the first launch compiles "
                        "every kernel; add " + std::to_string(cc / 10) + " to CMAKE_CUDA_ARCHITECTURES");
  }
  if (p == gpu_precision::bf16 && cc < 800)
    throw cuda_error("locus: preflight: " + card + " has no bf16 support (it needs compute capability 8.0, Ampere, "
                         "or newer): train in fp16 with a grad scaler (locus::amp::fp16_mixed and "
                         "locus::amp::grad_scaler; the main job: --precision fp16), or in fp32",
                     801 /* cudaErrorNotSupported */);
  if (p == gpu_precision::fp16 && cc < 700)
    r.notes.push_back(card + " has no tensor cores (compute capability 7.0): fp16 runs, but its GEMMs are not faster "
                      "than fp32");
  return r;
}

/// The mixed precision to train in on this card: bf16 from compute capability 8.0
/// (Ampere) on, fp16 with a grad scaler before it (the main job's default on cuda).
[[nodiscard]] inline gpu_precision mixed_precision_for(const cuda_device_info& d) noexcept {
  return d.compute_major >= 8 ? gpu_precision::bf16 : gpu_precision::fp16;
}

#if LOCUS_HAS_CUDA
namespace detail {
/// The report preflight needs for one GPU, from cheap runtime queries (versions and two
/// attributes: no device enumeration through the driver table, no pinned probe).
inline environment_report gpu_report(int gpu) {
  environment_report r;
  (void)cudaRuntimeGetVersion(&r.runtime_version);
  (void)cudaDriverGetVersion(&r.driver_version);
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess) {
    (void)cudaGetLastError();
    r.cuda_status = cudaGetErrorString(st);
    return r;
  }
  r.cuda_status = n > 0 ? "ok" : "no CUDA device found";
  r.device_count = n;
  if (gpu < 0 || gpu >= n) return r;
  cuda_device_info d;
  if (!describe_device_runtime(gpu, d)) {
    r.cuda_status = "the runtime could not describe GPU " + std::to_string(gpu);
    return r;
  }
  r.devices.push_back(std::move(d));
  return r;
}
}  // namespace detail

/// Checks GPU `gpu` (-1: the current one) against this program for kernels computing
/// in C (float, double, locus::bf16, locus::f16): see the header. Throws cuda_error or
/// device_error with the fix; returns the notes. Creates no context.
template <class C = float, class Archs = detail::this_file_cuda_archs>
preflight_result preflight(int gpu = -1) {
  if (gpu < 0 && gpu != -1)
    throw device_error("locus: preflight of GPU " + std::to_string(gpu) + ": a GPU index is >= 0 (-1: the current GPU)",
                       gpu, -1);
  if (gpu == -1) gpu = detail::current_device();
  return preflight_check(detail::gpu_report(gpu), gpu, gpu_precision_of<C>, std::span<const int>(Archs::values));
}
#endif

}  // namespace locus
