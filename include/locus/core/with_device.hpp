// with_device(choice, f): the typed form of "cuda if available else cpu". The generic
// callable f is instantiated for each compiled-in device and called with the tag of
// the one chosen at run time, so the body is device-generic and still fully typed.
// LOCUS_DEVICE=cpu|cuda|auto in the environment overrides the program's choice.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "device.hpp"
#include "environment.hpp"
#include "error.hpp"

namespace locus {

enum class device_choice { automatic, cpu, cuda };

/// Parses "auto", "cpu" or "cuda" (as given to --device or LOCUS_DEVICE).
inline device_choice parse_device_choice(std::string_view s) {
  if (s == "auto" || s == "automatic") return device_choice::automatic;
  if (s == "cpu") return device_choice::cpu;
  if (s == "cuda" || s == "gpu") return device_choice::cuda;
  throw error("locus: unknown device '" + std::string(s) + "'; expected auto, cpu or cuda");
}

inline std::string_view to_string(device_choice c) noexcept {
  switch (c) {
    case device_choice::cpu: return "cpu";
    case device_choice::cuda: return "cuda";
    default: return "auto";
  }
}

/// The device a choice resolves to here: LOCUS_DEVICE (if set) replaces the
/// requested choice; automatic becomes cuda when a CUDA device is usable, else cpu.
/// Forcing cuda without a usable device throws locus::error saying why.
inline device_choice resolve_device(device_choice requested) {
  device_choice c = requested;
  if (const char* env = std::getenv("LOCUS_DEVICE"); env && *env) c = parse_device_choice(env);
  if (c == device_choice::automatic) return cuda_available() ? device_choice::cuda : device_choice::cpu;
  if (c == device_choice::cuda && !cuda_available())
    throw error("locus: cuda was requested but no CUDA device is usable (" +
                environment().cuda_status + "); choose cpu or auto");
  return c;
}

/// Calls f(locus::cuda{}) or f(locus::cpu{}) according to resolve_device(choice).
/// f is instantiated for every compiled-in device, so both branches must compile and
/// return the same type.
template <class F>
decltype(auto) with_device(device_choice choice, F&& f) {
  const device_choice c = resolve_device(choice);
#if LOCUS_HAS_CUDA
  using R = decltype(std::forward<F>(f)(cpu{}));
  static_assert(std::is_same_v<R, decltype(std::forward<F>(f)(cuda{}))>,
                "locus: with_device needs the callable to return the same type for cpu and "
                "cuda; return a value that does not depend on the device (or void)");
  if (c == device_choice::cuda) return std::forward<F>(f)(cuda{});
#else
  (void)c;
#endif
  return std::forward<F>(f)(cpu{});
}

}  // namespace locus
