// The CUDA runtime, seen through locus: the checked-call macro, the current stream
// of this thread, and helpers that turn runtime error codes into locus exceptions.
// Host compilers may include this file (these are plain runtime API calls); it is
// only included when CUDA is compiled in.
#pragma once

#include "../../core/config.hpp"

#if !LOCUS_HAS_CUDA
#error "locus: backend/cuda/runtime.hpp needs a build with CUDA (LOCUS_ENABLE_CUDA=1)"
#endif

#include <cuda_runtime_api.h>

#include "../../core/error.hpp"

/// Checks a CUDA runtime call; throws locus::cuda_error with the call, file, line
/// and the runtime's text.
#define LOCUS_CUDA_CHECK(call)                                                          \
  do {                                                                                \
    const cudaError_t locus_cuda_check_status_ = (call);                              \
    if (locus_cuda_check_status_ != cudaSuccess) {                                    \
      (void)cudaGetLastError();                                                       \
      throw ::locus::cuda_error(#call, __FILE__, __LINE__,                            \
                                static_cast<int>(locus_cuda_check_status_),           \
                                cudaGetErrorString(locus_cuda_check_status_));        \
    }                                                                                 \
  } while (false)

namespace locus::detail {

/// The stream new work on `cuda` goes to, per host thread. The legacy default stream
/// until a stream_guard says otherwise.
inline cudaStream_t& current_stream_ref() noexcept {
  thread_local cudaStream_t s = nullptr;
  return s;
}
inline cudaStream_t current_stream() noexcept { return current_stream_ref(); }

inline int current_device() {
  int d = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

}  // namespace locus::detail
