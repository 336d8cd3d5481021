// The second main job's model (examples/gpt.cpp): GPT-2's block as PyTorch writes it
// (pre-norm, causal multi-head attention, GELU MLP), learned positions and the output
// projection tied to the token table, as a locus module over token ids under PyTorch's
// names ("wte.weight", "h.0.c_attn.weight", ...). tests/test_gpt_torch.cpp checks it
// against the same model in PyTorch in f64.
#pragma once

#include <deque>
#include <string>

#include <locus/nn/embedding.hpp>
#include <locus/nn/module.hpp>
#include <locus/nn/norm.hpp>

namespace gpt_job {
namespace nn = locus::nn;
namespace ag = locus::ag;
using locus::index_t;

struct gpt_config {
  index_t vocabulary = 0, context = 64, width = 96, heads = 4, layers = 2;
};

template <class D, class P>
struct block : nn::module<D, P> {
  index_t c, h;
  nn::layer<nn::layer_norm<D, P>> ln_1;
  nn::layer<nn::linear<D, P>> c_attn, c_proj;
  nn::layer<nn::layer_norm<D, P>> ln_2;
  nn::layer<nn::linear<D, P>> c_fc, mlp_proj;
  explicit block(const gpt_config& g)
      : c(g.width),
        h(g.heads),
        ln_1{this, "ln_1", g.width},
        c_attn{this, "c_attn", g.width, 3 * g.width},
        c_proj{this, "c_proj", g.width, g.width},
        ln_2{this, "ln_2", g.width},
        c_fc{this, "c_fc", g.width, 4 * g.width},
        mlp_proj{this, "mlp_proj", 4 * g.width, g.width} {}
  // x [b * t, c]
  auto forward(const typename block::template var<2>& x, index_t b, index_t t) {
    const auto qkv = c_attn(ln_1(x));
    const auto heads = [&](index_t part) {
      return ag::transpose(ag::reshape(ag::slice(qkv, 1, part * c, (part + 1) * c), locus::extents<4>{b, t, h, c / h}),
                           1, 2);
    };
    const auto att = ag::scaled_dot_product_attention(heads(0), heads(1), heads(2), {.causal = true});
    const auto y = x + c_proj(ag::reshape(ag::transpose(att, 1, 2), locus::extents<2>{b * t, c}));
    return y + mlp_proj(c_fc(ln_2(y), ag::fused::gelu));
  }
};

template <class D, class P>
struct gpt : nn::module<D, P> {
  gpt_config g;
  nn::embedding<D, P> wte;
  nn::positional_embedding<D, P> wpe;
  std::deque<nn::child<block<D, P>>> h;  // "h.0", "h.1", ... (a deque: children do not move)
  nn::layer<nn::layer_norm<D, P>> ln_f;
  explicit gpt(const gpt_config& c)
      : g(c),
        wte{this, "wte", c.vocabulary, c.width, nn::param_init::normal(0.0, 0.02)},
        wpe{this, "wpe", c.context, c.width, nn::param_init::normal(0.0, 0.02)},
        ln_f{this, "ln_f", c.width} {
    for (index_t i = 0; i < c.layers; ++i) h.emplace_back(this, "h." + std::to_string(i), c);
  }
  auto forward(const typename gpt::template ids<2>& x) {  // [batch, time] -> logits [batch * time, vocabulary]
    const index_t b = x.shape()[0], t = x.shape()[1];
    auto e = ag::reshape(wpe(wte(x)), locus::extents<2>{b * t, g.width});
    for (auto& blk : h) e = blk(e, b, t);
    return ag::linear(ln_f(e), wte.weight().on(x));
  }
};

}  // namespace gpt_job
