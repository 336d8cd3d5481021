// Several GPUs in one process: which GPUs there are, which one is current, and moving a
// tensor to a given GPU. The device type `cuda` says "GPU memory"; which GPU is a
// run-time fact that every cuda tensor and view carries (device_index()), because the
// GPU of a data-parallel rank or of a `--device cuda:1` option is chosen at run time.
// Work on cuda launches on the current GPU; an operation whose operands live on another
// GPU, or on two, is a device_error before anything is launched (docs/DESIGN.md,
// "Device identity"). This header is part of <locus/locus.hpp> in builds with CUDA.
#pragma once

#include <cstdlib>
#include <string>

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../tensor/tensor.hpp"
#include "copy.hpp"

#if LOCUS_HAS_CUDA
#include "../backend/cuda/runtime.hpp"

namespace locus {

/// The GPUs this process sees (CUDA_VISIBLE_DEVICES applies); 0 without a driver or
/// without a GPU. Creates no context.
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

namespace detail {
/// A GPU index that exists in this process, or a device_error saying what does.
inline void check_gpu_index(int gpu, const char* what) {
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess) (void)cudaGetLastError();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string vis = visible ? std::string(" (CUDA_VISIBLE_DEVICES=\"") + visible + "\")" : std::string();
  if (st != cudaSuccess || n == 0)
    throw_device_error("locus: %s GPU %d, but this process sees no GPU%s: %s; locus::environment() and "
                       "build/default/examples/doctor say why",
                       what, gpu, vis.c_str(), st != cudaSuccess ? cudaGetErrorString(st) : "no CUDA device");
  if (gpu < 0 || gpu >= n)
    throw device_error(format("locus: %s GPU %d, which does not exist: this process sees %d GPU%s, numbered 0 "
                              "to %d%s",
                              what, gpu, n, n == 1 ? "" : "s", n - 1, vis.c_str()),
                       gpu, -1);
}
}  // namespace detail

/// The current GPU of this thread (where work on cuda launches and cuda tensors are
/// allocated).
inline int current_device() { return detail::current_device(); }

/// Makes GPU `gpu` current for a scope (work launches there, new cuda tensors are
/// allocated there), and restores the previous one. A GPU that does not exist is a
/// device_error naming the GPUs there are, before anything changes. PyTorch's
/// `with torch.cuda.device(n):`.
class device_guard {
 public:
  // A guard that is itself a temporary (locus::device_guard{1};) ends at the ';': a
  // warning (an error under -Werror).
  [[nodiscard("locus: a device_guard acts for its scope; name it: locus::device_guard g(n);")]]
  explicit device_guard(int gpu) : previous_((detail::check_gpu_index(gpu, "device_guard names"), detail::current_device())) {
    if (gpu != previous_) {
      LOCUS_CUDA_CHECK(cudaSetDevice(gpu));
      switched_ = true;
    }
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_;
  bool switched_ = false;
};

/// A new cuda tensor on GPU `gpu` holding x's elements (x: a tensor or view on any
/// device; from another GPU a peer copy). Blocking, like to<D>(); the current GPU is
/// unchanged afterwards. PyTorch's `x.to("cuda:1")`.
template <class X>
  requires TensorLike<X>
auto to_device(const X& x, int gpu) {
  using tr = detail::tensor_traits<std::remove_cvref_t<X>>;
  detail::check_gpu_index(gpu, "to_device names");
  const auto v = detail::as_view(x);
  tensor<typename tr::value_type, cuda, tr::rank> out;
  {
    const device_guard on(gpu);
    out = tensor<typename tr::value_type, cuda, tr::rank>(v.shape());
  }
  copy(x, out);
  return out;
}

}  // namespace locus

#endif
