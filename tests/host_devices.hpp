// The devices the host suite runs its device-generic bodies on: cpu, and pinned when
// the build has CUDA compiled in (LOCUS_ENABLE_CUDA=OFF builds have no pinned device:
// naming it is a compile error there). Include before a generic/*_cases.hpp file.
#pragma once

#include <locus/core/config.hpp>
#include <locus/core/device.hpp>

#if LOCUS_HAS_CUDA
#  define LOCUS_TEST_DEVICES locus::cpu, locus::pinned
#else
#  define LOCUS_TEST_DEVICES locus::cpu
#endif

namespace locus_test {
/// Host memory a loader stages into: pinned where it exists, else cpu.
#if LOCUS_HAS_CUDA
using staging = locus::pinned;
#else
using staging = locus::cpu;
#endif
}  // namespace locus_test
