// doctor: what can this machine run? Prints locus's environment report: CUDA
// compiled in or not, runtime and driver versions (or why there is no driver), the
// devices, whether pinned memory is really page-locked, OpenMP's wait policy against
// the machine's load, and which library runs f32 host GEMMs. Then the preflight of each
// GPU against this build (locus::preflight_check, core/preflight.hpp): its
// architectures (CMake passes CMAKE_CUDA_ARCHITECTURES as LOCUS_CUDA_ARCHITECTURES,
// since this file is host-compiled), the driver against the runtime, and which
// precisions the card runs (bf16 needs compute capability 8.0).
#include <locus/locus.hpp>

#include <cstdio>
#include <utility>

int main() {
  const auto env = locus::environment();
  std::fputs(env.to_string().c_str(), stdout);
  std::printf("  host GEMM (f32): %s (locus::set_host_gemm or LOCUS_HOST_GEMM chooses another)\n",
              locus::name_of(locus::current_host_gemm()));
  if (!env.cuda_usable() && env.cuda_compiled)
    std::printf("\nThe CUDA code paths are compiled in but cannot run here: %s.\n"
                "Everything on locus::cpu (and locus::pinned) still runs.\n",
                env.cuda_status.c_str());
  if (env.cuda_compiled && env.device_count == 0) {
    try {  // what preflight says (the driver needed, when there is none)
      (void)locus::preflight_check(env, 0, locus::gpu_precision::fp32, locus::detail::this_file_cuda_archs::values);
    } catch (const locus::error& e) {
      std::printf("preflight: %s\n", e.what());
    }
  }
  if (env.cuda_compiled && env.device_count > 0) {
    const auto& archs = locus::detail::this_file_cuda_archs::values;
    std::printf("\npreflight (this build: %s):\n",
                archs.empty() ? "architectures not known" : locus::detail::arch_list_string(archs).c_str());
    for (const auto& d : env.devices) {
      for (const auto& [p, name] : {std::pair{locus::gpu_precision::bf16, "bf16"}, std::pair{locus::gpu_precision::fp16, "fp16"},
                                   std::pair{locus::gpu_precision::fp32, "fp32"}}) {
        try {
          const auto r = locus::preflight_check(env, d.index, p, archs);
          std::printf("  GPU %d %s: ok%s\n", d.index, name, r.notes.empty() ? "" : " (notes below)");
          for (const auto& n : r.notes) std::printf("    note: %s\n", n.c_str());
        } catch (const locus::error& e) {
          std::printf("  GPU %d %s: %s\n", d.index, name, e.what());
        }
      }
    }
  }
  return 0;
}
