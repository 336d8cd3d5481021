// fashion_mnist: trains an MLP classifier on Fashion-MNIST (or any IDX directory, such as
// MNIST) with locus's typed training loop. The README's first command runs it.
//
//   fashion_mnist [--data DIR] [--device auto|cpu|cuda] [--precision fp32|bf16|fp16]
//                 [--epochs N] [--batch-size N|auto] [--lr X] [--accumulate N] [--seed N]
//                 [--hidden A,B,...] [--checkpoint-dir DIR] [--resume [FILE]] [--log FILE.csv]
//                 [--memory-limit BYTES[K|M|G]]
//
// --batch-size auto tries batches from 64 up (doubling, then bisecting) and keeps the
// largest whose forward and backward fit the device's memory, counting the batches the
// loader holds ahead; it searches up to min(training set, 4096) samples, since beyond
// that an epoch has too few optimizer steps to train well. --memory-limit caps the
// device's allocator (locus::set_memory_limit), so auto can be tried on a CPU.
//
// The body is written once for any device D and precision policy P; the options pick
// the instantiation. Compiled by nvcc when CUDA is enabled (the cuda instantiations
// launch kernels).
#include <algorithm>
#include <locus/data/loader.hpp>
#include <locus/train.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct config {
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string device = "auto";
  std::string precision;  // default: bf16 on cuda, fp32 on cpu
  int epochs = 15;
  std::string batch_size = "128";
  double lr = 1e-3;
  int accumulate = 1;
  std::uint64_t seed = 0;
  std::vector<locus::index_t> hidden{512, 256};
  std::string checkpoint_dir;
  bool resume = false;
  std::string resume_file;
  std::string log;
  std::size_t memory_limit = 0;  // 0: none
};

/// "512M" -> 536870912; throws std::invalid_argument on a malformed size.
std::size_t parse_bytes(const std::string& v) {
  std::size_t used = 0;
  const double x = std::stod(v, &used);
  double mult = 1;
  const std::string rest = v.substr(used);
  if (rest == "K" || rest == "k") mult = 1024.0;
  else if (rest == "M" || rest == "m") mult = 1024.0 * 1024;
  else if (rest == "G" || rest == "g") mult = 1024.0 * 1024 * 1024;
  else if (!rest.empty()) throw std::invalid_argument("size suffix");
  if (!(x > 0)) throw std::invalid_argument("size");
  return static_cast<std::size_t>(x * mult);
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "fashion_mnist: %s\n"
               "usage: fashion_mnist [--data DIR] [--device auto|cpu|cuda] [--precision fp32|bf16|fp16]\n"
               "                     [--epochs N] [--batch-size N|auto] [--lr X] [--accumulate N] [--seed N]\n"
               "                     [--hidden A,B] [--checkpoint-dir DIR] [--resume [FILE]] [--log FILE.csv]\n"
               "                     [--memory-limit BYTES[K|M|G]]\n",
               why.c_str());
  std::exit(2);
}

config parse(int argc, char** argv) {
  config c;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--data") c.data = value(i);
      else if (a == "--device") c.device = value(i);
      else if (a == "--precision") c.precision = value(i);
      else if (a == "--epochs") c.epochs = std::stoi(value(i));
      else if (a == "--batch-size") c.batch_size = value(i);
      else if (a == "--lr") c.lr = std::stod(value(i));
      else if (a == "--accumulate") c.accumulate = std::stoi(value(i));
      else if (a == "--seed") c.seed = std::stoull(value(i));
      else if (a == "--checkpoint-dir") c.checkpoint_dir = value(i);
      else if (a == "--log") c.log = value(i);
      else if (a == "--memory-limit") c.memory_limit = parse_bytes(value(i));
      else if (a == "--hidden") {
        c.hidden.clear();
        std::string s = value(i);
        std::size_t p = 0;
        while (p <= s.size()) {
          const std::size_t q = s.find(',', p);
          c.hidden.push_back(std::stoll(s.substr(p, q - p)));
          if (q == std::string::npos) break;
          p = q + 1;
        }
        if (c.hidden.size() != 2) usage("--hidden takes two layer widths, e.g. 512,256");
      } else if (a == "--resume") {
        c.resume = true;
        if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) c.resume_file = argv[++i];
      } else if (a == "--help" || a == "-h") {
        usage("trains an MLP on Fashion-MNIST");
      } else {
        usage("unknown option " + a);
      }
    }
  } catch (const std::logic_error&) {
    usage("a numeric option has a value that is not a number");
  }
  if (c.epochs < 1) usage("--epochs must be at least 1");
  if (c.accumulate < 1) usage("--accumulate must be at least 1");
  if (c.device != "auto" && c.device != "cpu" && c.device != "cuda") usage("--device is auto, cpu or cuda");
  if (!c.precision.empty() && c.precision != "fp32" && c.precision != "bf16" && c.precision != "fp16")
    usage("--precision is fp32, bf16 or fp16");
  return c;
}

std::string bytes(std::size_t b) { return locus::out_of_memory::format_bytes(b); }

/// A progress bar on a terminal, nothing otherwise (the epoch line follows either way).
struct progress_printer {
  bool tty = ::isatty(1) != 0;
  void operator()(const locus::train::progress& p) const {
    if (!tty || p.batches <= 0) return;
    const int width = 30;
    const int filled = static_cast<int>(width * p.batch / p.batches);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(width, '.');
    std::printf("\r  epoch %lld [%s] %lld/%lld  loss %.4f  %.0f samples/s ", static_cast<long long>(p.epoch + 1),
                bar.c_str(), static_cast<long long>(p.batch), static_cast<long long>(p.batches), p.loss,
                p.samples_per_s);
    std::fflush(stdout);
  }
};

template <class D, class P>
int run(const config& c) {
  namespace nn = locus::nn;
  if (c.memory_limit) locus::set_memory_limit<D>(c.memory_limit);
  auto train_set = locus::data::idx_dataset::from_directory(c.data, "train");
  auto test_set = locus::data::idx_dataset::from_directory(c.data, "t10k");
  const locus::index_t features = train_set.rows() * train_set.cols();
  std::int64_t classes = 0;
  for (std::int64_t v : train_set.labels().span()) classes = std::max(classes, v + 1);

  nn::sequential model(nn::linear<D, P>(features, c.hidden[0]), nn::relu<D, P>(),
                       nn::linear<D, P>(c.hidden[0], c.hidden[1]), nn::relu<D, P>(),
                       nn::linear<D, P>(c.hidden[1], classes));
  model.reset_parameters(c.seed);
  locus::optim::adamw<D> opt(model.parameters(), {.lr = c.lr, .weight_decay = 1e-4});

  auto go = [&](auto& t) -> int {
    // Batch size: a number, or the largest that fits the device's memory.
    const locus::data::loader_options train_options{.shuffle = true, .seed = c.seed};
    locus::index_t batch = 0;
    if (c.batch_size == "auto") {
      const locus::index_t cap = std::min<locus::index_t>(train_set.size(), 4096);
      // The loader keeps `prefetch` batches on the device beside the one in use: the
      // probe holds as many while it runs forward and backward.
      std::vector<locus::tensor<float, D, 2>> ahead;
      batch = locus::train::find_max_batch_size(
          t,
          [&](locus::index_t b) {
            ahead.clear();
            for (int k = 0; k < train_options.prefetch; ++k) ahead.push_back(locus::empty<float, D>({b, features + 2}));
            auto x = locus::zeros<float, D>({b, features});
            auto y = locus::zeros<std::int64_t, D>({b});
            return std::pair{std::move(x), std::move(y)};
          },
          64, cap);
      ahead.clear();
      if (batch == 0) throw std::runtime_error("not even a batch of 1 fits in the device's memory");
      std::printf("batch size auto: %lld (the largest that fits %s memory, searched up to %lld)\n",
                  static_cast<long long>(batch), std::string(D::name).c_str(), static_cast<long long>(cap));
    } else {
      batch = std::stoll(c.batch_size);
      if (batch < 1) usage("--batch-size must be at least 1 or auto");
    }
    auto lo = train_options;
    lo.batch_size = batch;
    locus::data::loader<D> train_loader(train_set, lo);
    locus::data::loader<D> test_loader(test_set, {.batch_size = 1000});
    const auto steps_per_epoch =
        (static_cast<std::int64_t>(train_loader.size()) + c.accumulate - 1) / c.accumulate;
    t.set_schedule(locus::optim::cosine_lr{steps_per_epoch * c.epochs, c.lr * 0.01});

    std::int64_t first_epoch = 0;
    if (c.resume) {
      std::string file = c.resume_file;
      if (file.empty()) {
        if (c.checkpoint_dir.empty()) usage("--resume without a file needs --checkpoint-dir");
        file = (std::filesystem::path(c.checkpoint_dir) / "last.safetensors").string();
      }
      first_epoch = locus::train::resume(file, t);
      std::printf("resumed from %s after epoch %lld\n", file.c_str(), static_cast<long long>(first_epoch));
    }

    std::ofstream log;
    if (!c.log.empty()) {
      const bool fresh = !std::filesystem::exists(c.log) || first_epoch == 0;
      log.open(c.log, fresh ? std::ios::trunc : std::ios::app);
      if (!log) throw locus::io_error("cannot write " + c.log);
      if (fresh) log << "epoch,train_loss,test_loss,test_accuracy,samples_per_s,peak_bytes,seconds\n";
    }

    std::printf("model: %lld-%lld-%lld-%lld MLP, %lld parameters; %s on %s, batch %lld x %d, %d epochs\n",
                static_cast<long long>(features), static_cast<long long>(c.hidden[0]),
                static_cast<long long>(c.hidden[1]), static_cast<long long>(classes),
                static_cast<long long>(model.parameters().parameter_count()), std::string(P::name).c_str(),
                std::string(D::name).c_str(), static_cast<long long>(batch), c.accumulate, c.epochs);
    locus::train::metrics ev;
    progress_printer bar;
    // Progress reads the running loss back (a synchronisation): only for a terminal.
    const locus::train::epoch_options eo{.report_every = 20,
                                         .on_progress = bar.tty ? std::function<void(const locus::train::progress&)>(bar)
                                                                : nullptr};
    if (first_epoch >= c.epochs) {
      ev = t.evaluate(test_loader);
      std::printf("nothing to train: the checkpoint is after epoch %lld and --epochs is %d\n",
                  static_cast<long long>(first_epoch), c.epochs);
    }
    for (std::int64_t e = first_epoch; e < c.epochs; ++e) {
      locus::reset_peak_memory_stats<D>();
      auto eoe = eo;
      eoe.epoch = e;
      const auto r = t.train_epoch(train_loader, eoe);
      ev = t.evaluate(test_loader);
      if (bar.tty) std::printf("\r%*s\r", 100, "");
      std::printf("epoch %2lld  train loss %.4f  test loss %.4f  test accuracy %.4f  %8.0f samples/s  peak %s\n",
                  static_cast<long long>(e + 1), r.loss, ev.loss, ev.accuracy, r.samples_per_s,
                  bytes(r.peak_bytes).c_str());
      std::fflush(stdout);
      if (log)
        log << e + 1 << ',' << r.loss << ',' << ev.loss << ',' << ev.accuracy << ',' << r.samples_per_s << ','
            << r.peak_bytes << ',' << r.seconds << '\n'
            << std::flush;
      if (!c.checkpoint_dir.empty()) {
        const std::filesystem::path dir(c.checkpoint_dir);
        locus::train::save_checkpoint(dir / ("epoch-" + std::to_string(e + 1) + ".safetensors"), t, e + 1);
        locus::train::save_checkpoint(dir / "last.safetensors", t, e + 1);
      }
    }
    std::printf("final test accuracy %.4f\n", ev.accuracy);
    return 0;
  };

  const locus::train::options o{.accumulate = c.accumulate};
  if constexpr (locus::amp::needs_loss_scaling<P>) {
    locus::amp::grad_scaler<D> scaler;
    locus::train::trainer t(model, opt, nn::cross_entropy{}, scaler, o);
    return go(t);
  } else {
    locus::train::trainer t(model, opt, nn::cross_entropy{}, o);
    return go(t);
  }
}

template <class D>
int run_device(const config& c, const std::string& precision) {
  if (precision == "fp32") return run<D, locus::amp::fp32>(c);
  if (precision == "bf16") return run<D, locus::amp::bf16_mixed>(c);
  return run<D, locus::amp::fp16_mixed>(c);
}

}  // namespace

int main(int argc, char** argv) {
  const config c = parse(argc, argv);
  const auto env = locus::environment();
  std::fputs(env.to_string().c_str(), stdout);
  try {
    bool use_cuda = false;
    if (c.device == "cuda") {
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
      if (!locus::cuda_available()) {
        std::fprintf(stderr, "fashion_mnist: --device cuda, but no usable GPU: %s\n", env.cuda_status.c_str());
        return 1;
      }
      use_cuda = true;
#else
      std::fprintf(stderr, "fashion_mnist: --device cuda, but this build has no CUDA (configure with nvcc on PATH)\n");
      return 1;
#endif
    } else if (c.device == "auto") {
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
      use_cuda = locus::cuda_available();
#endif
    }
    const std::string precision = !c.precision.empty() ? c.precision : (use_cuda ? "bf16" : "fp32");
    std::printf("\ntraining on %s in %s\n", use_cuda ? "cuda" : "cpu", precision.c_str());
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
    if (use_cuda) return run_device<locus::cuda>(c, precision);
#endif
    return run_device<locus::cpu>(c, precision);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
