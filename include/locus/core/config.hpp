// Build configuration: whether CUDA is compiled in, which compiler is reading this
// file, and the few macros every other header needs. Everything that differs between
// a g++/clang++ translation unit and an nvcc one is decided here, once.
#pragma once

#include <cstddef>
#include <cstdint>

// LOCUS_ENABLE_CUDA is set by the CMake target (1 when the CUDA toolkit was found).
// A user without CMake may define it by hand; without it, CUDA is compiled in when
// the CUDA runtime header can be found.
#ifndef LOCUS_ENABLE_CUDA
#  if defined(__CUDACC__) || __has_include(<cuda_runtime_api.h>)
#    define LOCUS_ENABLE_CUDA 1
#  else
#    define LOCUS_ENABLE_CUDA 0
#  endif
#endif

#if LOCUS_ENABLE_CUDA
#  define LOCUS_HAS_CUDA 1
#else
#  define LOCUS_HAS_CUDA 0
#endif

// True while nvcc (or clang in CUDA mode) compiles this translation unit: only then
// can a kernel be launched.
#if defined(__CUDACC__)
#  define LOCUS_CUDA_COMPILER 1
#else
#  define LOCUS_CUDA_COMPILER 0
#endif

#if defined(__CUDACC__)
#  define LOCUS_HOST_DEVICE __host__ __device__
#  define LOCUS_DEVICE __device__
#else
#  define LOCUS_HOST_DEVICE
#  define LOCUS_DEVICE
#endif

#define LOCUS_VERSION_MAJOR 0
#define LOCUS_VERSION_MINOR 1
#define LOCUS_VERSION_PATCH 0

namespace locus {

/// Extents and indices are signed 64-bit: a negative extent is a detectable error
/// instead of a huge unsigned size.
using index_t = std::int64_t;

namespace detail {
template <class...>
inline constexpr bool always_false = false;
template <auto...>
inline constexpr bool always_false_v = false;
}  // namespace detail

}  // namespace locus
