// The main job's command line (examples/fashion_mnist.cpp), parsed strictly by CLI11:
// every value whole and in range, an error naming its option. A header of its own so that
// tests/fuzz/fuzz_options.cpp fuzzes exactly the parser the main job runs.
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include <locus/core/shape.hpp>

namespace fashion_mnist {

struct config {
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string device = "auto";
  std::string precision;  // default: bf16 on cuda, fp32 on cpu
  int epochs = 15;
  std::string batch_size = "128";
  double lr = 1e-3;
  int accumulate = 1;
  double clip_grad_norm = 0.0;  // 0: no clipping
  double clip_grad_value = 0.0;  // 0: no clipping
  std::uint64_t seed = 0;
  std::vector<locus::index_t> hidden{512, 256};
  std::string model = "mlp";
  std::string augment = "flip";  // cnn, resnet: none, flip (horizontal flips) or crop+flip (and random crops)
  long long width = 16;          // resnet: the first stage's channels
  std::string checkpoint_dir;
  bool resume = false;
  std::string resume_file;
  std::string log;
  std::string plot;  // PNG of the --log CSV, rendered at the end
  std::size_t memory_limit = 0;  // 0: none
  int workers = 1;  // threads that load and augment the training batches' samples
};

/// A command line the job refuses: the message names the option.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// --help: the options, their ranges and defaults.
struct help_request {
  std::string text;
};

/// Parses the command line strictly with CLI11: every value whole, in range, and an error
/// names its option (usage_error); --help throws help_request with the options' text.
inline config parse_options(int argc, const char* const* argv) {
  config c;
  CLI::App app{"fashion_mnist: trains an MLP classifier on Fashion-MNIST (or any IDX directory, such as MNIST)\n"
               "with locus's typed training loop.",
               "fashion_mnist"};
  app.option_defaults()->always_capture_default();
  app.add_option("--data", c.data, "IDX directory (train-* and t10k-* files, plain or .gz)");
  app.add_option("--device", c.device, "where to train")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--precision", c.precision, "fp32, bf16 or fp16 (default: bf16 on cuda, fp32 on cpu)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--epochs", c.epochs, "epochs to train (the cosine schedule spans them)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--batch-size", c.batch_size, "samples per micro-batch, or auto (the largest that fits)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "auto") return {};
            long long n = 0;
            std::size_t used = 0;
            try {
              n = std::stoll(v, &used);
            } catch (const std::exception&) {
              used = 0;
            }
            if (used != v.size() || used == 0) return "'" + v + "' is not a number or auto";
            if (n < 1 || n > (1LL << 31)) return "'" + v + "' is not in [1, 2^31]";
            return {};
          },
          "N|auto"));
  app.add_option("--lr", c.lr, "base learning rate")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            std::size_t used = 0;
            double x = 0;
            try {
              x = std::stod(v, &used);
            } catch (const std::exception&) {
              used = 0;
            }
            if (used != v.size() || used == 0) return "'" + v + "' is not a number";
            if (!(x > 0 && x <= 10)) return "'" + v + "' is not in (0, 10]";
            return {};
          },
          "X in (0, 10]"));
  app.add_option("--accumulate", c.accumulate, "micro-batches per optimizer step")->check(CLI::Range(1, 65536));
  // 0 (off) or an f32 normal number: a bound that would round to 0 or to a denormal in
  // the step's f32 arithmetic is refused here, naming the option, not later
  const CLI::Validator clip_bound(
      [](std::string& v) -> std::string {
        double x = 0;
        std::size_t used = 0;
        try {
          x = std::stod(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != v.size() || used == 0) return "'" + v + "' is not a number";
        if (!(x == 0 || (x >= 1.2e-38 && x <= 1e30))) return "'" + v + "' is not 0 (off) or in [1.2e-38, 1e30]";
        return {};
      },
      "0 or X in [1.2e-38, 1e30]");
  app.add_option("--clip-grad-norm", c.clip_grad_norm,
                 "clip the gradients by their global L2 norm before each step (0: off)")
      ->check(clip_bound);
  app.add_option("--clip-grad-value", c.clip_grad_value,
                 "clip every gradient to [-X, X] before each step (0: off; not with --clip-grad-norm)")
      ->check(clip_bound);
  app.add_option("--seed", c.seed, "seed of the initial weights and the shuffle (0 to 2^64-1)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
              return "'" + v + "' is not a non-negative integer";
            return {};
          },
          "N"));
  app.add_option("--model", c.model,
                 "mlp (784-512-256-10), cnn (two 3x3 convolutions with batch norm and pooling, then 128-10) or "
                 "resnet (a residual network written as a module: a stem and three stages of basic blocks)")
      ->check(CLI::IsMember({"mlp", "cnn", "resnet"}));
  app.add_option("--width", c.width, "resnet: the channels of the first stage (the stages have w, 2w and 4w)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--augment", c.augment,
                 "cnn and resnet: none, flip (horizontal flips of the training images) or crop+flip (also random crops "
                 "of the images padded by 2)")
      ->check(CLI::IsMember({"none", "flip", "crop+flip"}));
  app.add_option("--hidden", c.hidden, "the two hidden layers' widths, e.g. 512,256")
      ->delimiter(',')
      ->expected(2)
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--workers", c.workers,
                 "threads that load and augment the training samples (data::loader_options::workers; the "
                 "batches are the same at every count)")
      ->check(CLI::Range(1, 256));
  app.add_option("--checkpoint-dir", c.checkpoint_dir, "write last.safetensors and epoch-N.safetensors here");
  auto* resume = app.add_option("--resume", c.resume_file,
                                "resume from FILE (default: last.safetensors in --checkpoint-dir), with the "
                                "first run's options; 'newest-good': the newest checkpoint in --checkpoint-dir "
                                "that loads (a corrupt file, one whose tensors do not match their checksums, is "
                                "skipped)")
                     ->expected(0, 1);
  auto* log_option = app.add_option("--log", c.log, "append each epoch's figures to this CSV file");
  app.add_option("--plot", c.plot,
                 "at the end, render the --log CSV to this PNG (losses, accuracy, learning rate; "
                 "scripts/plot-metrics, matplotlib)")
      ->needs(log_option);
  app.add_option("--memory-limit", c.memory_limit, "cap the device's allocator, e.g. 512M")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            return v == "0" ? std::string("a limit of 0 bytes holds nothing; give a size such as 512M") : std::string();
          },
          "BYTES"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    throw help_request{app.help()};
  } catch (const CLI::ParseError& e) {
    throw usage_error(e.what());
  }
  if (c.clip_grad_norm > 0 && c.clip_grad_value > 0)
    throw usage_error("--clip-grad-norm and --clip-grad-value are both set; choose one (0 turns either off)");
  // CLI11's needs() is satisfied by an empty value (`--log '' --plot m.png`, found by
  // tests/fuzz/fuzz_options.cpp): the log the plot reads must be a file
  if (!c.plot.empty() && c.log.empty()) throw usage_error("--plot needs --log FILE.csv (the log it draws)");
  c.resume = resume->count() > 0;
  return c;
}

}  // namespace fashion_mnist
