// A small GPT written with locus's differentiable operations against the same model in
// PyTorch (tests/python/gpt_torch.py writes its weights, token ids and targets, logits,
// loss and every parameter's gradient in f64). The model: token and learned position
// embeddings (ag::gather_rows over nn.Embedding tables), two pre-norm blocks (ag::layer_norm,
// ag::linear for the projections, the heads split with ag::slice, ag::reshape and
// ag::transpose, causal ag::scaled_dot_product_attention, a GELU MLP), a final layer norm
// and the output projection tied to the token embedding (one leaf used twice: the
// gradients add), then ag::cross_entropy. Every logit, the loss and every gradient must
// equal PyTorch's to 1e-12 (relative to 1 + |PyTorch's value|).
//
// The file is named by LOCUS_GPT_TORCH_FILE (the CTest "interop: a small GPT against
// PyTorch (logits, loss, gradients)" writes it and sets it).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include <locus/ag/ops.hpp>
#include <locus/locus.hpp>
#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
#include <locus/io/safetensors.hpp>
#endif

#include "../examples/gpt_model.hpp"

TEST_CASE("A small GPT equals PyTorch in f64: logits, loss and every gradient" * doctest::skip()) {
#if !defined(LOCUS_HAS_JSON) || !LOCUS_HAS_JSON
  FAIL("reading the PyTorch file needs locus/io/safetensors.hpp, which needs nlohmann-json");
#else
  namespace ag = locus::ag;
  using D = locus::cpu;
  using locus::index_t;
  const char* env = std::getenv("LOCUS_GPT_TORCH_FILE");
  if (env == nullptr || *env == '\0') FAIL("LOCUS_GPT_TORCH_FILE is not set (tests/python/gpt_torch.py FILE writes it)");
  const std::filesystem::path file = env;
  if (!std::filesystem::exists(file)) FAIL("LOCUS_GPT_TORCH_FILE names " << file << ", which does not exist");
  const auto a = locus::io::load<D>(file);
  constexpr index_t V = 11, T = 9, C = 12, H = 3, L = 2, B = 2;  // tests/python/gpt_torch.py's sizes

  ag::tape<double, D> tape;
  std::map<std::string, ag::var<double, D, 1>> v1;
  std::map<std::string, ag::var<double, D, 2>> v2;
  const auto p1 = [&](const std::string& n) -> const ag::var<double, D, 1>& {
    if (!v1.count(n)) v1.emplace(n, tape.leaf(a.template get<double, 1>("w." + n)));
    return v1.at(n);
  };
  const auto p2 = [&](const std::string& n) -> const ag::var<double, D, 2>& {
    if (!v2.count(n)) v2.emplace(n, tape.leaf(a.template get<double, 2>("w." + n)));
    return v2.at(n);
  };
  const auto ids = a.template get<std::int64_t, 2>("ids");
  const auto targets = a.template get<std::int64_t, 2>("targets");
  locus::tensor<std::int64_t, D, 1> positions({T});
  for (index_t i = 0; i < T; ++i) positions(i) = i;
  const auto targets_flat = targets.reshape(locus::extents<1>{B * T});

  const auto& wte = p2("wte.weight");
  auto x = ag::reshape(ag::gather_rows(wte, ids) + ag::gather_rows(p2("wpe.weight"), positions.view()),
                       {B * T, C});  // [B * T, C]
  const auto heads = [&](const ag::var<double, D, 2>& qkv, index_t part) {
    return ag::transpose(ag::reshape(ag::slice(qkv, 1, part * C, (part + 1) * C), {B, T, H, C / H}), 1, 2);
  };
  for (int l = 0; l < L; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    const auto qkv = ag::linear(ag::layer_norm(x, p1(p + "ln_1.weight"), p1(p + "ln_1.bias"), 1e-5),
                                p2(p + "c_attn.weight"), p1(p + "c_attn.bias"));
    const auto att = ag::scaled_dot_product_attention(heads(qkv, 0), heads(qkv, 1), heads(qkv, 2), {.causal = true});
    const auto merged = ag::reshape(ag::transpose(att, 1, 2), {B * T, C});
    x = x + ag::linear(merged, p2(p + "c_proj.weight"), p1(p + "c_proj.bias"));
    const auto hidden = ag::linear(ag::layer_norm(x, p1(p + "ln_2.weight"), p1(p + "ln_2.bias"), 1e-5),
                                   p2(p + "c_fc.weight"), p1(p + "c_fc.bias"), ag::fused::gelu);
    x = x + ag::linear(hidden, p2(p + "mlp_proj.weight"), p1(p + "mlp_proj.bias"));
  }
  const auto logits = ag::linear(ag::layer_norm(x, p1("ln_f.weight"), p1("ln_f.bias"), 1e-5), wte);  // tied
  const auto loss = ag::cross_entropy(logits, targets_flat);
  tape.backward(loss);

  const auto compare = [&](const std::string& key, const double* got, index_t count) {
    const auto want = a.template flat<double>(key);
    REQUIRE_MESSAGE(want.numel() == count, key << ": PyTorch has " << want.numel() << " elements, locus " << count);
    double worst = 0;
    for (index_t i = 0; i < count; ++i)
      worst = std::max(worst, std::abs(got[i] - want.data_handle()[i]) / (1.0 + std::abs(want.data_handle()[i])));
    INFO(key << ": largest difference from PyTorch " << worst);
    CHECK(worst < 1e-12);
  };
  CHECK(logits.shape() == locus::extents<2>{B * T, V});
  compare("logits", logits.value().data_handle(), logits.numel());
  compare("loss", loss.value().data_handle(), 1);
  std::size_t checked = 0;
  for (const auto& [n, v] : v1) {
    compare("g." + n, tape.grad(v).data_handle(), v.numel());
    ++checked;
  }
  for (const auto& [n, v] : v2) {
    compare("g." + n, tape.grad(v).data_handle(), v.numel());
    ++checked;
  }
  CHECK(checked == 4 + 12 * L);  // wte, wpe, ln_f's two, 12 per block: every parameter
#endif
}

// The same GPT as the second main job trains it (examples/gpt_model.hpp): an nn::model
// of modules over token ids (nn::embedding, nn::positional_embedding, nn::layer<layer_norm>
// and <linear> members, a child per block named "h.0", "h.1", the output projection tied
// to wte through wte.weight().on(x)). PyTorch's weights load by name (named_parameters() spells the
// store's names), the logits equal PyTorch's, and the gradients of the mean
// cross-entropy (its dL/dlogits computed here in f64, (softmax - one_hot) / rows) equal
// PyTorch's autograd.
namespace {
namespace gpt {
constexpr locus::index_t V = 11, T = 9, C = 12, H = 3, L = 2, B = 2;  // tests/python/gpt_torch.py's sizes
}  // namespace gpt
}  // namespace

TEST_CASE("The GPT module equals PyTorch in f64: weights load by name, logits and every gradient" * doctest::skip()) {
#if !defined(LOCUS_HAS_JSON) || !LOCUS_HAS_JSON
  FAIL("reading the PyTorch file needs locus/io/safetensors.hpp, which needs nlohmann-json");
#else
  using D = locus::cpu;
  using locus::index_t;
  const char* env = std::getenv("LOCUS_GPT_TORCH_FILE");
  if (env == nullptr || *env == '\0') FAIL("LOCUS_GPT_TORCH_FILE is not set (tests/python/gpt_torch.py FILE writes it)");
  const std::filesystem::path file = env;
  if (!std::filesystem::exists(file)) FAIL("LOCUS_GPT_TORCH_FILE names " << file << ", which does not exist");
  const auto a = locus::io::load<D>(file);
  locus::nn::model<gpt_job::gpt<D, locus::amp::fp64>> m(gpt_job::gpt_config{gpt::V, gpt::T, gpt::C, gpt::H, gpt::L});
  auto& st = m.parameters();
  REQUIRE(st.entries().size() == 4 + 12 * gpt::L);
  for (const auto& e : st.entries()) {
    const auto w = a.template flat<double>("w." + e.name);  // a name PyTorch does not have: an error here
    REQUIRE_MESSAGE(w.numel() == e.numel, e.name << ": PyTorch has " << w.numel() << " elements, locus " << e.numel);
    for (index_t i = 0; i < e.numel; ++i) st.master().data_handle()[e.offset + i] = w.data_handle()[i];
  }
  st.sync_compute();
  const auto ids = a.template get<std::int64_t, 2>("ids");
  const auto targets = a.template get<std::int64_t, 2>("targets");
  st.zero_grad();
  const auto logits = m.forward(ids.view());
  REQUIRE(logits.shape() == locus::extents<2>{gpt::B * gpt::T, gpt::V});
  // dL/dlogits of the mean cross-entropy, and the loss, in f64 here
  const index_t rows = gpt::B * gpt::T;
  locus::tensor<double, D, 2> g({rows, gpt::V});
  double loss = 0;
  for (index_t r = 0; r < rows; ++r) {
    double mx = -1e300, z = 0;
    for (index_t j = 0; j < gpt::V; ++j) mx = std::max(mx, logits(r, j));
    for (index_t j = 0; j < gpt::V; ++j) z += std::exp(logits(r, j) - mx);
    const index_t label = targets.data_handle()[r];
    loss += (mx + std::log(z) - logits(r, label)) / static_cast<double>(rows);
    for (index_t j = 0; j < gpt::V; ++j)
      g(r, j) = (std::exp(logits(r, j) - mx) / z - (j == label ? 1.0 : 0.0)) / static_cast<double>(rows);
  }
  (void)m.backward(g.view());
  const auto compare = [&](const std::string& key, const double* got, index_t count) {
    const auto want = a.template flat<double>(key);
    REQUIRE_MESSAGE(want.numel() == count, key << ": PyTorch has " << want.numel() << " elements, locus " << count);
    double worst = 0;
    for (index_t i = 0; i < count; ++i)
      worst = std::max(worst, std::abs(got[i] - want.data_handle()[i]) / (1.0 + std::abs(want.data_handle()[i])));
    INFO(key << ": largest difference from PyTorch " << worst);
    CHECK(worst < 1e-12);
  };
  compare("logits", logits.data_handle(), logits.numel());
  compare("loss", &loss, 1);
  for (const auto& e : st.entries()) compare("g." + e.name, st.grad().data_handle() + e.offset, e.numel);
  // inference gives the same logits
  const auto again = m.infer(ids.view());
  compare("logits", again.data_handle(), again.numel());
#endif
}
