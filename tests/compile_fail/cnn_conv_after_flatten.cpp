// expect: error: .*locus: a sequential model feeds a rank-2 activation \[batch, features\] into a layer that takes rank 4 \[batch, channels, height, width\]
// Rule: a convolution, pooling or batch_norm2d layer takes images, not rows.
#include <locus/nn/conv.hpp>

void build() {
  using D = locus::cpu;
  using P = locus::amp::fp32;
#ifdef LOCUS_VIOLATION
  locus::nn::sequential m(locus::nn::linear<D, P>(784, 784), locus::nn::max_pool2d<D, P>(2));
#else
  locus::nn::sequential m(locus::nn::max_pool2d<D, P>(2), locus::nn::flatten<D, P>(), locus::nn::linear<D, P>(196, 10));
#endif
  (void)m;
}
