// Compile-time benchmark, training side: a small, realistic user file of
// <locus/train.hpp>. It builds a 16-32-4 MLP on cpu (fp32), AdamW with a cosine
// schedule and the trainer, runs 50 steps on a fixed synthetic batch (counter-based
// random inputs, labels from the inputs' first column) and prints the last loss.
// bench/compile-time times it beside user_locus.cpp and user_thrust.cpp; it has no
// Thrust-only twin (Thrust has no training loop), so its figure is recorded as seconds
// and as a ratio to the Thrust-only file, with no target (issue 19 asks for the figure).
#include <locus/train.hpp>

#include <cstdio>

int main() {
  using D = locus::cpu;
  using P = locus::amp::fp32;
  namespace nn = locus::nn;
  constexpr locus::index_t batch = 64, features = 16, classes = 4;

  auto x = locus::rand<float, D>({batch, features}, 7, -1.0, 1.0);
  auto y = locus::empty<std::int64_t, D>({batch});
  for (locus::index_t i = 0; i < batch; ++i) y(i) = static_cast<std::int64_t>((x(i, 0) + 1.0f) * 2.0f) % classes;

  nn::sequential model(nn::linear<D, P>(features, 32), nn::relu<D, P>(), nn::linear<D, P>(32, classes));
  model.reset_parameters(1);
  locus::optim::adamw<D> opt(model.parameters(), {.lr = 1e-2, .weight_decay = 1e-4});
  locus::train::trainer t(model, opt, nn::cross_entropy{}, locus::train::options{});
  t.set_schedule(locus::optim::cosine_lr{50, 1e-4});
  for (int s = 0; s < 50; ++s) t.step(x, y);
  const auto m = t.report();
  std::printf("after %lld steps: mean loss %.4f\n", static_cast<long long>(t.optimizer_steps()), m.loss);
  return 0;
}
