// bench_cnn: the CNN side of issue 15 on the host, the locus half of
// bench/pytorch/cnn_train.py and bench/pytorch/conv_layer.py (bench/cnn-run runs all
// four interleaved and prints the ratios). Two modes, each printing JSON lines:
//
//   --mode train (default): samples/s of one training epoch of the main job's CNN
//     (make_cnn in examples/fashion_mnist_job.hpp): conv2d(1,32,3,p1) batch_norm2d relu
//     max_pool2d(2) conv2d(32,64,3,p1) batch_norm2d relu max_pool2d(2) flatten
//     linear(3136,128) relu dropout(0.3) linear(128,10); cross-entropy; AdamW(lr 1e-3,
//     weight decay 1e-4); fp32. Fashion-MNIST's 60,000 training images preloaded as
//     float [0, 1] [N, 1, 28, 28]; each epoch a shuffled order, batches gathered from
//     the preloaded tensor, the last partial batch dropped; a warm-up of --warmup-steps
//     steps (default 10) that is not timed and is undone through a checkpoint before
//     timing. --steps N times only the first N steps of the epoch instead of all of it.
//   --mode conv: forward + backward (weight, bias and input gradients) of one
//     conv2d(64, 64, 3, padding 1) at batch --batch-size on [B, 64, S, S] for each S of
//     --sizes (default 28,14): per iteration zero_grad, forward, backward(gy, true).
//     Timing as Google Benchmark (and bench/pytorch/_common.py): a calibration run finds
//     the iterations that last --min-time s (default 0.5), then --reps repetitions
//     (default 5), median time per iteration; forward and backward are also timed
//     apart inside the same iterations.
//
//   bench_cnn [--mode train|conv] [--batch-size N] [--threads N] [--steps N]
//             [--epochs N] [--warmup-steps N] [--data DIR] [--sizes LIST]
//             [--reps N] [--min-time S]
#include <locus/data/loader.hpp>
#include <locus/train.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

namespace {

using D = locus::cpu;
using P = locus::amp::fp32;
using clock_type = std::chrono::steady_clock;

struct args {
  std::string mode = "train";
  locus::index_t batch = 128;
  int threads = 0;
  locus::index_t steps = 0;  // 0: the whole epoch
  int epochs = 1;
  int warmup = 10;
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::vector<locus::index_t> sizes = {28, 14};
  int reps = 5;
  double min_time = 0.5;
};

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

std::string list(const std::vector<double>& v, double scale) {
  std::string s = "[";
  char b[32];
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::snprintf(b, sizeof b, "%s%.4f", i ? ", " : "", v[i] * scale);
    s += b;
  }
  return s + "]";
}

/// dst[b, :] = src[order[first + b], :], one contiguous copy per image (as PyTorch's
/// x_all[idx] copies rows)
struct gather_images {
  const float* src;
  const locus::index_t* order;
  float* dst;
  locus::index_t first, features;
  void operator()(locus::index_t b) const {
    std::memcpy(dst + b * features, src + order[first + b] * features, sizeof(float) * static_cast<std::size_t>(features));
  }
};

int run_train(const args& a) {
  namespace nn = locus::nn;
  auto set = locus::data::idx_dataset::from_directory(a.data, "train");
  const locus::index_t n = set.size(), rows = set.rows(), cols = set.cols(), features = rows * cols;
  const auto x_all = set.images_normalized();  // [N, rows, cols], contiguous
  const auto y_all = set.labels();
  const std::uint64_t seed = 0;
  nn::sequential model(nn::conv2d<D, P>(1, 32, 3, {.padding = 1}), nn::batch_norm2d<D, P>(32), nn::relu<D, P>(),
                       nn::max_pool2d<D, P>(2), nn::conv2d<D, P>(32, 64, 3, {.padding = 1}),
                       nn::batch_norm2d<D, P>(64), nn::relu<D, P>(), nn::max_pool2d<D, P>(2), nn::flatten<D, P>(),
                       nn::linear<D, P>(64 * (rows / 4) * (cols / 4), 128), nn::relu<D, P>(),
                       nn::dropout<D, P>(0.3f, seed), nn::linear<D, P>(128, 10));
  model.reset_parameters(seed);
  locus::optim::adamw<D> opt(model.parameters(), {.lr = 1e-3, .weight_decay = 1e-4});
  locus::train::trainer t(model, opt, nn::cross_entropy{});

  locus::tensor<float, D, 4> xb(locus::extents<4>{a.batch, 1, rows, cols});
  locus::tensor<std::int64_t, D, 1> yb(locus::extents<1>{a.batch});
  const locus::index_t batches = n / a.batch;  // drop_last, as the PyTorch peer
  const locus::index_t timed_steps = a.steps > 0 ? std::min(a.steps, batches) : batches;
  auto epoch = [&](std::uint64_t e, locus::index_t limit) {
    const auto order = locus::data::detail::epoch_order(n, true, 0, e);
    for (locus::index_t b = 0; b < limit; ++b) {
      locus::detail::launch_n<D>(
          a.batch, gather_images{x_all.data_handle(), order.data(), xb.data_handle(), b * a.batch, features}, features);
      for (locus::index_t i = 0; i < a.batch; ++i) yb.data_handle()[i] = y_all.data_handle()[order[b * a.batch + i]];
      t.step(xb, yb);
    }
  };
  // Warm-up (allocator, the layers' buffers, oneDNN's GEMM kernels), then back to the
  // initial state through a checkpoint, as the PyTorch peer restores its state_dicts.
  const auto saved = std::filesystem::temp_directory_path() /
                     ("locus-bench-cnn-" + std::to_string(static_cast<long long>(::getpid())) + ".safetensors");
  locus::train::save_checkpoint(saved, t, 0);
  epoch(1000, std::min<locus::index_t>(a.warmup, batches));
  t.report();
  locus::train::resume(saved, t);
  std::filesystem::remove(saved);

  const auto t0 = clock_type::now();
  double loss = 0;
  for (int e = 0; e < a.epochs; ++e) {
    epoch(static_cast<std::uint64_t>(e), timed_steps);
    loss = t.report().loss;  // the one synchronisation
  }
  const double dt = seconds_since(t0);
  const double samples = static_cast<double>(timed_steps * a.batch * a.epochs);
  std::printf(
      "{\"name\": \"cnn_train\", \"impl\": \"locus\", \"device\": \"cpu\", \"amp\": \"none\", \"batch_size\": %lld, "
      "\"threads\": %d, \"epochs\": %d, \"steps\": %lld, \"steps_per_epoch\": %lld, \"samples_per_s\": %.1f, "
      "\"seconds\": %.4f, \"ms_per_step\": %.3f, \"final_loss\": %.6f, \"host_gemm\": \"%s\"}\n",
      static_cast<long long>(a.batch), a.threads, a.epochs, static_cast<long long>(timed_steps),
      static_cast<long long>(batches), samples / dt, dt, 1e3 * dt / static_cast<double>(timed_steps * a.epochs), loss,
      locus::name_of(locus::current_host_gemm()));
  std::fflush(stdout);
  return 0;
}

/// x-like deterministic values in [-1, 1) (a 64-bit LCG)
void fill(float* p, locus::index_t n, std::uint64_t s) {
  for (locus::index_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = static_cast<float>(static_cast<double>(s >> 40) / static_cast<double>(1ull << 24) * 2.0 - 1.0);
  }
}

int run_conv(const args& a) {
  namespace nn = locus::nn;
  constexpr locus::index_t ch = 64, k = 3;
  for (const locus::index_t s : a.sizes) {
    nn::sequential c(nn::conv2d<D, P>(ch, ch, k, {.padding = 1}));
    c.reset_parameters(0);
    locus::tensor<float, D, 4> x(locus::extents<4>{a.batch, ch, s, s});
    locus::tensor<float, D, 4> gy(locus::extents<4>{a.batch, ch, s, s});
    fill(x.data_handle(), x.numel(), 1);
    fill(gy.data_handle(), gy.numel(), 2);
    const auto xv = std::as_const(x).view();
    const auto gyv = std::as_const(gy).view();
    double fwd_acc = 0, bwd_acc = 0;
    volatile float sink = 0;
    auto iteration = [&] {
      c.parameters().zero_grad();
      const auto t0 = clock_type::now();
      const auto y = c.forward(xv);
      const auto t1 = clock_type::now();
      const auto gx = c.backward(gyv, true);
      const auto t2 = clock_type::now();
      sink = sink + y.data_handle()[0] + gx.data_handle()[0];
      fwd_acc += std::chrono::duration<double>(t1 - t0).count();
      bwd_acc += std::chrono::duration<double>(t2 - t1).count();
    };
    auto timed = [&](long iters) {
      fwd_acc = bwd_acc = 0;
      const auto t0 = clock_type::now();
      for (long i = 0; i < iters; ++i) iteration();
      return seconds_since(t0);
    };
    iteration();  // first call: buffers
    long iters = 1;
    for (;;) {
      const double dt = timed(iters);
      if (dt >= a.min_time || iters >= 1000000) break;
      iters = std::max(iters + 1, std::min(10 * iters, static_cast<long>(static_cast<double>(iters) * 1.4 * a.min_time /
                                                                          std::max(dt, 1e-9))));
    }
    std::vector<double> total, fwd, bwd;
    for (int r = 0; r < std::max(1, a.reps); ++r) {
      const double dt = timed(iters);
      total.push_back(dt / static_cast<double>(iters));
      fwd.push_back(fwd_acc / static_cast<double>(iters));
      bwd.push_back(bwd_acc / static_cast<double>(iters));
    }
    // forward 2*B*K*C*9*S*S; backward twice that (weight and input gradients)
    const double flop_fwd = 2.0 * static_cast<double>(a.batch * ch * ch * k * k * s * s);
    const double med = median(total);
    std::printf(
        "{\"name\": \"conv_layer\", \"impl\": \"locus\", \"device\": \"cpu\", \"batch_size\": %lld, \"channels\": %lld, "
        "\"kernel\": %lld, \"padding\": 1, \"size\": %lld, \"threads\": %d, \"iterations\": %ld, \"reps\": %d, "
        "\"seconds\": %.6f, \"fwd_seconds\": %.6f, \"bwd_seconds\": %.6f, \"gflop_per_s\": %.2f, "
        "\"rep_ms\": %s, \"host_gemm\": \"%s\"}\n",
        static_cast<long long>(a.batch), static_cast<long long>(ch), static_cast<long long>(k),
        static_cast<long long>(s), a.threads, iters, a.reps, med, median(fwd), median(bwd), 3.0 * flop_fwd / med * 1e-9,
        list(total, 1e3).c_str(), locus::name_of(locus::current_host_gemm()));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      std::puts(
          "bench_cnn [--mode train|conv] [--batch-size N] [--threads N] [--steps N] [--epochs N]\n"
          "          [--warmup-steps N] [--data DIR] [--sizes LIST] [--reps N] [--min-time S]\n"
          "(see the top of bench/bench_cnn.cpp)");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_cnn: %s needs a value\n", k.c_str());
      return 2;
    }
    const std::string v = argv[i + 1];
    if (k == "--mode") a.mode = v;
    else if (k == "--batch-size") a.batch = std::atoll(v.c_str());
    else if (k == "--threads") a.threads = std::atoi(v.c_str());
    else if (k == "--steps") a.steps = std::atoll(v.c_str());
    else if (k == "--epochs") a.epochs = std::atoi(v.c_str());
    else if (k == "--warmup-steps") a.warmup = std::atoi(v.c_str());
    else if (k == "--data") a.data = v;
    else if (k == "--reps") a.reps = std::atoi(v.c_str());
    else if (k == "--min-time") a.min_time = std::atof(v.c_str());
    else if (k == "--sizes") {
      a.sizes.clear();
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) {
        const long long s = std::atoll(item.c_str());
        if (s < 1) {
          std::fprintf(stderr, "bench_cnn: --sizes takes positive sizes, e.g. 28,14\n");
          return 2;
        }
        a.sizes.push_back(s);
      }
    } else {
      std::fprintf(stderr, "bench_cnn: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (a.batch < 2 || a.epochs < 1 || a.steps < 0 || a.warmup < 0) {
    std::fprintf(stderr, "bench_cnn: --batch-size needs at least 2, --epochs at least 1, --steps and "
                         "--warmup-steps at least 0\n");
    return 2;
  }
#if defined(_OPENMP)
  if (a.threads > 0) omp_set_num_threads(a.threads);
  a.threads = omp_get_max_threads();
#else
  a.threads = 1;
#endif
  try {
    if (a.mode == "train") return run_train(a);
    if (a.mode == "conv") return run_conv(a);
    std::fprintf(stderr, "bench_cnn: --mode is train or conv\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cnn: %s\n", e.what());
    return 1;
  }
}
