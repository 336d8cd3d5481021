// A program that uses locus itself and calls libmodel, a shared library built with
// -fvisibility=hidden that uses locus inside (model.h: no locus type crosses the API).
// It checks which of locus's process-wide state the two share (docs/building.md,
// "Shared libraries"):
//   - shared (LOCUS_TEST_EXPECT_SHARED=1, locus's default): the allocators, with their
//     statistics and memory limits, and the fault injector, are one per process;
//   - private (=0, the library built with LOCUS_SHARED_STATE defined empty): the
//     library has its own allocators and fault injector;
//   - in both: the f32 matmul precision and the host GEMM choice are per DSO, OpenMP's
//     settings are the process's (one libgomp).
#include "model.h"

#include <locus/locus.hpp>

#include <omp.h>

#include <cstdio>
#include <limits>

#ifndef LOCUS_TEST_EXPECT_SHARED
#error "define LOCUS_TEST_EXPECT_SHARED to 0 or 1"
#endif

namespace {
int failures = 0;
void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}
using C = locus::cpu;
std::size_t allocated() { return locus::memory_stats<C>().allocated_bytes; }
}  // namespace

int main() {
  constexpr bool shared = LOCUS_TEST_EXPECT_SHARED;
  std::printf("dso: expecting %s allocators\n", shared ? "shared" : "private");

  // The program computes with locus itself, and keeps a tensor alive throughout.
  auto a = locus::arange<double, C>(10);
  check(locus::sum(a).item() == 45.0, "the program computes on the cpu (sum 0..9 = 45)");
  const double mse = model_train(300);
  std::printf("      the library's model: mse %g after 300 steps\n", mse);
  check(mse >= 0 && mse < 0.01, "the library trains its model (mse below 0.01)");

  check((model_cpu_allocator_identity() == &locus::detail::allocator_for<C>()) == shared,
        shared ? "one cpu allocator object in the process" : "the library has its own cpu allocator object");

  // Statistics: a 1000-float tensor is 4032 bytes (64-byte rounding) to whichever
  // allocator made it.
  const std::size_t mine = allocated(), theirs = model_cpu_allocated_bytes();
  check(model_hold(1000) == 0, "the library holds a 1000-float tensor");
  check(allocated() - mine == (shared ? 4032u : 0u),
        shared ? "the program's memory_stats<cpu>() count the library's tensor"
               : "the program's memory_stats<cpu>() do not see the library's tensor");
  check(model_cpu_allocated_bytes() - theirs == 4032u, "the library's memory_stats<cpu>() count it");
  model_release();
  check(allocated() == mine && model_cpu_allocated_bytes() == theirs, "both counts return after the release");

  // Memory limit set by the program.
  locus::set_memory_limit<C>(allocated() + 1024);
  check((model_cpu_limit_bytes() == allocated() + 1024) == shared,
        shared ? "the library sees the program's memory limit" : "the library does not see the program's memory limit");
  const int held_over_limit = model_hold(1 << 20);
  if (held_over_limit) std::printf("      library: %s\n", model_last_error());
  check(held_over_limit == (shared ? 1 : 0),
        shared ? "a 4 MiB tensor in the library is refused by the program's limit"
               : "a 4 MiB tensor in the library ignores the program's limit");
  model_release();
  locus::set_memory_limit<C>(std::numeric_limits<std::size_t>::max());

  // The fault injector armed by the program: the next allocation anywhere.
  locus::fault::fail_allocation(1);
  const int held_with_fault = model_hold(16);
  if (held_with_fault) std::printf("      library: %s\n", model_last_error());
  check(held_with_fault == (shared ? 1 : 0),
        shared ? "the program's armed fault fails the library's next allocation"
               : "the program's armed fault does not reach the library");
  check(model_fault_fired() == (shared ? 1 : 0) && locus::fault::fired() == shared,
        shared ? "both see the fault fired" : "neither sees it fired");
  locus::fault::fail_allocation(0);
  model_release();

  // Per DSO in both modes: settings kept in locus's other function-local statics.
  locus::set_float32_matmul_precision(locus::matmul_precision::high);
  check(model_matmul_precision_high() == 0,
        "set_float32_matmul_precision in the program does not reach the library (per DSO)");
  locus::set_float32_matmul_precision(locus::matmul_precision::highest);
  const int library_gemm = model_host_gemm();
  const auto other = library_gemm == static_cast<int>(locus::host_gemm::fallback) ? locus::detail::best_host_gemm()
                                                                                   : locus::host_gemm::fallback;
  if (static_cast<int>(other) != library_gemm) {
    locus::set_host_gemm(other);
    check(model_host_gemm() == library_gemm, "set_host_gemm in the program does not reach the library (per DSO)");
  } else {
    std::printf("      (this build has only the fallback GEMM: the host GEMM choice cannot differ)\n");
  }

  // OpenMP: one runtime in the process.
  omp_set_num_threads(3);
  check(model_omp_max_threads() == 3, "omp_set_num_threads in the program reaches the library (one libgomp)");

  std::printf("dso: %d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
