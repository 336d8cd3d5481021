// The fix: keep the locus::pending that an asynchronous copy returns, do other work
// while the copy runs, and take the tensor with get(), which waits for exactly that
// copy (an event, not the whole device):
//   auto p = locus::to_async<locus::pinned>(logits);   // cuda -> pinned, returns at once
//   ...                                                // overlap: host or GPU work
//   locus::tensor<float, locus::pinned, 2> h = std::move(p).get();   // waits, then h is the data
// copy_async(src, std::move(buffer)) reuses a pinned buffer the same way, and p.ready()
// polls without waiting.
//
// This needs a GPU: without one it prints "SKIPPED: no GPU" and exits 77 (CTest reports
// the test as skipped). Compiled by nvcc (it computes on cuda).
#include <locus/locus.hpp>

#include <cmath>
#include <cstdio>
#include <utility>

int main() {
  if (!locus::cuda_available()) {
    std::printf("SKIPPED: no GPU (%s)\n", locus::environment().cuda_status.c_str());
    return 77;
  }
  using G = locus::cuda;
  constexpr locus::index_t rows = 4096, cols = 10;
  locus::tensor<float, G, 2> x = locus::rand<float, G>({rows, cols}, /*seed=*/1, 0.0, 1.0);
  locus::tensor<float, G, 2> logits = x * 2.0f + 1.0f;  // a kernel on the GPU: values in [1, 3)

  // Start the copy; it is ordered after the kernel on the current stream.
  auto p = locus::to_async<locus::pinned>(logits);
  // Overlap: more GPU work while the copy runs.
  auto total = locus::sum(logits);
  // Take the data: get() waits for the copy, then hands over the pinned tensor.
  locus::tensor<float, locus::pinned, 2> host = std::move(p).get();
  double host_total = 0.0;
  int outside = 0;
  for (float v : std::as_const(host).span()) {
    host_total += v;
    outside += !(v >= 1.0f && v < 3.0f);
  }

  // A second copy into the same pinned buffer: copy_async takes it and gives it back.
  auto again = locus::copy_async(logits, std::move(host));
  while (!again.ready()) {
  }  // polls; a real program would do other work here
  host = std::move(again).get();

  const double device_total = locus::to<locus::cpu>(total).item();
  std::printf("copied %lld values from cuda to pinned memory: host sum %.2f, device sum %.2f, %d outside [1, 3)\n",
              (long long)host.numel(), host_total, device_total, outside);
  if (outside != 0 || std::fabs(host_total - device_total) > 1e-4 * device_total || host(0, 0) < 1.0f) {
    std::printf("fixed: the copied values are not the GPU's\n");
    return 1;
  }
  return 0;
}
