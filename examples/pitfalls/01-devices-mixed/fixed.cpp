// The fix: build the model for a device D and bring the data to D. The body is written
// once for any D; locus::with_device instantiates it for cpu and cuda and runs the one
// this machine can use (cuda on a GPU machine, cpu here; LOCUS_DEVICE=cpu|cuda, or
// `fixed cpu`, chooses). Every batch the trainer takes is a tensor of D by type:
//   - whole tensors: locus::to<D>(x) copies host data to D once (explicit, blocking);
//   - per batch: locus::data::loader<D> stages each batch and copies it to D (through
//     pinned memory and a side stream on cuda).
// Compiled by nvcc in a CUDA build (the cuda instantiation launches kernels).
#include <locus/data/loader.hpp>
#include <locus/train.hpp>

#include <cstdio>
#include <string>

#include "synthetic.hpp"

int main(int argc, char** argv) {
  const auto choice = argc > 1 ? locus::parse_device_choice(argv[1]) : locus::device_choice::automatic;
  return locus::with_device(choice, [](auto device) -> int {
    using D = decltype(device);
    using P = locus::amp::fp32;
    namespace nn = locus::nn;
    std::printf("model, batches and labels on %s\n", std::string(D::name).c_str());

    auto train = pitfalls::make_data(4096, 32, 4, /*seed=*/1);  // host memory, as read from disk
    auto test = pitfalls::make_data(1024, 32, 4, /*seed=*/2);

    nn::sequential model(nn::linear<D, P>(32, 64), nn::relu<D, P>(), nn::linear<D, P>(64, 4));
    locus::optim::adamw<D> opt(model.parameters(), {.lr = 3e-3});
    locus::train::trainer t(model, opt, nn::cross_entropy{});

    // 1. One explicit transfer of a whole tensor, then steps on views of it (no copies).
    locus::tensor<float, D, 2> x = locus::to<D>(train.x);
    locus::tensor<std::int64_t, D, 1> y = locus::to<D>(train.y);
    for (locus::index_t b = 0; b < x.extent(0); b += 128) t.step(x.slice(b, b + 128), y.slice(b, b + 128));
    const double first = t.report().loss;

    // 2. A loader of D: each batch arrives on D.
    locus::data::tensor_dataset train_set(std::move(train.x), std::move(train.y));
    locus::data::tensor_dataset test_set(std::move(test.x), std::move(test.y));
    locus::data::loader<D, locus::data::tensor_dataset> batches(train_set, {.batch_size = 128, .shuffle = true, .seed = 1});
    locus::data::loader<D, locus::data::tensor_dataset> test_batches(test_set, {.batch_size = 512});
    double last = first;
    for (int epoch = 1; epoch <= 4; ++epoch) last = t.train_epoch(batches, {.epoch = epoch}).loss;
    const auto ev = t.evaluate(test_batches);
    std::printf("training loss %.3f after one epoch, %.3f after five; test accuracy %.3f\n", first, last, ev.accuracy);
    if (!(last < first && ev.accuracy > 0.85)) {
      std::printf("fixed: the model did not learn (expected a falling loss and accuracy > 0.85)\n");
      return 1;
    }
    return 0;
  });
}
