// expect: error: .*locus: this model starts with a layer that takes rank-4 images \[batch, channels, height, width\], but the input batch has another rank; view a loader's batches as images with locus::data::images
// Rule: a rank-2 batch (a loader's rows) into a model that starts with a convolution.
#include <locus/nn/conv.hpp>
#include <locus/train/trainer.hpp>

using D = locus::cpu;
using P = locus::amp::fp32;

void train_one(locus::tensor<float, D, 2>& rows, locus::tensor<std::int64_t, D, 1>& y) {
  locus::nn::sequential model(locus::nn::conv2d<D, P>(1, 4, 3), locus::nn::flatten<D, P>(),
                              locus::nn::linear<D, P>(4 * 26 * 26, 10));
  locus::optim::sgd<D> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
#ifdef LOCUS_VIOLATION
  t.step(rows, y);
#else
  t.step(rows.reshape({rows.extent(0), 1, 28, 28}), y);
#endif
}
