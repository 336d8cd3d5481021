// doctor: what can this machine run? Prints locus's environment report: CUDA
// compiled in or not, runtime and driver versions (or why there is no driver), the
// devices, and whether pinned memory is really page-locked.
#include <locus/locus.hpp>

#include <cstdio>

int main() {
  const auto env = locus::environment();
  std::fputs(env.to_string().c_str(), stdout);
  if (!env.cuda_usable() && env.cuda_compiled)
    std::printf("\nThe CUDA code paths are compiled in but cannot run here: %s.\n"
                "Everything on locus::cpu (and locus::pinned) still runs.\n",
                env.cuda_status.c_str());
  return 0;
}
