// to_dlpack's own deleter, wrapped to count its calls (tests/test_dlpack.cpp and
// tests/cuda/test_dlpack.cu): counted(m) swaps m's deleter for one that counts, then
// calls the original.
#pragma once

#include <dlpack/dlpack.h>

namespace locus_test {

inline int g_locus_deletes = 0;
inline void (*g_locus_deleter)(DLManagedTensor*) = nullptr;

inline void counting_locus_deleter(DLManagedTensor* self) {
  ++g_locus_deletes;
  g_locus_deleter(self);
}

inline DLManagedTensor* counted(DLManagedTensor* m) {
  g_locus_deleter = m->deleter;
  m->deleter = &counting_locus_deleter;
  return m;
}

}  // namespace locus_test
