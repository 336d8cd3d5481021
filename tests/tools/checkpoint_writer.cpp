// Writes the files tests/python/read_safetensors.py reads with the Python `safetensors`
// package (an independent reader): values.safetensors (known values in f32, f16, bf16,
// i64), trainer.safetensors (a checkpoint of a small trained model), cnn.safetensors (a
// trained CNN's checkpoint, batch norm included) and cnn_io.safetensors (an input and the
// CNN's inference output on it).
#include <locus/train.hpp>

#include <cstdio>
#include <filesystem>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_writer OUT_DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  try {
    locus::io::writer w;
    auto a = locus::arange<float, locus::cpu>(12);
    w.add("values.f32", a.reshape({3, 4}));
    auto h = locus::full<locus::f16, locus::cpu>({2}, 0.5);
    w.add("values.f16", h);
    auto b = locus::full<locus::bf16, locus::cpu>({2}, -2.0);
    w.add("values.bf16", b);
    auto i = locus::zeros<std::int64_t, locus::cpu>({2});
    i(0) = 7;
    i(1) = -9;
    w.add("values.i64", i);
    w.metadata("writer", "locus");
    w.save(dir / "values.safetensors");

    using P = locus::amp::fp32;
    namespace nn = locus::nn;
    nn::sequential model(nn::linear<locus::cpu, P>(16, 32), nn::relu<locus::cpu, P>(),
                         nn::linear<locus::cpu, P>(32, 3));
    locus::optim::adamw<locus::cpu> opt(model.parameters());
    locus::train::trainer t(model, opt, nn::cross_entropy{});
    auto x = locus::rand<float, locus::cpu>({8, 16}, 1);
    auto y = locus::zeros<std::int64_t, locus::cpu>({8});
    for (int s = 0; s < 5; ++s) t.step(x, y);
    locus::train::save_checkpoint(dir / "trainer.safetensors", t, 2);

    // A CNN (batch norm's running statistics are buffers), trained a few steps, and its
    // inference output on a known input: PyTorch loads the checkpoint into the
    // equivalent nn.Sequential and must compute the same output in eval mode.
    nn::sequential cnn(nn::conv2d<locus::cpu, P>(1, 4, 3, {.padding = 1}), nn::batch_norm2d<locus::cpu, P>(4),
                       nn::relu<locus::cpu, P>(), nn::max_pool2d<locus::cpu, P>(2), nn::flatten<locus::cpu, P>(),
                       nn::linear<locus::cpu, P>(4 * 4 * 4, 3));
    cnn.reset_parameters(3);
    locus::optim::adamw<locus::cpu> copt(cnn.parameters(), {.lr = 1e-2});
    locus::train::trainer ct(cnn, copt, nn::cross_entropy{});
    auto images = locus::rand<float, locus::cpu>({6, 1, 8, 8}, 2);
    auto labels = locus::zeros<std::int64_t, locus::cpu>({6});
    for (locus::index_t k = 0; k < 6; ++k) labels(k) = k % 3;
    for (int s = 0; s < 4; ++s) ct.step(images, labels);
    locus::train::save_checkpoint(dir / "cnn.safetensors", ct, 1);
    locus::io::writer io;
    io.add("x", images);
    io.add("y", cnn.infer(std::as_const(images).view()));
    io.save(dir / "cnn_io.safetensors");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_writer: %s\n", e.what());
    return 1;
  }
  return 0;
}
