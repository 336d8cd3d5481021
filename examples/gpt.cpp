// The second main job: a character-level GPT trained on a text corpus (by default the
// fortunes Debian's package `fortunes` installs; scripts/run-main --task text), on cpu.
//
//   gpt --steps 600 --log run.csv --checkpoint-dir ckpt   # train, evaluate, sample
//   gpt --resume ckpt/last.safetensors --steps 900        # go on from a checkpoint
//
// The model is GPT-2's block as PyTorch writes it (pre-norm, causal multi-head
// attention, GELU MLP; learned positions; the output projection tied to the token
// table), written as a locus module over token ids. AdamW with the transformer recipe's
// parameter groups (no decay on norms, biases and embeddings), a warm-up then cosine
// learning rate, clipping at norm 1. The split is deterministic (the corpus's last 10%
// validates), training windows come from Philox(seed); every --eval-every steps the
// validation loss and perplexity over the same windows are printed (and logged with
// --log), and checkpoints are written with --checkpoint-dir (step-N and last); --plot PNG
// renders the log at the end (scripts/plot-metrics). At the end a sample of generated
// text (--temperature, --top-k; the same --seed gives the same text).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <locus/data/text.hpp>
#include <locus/train.hpp>

#include "gpt_model.hpp"
#include "plot_metrics.hpp"

namespace nn = locus::nn;
using gpt_job::gpt;
using gpt_job::gpt_config;
using locus::index_t;

namespace {
/// The next token after `ids` (the last `context` of them): softmax of the last logits
/// at `temperature`, only the `top_k` largest when top_k > 0, drawn from Philox(seed, draw).
template <class Model>
std::int64_t sample_next(const Model& m, const std::vector<std::int64_t>& ids, index_t context, double temperature,
                         index_t top_k, std::uint64_t seed, std::uint64_t draw) {
  const index_t t = std::min<index_t>(context, static_cast<index_t>(ids.size()));
  locus::tensor<std::int64_t, locus::cpu, 2> x(locus::extents<2>{1, t});
  std::copy(ids.end() - t, ids.end(), x.data_handle());
  const auto logits = m.infer(x.view());
  const index_t v = logits.shape()[1];
  std::vector<double> z(static_cast<std::size_t>(v));
  for (index_t j = 0; j < v; ++j) z[static_cast<std::size_t>(j)] = logits(t - 1, j) / temperature;
  if (top_k > 0 && top_k < v) {
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[static_cast<std::size_t>(top_k - 1)];
    for (auto& zi : z)
      if (zi < kth) zi = -INFINITY;
  }
  const double mx = *std::max_element(z.begin(), z.end());
  double total = 0;
  for (auto& zi : z) total += (zi = std::exp(zi - mx));
  const auto r = locus::detail::philox4x32(seed, draw, 1);
  double u = locus::detail::uniform_double(r.v[0], r.v[1]) * total;
  for (index_t j = 0; j < v; ++j) {
    u -= z[static_cast<std::size_t>(j)];
    if (u < 0) return j;
  }
  return v - 1;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"locus: a character-level GPT on a text corpus (the second main job)"};
  std::string corpus_path = "/usr/share/games/fortunes", log_path, plot_path, checkpoint_dir, resume_path;
  gpt_config g;
  index_t batch = 32, eval_batches = 16, sample_length = 300, top_k = 20;
  std::int64_t steps = 600, eval_every = 100, warmup = 50;
  double lr = 3e-3, weight_decay = 0.1, temperature = 0.8;
  std::uint64_t seed = 0;
  app.add_option("--corpus", corpus_path, "a text file, or a directory of them (fortune's .dat files are left out)");
  app.add_option("--steps", steps, "optimizer steps in all (a resumed run counts the steps before)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  app.add_option("--batch", batch, "windows per step")->check(CLI::Range(index_t{1}, index_t{1} << 20));
  app.add_option("--context", g.context, "tokens per window (the model's context length)")
      ->check(CLI::Range(index_t{1}, index_t{1} << 16));
  app.add_option("--width", g.width, "the model's width")->check(CLI::Range(index_t{1}, index_t{1} << 16));
  app.add_option("--heads", g.heads, "attention heads (they divide the width)")->check(CLI::Range(index_t{1}, index_t{1} << 10));
  app.add_option("--layers", g.layers, "transformer blocks")->check(CLI::Range(index_t{1}, index_t{64}));
  app.add_option("--lr", lr, "AdamW's peak learning rate")->check(CLI::PositiveNumber);
  app.add_option("--weight-decay", weight_decay, "AdamW's decay of the linear layers' weights")->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", warmup, "steps of linear warm-up before the cosine decay")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  app.add_option("--eval-every", eval_every, "steps between evaluations (and checkpoints)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  app.add_option("--eval-batches", eval_batches, "validation batches per evaluation (the same windows each time)")
      ->check(CLI::Range(index_t{1}, index_t{1} << 20));
  app.add_option("--seed", seed, "initialisation, training windows and the sample");
  app.add_option("--log", log_path, "CSV of step, train_loss, val_loss, val_perplexity, lr, seconds");
  app.add_option("--plot", plot_path,
                 "at the end, render the --log CSV (losses, perplexity, learning rate per evaluation) to this PNG "
                 "(scripts/plot-metrics, matplotlib)");
  app.add_option("--checkpoint-dir", checkpoint_dir, "write DIR/step-N.safetensors and DIR/last.safetensors at every evaluation");
  app.add_option("--resume", resume_path, "continue from a checkpoint this program wrote");
  app.add_option("--sample", sample_length, "characters of text to generate at the end (0: none)")
      ->check(CLI::Range(index_t{0}, index_t{1} << 20));
  app.add_option("--temperature", temperature, "the sample's temperature")->check(CLI::PositiveNumber);
  app.add_option("--top-k", top_k, "sample among the k likeliest tokens (0: all)")->check(CLI::Range(index_t{0}, index_t{1} << 20));
  CLI11_PARSE(app, argc, argv);
  // checked here, not with CLI11's needs(), which an empty --log '' satisfies
  if (!plot_path.empty() && log_path.empty()) {
    std::fprintf(stderr, "locus: --plot needs --log FILE.csv (the log it draws)\n");
    return 2;
  }

  try {
    if (g.width % g.heads != 0)
      throw locus::value_error("locus: " + std::to_string(g.heads) + " heads do not divide the width " +
                               std::to_string(g.width) + "; pick --heads among the width's divisors");
    const auto corpus = locus::data::text_corpus::from_path(corpus_path);
    const auto [train_ids, val_ids] = corpus.split(0.1);
    g.vocabulary = corpus.vocabulary_size();
    const auto val = locus::data::windows_in_order(val_ids, batch, g.context, eval_batches);
    locus::data::token_windows windows(train_ids, batch, g.context, seed);
    std::printf("locus: corpus %s: %lld characters, a vocabulary of %lld; %zu for training, %zu to validate\n",
                corpus_path.c_str(), static_cast<long long>(corpus.size()), static_cast<long long>(g.vocabulary),
                train_ids.size(), val_ids.size());

    using D = locus::cpu;
    nn::model<gpt<D, locus::amp::fp32>> m(g);
    m.reset_parameters(seed);
    std::printf("locus: a GPT of %lld parameters (width %lld, %lld heads, %lld blocks, context %lld)\n",
                static_cast<long long>(m.parameters().parameter_count()), static_cast<long long>(g.width),
                static_cast<long long>(g.heads), static_cast<long long>(g.layers), static_cast<long long>(g.context));
    locus::optim::adamw<D> opt(m.parameters(), {.lr = lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = weight_decay},
                               {locus::optim::no_decay_group(m.parameters())});
    locus::train::options o;
    o.schedule = locus::optim::warmup_lr<locus::optim::cosine_lr>{warmup, {std::max<std::int64_t>(1, steps - warmup), lr / 10}};
    o.clip_grad_norm = 1.0;
    locus::train::trainer t(m, opt, nn::cross_entropy{}, o);

    std::int64_t step = 0;
    if (!resume_path.empty()) {
      step = locus::train::resume(resume_path, t);
      windows.set_draws(static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(batch));
      std::printf("locus: resumed from %s at step %lld\n", resume_path.c_str(), static_cast<long long>(step));
    }
    std::ofstream log;
    if (!log_path.empty()) {
      const bool fresh = resume_path.empty() || !std::filesystem::exists(log_path);
      log.open(log_path, fresh ? std::ios::trunc : std::ios::app);
      if (!log) throw locus::io_error("locus: cannot write the log '" + log_path + "'");
      if (fresh) log << "step,train_loss,val_loss,val_perplexity,lr,seconds\n";
    }
    const auto t0 = std::chrono::steady_clock::now();
    while (step < steps) {
      const auto b = windows.next();
      t.step(b.x, b.y);
      ++step;
      if (step % eval_every == 0 || step == steps) {
        const double train_loss = t.report().loss;
        const auto v = t.evaluate(val);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("step %6lld  train loss %.4f  val loss %.4f  perplexity %.3f  lr %.2e  %.0f s\n",
                    static_cast<long long>(step), train_loss, v.loss, std::exp(v.loss), opt.lr(), secs);
        std::fflush(stdout);
        if (log) log << step << ',' << train_loss << ',' << v.loss << ',' << std::exp(v.loss) << ',' << opt.lr() << ','
                     << secs << '\n' << std::flush;
        if (!checkpoint_dir.empty()) {
          const std::filesystem::path dir(checkpoint_dir);
          locus::train::save_checkpoint(dir / ("step-" + std::to_string(step) + ".safetensors"), t, step);
          locus::train::save_checkpoint(dir / "last.safetensors", t, step);
        }
      }
    }
    if (sample_length > 0) {
      // the prompt: a newline where the corpus has one, else its first character
      std::vector<std::int64_t> ids{corpus.ids()[0]};
      try {
        ids = corpus.encode("\n");
      } catch (const locus::value_error&) {
      }
      for (index_t i = 0; i < sample_length; ++i)
        ids.push_back(sample_next(m, ids, g.context, temperature, top_k, seed, static_cast<std::uint64_t>(i)));
      std::printf("locus: a sample (temperature %.2f, top-k %lld, seed %llu):\n%s\n", temperature,
                  static_cast<long long>(top_k), static_cast<unsigned long long>(seed),
                  corpus.decode(std::span<const std::int64_t>(ids).subspan(1)).c_str());
    }
    if (!plot_path.empty()) {
      log.close();
      std::fflush(stdout);
      if (!locus_examples::plot_metrics("gpt", log_path, plot_path)) return 1;
    }
  } catch (const locus::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
