// bench_train: samples/s of one MLP training epoch with locus's trainer, the same work
// as bench/pytorch/mlp_train.py does in PyTorch (bench/run runs both and quotes the
// ratio): Fashion-MNIST's 60,000 training images as floats in [0, 1], preloaded into one
// tensor on the device; each epoch a shuffled order, batches gathered from the
// preloaded tensor; 784-256-128-10 with ReLU (--hidden A,B: 784-A-B-10, e.g. 512,256 for
// the main job's model), cross-entropy, AdamW(lr 1e-3, weight decay 0.01); a 20-step warm-up that is not timed and is undone before timing. Prints
// one JSON line.
//
//   bench_train [--epochs N] [--batch-size N] [--threads N] [--device cpu|cuda]
//               [--precision fp32|bf16|fp16] [--data DIR] [--hidden A,B] [--cuda-graph 1]
// --cuda-graph 1 trains in the trainer's CUDA graph mode (cuda only).
#include <locus/data/loader.hpp>
#include <locus/train.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include <unistd.h>

namespace {

struct args {
  int epochs = 1;
  locus::index_t batch = 128;
  int threads = 0;
  std::string device = "cpu";
  std::string precision = "fp32";
  std::string data = "/usr/share/datasets/fashion-mnist";
  locus::index_t hidden[2] = {256, 128};
  bool cuda_graph = false;
};

/// dst[b, :] = src[order[first + b], :], a row per call (the host: one contiguous copy
/// per row, as PyTorch's x_all[idx] copies rows)
template <class T>
struct gather_whole_rows {
  const T* src;
  const locus::index_t* order;
  T* dst;
  locus::index_t first, features;
  void operator()(locus::index_t b) const {
    std::memcpy(dst + b * features, src + order[first + b] * features, sizeof(T) * static_cast<std::size_t>(features));
  }
};

/// dst[b, :] = src[order[first + b], :], an element per call (cuda)
template <class T>
struct gather_rows {
  const T* src;
  const locus::index_t* order;
  T* dst;
  locus::index_t first, features;
  LOCUS_HOST_DEVICE void operator()(locus::index_t i) const {
    const locus::index_t b = i / features, f = i % features;
    dst[i] = src[order[first + b] * features + f];
  }
};

template <class D, class P>
int run(const args& a) {
  namespace nn = locus::nn;
  auto set = locus::data::idx_dataset::from_directory(a.data, "train");
  const locus::index_t n = set.size(), features = set.rows() * set.cols();
  auto xh = set.images_normalized();
  const auto x_all = locus::to<D>(xh.reshape({n, features}));
  const auto y_all = locus::to<D>(set.labels());

  const locus::index_t h0 = a.hidden[0], h1 = a.hidden[1];
  nn::sequential model(nn::linear<D, P>(features, h0), nn::relu<D, P>(), nn::linear<D, P>(h0, h1), nn::relu<D, P>(),
                       nn::linear<D, P>(h1, 10));
  model.reset_parameters(0);
  locus::optim::adamw<D> opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.01});

  auto body = [&](auto& t) {
    locus::tensor<float, D, 2> xb(locus::extents<2>{a.batch, features});
    locus::tensor<std::int64_t, D, 1> yb(locus::extents<1>{a.batch});
    const locus::index_t batches = n / a.batch;  // drop_last, as the PyTorch peer
    auto epoch = [&](std::uint64_t e, locus::index_t limit) {
      const auto order_v = locus::data::detail::epoch_order(n, true, 0, e);
      locus::tensor<locus::index_t, locus::cpu, 1> order_h(locus::extents<1>{n});
      std::memcpy(order_h.data_handle(), order_v.data(), sizeof(locus::index_t) * static_cast<std::size_t>(n));
      const auto order = locus::to<D>(order_h);
      for (locus::index_t b = 0; b < limit; ++b) {
        if constexpr (D::host_accessible) {
          locus::detail::launch_n<D>(a.batch,
                                     gather_whole_rows<float>{x_all.data_handle(), order.data_handle(),
                                                              xb.data_handle(), b * a.batch, features},
                                     features);
        } else {
          locus::detail::launch_n<D>(a.batch * features, gather_rows<float>{x_all.data_handle(), order.data_handle(),
                                                                            xb.data_handle(), b * a.batch, features});
        }
        locus::detail::launch_n<D>(a.batch, gather_rows<std::int64_t>{y_all.data_handle(), order.data_handle(),
                                                                      yb.data_handle(), b * a.batch, 1});
        t.step(xb, yb);
      }
    };
    // Warm-up (allocator caches, BLAS/cuBLASLt plans), then back to the initial state
    // through a checkpoint, as the PyTorch peer restores its state_dicts: both sides then
    // time the same training from the same weights.
    const auto saved = std::filesystem::temp_directory_path() /
                       ("locus-bench-train-" + std::to_string(static_cast<long long>(::getpid())) + ".safetensors");
    locus::train::save_checkpoint(saved, t, 0);
    epoch(1000, 20);
    t.report();
    locus::train::resume(saved, t);
    std::filesystem::remove(saved);
    const auto t0 = std::chrono::steady_clock::now();
    double loss = 0;
    for (int e = 0; e < a.epochs; ++e) {
      epoch(static_cast<std::uint64_t>(e), batches);
      loss = t.report().loss;  // synchronises
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double sps = static_cast<double>(batches * a.batch * a.epochs) / dt;
    std::printf(
        "{\"name\": \"mlp_train\", \"impl\": \"locus\", \"device\": \"%s\", \"amp\": \"%s\", \"batch_size\": %lld, "
        "\"hidden\": \"%lld,%lld\", \"threads\": %d, \"epochs\": %d, \"samples_per_s\": %.1f, \"seconds\": %.4f, "
        "\"final_loss\": %.6f}\n",
        std::string(D::name).c_str(), a.precision == "fp32" ? "none" : a.precision.c_str(),
        static_cast<long long>(a.batch), static_cast<long long>(h0), static_cast<long long>(h1), a.threads, a.epochs,
        sps, dt, loss);
  };
  const locus::train::options o{.cuda_graph = a.cuda_graph};
  if constexpr (locus::amp::needs_loss_scaling<P>) {
    locus::amp::grad_scaler<D> scaler;
    locus::train::trainer t(model, opt, nn::cross_entropy{}, scaler, o);
    body(t);
  } else {
    locus::train::trainer t(model, opt, nn::cross_entropy{}, o);
    body(t);
  }
  return 0;
}

template <class D>
int run_precision(const args& a) {
  if (a.precision == "fp32") return run<D, locus::amp::fp32>(a);
  if (a.precision == "bf16") return run<D, locus::amp::bf16_mixed>(a);
  if (a.precision == "fp16") return run<D, locus::amp::fp16_mixed>(a);
  std::fprintf(stderr, "bench_train: --precision is fp32, bf16 or fp16\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--epochs") a.epochs = std::atoi(v.c_str());
    else if (k == "--batch-size") a.batch = std::atoll(v.c_str());
    else if (k == "--threads") a.threads = std::atoi(v.c_str());
    else if (k == "--device") a.device = v;
    else if (k == "--precision") a.precision = v;
    else if (k == "--data") a.data = v;
    else if (k == "--cuda-graph") a.cuda_graph = v == "1" || v == "true" || v == "on";
    else if (k == "--hidden") {
      long long x = 0, y = 0;
      char tail = 0;
      if (std::sscanf(v.c_str(), "%lld,%lld%c", &x, &y, &tail) != 2 || x < 1 || y < 1) {
        std::fprintf(stderr, "bench_train: --hidden takes two positive widths, e.g. 512,256\n");
        return 2;
      }
      a.hidden[0] = x;
      a.hidden[1] = y;
    } else {
      std::fprintf(stderr, "bench_train: unknown option %s\n", k.c_str());
      return 2;
    }
  }
#if defined(_OPENMP)
  if (a.threads > 0) omp_set_num_threads(a.threads);
  a.threads = omp_get_max_threads();
#endif
  try {
    if (a.device == "cuda") {
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
      if (!locus::cuda_available()) {
        std::fprintf(stderr, "bench_train: no usable GPU\n");
        return 1;
      }
      return run_precision<locus::cuda>(a);
#else
      std::fprintf(stderr, "bench_train: built without CUDA\n");
      return 1;
#endif
    }
    return run_precision<locus::cpu>(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train: %s\n", e.what());
    return 1;
  }
}
