// The fix: build the optimizer (and, in a hand-written loop, the loss) for the model's
// device. decltype(model)::device names it, so the pair cannot drift apart when the
// model moves to another device. The trainer builds its loss state itself, on the
// model's device (nn::cross_entropy{} holds only options, no tensors). Runs on the best
// available device (cuda on a GPU machine, cpu here; LOCUS_DEVICE or `fixed cpu`
// chooses). Compiled by nvcc in a CUDA build.
#include <locus/train.hpp>

#include <cstdio>
#include <string>

#include "synthetic.hpp"

int main(int argc, char** argv) {
  const auto choice = argc > 1 ? locus::parse_device_choice(argv[1]) : locus::device_choice::automatic;
  return locus::with_device(choice, [](auto device) -> int {
    using P = locus::amp::fp32;
    namespace nn = locus::nn;
    using D0 = decltype(device);
    nn::sequential model(nn::linear<D0, P>(32, 64), nn::relu<D0, P>(), nn::linear<D0, P>(64, 4));

    using D = typename decltype(model)::device;  // the model's device, wherever it was built
    locus::optim::adamw<D> opt(model.parameters(), {.lr = 3e-3});
    nn::cross_entropy::state<D, P> loss(nn::cross_entropy{});
    std::printf("model, optimizer and loss on %s\n", std::string(D::name).c_str());

    auto data = pitfalls::make_data(4096, 32, 4, /*seed=*/1);
    locus::tensor<float, D, 2> x = locus::to<D>(data.x);
    locus::tensor<std::int64_t, D, 1> y = locus::to<D>(data.y);

    // A hand-written loop: forward, loss, backward, optimizer step.
    double first = 0.0, last = 0.0;
    for (int epoch = 0; epoch < 5; ++epoch) {
      for (locus::index_t b = 0; b < x.extent(0); b += 128) {
        auto out = model.forward(x.slice(b, b + 128));
        auto l = loss.forward(out, y.slice(b, b + 128));
        model.backward(loss.grad());
        opt.step();
        model.parameters().zero_grad();
        if (b == 0) (epoch == 0 ? first : last) = locus::to<locus::cpu>(l).item();  // one read-back an epoch
      }
    }
    std::printf("loss of the first batch: %.3f in epoch 1, %.3f in epoch 5\n", first, last);
    if (!(last < 0.5 * first)) {
      std::printf("fixed: the loss did not fall by half\n");
      return 1;
    }
    return 0;
  });
}
