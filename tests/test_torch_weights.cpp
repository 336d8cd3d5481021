// Models trained in PyTorch, loaded into locus: tests/python/torch_to_locus.py trains the
// main job's MLP (784-512-256-10) and CNN (examples/fashion_mnist_job.hpp --model cnn) on
// Fashion-MNIST as torch nn.Sequential, saves each with
// safetensors.torch.save_file(model.state_dict()), and records PyTorch's test accuracy
// (eval mode, f32), its logits for all 10000 test images, and for the first K an f64
// reference and a bound on any f32 implementation's error. Here the same models, built
// under amp::fp32 on the cpu, read the files with nn::load, and
//   * the trainer's evaluate() on the test set gives PyTorch's number of correct
//     predictions (accuracy to 1e-4: the same count);
//   * the logits of the first K images are within the f32 error bound of the f64
//     reference (a rigorous bound, any summation order) and within 16 times PyTorch's own
//     largest f32 error (see kNoiseFactor); every prediction that differs from
//     PyTorch's is a near-tie within that noise (none did when this was written).
//
// The directory is named by LOCUS_TORCH_WEIGHTS_DIR (the CTest "interop: a model trained
// in PyTorch loads into locus ..." writes it and sets it); without it the test says it
// is skipped and passes.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <string>
#include <vector>

#include <locus/data/idx.hpp>
#include <locus/data/loader.hpp>
#include <locus/train.hpp>
#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
#include <nlohmann/json.hpp>

#include <locus/io/safetensors.hpp>
#include <locus/nn/serialize.hpp>
#endif

#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
namespace {

namespace fs = std::filesystem;
namespace nn = locus::nn;
using locus::index_t;
using D = locus::cpu;
using P = locus::amp::fp32;

// Both PyTorch (oneDNN/MKL GEMMs and convolutions) and locus (im2col + sgemm, batch norm in
// f64) compute in f32 and differ only in how they order and block their sums; the error
// of each is made of roundings of the same partial sums, so the two errors are of the
// same size. 16 times PyTorch's largest |f32 - f64| over the K reference images leaves
// room for a less favourable blocking and still catches any real difference (a missing
// bias, a transposed weight, a wrong batch-norm statistic move logits by 1e-2 and more;
// f32 noise is about 1e-6).
constexpr double kNoiseFactor = 16.0;

struct figures {
  std::int64_t torch_correct = 0, locus_correct = 0, argmax_correct = 0, disagreements = 0;
  double accuracy = 0, max_diff_all = 0, max_diff_k = 0, max_diff64 = 0, torch_noise = 0, worst_of_bound = 0, eval_s = 0;
};

/// Loads `name`'s weights into `model`, evaluates it on the test set (rows for the MLP,
/// images for the CNN) and compares with PyTorch's figures.
template <class Model>
void check_model(const fs::path& dir, const nlohmann::json& results, const std::string& name, Model& model) {
  INFO(name);
  const auto& r = results.at(name);
  const fs::path weights = dir / r.at("weights").get<std::string>();
  const auto t0 = std::chrono::steady_clock::now();
  nn::load(weights, model);  // strict: every name and shape of the state_dict must match
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const auto test_set = locus::data::idx_dataset::from_directory(results.at("data_dir").get<std::string>(), "t10k");
  const index_t n = test_set.size();
  REQUIRE(n == results.at("test_samples").get<index_t>());
  locus::data::loader<D> rows(test_set, {.batch_size = 1000});
  constexpr bool images = Model::input_rank == 4;

  // the trainer's evaluate(): its optimizer is never stepped
  locus::optim::adamw<D> opt(model.parameters());
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  const auto ev = [&] {
    if constexpr (images) {
      auto b = locus::data::images(rows, 1, 28, 28);
      return t.evaluate(b);
    } else {
      return t.evaluate(rows);
    }
  }();
  figures f;
  f.eval_s = ev.seconds;
  f.accuracy = ev.accuracy;
  f.torch_correct = r.at("correct").get<std::int64_t>();
  f.locus_correct = std::llround(ev.accuracy * static_cast<double>(ev.samples));
  CHECK(ev.samples == n);

  // every test image's logits through infer(), against PyTorch's
  const auto ref = locus::io::load<D>(dir / "reference.safetensors");
  const auto torch_logits = ref.get<float, 2>(name + ".logits");
  const auto torch_pred = ref.get<std::int64_t, 1>(name + ".pred");
  const auto logits64 = ref.get<double, 2>(name + ".logits64");
  const auto bound = ref.get<double, 2>(name + ".bound");
  REQUIRE(torch_logits.shape()[0] == n);
  const index_t classes = torch_logits.shape()[1], k = logits64.shape()[0];
  std::vector<float> ours(static_cast<std::size_t>(n * classes));
  {
    index_t row = 0;
    const auto run = [&](auto& batches) {
      for (const auto& b : batches) {
        const auto y = model.infer(b.x);
        REQUIRE(y.shape()[1] == classes);
        std::copy_n(y.data_handle(), y.numel(), ours.begin() + row * classes);
        row += y.shape()[0];
      }
    };
    if constexpr (images) {
      auto b = locus::data::images(rows, 1, 28, 28);
      run(b);
    } else {
      run(rows);
    }
    REQUIRE(row == n);
  }
  const auto labels = test_set.labels();
  for (index_t i = 0; i < k; ++i)
    for (index_t c = 0; c < classes; ++c)
      f.torch_noise = std::max(f.torch_noise, std::abs(static_cast<double>(torch_logits(i, c)) - logits64(i, c)));
  const double noise_tol = kNoiseFactor * f.torch_noise + 1e-7;
  index_t outside_bound = 0, outside_noise = 0, unjustified = 0;
  std::int64_t torch_correct_from_pred = 0;
  for (index_t i = 0; i < n; ++i) {
    const float* o = ours.data() + i * classes;
    const index_t pred = std::max_element(o, o + classes) - o;  // the first maximum, as PyTorch's argmax
    f.argmax_correct += pred == labels(i);
    for (index_t c = 0; c < classes; ++c) {
      const double d = std::abs(static_cast<double>(o[c]) - static_cast<double>(torch_logits(i, c)));
      f.max_diff_all = std::max(f.max_diff_all, d);
      if (i < k) {
        const double d64 = std::abs(static_cast<double>(o[c]) - logits64(i, c));
        f.max_diff_k = std::max(f.max_diff_k, d);
        f.max_diff64 = std::max(f.max_diff64, d64);
        f.worst_of_bound = std::max(f.worst_of_bound, d64 / bound(i, c));
        outside_bound += !(d64 <= bound(i, c) * (1 + 1e-9)) || !(d <= 2 * bound(i, c) * (1 + 1e-9));
        outside_noise += !(d64 <= noise_tol);
      }
    }
    torch_correct_from_pred += torch_pred(i) == labels(i);
    if (pred != torch_pred(i)) {
      ++f.disagreements;
      const double margin = static_cast<double>(torch_logits(i, torch_pred(i))) - static_cast<double>(torch_logits(i, pred));
      const bool tie = margin <= 2 * noise_tol;
      unjustified += !tie;
      MESSAGE(name << ": test image " << i << ": locus predicts " << pred << ", PyTorch " << torch_pred(i)
                   << " (label " << labels(i) << "); PyTorch's margin " << margin << (tie ? ", a near-tie within f32 noise" : ", NOT a tie"));
    }
  }
  MESSAGE(std::setprecision(6) << name << ": PyTorch " << f.torch_correct << " correct of " << n << " (accuracy "
                               << r.at("accuracy").get<double>() << "), locus evaluate() " << f.locus_correct
                               << " (accuracy " << f.accuracy << ", argmax of infer() " << f.argmax_correct
                               << "); predictions that differ: " << f.disagreements << "; max |locus - PyTorch| logit "
                               << f.max_diff_all << " over all images, " << f.max_diff_k << " over the first " << k
                               << "; max |f32 - f64| PyTorch " << f.torch_noise << ", locus " << f.max_diff64
                               << " (up to " << f.worst_of_bound << " of the rigorous bound); nn::load " << load_s << " s, evaluate() "
                               << f.eval_s << " s");
  CHECK_MESSAGE(outside_bound == 0, outside_bound << " logits of the first " << k
                                                   << " images are outside the f32 error bound (of the f64 reference, "
                                                      "or twice it of PyTorch's)");
  CHECK_MESSAGE(outside_noise == 0, outside_noise << " logits of the first " << k << " images differ from the f64 reference by more than "
                                                  << kNoiseFactor << " x PyTorch's own f32 error (" << noise_tol << ")");
  CHECK(f.argmax_correct == f.locus_correct);  // evaluate() counts what infer() + argmax gives
  // the same count of correct predictions; one apart only if every differing prediction
  // is a near-tie that f32 summation order decides (reported above)
  CHECK(unjustified == 0);
  CHECK(torch_correct_from_pred == f.torch_correct);  // PyTorch's count is that of its predictions
  if (f.locus_correct != f.torch_correct) {
    const bool near_tie = std::abs(f.locus_correct - f.torch_correct) <= 1 && f.disagreements > 0 && unjustified == 0;
    CHECK_MESSAGE(near_tie, "locus " << f.locus_correct << " correct, PyTorch " << f.torch_correct << ", with "
                                     << f.disagreements << " differing predictions");
    if (near_tie) MESSAGE(name << ": the counts differ by one, at a near-tie (see above)");
  } else {
    CHECK(std::abs(f.accuracy - r.at("accuracy").get<double>()) <= 1e-12);
  }
  CHECK(f.locus_correct > n / 2);  // a trained model, not chance
}

}  // namespace
#endif

// Not part of the host suite's run (doctest::skip(): it needs a file a Python script
// writes): the interop CTest named below runs the script, then this case with --no-skip.
TEST_CASE("PyTorch-trained MLP and CNN: nn::load reads their state_dict, evaluate() gives PyTorch's test accuracy" *
          doctest::skip()) {
#if !defined(LOCUS_HAS_JSON) || !LOCUS_HAS_JSON
  FAIL("reading safetensors needs nlohmann-json");
#else
  const char* env = std::getenv("LOCUS_TORCH_WEIGHTS_DIR");
  if (env == nullptr || *env == '\0') {
    FAIL("LOCUS_TORCH_WEIGHTS_DIR is not set (tests/python/torch_to_locus.py DIR writes it; the CTest "
         "\"interop: a model trained in PyTorch loads into locus ...\" runs both)");
  }
  const fs::path dir = env;
  if (!fs::exists(dir / "results.json")) {
    FAIL("LOCUS_TORCH_WEIGHTS_DIR names " << dir << ", which holds no results.json");
  }
  std::ifstream in(dir / "results.json");
  const auto results = nlohmann::json::parse(in);
  MESSAGE("PyTorch " << results.at("torch").get<std::string>() << " on " << results.at("threads").get<int>()
                     << " threads");
  {
    nn::sequential mlp{nn::linear<D, P>(784, 512), nn::relu<D, P>(), nn::linear<D, P>(512, 256), nn::relu<D, P>(),
                       nn::linear<D, P>(256, 10)};
    check_model(dir, results, "mlp", mlp);
  }
  {
    // examples/fashion_mnist_job.hpp's make_cnn for 28 x 28 images and 10 classes
    nn::sequential cnn{nn::conv2d<D, P>(1, 32, 3, {.padding = 1}), nn::batch_norm2d<D, P>(32), nn::relu<D, P>(),
                       nn::max_pool2d<D, P>(2), nn::conv2d<D, P>(32, 64, 3, {.padding = 1}), nn::batch_norm2d<D, P>(64),
                       nn::relu<D, P>(), nn::max_pool2d<D, P>(2), nn::flatten<D, P>(),
                       nn::linear<D, P>(64 * 7 * 7, 128), nn::relu<D, P>(), nn::dropout<D, P>(0.3f, 1),
                       nn::linear<D, P>(128, 10)};
    check_model(dir, results, "cnn", cnn);
  }
#endif
}
