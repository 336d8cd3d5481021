// The fix: evaluate with the inference forward. model.infer(x) saves nothing for
// backward, skips dropout and uses batch norm's running statistics: PyTorch's
// model.eval() and torch.no_grad() / inference_mode() in one call. trainer.evaluate(
// loader) uses it. Evaluation then changes nothing: the same samples give the same
// logits every time, and the dropout masks of the training that follows are the ones a
// run without evaluation would draw. Runs on the best available device (cuda on a GPU
// machine, cpu here; LOCUS_DEVICE or `fixed cpu` chooses); compiled by nvcc in a CUDA
// build.
#include <locus/data/loader.hpp>
#include <locus/train.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

#include "synthetic.hpp"

int main(int argc, char** argv) {
  const auto choice = argc > 1 ? locus::parse_device_choice(argv[1]) : locus::device_choice::automatic;
  return locus::with_device(choice, [](auto device) -> int {
    using D = decltype(device);
    using P = locus::amp::fp32;
    namespace nn = locus::nn;
    nn::sequential model(nn::linear<D, P>(32, 64), nn::relu<D, P>(), nn::dropout<D, P>(0.5f, /*seed=*/1),
                         nn::linear<D, P>(64, 4));
    locus::optim::adamw<D> opt(model.parameters(), {.lr = 3e-3});
    locus::train::trainer t(model, opt, nn::cross_entropy{});

    auto train = pitfalls::make_data(4096, 32, 4, /*seed=*/1);
    auto test = pitfalls::make_data(1024, 32, 4, /*seed=*/2);
    locus::tensor<float, D, 2> x_test = locus::to<D>(test.x);
    locus::data::tensor_dataset train_set(std::move(train.x), std::move(train.y));
    locus::data::tensor_dataset test_set(std::move(test.x), std::move(test.y));
    locus::data::loader<D, locus::data::tensor_dataset> batches(train_set, {.batch_size = 128, .shuffle = true, .seed = 1});
    locus::data::loader<D, locus::data::tensor_dataset> test_batches(test_set, {.batch_size = 512});

    double accuracy = 0.0;
    for (int epoch = 0; epoch < 5; ++epoch) {
      t.train_epoch(batches, {.epoch = epoch});
      accuracy = t.evaluate(test_batches).accuracy;  // the inference forward
    }
    const auto counter = model.template get<2>().counter();
    // By hand: infer, twice over the same samples.
    const auto xv = std::as_const(x_test).view();
    locus::tensor<float, D, 2> first = model.infer(xv);
    locus::tensor<float, D, 2> second = model.infer(xv);
    const locus::tensor<bool, D, 2> disagree = first != second;
    const auto differ = locus::to<locus::cpu>(locus::sum(disagree)).item();
    std::printf("on %s: test accuracy %.3f after 5 epochs with dropout; two inference passes disagree on %lld of "
                "%lld logits; dropout's stream advanced only in training (%llu forwards)\n",
                std::string(D::name).c_str(), accuracy, (long long)differ, (long long)first.numel(),
                (unsigned long long)counter);
    if (!(accuracy > 0.85 && differ == 0 && model.template get<2>().counter() == counter && counter == 5 * 4096 / 128)) {
      std::printf("fixed: expected a deterministic evaluation that leaves dropout's stream alone\n");
      return 1;
    }
    return 0;
  });
}
