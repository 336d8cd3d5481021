// The fix: find the largest batch whose training step fits, then reach the batch you
// wanted with gradient accumulation. locus::train::find_max_batch_size(t, make) probes
// forward and backward (no optimizer step) at doubling sizes, then bisects between the
// last that fit and the first locus::out_of_memory. With 4 MiB left for training (the
// cap of broken.cpp, locus::set_memory_limit<D>, which works on every device) a batch of
// 8192 does not fit; the largest that does becomes the micro-batch, and
// {.accumulate = k} makes k micro-batches one optimizer step of 8192 samples.
// Runs on the best available device (cuda on a GPU machine, cpu here; LOCUS_DEVICE or
// `fixed cpu` chooses); compiled by nvcc in a CUDA build.
#include <locus/train.hpp>

#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "synthetic.hpp"

int main(int argc, char** argv) {
  const auto choice = argc > 1 ? locus::parse_device_choice(argv[1]) : locus::device_choice::automatic;
  return locus::with_device(choice, [](auto device) -> int {
    using D = decltype(device);
    using P = locus::amp::fp32;
    namespace nn = locus::nn;
    constexpr locus::index_t wanted = 8192;  // the batch broken.cpp asked for

    auto data = pitfalls::make_data(2 * wanted, 256, 10, /*seed=*/1);
    locus::tensor<float, D, 2> x = locus::to<D>(data.x);
    locus::tensor<std::int64_t, D, 1> y = locus::to<D>(data.y);
    nn::sequential model(nn::linear<D, P>(256, 256), nn::relu<D, P>(), nn::linear<D, P>(256, 10));
    locus::optim::adamw<D> opt(model.parameters(), {.lr = 3e-3});

    // 4 MiB left for training, as in broken.cpp. The limit caps the memory the allocator
    // reserves (on cuda its cache holds more than the tensors do).
    locus::set_memory_limit<D>(locus::memory_stats<D>().reserved_bytes + (4 << 20));

    // 1. The largest batch that fits (the batches are views of x: no memory of their own).
    locus::index_t fits = 0;
    {
      locus::train::trainer probe(model, opt, nn::cross_entropy{});
      fits = locus::train::find_max_batch_size(
          probe, [&](locus::index_t b) { return std::pair{x.slice(0, b), y.slice(0, b)}; }, /*start=*/64, wanted);
    }
    // 2. k micro-batches of wanted / k samples make one optimizer step of `wanted`.
    int k = 1;
    while (wanted / k > fits) k *= 2;
    const locus::index_t micro = wanted / k;
    std::printf("on %s with 4 MiB left: a batch of %lld does not fit, %lld does; training with %d micro-batches "
                "of %lld per optimizer step\n",
                std::string(D::name).c_str(), (long long)wanted, (long long)fits, k, (long long)micro);

    locus::train::trainer t(model, opt, nn::cross_entropy{}, {.accumulate = k});
    double first = 0.0, last = 0.0;
    for (int epoch = 0; epoch < 8; ++epoch) {
      for (locus::index_t b = 0; b < x.extent(0); b += micro) t.step(x.slice(b, b + micro), y.slice(b, b + micro));
      const auto r = t.report();
      (epoch == 0 ? first : last) = r.loss;
    }
    const auto peak = locus::memory_stats<D>().peak_allocated_bytes;
    locus::set_memory_limit<D>(std::numeric_limits<std::size_t>::max());
    std::printf("loss %.3f in epoch 1, %.3f in epoch 8 (%lld optimizer steps); peak memory %s\n", first, last,
                (long long)t.report().optimizer_steps, locus::out_of_memory::format_bytes(peak).c_str());
    if (!(fits > 0 && fits < wanted && last < first)) {
      std::printf("fixed: expected a batch below %lld to fit and the loss to fall\n", (long long)wanted);
      return 1;
    }
    return 0;
  });
}
