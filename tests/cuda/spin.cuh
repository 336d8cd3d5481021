// A kernel that keeps a stream busy for a while (the GPU's global timer), so that work
// enqueued after it is observably not done yet: the CUDA suite's tool for testing
// stream ordering (test_async.cu, test_streams.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <locus/backend/cuda/runtime.hpp>

namespace locus_test {

__global__ inline void spin_kernel(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

/// Keeps stream s busy for about `ms` milliseconds.
inline void spin(cudaStream_t s, int ms) {
  spin_kernel<<<1, 1, 0, s>>>(static_cast<unsigned long long>(ms) * 1000000ull);
  LOCUS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace locus_test
