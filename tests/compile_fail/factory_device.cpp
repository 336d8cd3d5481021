// expect: error: .*locus: tensor device must be locus::cpu, locus::pinned or locus::cuda
// Rule: a factory's device is one of locus's device tags; anything else is reported by
// the tensor's own message, not a candidate list.
#include <locus/locus.hpp>

struct gpu {};

#ifdef LOCUS_VIOLATION
using device = gpu;
#else
using device = locus::cpu;
#endif

int main() {
  auto r = locus::rand<float, device>({2, 3}, /*seed=*/1);
  return static_cast<int>(r.numel());
}
