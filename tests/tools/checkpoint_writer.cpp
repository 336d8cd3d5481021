// Writes the files tests/python/read_safetensors.py reads with the Python `safetensors`
// package (an independent reader): values.safetensors (known values in f32, f16, bf16,
// i64) and trainer.safetensors (a checkpoint of a small trained model).
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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_writer: %s\n", e.what());
    return 1;
  }
  return 0;
}
