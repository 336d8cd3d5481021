// A user file that instantiates most of locus on the cpu: tensors, expressions,
// reductions, softmax, matmul, layers of every precision policy, both optimizers, the
// grad scaler and the trainer. CTest compiles it with g++ and clang++ at -O2 -fopenmp
// -Wall -Wextra -Wpedantic -Werror ("warnings: ..."): locus's headers must not warn in
// a user's build, including the optimiser's own warnings (clang's -Wpass-failed when a
// requested simd loop cannot be vectorised), which only code generation shows.
#include <locus/data/transforms.hpp>
#include <locus/train.hpp>

#include <cstdint>
#include <vector>

namespace {

template <class P>
double train_once() {
  using D = locus::cpu;
  locus::nn::sequential model(locus::nn::linear<D, P>(8, 16), locus::nn::relu<D, P>(), locus::nn::dropout<D, P>(0.1f, 3),
                              locus::nn::linear<D, P>(16, 16), locus::nn::gelu<D, P>(), locus::nn::linear<D, P>(16, 16),
                              locus::nn::tanh<D, P>(), locus::nn::linear<D, P>(16, 16), locus::nn::sigmoid<D, P>(),
                              locus::nn::linear<D, P>(16, 4));
  model.reset_parameters(1);
  locus::optim::adamw<D> opt(model.parameters());
  locus::optim::sgd<D> plain(model.parameters(), {.lr = 0.01, .momentum = 0.9, .nesterov = true});
  if constexpr (locus::amp::needs_loss_scaling<P>) plain.step(locus::optim::unscaled);
  else plain.step();
  auto x = locus::randn<float, D>({32, 8}, 2);
  auto y = locus::cast<std::int64_t>(locus::rand<float, D>({32}, 3, 0.0, 3.99));
  auto labels = locus::eval(y);
  locus::amp::grad_scaler<D> scaler;
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{.label_smoothing = 0.1f}, scaler,
                          {.accumulate = 2, .schedule = locus::optim::warmup_lr<locus::optim::cosine_lr>{2, {10, 0.0}}});
  for (int i = 0; i < 4; ++i) t.step(x, labels);
  return t.report().loss;
}

template <class P>
double train_cnn() {
  using D = locus::cpu;
  namespace nn = locus::nn;
  nn::sequential model(nn::conv2d<D, P>(1, 4, 3, {.padding = 1}), nn::batch_norm2d<D, P>(4), nn::relu<D, P>(),
                       nn::max_pool2d<D, P>(2), nn::conv2d<D, P>(4, 4, 3, {.stride = 1, .dilation = 2, .groups = 2}),
                       nn::avg_pool2d<D, P>(2, {.stride = 1, .padding = 1}), nn::adaptive_avg_pool2d<D, P>(2),
                       nn::dropout<D, P>(0.1f, 4), nn::flatten<D, P>(), nn::layer_norm<D, P>(16), nn::linear<D, P>(16, 3));
  model.reset_parameters(2);
  locus::optim::adamw<D> opt(model.parameters());
  auto x = locus::randn<float, D>({8, 1, 12, 12}, 5);
  auto labels = locus::eval(locus::cast<std::int64_t>(locus::rand<float, D>({8}, 6, 0.0, 2.99)));
  locus::amp::grad_scaler<D> scaler;
  locus::train::trainer t(model, opt, nn::cross_entropy{}, scaler);
  for (int i = 0; i < 3; ++i) t.step(x, labels);
  const std::vector<float> row(144, 0.5f);
  std::vector<float> sample = row;
  locus::data::compose(locus::data::random_crop{.channels = 1, .height = 12, .width = 12},
                       locus::data::horizontal_flip{.channels = 1, .height = 12, .width = 12},
                       locus::data::normalize{})(sample, {1, 2, 3});
  return t.report().loss + static_cast<double>(sample[0]) + static_cast<double>(model.summary({8, 1, 12, 12}).size());
}

}  // namespace

int main() {
  using D = locus::cpu;
  auto a = locus::randn<float, D>({64, 48}, 1);
  auto b = locus::rand<float, D>({48, 32}, 2);
  locus::tensor<float, D, 2> c = locus::relu(locus::matmul(a, b) * 0.5f + 1.0f);
  auto s = locus::softmax(c, 1);
  auto l = locus::log_softmax(c, 0);
  auto h = locus::cast<locus::bf16>(c);
  auto f = locus::cast<locus::f16>(c);
  auto w = locus::where(c > 1.0f, locus::exp(c), locus::gelu(c));
  const double total = locus::to<locus::cpu>(locus::sum(s)).item() + locus::to<locus::cpu>(locus::var(l)).item() +
                       locus::to<locus::cpu>(locus::mean(locus::cast<float>(h))).item() +
                       locus::to<locus::cpu>(locus::max(locus::cast<float>(f))).item() +
                       static_cast<double>(locus::to<locus::cpu>(locus::argmax(w)).item());
  const double losses = train_once<locus::amp::fp32>() + train_once<locus::amp::bf16_mixed>() +
                        train_once<locus::amp::fp16_mixed>() + train_cnn<locus::amp::fp32>() +
                        train_cnn<locus::amp::bf16_mixed>() + train_cnn<locus::amp::fp16_mixed>();
  return total + losses > 0.0 ? 0 : 1;
}
