// The main job's ResNet (scripts/run-main --model resnet): a small residual network for
// 1-channel images written as a locus module, as torchvision writes ResNet: a stem
// (3x3 conv, batch norm, relu), three stages of basic blocks (widths w, 2w, 4w; the
// second and third stages halve the resolution with a stride-2 first conv and a 1x1
// projection on the skip path), global average pooling and a linear classifier.
// Parameter names are torchvision's ("layer2.0.downsample.0.weight"), so a checkpoint
// loads into the same model written in PyTorch (tests/python/resnet_torch.py).
#pragma once

#include <locus/nn/module.hpp>

#include <array>
#include <deque>
#include <optional>
#include <string>

namespace locus_examples {

/// torchvision's BasicBlock: conv-bn-relu-conv-bn, plus the input (or its 1x1 projection
/// when the block changes the width or the resolution), then relu.
template <class D, class P>
struct basic_block : locus::nn::module<D, P> {
  using var4 = typename basic_block::template var<4>;
  template <class L>
  using layer = locus::nn::layer<L>;

  layer<locus::nn::conv2d<D, P>> conv1;
  layer<locus::nn::batch_norm2d<D, P>> bn1;
  layer<locus::nn::conv2d<D, P>> conv2;
  layer<locus::nn::batch_norm2d<D, P>> bn2;
  // The projection exists only where the shapes change (torchvision's downsample).
  std::optional<layer<locus::nn::conv2d<D, P>>> down_conv;
  std::optional<layer<locus::nn::batch_norm2d<D, P>>> down_bn;

  basic_block(locus::index_t in, locus::index_t out, locus::index_t stride)
      : conv1{this, "conv1", in, out, 3, locus::nn::conv2d_options{.stride = stride, .padding = 1, .bias = false}},
        bn1{this, "bn1", out},
        conv2{this, "conv2", out, out, 3, locus::nn::conv2d_options{.padding = 1, .bias = false}},
        bn2{this, "bn2", out} {
    if (stride != 1 || in != out) {
      down_conv.emplace(this, "downsample.0", in, out, 1, locus::nn::conv2d_options{.stride = stride, .bias = false});
      down_bn.emplace(this, "downsample.1", out);
    }
  }

  var4 forward(const var4& x) {
    const auto y = bn2(conv2(bn1(conv1(x), locus::ag::fused::relu)));  // bn1 then relu, one pass
    if (down_conv) return locus::ag::relu(y + (*down_bn)((*down_conv)(x)));
    return locus::ag::relu(y + x);
  }
};

/// The whole network: blocks[i] basic blocks in stage i (torchvision's layer1..layer3).
template <class D, class P>
struct resnet : locus::nn::module<D, P> {
  using var4 = typename resnet::template var<4>;
  template <class L>
  using layer = locus::nn::layer<L>;
  using block = locus::nn::child<basic_block<D, P>>;

  layer<locus::nn::conv2d<D, P>> conv1;
  layer<locus::nn::batch_norm2d<D, P>> bn1;
  std::array<std::deque<block>, 3> stages;  // (a deque: children never move)
  int staged_;                              // (made right after the stages: the blocks in order)
  layer<locus::nn::adaptive_avg_pool2d<D, P>> avgpool{this, "avgpool", 1};
  layer<locus::nn::flatten<D, P>> flatten{this, "flatten"};
  layer<locus::nn::linear<D, P>> fc;

  resnet(locus::index_t classes, locus::index_t width, std::array<int, 3> blocks)
      : conv1{this, "conv1", 1, width, 3, locus::nn::conv2d_options{.padding = 1, .bias = false}},
        bn1{this, "bn1", width},
        staged_{add_stages(width, blocks)},
        fc{this, "fc", 4 * width, classes} {}

  /// Activation checkpointing of every block: its activations are recomputed in backward
  /// instead of kept (less memory, one more forward of the blocks per step).
  bool checkpointing = false;

  typename resnet::template var<2> forward(const var4& x) {
    auto y = bn1(conv1(x), locus::ag::fused::relu);
    for (auto& stage : stages)
      for (auto& b : stage) y = checkpointing ? locus::nn::checkpoint(b, y) : b(y);  // each block a child
    return fc(flatten(avgpool(y)));
  }

 private:
  // The stages' blocks, each a child named as torchvision names it (layer2.0, ...).
  int add_stages(locus::index_t width, const std::array<int, 3>& blocks) {
    locus::index_t in = width;
    for (std::size_t s = 0; s < 3; ++s) {
      const locus::index_t out = width << s;
      for (int b = 0; b < blocks[s]; ++b) {
        stages[s].emplace_back(this, "layer" + std::to_string(s + 1) + "." + std::to_string(b), in, out,
                               b == 0 && s > 0 ? 2 : 1);
        in = out;
      }
    }
    return 0;
  }
};

}  // namespace locus_examples
