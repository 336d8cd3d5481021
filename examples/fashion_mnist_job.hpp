// The main job's body (examples/fashion_mnist.cpp), written once for any device D and
// precision policy P. The program is two translation units: fashion_mnist.cpp, built by
// the host compiler, instantiates it for cpu (so the cpu job gets locus's vectorised host
// paths, which an nvcc translation unit does not have), and fashion_mnist_cuda.cu,
// built by nvcc when CUDA is enabled, instantiates it for cuda (run_cuda). docs/guide.md
// ("One program, both devices") shows the pattern for a program of one's own.
#pragma once

#include <algorithm>
#include <locus/data/loader.hpp>
#include <locus/data/transforms.hpp>
#include <locus/train.hpp>
#if LOCUS_HAS_MPI
#include <locus/dist.hpp>
#endif

#include "fashion_mnist_options.hpp"
#include "plot_metrics.hpp"
#include "resnet.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <cstring>
#include <string>
#include <vector>

namespace fashion_mnist::job {


#if LOCUS_HAS_MPI
inline locus::dist::environment* g_env = nullptr;  // set in main
#endif
/// This process's rank and the job's size (0 and 1 without MPI).
inline int job_rank() {
#if LOCUS_HAS_MPI
  return g_env ? g_env->rank() : 0;
#else
  return 0;
#endif
}
inline int job_size() {
#if LOCUS_HAS_MPI
  return g_env ? g_env->world_size() : 1;
#else
  return 1;
#endif
}

/// A command-line error: the message, a pointer to --help, exit status 2 (before anything
/// else is printed).
[[noreturn]] inline void usage(const std::string& why) {
  std::fprintf(stderr, "fashion_mnist: %s\nusage: fashion_mnist [OPTIONS]; fashion_mnist --help lists them\n",
               why.c_str());
  std::exit(2);
}

using fashion_mnist::config;

/// The options, or usage and status 2 (a bad option), or the options' text and status 0.
inline config parse(int argc, char** argv) {
  try {
    return fashion_mnist::parse_options(argc, argv);
  } catch (const fashion_mnist::help_request& h) {
    std::fputs(h.text.c_str(), stdout);
    std::exit(0);
  } catch (const fashion_mnist::usage_error& e) {
    usage(e.what());
  }
}

inline std::string bytes(std::size_t b) { return locus::out_of_memory::format_bytes(b); }

/// The checkpoints of `dir` newest first: last.safetensors, then epoch-N.safetensors by
/// decreasing N.
inline std::vector<std::filesystem::path> checkpoints_newest_first(const std::filesystem::path& dir) {
  std::vector<std::pair<long long, std::filesystem::path>> epochs;
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  if (std::filesystem::exists(dir / "last.safetensors", ec)) out.push_back(dir / "last.safetensors");
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string pre = "epoch-", post = ".safetensors";
    if (name.size() <= pre.size() + post.size() || name.compare(0, pre.size(), pre) != 0 ||
        name.compare(name.size() - post.size(), post.size(), post) != 0)
      continue;
    const std::string digits = name.substr(pre.size(), name.size() - pre.size() - post.size());
    if (digits.size() > 12 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    epochs.emplace_back(std::stoll(digits), it->path());
  }
  std::sort(epochs.begin(), epochs.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (auto& [n, path] : epochs) out.push_back(std::move(path));
  return out;
}

/// The newest checkpoint of `dir` other than `skip` that loads (every tensor matches its
/// checksum, the file is whole), loaded; nothing when none does.
template <class D>
std::optional<std::pair<std::string, locus::io::archive<D>>> newest_good_checkpoint(const std::filesystem::path& dir,
                                                                                     const std::string& skip) {
  for (const auto& p : checkpoints_newest_first(dir)) {
    std::error_code ec;
    if (!skip.empty() && std::filesystem::equivalent(p, skip, ec)) continue;
    try {
      auto a = locus::io::load<D>(p);
      return std::pair<std::string, locus::io::archive<D>>{p.string(), std::move(a)};
    } catch (const locus::io_error&) {
      // corrupt or unreadable too: try the next older one
    }
  }
  return std::nullopt;
}

/// The archive --resume names: FILE, last.safetensors of --checkpoint-dir, or with
/// --resume newest-good the newest checkpoint there that loads. A corrupt FILE is an
/// io_error that names the newest good checkpoint and how to resume from it.
template <class D>
locus::io::archive<D> open_resume(const config& c, std::string& file) {
  namespace fs = std::filesystem;
  if (c.resume_file == "newest-good") {
    if (c.checkpoint_dir.empty()) usage("--resume newest-good needs --checkpoint-dir (the directory to look in)");
    auto found = newest_good_checkpoint<D>(c.checkpoint_dir, "");
    if (!found)
      throw locus::io_error("locus: --resume newest-good: no checkpoint in '" + c.checkpoint_dir +
                            "' loads (none there, or every one is corrupt); start a new run without --resume");
    file = found->first;
    std::printf("--resume newest-good: %s\n", file.c_str());
    return std::move(found->second);
  }
  try {
    return locus::io::load<D>(file);
  } catch (const locus::io_error& e) {
    const fs::path dir = !c.checkpoint_dir.empty() ? fs::path(c.checkpoint_dir) : fs::path(file).parent_path();
    const auto found = newest_good_checkpoint<D>(dir.empty() ? fs::path(".") : dir, file);
    if (!found) throw;
    throw locus::io_error(std::string(e.what()) + "\nthe newest good checkpoint is " + found->first +
                          ": resume from it with --resume " + found->first +
                          (c.checkpoint_dir.empty() ? std::string() : std::string(" (or --resume newest-good)")));
  }
}

/// The main job's CNN for 1 x rows x cols images: two 3x3 convolutions (32 and 64
/// channels, same padding) each with batch norm, relu and 2x2 max pooling, then a
/// 128-wide hidden layer with dropout and the classes.
template <class D, class P>
auto make_cnn(locus::index_t rows, locus::index_t cols, locus::index_t classes, std::uint64_t seed) {
  namespace nn = locus::nn;
  nn::sequential m(nn::conv2d<D, P>(1, 32, 3, {.padding = 1}), nn::batch_norm2d<D, P>(32), nn::relu<D, P>(),
                   nn::max_pool2d<D, P>(2), nn::conv2d<D, P>(32, 64, 3, {.padding = 1}), nn::batch_norm2d<D, P>(64),
                   nn::relu<D, P>(), nn::max_pool2d<D, P>(2), nn::flatten<D, P>(),
                   nn::linear<D, P>(64 * (rows / 4) * (cols / 4), 128), nn::relu<D, P>(), nn::dropout<D, P>(0.3f, seed),
                   nn::linear<D, P>(128, classes));
  m.reset_parameters(seed);
  return m;
}

template <class D, class P, class Model>
inline int train_model(const config& c, locus::data::idx_dataset& train_set, locus::data::idx_dataset& test_set, Model& model);

template <class D, class P>
inline int run(const config& c) {
  namespace nn = locus::nn;
  if (c.memory_limit) locus::set_memory_limit<D>(c.memory_limit);
  auto train_set = locus::data::idx_dataset::from_directory(c.data, "train");
  auto test_set = locus::data::idx_dataset::from_directory(c.data, "t10k");
  const locus::index_t features = train_set.rows() * train_set.cols();
  std::int64_t classes = 0;
  for (std::int64_t v : train_set.labels().span()) classes = std::max(classes, v + 1);
  if (c.model == "cnn") {
    if (train_set.rows() < 4 || train_set.cols() < 4)
      throw std::runtime_error("--model cnn needs images of at least 4 x 4 pixels");
    auto model = make_cnn<D, P>(train_set.rows(), train_set.cols(), classes, c.seed);
    return train_model<D, P>(c, train_set, test_set, model);
  }
  if (c.model == "resnet") {
    if (train_set.rows() < 4 || train_set.cols() < 4)
      throw std::runtime_error("--model resnet needs images of at least 4 x 4 pixels");
    // a module of one block per stage (examples/resnet.hpp), initialised from --seed
    nn::model<locus_examples::resnet<D, P>> model(classes, static_cast<locus::index_t>(c.width),
                                                  std::array<int, 3>{1, 1, 1});
    model.reset_parameters(c.seed);
    return train_model<D, P>(c, train_set, test_set, model);
  }
  nn::sequential model(nn::linear<D, P>(features, c.hidden[0]), nn::relu<D, P>(),
                       nn::linear<D, P>(c.hidden[0], c.hidden[1]), nn::relu<D, P>(),
                       nn::linear<D, P>(c.hidden[1], classes));
  model.reset_parameters(c.seed);
  return train_model<D, P>(c, train_set, test_set, model);
}

template <class D, class P, class Model>
inline int train_model(const config& c, locus::data::idx_dataset& train_set, locus::data::idx_dataset& test_set, Model& model) {
  namespace nn = locus::nn;
  constexpr bool images = Model::input_rank == 4;
  const locus::index_t rows = train_set.rows(), cols = train_set.cols(), features = rows * cols;
  const std::int64_t classes = model.output_shape(images ? std::vector<locus::index_t>{1, 1, rows, cols}
                                                         : std::vector<locus::index_t>{1, features})[1];
  locus::optim::adamw<D> opt(model.parameters(), {.lr = c.lr, .weight_decay = 1e-4});

  constexpr locus::index_t eval_batch_size = 1000;
  const int rank = job_rank(), world = job_size();
  auto go = [&](auto& t) -> int {
    for (const auto& note : t.preflight().notes) std::printf("preflight note: %s\n", note.c_str());
    // Several ranks: the epoch functions and checkpoints through data_parallel (rank 0's
    // initial weights on every rank, gradients averaged each optimizer step).
#if LOCUS_HAS_MPI
    using T = std::remove_reference_t<decltype(t)>;
    std::optional<locus::dist::communicator<D>> comm;
    std::optional<locus::dist::data_parallel<T>> dp;
    if (world > 1) {
      if constexpr (std::is_same_v<D, locus::cuda> && !LOCUS_DIST_NCCL) {
        throw std::runtime_error("several ranks on cuda need NCCL, and this build has none");
      } else {
        comm.emplace(*g_env);
        dp.emplace(*comm, t);
      }
    }
    auto train_epoch = [&](auto& rows_loader, const locus::train::epoch_options& eo) {
      auto run_on = [&](auto& loader) { return dp ? dp->train_epoch(loader, eo) : t.train_epoch(loader, eo); };
      if constexpr (images) {
        auto b = locus::data::images(rows_loader, 1, rows, cols);
        return run_on(b);
      } else {
        return run_on(rows_loader);
      }
    };
    auto evaluate = [&](auto& rows_loader) {
      auto run_on = [&](auto& loader) { return dp ? dp->evaluate(loader) : t.evaluate(loader); };
      if constexpr (images) {
        auto b = locus::data::images(rows_loader, 1, rows, cols);
        return run_on(b);
      } else {
        return run_on(rows_loader);
      }
    };
    auto save = [&](const std::filesystem::path& path, std::int64_t epoch, const std::map<std::string, std::string>& run) {
      if (dp) dp->save_checkpoint(path, epoch, run);
      else locus::train::save_checkpoint(path, t, epoch, run);
    };
#else
    auto train_epoch = [&](auto& rows_loader, const locus::train::epoch_options& eo) {
      if constexpr (images) {
        auto b = locus::data::images(rows_loader, 1, rows, cols);
        return t.train_epoch(b, eo);
      } else {
        return t.train_epoch(rows_loader, eo);
      }
    };
    auto evaluate = [&](auto& rows_loader) {
      if constexpr (images) {
        auto b = locus::data::images(rows_loader, 1, rows, cols);
        return t.evaluate(b);
      } else {
        return t.evaluate(rows_loader);
      }
    };
    auto save = [&](const std::filesystem::path& path, std::int64_t epoch, const std::map<std::string, std::string>& run) {
      locus::train::save_checkpoint(path, t, epoch, run);
    };
#endif
    // Batch size: a number, or the largest that fits the device's memory.
    const locus::data::loader_options train_options{
        .shuffle = true, .seed = c.seed, .drop_last = world > 1, .rank = rank, .world_size = world};
    locus::index_t batch = 0;
    if (c.batch_size == "auto") {
      const locus::index_t cap = std::min<locus::index_t>(train_set.size(), 4096);
      // The loader keeps `prefetch` batches on the device beside the one in use: the
      // probe holds as many while it runs forward and backward. Evaluation runs while
      // the training's buffers are still held: the probe also holds the test loader's
      // batches (prefetch + 1 of eval_batch) and the inference forward's activations.
      std::vector<locus::tensor<float, D, 2>> ahead;
      // per sample: the MLP's layer widths, or every CNN layer's output
      locus::index_t widths = 0;
      if constexpr (images) {
        for (const auto& shape : model.layer_shapes({1, 1, rows, cols})) {
          locus::index_t n = 1;
          for (const auto e : shape) n *= e;
          widths += n;
        }
      } else {
        widths = c.hidden[0] + c.hidden[1] + classes;
      }
      batch = locus::train::find_max_batch_size(
          t,
          [&](locus::index_t b) {
            const locus::index_t eval_batch = std::min({eval_batch_size, b, test_set.size()});
            ahead.clear();
            for (int k = 0; k < train_options.prefetch; ++k) ahead.push_back(locus::empty<float, D>({b, features + 2}));
            for (int k = 0; k <= train_options.prefetch; ++k)
              ahead.push_back(locus::empty<float, D>({eval_batch, features + 2}));
            ahead.push_back(locus::empty<float, D>({eval_batch, 2 * widths}));
            auto y = locus::zeros<std::int64_t, D>({b});
            if constexpr (images) {
              auto x = locus::zeros<float, D>({b, 1, rows, cols});
              return std::pair{std::move(x), std::move(y)};
            } else {
              auto x = locus::zeros<float, D>({b, features});
              return std::pair{std::move(x), std::move(y)};
            }
          },
          64, cap);
      ahead.clear();
      if (batch == 0) throw std::runtime_error("not even a batch of 1 fits in the device's memory");
#if LOCUS_HAS_MPI
      if (comm) batch = static_cast<locus::index_t>(comm->min(static_cast<double>(batch)));  // every rank's
#endif
      std::printf("batch size auto: %lld (the largest that fits %s memory, searched up to %lld)\n",
                  static_cast<long long>(batch), std::string(D::name).c_str(), static_cast<long long>(cap));
    } else {
      batch = std::stoll(c.batch_size);  // checked by parse()
    }
    auto lo = train_options;
    lo.batch_size = batch;
    lo.workers = c.workers;  // the same batches at any count: not a resume option
    if (images && c.augment == "crop+flip")
      lo.transform = locus::data::compose(
          locus::data::random_crop{.channels = 1, .height = rows, .width = cols, .padding = 2},
          locus::data::horizontal_flip{.channels = 1, .height = rows, .width = cols});
    else if (images && c.augment == "flip")
      lo.transform = locus::data::compose(locus::data::horizontal_flip{.channels = 1, .height = rows, .width = cols});
    locus::data::loader<D> train_loader(train_set, lo);
    // Evaluation in batches of 1000, or of the training batch when auto chose a smaller one.
    const locus::index_t eval_batch =
        c.batch_size == "auto" ? std::min(eval_batch_size, batch) : eval_batch_size;
    locus::data::loader<D> test_loader(
        test_set, {.batch_size = eval_batch, .rank = rank, .world_size = world, .prefetch = train_options.prefetch});
    const auto steps_per_epoch =
        (static_cast<std::int64_t>(train_loader.size()) + c.accumulate - 1) / c.accumulate;
    t.set_schedule(locus::optim::cosine_lr{steps_per_epoch * c.epochs, c.lr * 0.01});

    // Recorded in every checkpoint, compared on --resume.
    std::string hidden_text = std::to_string(c.hidden[0]) + "," + std::to_string(c.hidden[1]);
    char lr_text[32], clip_text[32], clip_value_text[32];
    std::snprintf(lr_text, sizeof lr_text, "%.17g", c.lr);
    std::snprintf(clip_text, sizeof clip_text, "%.17g", c.clip_grad_norm);
    std::snprintf(clip_value_text, sizeof clip_value_text, "%.17g", c.clip_grad_value);
    const std::map<std::string, std::string> run_info{{"epochs", std::to_string(c.epochs)},
                                                      {"batch-size", std::to_string(batch)},
                                                      {"accumulate", std::to_string(c.accumulate)},
                                                      {"clip-grad-norm", clip_text},
                                                      {"clip-grad-value", clip_value_text},
                                                      {"lr", lr_text},
                                                      {"seed", std::to_string(c.seed)},
                                                      {"hidden", hidden_text},
                                                      {"model", c.model},
                                                      {"augment", c.model != "mlp" ? c.augment : std::string("-")},
                                                      {"width", c.model == "resnet" ? std::to_string(c.width) : "-"},
                                                      // the steps per epoch (and the schedule) follow the ranks
                                                      {"ranks", std::to_string(world)}};
    std::int64_t first_epoch = 0;
    if (c.resume) {
      std::string file = c.resume_file;
      if (file.empty()) {
        if (c.checkpoint_dir.empty()) usage("--resume without a file needs --checkpoint-dir");
        file = (std::filesystem::path(c.checkpoint_dir) / "last.safetensors").string();
      }
      // Read once, onto the model's device. The run's options that shape training must be
      // the first run's: the cosine schedule spans --epochs steps of --batch-size x
      // --accumulate, and the checkpoint's learning rate and seed win over new ones.
      const auto archive = open_resume<D>(c, file);
      const auto saved = locus::train::run_options(archive);
      std::string diff;
      for (const auto& [k, v] : run_info)
        if (const auto it = saved.find(k); it != saved.end() && it->second != v)
          diff += " --" + k + " " + it->second + " (this run: " + v + ")";
      if (!diff.empty())
        usage("--resume: " + file + " was written by a run with" + diff +
              "; resume with the first run's options, or start a new run without --resume");
      first_epoch = locus::train::load_checkpoint(archive, t);
      std::printf("resumed from %s after epoch %lld\n", file.c_str(), static_cast<long long>(first_epoch));
    }

    std::ofstream log;
    if (!c.log.empty() && rank == 0) {
      // A resumed run keeps the rows of the epochs before the checkpoint and drops later
      // ones (resuming from an earlier checkpoint would otherwise repeat them).
      std::vector<std::string> kept;
      if (first_epoch > 0 && std::filesystem::exists(c.log)) {
        std::ifstream in(c.log);
        std::string line;
        std::getline(in, line);  // the header
        while (std::getline(in, line)) {
          const std::size_t comma = line.find(',');
          long long epoch = 0;
          try {
            epoch = std::stoll(line.substr(0, comma));
          } catch (const std::exception&) {
            continue;
          }
          if (epoch >= 1 && epoch <= first_epoch) kept.push_back(line);
        }
      }
      log.open(c.log, std::ios::trunc);
      if (!log) throw locus::io_error("cannot write " + c.log);
      log << "epoch,train_loss,test_loss,test_accuracy,samples_per_s,peak_bytes,seconds,lr,loader_wait_seconds\n";
      for (const auto& line : kept) log << line << '\n';
    }

    if (world > 1)
      std::printf("data-parallel: %d ranks, batch %lld per rank (%lld in all), gradients averaged each step\n", world,
                  static_cast<long long>(batch), static_cast<long long>(batch) * world);
    if constexpr (images)
      std::printf("model: %s, %lld parameters; %s on %s, batch %lld x %d, %d epochs%s\n",
                  c.model == "resnet" ? ("ResNet (widths " + std::to_string(c.width) + ", " +
                                         std::to_string(2 * c.width) + ", " + std::to_string(4 * c.width) +
                                         "; one basic block each; " + std::to_string(classes) + " classes)").c_str()
                                      : ("CNN (conv 32, conv 64, 128, " + std::to_string(classes) + ")").c_str(),
                  static_cast<long long>(model.parameters().parameter_count()),
                  std::string(P::name).c_str(), std::string(D::name).c_str(), static_cast<long long>(batch),
                  c.accumulate, c.epochs,
                  c.augment == "none" ? "" : c.augment == "flip" ? ", augmented (flips)" : ", augmented (crops, flips)");
    else
      std::printf("model: %lld-%lld-%lld-%lld MLP, %lld parameters; %s on %s, batch %lld x %d, %d epochs\n",
                  static_cast<long long>(features), static_cast<long long>(c.hidden[0]),
                  static_cast<long long>(c.hidden[1]), static_cast<long long>(classes),
                  static_cast<long long>(model.parameters().parameter_count()), std::string(P::name).c_str(),
                  std::string(D::name).c_str(), static_cast<long long>(batch), c.accumulate, c.epochs);
    locus::train::metrics ev;
    // The library's bar on a terminal (rank 0's, at the whole job's rate). Progress reads
    // the running loss back (a synchronisation): only for a terminal.
    const locus::train::progress_bar bar{.scale = static_cast<double>(world)};
    const bool tty = locus::train::progress_bar::is_terminal(stdout);
    const locus::train::epoch_options eo{
        .report_every = 20, .on_progress = tty ? std::function<void(const locus::train::progress&)>(bar) : nullptr};
    if (first_epoch >= c.epochs) {
      ev = evaluate(test_loader);
      std::printf("nothing to train: the checkpoint is after epoch %lld and --epochs is %d\n",
                  static_cast<long long>(first_epoch), c.epochs);
    }
    for (std::int64_t e = first_epoch; e < c.epochs; ++e) {
      locus::reset_peak_memory_stats<D>();
      auto eoe = eo;
      eoe.epoch = e;
      const auto r = train_epoch(train_loader, eoe);
      ev = evaluate(test_loader);

      std::printf("epoch %2lld  train loss %.4f  test loss %.4f  test accuracy %.4f  %8.0f samples/s  peak %s  %.1f s"
                  "  loader wait %.2f s\n",
                  static_cast<long long>(e + 1), r.loss, ev.loss, ev.accuracy, r.samples_per_s,
                  bytes(r.peak_bytes).c_str(), r.seconds + ev.seconds, r.loader_wait_seconds);
      std::fflush(stdout);
      if (log)
        log << e + 1 << ',' << r.loss << ',' << ev.loss << ',' << ev.accuracy << ',' << r.samples_per_s << ','
            << r.peak_bytes << ',' << r.seconds << ',' << opt.lr() << ',' << r.loader_wait_seconds << '\n'
            << std::flush;
      if (!c.checkpoint_dir.empty()) {
        const std::filesystem::path dir(c.checkpoint_dir);
        save(dir / ("epoch-" + std::to_string(e + 1) + ".safetensors"), e + 1, run_info);
        save(dir / "last.safetensors", e + 1, run_info);
      }
    }
    std::printf("final test accuracy %.4f\n", ev.accuracy);
    if (!c.plot.empty() && rank == 0) {
      log.close();
      std::fflush(stdout);
      if (!locus_examples::plot_metrics("fashion_mnist", c.log, c.plot)) return 1;
    }
    return 0;
  };

  const locus::train::options o{
      .accumulate = c.accumulate, .clip_grad_norm = c.clip_grad_norm, .clip_grad_value = c.clip_grad_value};
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
inline int run_device(const config& c, const std::string& precision) {
  if (precision == "fp32") return run<D, locus::amp::fp32>(c);
  if (precision == "bf16") return run<D, locus::amp::bf16_mixed>(c);
  return run<D, locus::amp::fp16_mixed>(c);
}

/// The job on cuda (fashion_mnist_cuda.cu, compiled by nvcc; present when
/// FASHION_MNIST_HAS_CUDA is 1).
int run_cuda(const config& c, const std::string& precision);

}  // namespace fashion_mnist::job
