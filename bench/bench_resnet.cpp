// bench_resnet: the main job's ResNet module (examples/resnet.hpp, width 16, one basic
// block per stage) on the host: one training step (forward, backward, AdamW) at batch
// --batch-size on random 1x28x28 images, plain and with every block checkpointed
// (nn::checkpoint), interleaved round by round. Prints per variant the median ms per
// step over the rounds and the step's peak allocated bytes: each variant alone in the
// process (the other not yet built or already gone), the allocator's
// peak_allocated_bytes over a steady-state step after reset_peak_memory_stats: its
// parameters, optimizer state, the batch, and what the step holds at its peak. Then
// the ratios (checkpointed / plain). The locus side of bench/pytorch/resnet_step.py (same model,
// batch and threads; run both in one session and quote the ratio).
//
//   bench_resnet [--batch-size 128] [--steps 10] [--rounds 5] [--threads N]
#include <locus/train.hpp>

#include "../examples/resnet.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {
using D = locus::cpu;
using P = locus::amp::fp32;
using model_t = locus::nn::model<locus_examples::resnet<D, P>>;

struct variant {
  model_t model{10, 16, std::array<int, 3>{1, 1, 1}};
  locus::optim::adamw<D> opt{model.parameters(), {.lr = 1e-3, .weight_decay = 1e-4}};
  locus::train::trainer<model_t, locus::optim::adamw<D>, locus::nn::cross_entropy> t{model, opt,
                                                                                     locus::nn::cross_entropy{}};
  std::vector<double> ms;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  long long batch = 128;
  int steps = 10, rounds = 5, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (k == "--batch-size") batch = v;
    else if (k == "--steps") steps = static_cast<int>(v);
    else if (k == "--rounds") rounds = static_cast<int>(v);
    else if (k == "--threads") threads = static_cast<int>(v);
    else {
      std::fprintf(stderr, "usage: bench_resnet [--batch-size N] [--steps N] [--rounds N] [--threads N]\n");
      return 2;
    }
  }
#if defined(_OPENMP)
  if (threads > 0) omp_set_num_threads(threads);
  threads = omp_get_max_threads();
#endif
  const auto x = locus::rand<float, D>({batch, 1, 28, 28}, 1);
  locus::tensor<std::int64_t, D, 1> y({batch});
  for (long long i = 0; i < batch; ++i) y(i) = i % 10;
  // memory: each variant alone
  std::array<std::size_t, 2> peak{};
  for (int i = 0; i < 2; ++i) {
    variant w;
    w.model.net().checkpointing = i == 1;
    for (int s = 0; s < 2; ++s) w.t.step(x, y);
    locus::reset_peak_memory_stats<D>();
    w.t.step(x, y);
    peak[i] = locus::memory_stats<D>().peak_allocated_bytes;
  }
  // time: both, interleaved
  std::array<variant, 2> v;
  v[1].model.net().checkpointing = true;
  for (auto& w : v)
    for (int s = 0; s < 2; ++s) w.t.step(x, y);  // warm-up: buffers allocated, caches filled
  for (int r = 0; r < rounds; ++r) {
    for (auto& w : v) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) w.t.step(x, y);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      w.ms.push_back(1e3 * sec / steps);
    }
  }
  const char* names[2] = {"plain", "checkpointed"};
  for (int i = 0; i < 2; ++i)
    std::printf("{\"variant\": \"%s\", \"batch\": %lld, \"threads\": %d, \"ms_per_step\": %.3f, "
                "\"samples_per_s\": %.1f, \"peak_allocated_bytes\": %zu}\n",
                names[i], batch, threads, median(v[i].ms), 1e3 * static_cast<double>(batch) / median(v[i].ms),
                peak[i]);
  std::printf("checkpointed / plain: time %.3fx, peak allocated %.3fx\n", median(v[1].ms) / median(v[0].ms),
              static_cast<double>(peak[1]) / static_cast<double>(peak[0]));
  return 0;
}
