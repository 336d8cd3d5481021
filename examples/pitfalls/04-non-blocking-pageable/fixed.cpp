// The fix: stage the batches in page-locked (pinned) memory; then the copy to the GPU
// is truly asynchronous and the host prepares the next batch while it runs (double
// buffering: two pinned buffers, each handed to the copy and taken back after it).
// locus::to_async takes the pinned buffer by std::move: while the copy runs the host
// cannot touch it; get_with_source() waits and gives both the GPU tensor and the buffer
// back. (locus::data::loader<locus::cuda> does all of this for you.)
//
// This needs a GPU: without one it prints "SKIPPED: no GPU" and exits 77 (CTest reports
// the test as skipped). Compiled by nvcc (it sums on cuda).
#include <locus/locus.hpp>

#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

namespace {

constexpr locus::index_t rows = 256, cols = 784, batches = 8;

// Batch b in host memory: element i of batch b is (b + 1) * 0.5 + i % 7.
void fill(locus::tensor<float, locus::pinned, 2>& buffer, locus::index_t b) {
  auto s = buffer.span();
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>(b + 1) * 0.5f + static_cast<float>(i % 7);
}

double expected_sum(locus::index_t b) {
  double total = 0.0;
  for (locus::index_t i = 0; i < rows * cols; ++i) total += static_cast<double>(b + 1) * 0.5 + static_cast<double>(i % 7);
  return total;
}

}  // namespace

int main() {
  if (!locus::cuda_available()) {
    std::printf("SKIPPED: no GPU (%s)\n", locus::environment().cuda_status.c_str());
    return 77;
  }
  // Two pinned buffers: while one is copied to the GPU, the host fills the other.
  std::vector<locus::tensor<float, locus::pinned, 2>> buffer;
  buffer.push_back(locus::empty<float, locus::pinned>({rows, cols}));
  buffer.push_back(locus::empty<float, locus::pinned>({rows, cols}));

  fill(buffer[0], 0);
  auto in_flight = locus::to_async<locus::cuda>(std::move(buffer[0]));  // returns at once
  int wrong = 0;
  for (locus::index_t b = 0; b < batches; ++b) {
    const bool more = b + 1 < batches;
    if (more) fill(buffer[(b + 1) % 2], b + 1);  // overlaps the copy of batch b
    auto [x, staging] = std::move(in_flight).get_with_source();  // waits for batch b
    buffer[b % 2] = std::move(staging);
    if (more) in_flight = locus::to_async<locus::cuda>(std::move(buffer[(b + 1) % 2]));
    const double got = locus::to<locus::cpu>(locus::sum(x)).item();  // computed on the GPU
    const double want = expected_sum(b);
    std::printf("batch %lld: sum on cuda %.1f, expected %.1f\n", (long long)b, got, want);
    if (std::fabs(got - want) > 1e-5 * want) ++wrong;
  }
  if (wrong) {
    std::printf("fixed: %d batches arrived wrong\n", wrong);
    return 1;
  }
  return 0;
}
