// Compile-time benchmark, modules: user_train.cpp's model and loop with the model written
// as a module of one's own (nn::module, nn::layer, nn::model) instead of nn::sequential.
// bench/compile-time times it beside user_train.cpp; target: at most 1.3x its time
// (issue 30). Same data, model, seed and steps as user_train.cpp, so it prints the same
// loss.
#include <locus/nn/module.hpp>
#include <locus/train.hpp>

#include <cstdio>

namespace nn = locus::nn;

template <class D, class P>
struct mlp : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> fc1{this, "0", 16, 32};  // sequential's names: the same weights
  nn::layer<nn::relu<D, P>> relu{this, "1"};
  nn::layer<nn::linear<D, P>> fc2{this, "2", 32, 4};
  auto forward(const typename mlp::template var<2>& x) { return fc2(relu(fc1(x))); }
};

int main() {
  using D = locus::cpu;
  using P = locus::amp::fp32;
  constexpr locus::index_t batch = 64, features = 16, classes = 4;

  auto x = locus::rand<float, D>({batch, features}, 7, -1.0, 1.0);
  auto y = locus::empty<std::int64_t, D>({batch});
  for (locus::index_t i = 0; i < batch; ++i) y(i) = static_cast<std::int64_t>((x(i, 0) + 1.0f) * 2.0f) % classes;

  nn::model<mlp<D, P>> model;
  model.reset_parameters(1);
  locus::optim::adamw<D> opt(model.parameters(), {.lr = 1e-2, .weight_decay = 1e-4});
  locus::train::trainer t(model, opt, nn::cross_entropy{}, locus::train::options{});
  t.set_schedule(locus::optim::cosine_lr{50, 1e-4});
  for (int s = 0; s < 50; ++s) t.step(x, y);
  const auto m = t.report();
  std::printf("after %lld steps: mean loss %.4f\n", static_cast<long long>(t.optimizer_steps()), m.loss);
  return 0;
}
