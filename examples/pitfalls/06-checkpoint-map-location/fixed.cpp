// The fix: load the file onto the device of the model that reads it. A locus checkpoint
// (safetensors) records no device at all, so a file written by a GPU run opens on any
// machine:
//   - locus::train::resume(path, t) loads onto t's device (the usual call);
//   - locus::io::load<locus::cpu>(path) names the device (map_location as a type), and
//     train::load_checkpoint(archive, t) restores a trainer from it;
//   - nn::load(path, model) reads only the weights, for inference.
// The program trains on the best available device (cuda on a GPU machine, cpu here;
// LOCUS_DEVICE or `fixed cpu` chooses) and saves a checkpoint, then restores it into a
// model built for the cpu and checks that it predicts as the trained model did.
// Compiled by nvcc in a CUDA build.
#include <locus/data/loader.hpp>
#include <locus/train.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "synthetic.hpp"

namespace {

using P = locus::amp::fp32;

template <class D>
auto make_model() {
  namespace nn = locus::nn;
  return nn::sequential(nn::linear<D, P>(32, 64), nn::relu<D, P>(), nn::linear<D, P>(64, 4));
}

template <class D>
double accuracy(auto& t) {
  auto test = pitfalls::make_data(1024, 32, 4, /*seed=*/2);
  locus::data::tensor_dataset set(std::move(test.x), std::move(test.y));
  locus::data::loader<D, locus::data::tensor_dataset> batches(set, {.batch_size = 512});
  return t.evaluate(batches).accuracy;
}

}  // namespace

int main(int argc, char** argv) {
  const auto choice = argc > 1 ? locus::parse_device_choice(argv[1]) : locus::device_choice::automatic;
  const auto dir = std::filesystem::temp_directory_path() / ("locus-pitfall-06-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "last.safetensors";

  // 1. The training run (on a GPU machine: cuda), which writes the checkpoint.
  const double trained = locus::with_device(choice, [&](auto device) -> double {
    using D = decltype(device);
    auto model = make_model<D>();
    locus::optim::adamw<D> opt(model.parameters(), {.lr = 3e-3});
    locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
    auto train = pitfalls::make_data(4096, 32, 4, /*seed=*/1);
    locus::data::tensor_dataset set(std::move(train.x), std::move(train.y));
    locus::data::loader<D, locus::data::tensor_dataset> batches(set, {.batch_size = 128, .shuffle = true, .seed = 1});
    for (int epoch = 0; epoch < 3; ++epoch) t.train_epoch(batches, {.epoch = epoch});
    locus::train::save_checkpoint(path, t, /*epoch=*/3);
    const double acc = accuracy<D>(t);
    std::printf("trained on %s for 3 epochs: test accuracy %.4f; saved %s\n", std::string(D::name).c_str(), acc,
                path.filename().string().c_str());
    return acc;
  });

  // 2. The CPU-only machine: the same model, built for the cpu.
  using H = locus::cpu;
  auto model = make_model<H>();
  locus::optim::adamw<H> opt(model.parameters(), {.lr = 3e-3});
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
  const auto epochs = locus::train::resume(path, t);  // onto t's device
  const double resumed = accuracy<H>(t);
  std::printf("resumed on cpu after epoch %lld: test accuracy %.4f\n", static_cast<long long>(epochs), resumed);

  // The same with the device named: map_location as a type.
  auto model2 = make_model<H>();
  locus::optim::adamw<H> opt2(model2.parameters(), {.lr = 3e-3});
  locus::train::trainer t2(model2, opt2, locus::nn::cross_entropy{});
  locus::train::load_checkpoint(locus::io::load<locus::cpu>(path), t2);
  const double named = accuracy<H>(t2);

  // Weights only, for inference.
  auto model3 = make_model<H>();
  locus::nn::load(path, model3);
  auto probe = pitfalls::make_data(8, 32, 4, /*seed=*/2);
  auto out = model3.infer(std::as_const(probe.x).view());
  std::printf("io::load<cpu> + load_checkpoint: accuracy %.4f; nn::load: logits of sample 0 start %.4f\n", named,
              static_cast<double>(out(0, 0)));

  std::filesystem::remove_all(dir);
  // The same weights give the same predictions (the GPU's sums may round differently).
  if (epochs != 3 || std::fabs(resumed - trained) > 0.01 || resumed != named) {
    std::printf("fixed: the restored model does not predict as the trained one\n");
    return 1;
  }
  return 0;
}
