// pitfall-check: run-output
// The mistake, in a hand-written loop: gradient accumulation over 4 micro-batches with
// each micro-batch's loss not divided by 4, and opt.step() after every micro-batch
// instead of after the 4th (the gradients zeroed only after the 4th). locus does not
// catch this: backward adds into the gradients and step() applies them whenever it is
// called, as in PyTorch; no type or run-time check knows which loop was meant. The
// program shows the damage: it compares the weights' change with what the accumulated
// step must equal, one step on the whole batch.
#include <locus/train.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

#include "synthetic.hpp"

namespace {

using D = locus::cpu;
using P = locus::amp::fp32;

auto make_model() {
  locus::nn::sequential model(locus::nn::linear<D, P>(32, 64), locus::nn::relu<D, P>(), locus::nn::linear<D, P>(64, 4));
  model.reset_parameters(/*seed=*/7);
  return model;
}

double distance(const auto& a, const auto& b) {  // |a - b| over every weight
  const locus::tensor<float, D, 1> d = a.parameters().master() - b.parameters().master();
  return std::sqrt(locus::sum(d * d).item());
}

}  // namespace

int main() {
  auto data = pitfalls::make_data(512, 32, 4, /*seed=*/1);
  const auto& x = data.x;
  const auto& y = data.y;
  const auto start = make_model();

  // What 4 accumulated micro-batches of 128 must equal: one SGD step on the whole batch.
  auto whole = make_model();
  locus::optim::sgd<D> opt_whole(whole.parameters(), {.lr = 0.01});
  locus::nn::cross_entropy::state<D, P> loss_whole(locus::nn::cross_entropy{});
  auto out_whole = whole.forward(x.view());
  loss_whole.forward(out_whole, y.view());
  whole.backward(loss_whole.grad());
  opt_whole.step();

  // The mistake.
  auto model = make_model();
  locus::optim::sgd<D> opt(model.parameters(), {.lr = 0.01});
  locus::nn::cross_entropy::state<D, P> loss(locus::nn::cross_entropy{});
  for (locus::index_t i = 0; i < 4; ++i) {
    auto out = model.forward(x.slice(128 * i, 128 * (i + 1)));
    loss.forward(out, y.slice(128 * i, 128 * (i + 1)));  // not divided by 4
    model.backward(loss.grad());
    opt.step();  // after every micro-batch
  }
  model.parameters().zero_grad();

  std::printf("how far the weights moved, in steps of the whole batch of 512 (what accumulation must give: 1.0)\n");
  std::printf("  4 micro-batches of 128, losses not divided, opt.step() after each: %.1f (4 optimizer steps)\n",
              distance(model, start) / distance(whole, start));
  std::printf("  how far they ended from the whole batch's step: %.1f\n", distance(model, whole) / distance(whole, start));
}
