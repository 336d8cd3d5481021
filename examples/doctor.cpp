// doctor: what can this machine run? Prints locus's environment report: CUDA
// compiled in or not, runtime and driver versions (or why there is no driver), the
// devices, whether pinned memory is really page-locked, OpenMP's wait policy against
// the machine's load, and which library runs f32 host GEMMs.
#include <locus/locus.hpp>

#include <cstdio>

int main() {
  const auto env = locus::environment();
  std::fputs(env.to_string().c_str(), stdout);
  std::printf("  host GEMM (f32): %s (locus::set_host_gemm or LOCUS_HOST_GEMM chooses another)\n",
              locus::name_of(locus::current_host_gemm()));
  if (!env.cuda_usable() && env.cuda_compiled)
    std::printf("\nThe CUDA code paths are compiled in but cannot run here: %s.\n"
                "Everything on locus::cpu (and locus::pinned) still runs.\n",
                env.cuda_status.c_str());
  return 0;
}
