// bench_module_mlp: the main job's MLP (784-512-256-10, relu, fp32, AdamW, batch
// --batch-size) trained through the trainer as nn::sequential and as a module of one's
// own (nn::module with the same layers, the relu fused into each linear layer as
// nn::sequential fuses it: fc(x, ag::fused::relu)), step by step on the same random batch,
// interleaved round by round. Prints the median samples/s of each and the ratio
// module / sequential (issue 30's target: at least 0.97). Both models start from the
// same weights and see the same batch, so their losses agree (printed as a check).
//
//   bench_module_mlp [--batch-size 128] [--steps 20] [--rounds 7] [--threads N]
#include <locus/nn/module.hpp>
#include <locus/train.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {
namespace nn = locus::nn;
using D = locus::cpu;
using P = locus::amp::fp32;

template <class Dv, class Pol>
struct mlp : nn::module<Dv, Pol> {
  // sequential's names (its relu layers have none to declare): the same weights
  nn::layer<nn::linear<Dv, Pol>> fc0{this, "0", 784, 512};
  nn::layer<nn::linear<Dv, Pol>> fc2{this, "2", 512, 256};
  nn::layer<nn::linear<Dv, Pol>> fc4{this, "4", 256, 10};
  // the relu in each GEMM's epilogue, as nn::sequential fuses it
  auto forward(const typename mlp::template var<2>& x) {
    using locus::ag::fused;
    return fc4(fc2(fc0(x, fused::relu), fused::relu));
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

template <class T>
double time_steps(T& t, const locus::tensor<float, D, 2>& x, const locus::tensor<std::int64_t, D, 1>& y, int steps) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) t.step(x, y);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  long long batch = 128;
  int steps = 20, rounds = 7, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (k == "--batch-size") batch = v;
    else if (k == "--steps") steps = static_cast<int>(v);
    else if (k == "--rounds") rounds = static_cast<int>(v);
    else if (k == "--threads") threads = static_cast<int>(v);
    else {
      std::fprintf(stderr, "usage: bench_module_mlp [--batch-size N] [--steps N] [--rounds N] [--threads N]\n");
      return 2;
    }
  }
#if defined(_OPENMP)
  if (threads > 0) omp_set_num_threads(threads);
  threads = omp_get_max_threads();
#endif
  const auto x = locus::rand<float, D>({batch, 784}, 1);
  locus::tensor<std::int64_t, D, 1> y({batch});
  for (long long i = 0; i < batch; ++i) y(i) = i % 10;

  nn::sequential seq(nn::linear<D, P>(784, 512), nn::relu<D, P>(), nn::linear<D, P>(512, 256), nn::relu<D, P>(),
                     nn::linear<D, P>(256, 10));
  seq.reset_parameters(0);
  nn::model<mlp<D, P>> mod;
  mod.reset_parameters(0);
  locus::optim::adamw<D> opt_s(seq.parameters(), {.lr = 1e-3, .weight_decay = 1e-4});
  locus::optim::adamw<D> opt_m(mod.parameters(), {.lr = 1e-3, .weight_decay = 1e-4});
  locus::train::trainer ts(seq, opt_s, nn::cross_entropy{});
  locus::train::trainer tm(mod, opt_m, nn::cross_entropy{});
  for (int s = 0; s < 3; ++s) {  // warm-up
    ts.step(x, y);
    tm.step(x, y);
  }
  std::vector<double> sps_s, sps_m, ratio;
  for (int r = 0; r < rounds; ++r) {
    // alternate which goes first
    double a = 0, b = 0;
    if (r % 2 == 0) {
      a = time_steps(ts, x, y, steps);
      b = time_steps(tm, x, y, steps);
    } else {
      b = time_steps(tm, x, y, steps);
      a = time_steps(ts, x, y, steps);
    }
    sps_s.push_back(static_cast<double>(batch) * steps / a);
    sps_m.push_back(static_cast<double>(batch) * steps / b);
    ratio.push_back(a / b);
  }
  std::printf("{\"model\": \"sequential\", \"batch\": %lld, \"threads\": %d, \"samples_per_s\": %.1f, \"loss\": %.6f}\n",
              batch, threads, median(sps_s), ts.report().loss);
  std::printf("{\"model\": \"module\", \"batch\": %lld, \"threads\": %d, \"samples_per_s\": %.1f, \"loss\": %.6f}\n", batch,
              threads, median(sps_m), tm.report().loss);
  std::printf("module / sequential: %.3fx (median of the %d rounds' ratios; each round:", median(ratio), rounds);
  for (const double q : ratio) std::printf(" %.3f", q);
  std::printf(")\n");
  return 0;
}
