// Host suite: models of your own (nn::module, nn::layer, nn::child, nn::model). The
// main job's MLP written as a module trains bit for bit as the nn::sequential one (same
// seed, same batches, the trainer's fused step); a residual block with batch norm and a
// skip connection has PyTorch's dotted names, trains, saves and loads, checkpoints and
// resumes; a module's parameter gradients match f64 finite differences through
// branches and a skip connection; and the rules: a layer called twice in one forward, a
// module built outside a model, shapes of two branches that do not match.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include <locus/data/loader.hpp>
#include <locus/data/tensor_dataset.hpp>
#include <locus/nn/module.hpp>
#include <locus/nn/param.hpp>
#include <locus/train.hpp>

namespace {
namespace nn = locus::nn;
namespace ag = locus::ag;
namespace optim = locus::optim;
using locus::cpu;
using locus::index_t;

template <class D, class P>
struct mlp : nn::module<D, P> {
  // named as nn::sequential names its layers, so the two models draw the same weights
  nn::layer<nn::linear<D, P>> fc0{this, "0", 20, 16};
  nn::layer<nn::relu<D, P>> act1{this, "1"};
  nn::layer<nn::linear<D, P>> fc2{this, "2", 16, 12};
  nn::layer<nn::relu<D, P>> act3{this, "3"};
  nn::layer<nn::linear<D, P>> fc4{this, "4", 12, 5};
  auto forward(const typename mlp::template var<2>& x) { return fc4(act3(fc2(act1(fc0(x))))); }
};

// The MLP with each relu fused into its linear layer (fc(x, ag::fused::relu)).
template <class D, class P>
struct mlp_fused : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> fc0{this, "0", 20, 16};
  nn::layer<nn::linear<D, P>> fc2{this, "2", 16, 12};
  nn::layer<nn::linear<D, P>> fc4{this, "4", 12, 5};
  auto forward(const typename mlp_fused::template var<2>& x) {
    return fc4(fc2(fc0(x, ag::fused::relu), ag::fused::relu));
  }
};

// Batch norm with a fused activation it lacks (gelu): a value_error.
template <class D, class P>
struct bn_gelu : nn::module<D, P> {
  nn::layer<nn::batch_norm2d<D, P>> bn{this, "bn", 2};
  nn::layer<nn::flatten<D, P>> flat{this, "flat"};
  auto forward(const typename bn_gelu::template var<4>& x) { return flat(bn(x, ag::fused::gelu)); }
};

template <class D, class P>
struct block : nn::module<D, P> {
  nn::layer<nn::conv2d<D, P>> conv1{this, "conv1", 4, 4, 3, nn::conv2d_options{.padding = 1, .bias = false}};
  nn::layer<nn::batch_norm2d<D, P>> bn1{this, "bn1", 4};
  nn::layer<nn::relu<D, P>> relu1{this, "relu1"};
  nn::layer<nn::conv2d<D, P>> conv2{this, "conv2", 4, 4, 3, nn::conv2d_options{.padding = 1, .bias = false}};
  nn::layer<nn::batch_norm2d<D, P>> bn2{this, "bn2", 4};
  nn::layer<nn::relu<D, P>> relu2{this, "relu2"};
  auto forward(const typename block::template var<4>& x) {
    return relu2(bn2(conv2(relu1(bn1(conv1(x))))) + x);  // the skip connection
  }
};

template <class D, class P>
struct small_resnet : nn::module<D, P> {
  nn::layer<nn::conv2d<D, P>> stem{this, "conv1", 1, 4, 3, nn::conv2d_options{.padding = 1}};
  nn::layer<nn::relu<D, P>> relu{this, "relu"};
  nn::child<block<D, P>> layer1{this, "layer1.0"};
  nn::layer<nn::adaptive_avg_pool2d<D, P>> pool{this, "avgpool", 1};
  nn::layer<nn::flatten<D, P>> flat{this, "flatten"};
  nn::layer<nn::linear<D, P>> fc{this, "fc", 4, 3};
  auto forward(const typename small_resnet::template var<4>& x) {
    return fc(flat(pool(layer1(relu(stem(x))))));
  }
};

template <class T>
std::vector<std::uint64_t> bits(const T* p, index_t n) {
  std::vector<std::uint64_t> out;
  for (index_t i = 0; i < n; ++i) {
    if constexpr (sizeof(T) == 8) out.push_back(std::bit_cast<std::uint64_t>(p[i]));
    else out.push_back(std::bit_cast<std::uint32_t>(p[i]));
  }
  return out;
}

}  // namespace

TEST_CASE("modules: the MLP as a module trains bit for bit as the nn::sequential MLP, through the trainer") {
  using P = locus::amp::fp32;
  nn::model<mlp<cpu, P>> m;
  nn::sequential s(nn::linear<cpu, P>(20, 16), nn::relu<cpu, P>(), nn::linear<cpu, P>(16, 12), nn::relu<cpu, P>(),
                   nn::linear<cpu, P>(12, 5));
  m.reset_parameters(7);
  s.reset_parameters(7);
  REQUIRE(m.parameters().entries().size() == s.parameters().entries().size());
  for (std::size_t i = 0; i < s.parameters().entries().size(); ++i)
    CHECK(m.parameters().entries()[i].name == s.parameters().entries()[i].name);
  CHECK(bits(m.parameters().master().data_handle(), m.parameters().size()) ==
        bits(s.parameters().master().data_handle(), s.parameters().size()));
  optim::adamw<cpu> om(m.parameters(), {.lr = 1e-2});
  optim::adamw<cpu> os(s.parameters(), {.lr = 1e-2});
  locus::train::trainer tm(m, om, nn::cross_entropy{}, {.accumulate = 2});
  locus::train::trainer ts(s, os, nn::cross_entropy{}, {.accumulate = 2});
  for (int step = 0; step < 12; ++step) {
    auto x = locus::randn<float, cpu>({8 + step % 3, 20}, 100 + static_cast<std::uint64_t>(step));
    std::vector<std::int64_t> labels;
    for (index_t i = 0; i < x.shape()[0]; ++i) labels.push_back((i * 7 + step) % 5);
    const auto y = locus::from_host<cpu>(labels, {x.shape()[0]});
    tm.step(x, y);
    ts.step(x, y);
  }
  CHECK(tm.optimizer_steps() == 6);
  CHECK(bits(m.parameters().master().data_handle(), m.parameters().size()) ==
        bits(s.parameters().master().data_handle(), s.parameters().size()));
  // inference too
  const auto x = locus::randn<float, cpu>({4, 20}, 9);
  const auto ym = m.infer(x.view());
  const auto ys = s.infer(x.view());
  CHECK(bits(ym.data_handle(), ym.numel()) == bits(ys.data_handle(), ys.numel()));
}

TEST_CASE("modules: a residual network has PyTorch's dotted names and buffers, trains, and round-trips through files") {
  using P = locus::amp::fp32;
  nn::model<small_resnet<cpu, P>> m;
  std::vector<std::string> names;
  for (const auto& e : m.parameters().entries()) names.push_back(e.name);
  const std::vector<std::string> expected{"conv1.weight",          "conv1.bias",          "layer1.0.conv1.weight",
                                          "layer1.0.bn1.weight",   "layer1.0.bn1.bias",   "layer1.0.conv2.weight",
                                          "layer1.0.bn2.weight",   "layer1.0.bn2.bias",   "fc.weight",
                                          "fc.bias"};
  CHECK(names == expected);
  std::vector<std::string> buffers;
  m.for_each_buffer([&](const std::string& n, auto) { buffers.push_back(n); });
  CHECK(buffers == std::vector<std::string>{"layer1.0.bn1.running_mean", "layer1.0.bn1.running_var",
                                            "layer1.0.bn1.num_batches_tracked", "layer1.0.bn2.running_mean",
                                            "layer1.0.bn2.running_var", "layer1.0.bn2.num_batches_tracked"});
  optim::adamw<cpu> opt(m.parameters(), {.lr = 3e-2});
  locus::train::trainer t(m, opt, nn::cross_entropy{});
  // three classes told apart by where the bright square is
  auto x = locus::zeros<float, cpu>({24, 1, 6, 6});
  std::vector<std::int64_t> labels;
  for (index_t i = 0; i < 24; ++i) {
    const index_t c = i % 3;
    labels.push_back(c);
    for (index_t r = 0; r < 2; ++r)
      for (index_t q = 0; q < 2; ++q) x(i, 0, 2 * c + r, 2 * c + q) = 1.0f + 0.1f * static_cast<float>(i % 5);
  }
  const auto y = locus::from_host<cpu>(labels, {24});
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    t.step(x, y);
    const auto logits = m.infer(x.view());
    double loss = 0;  // mean cross-entropy in f64, from the inference forward
    for (index_t i = 0; i < 24; ++i) {
      double mx = -1e300, z = 0;
      for (index_t j = 0; j < 3; ++j) mx = std::max(mx, static_cast<double>(logits(i, j)));
      for (index_t j = 0; j < 3; ++j) z += std::exp(static_cast<double>(logits(i, j)) - mx);
      loss += (mx + std::log(z) - static_cast<double>(logits(i, labels[static_cast<std::size_t>(i)]))) / 24;
    }
    if (step == 0) first = loss;
    last = loss;
  }
  CHECK(last < first * 0.5);
  CHECK(m.tape().operations() > 10);
  // nn::save / nn::load round trip, buffers included
  const auto dir = std::filesystem::temp_directory_path() / ("locus-modules-" + std::to_string(::getpid()));
  nn::save(dir / "resnet.safetensors", m);
  nn::model<small_resnet<cpu, P>> m2;
  nn::load(dir / "resnet.safetensors", m2);
  CHECK(bits(m2.parameters().master().data_handle(), m2.parameters().size()) ==
        bits(m.parameters().master().data_handle(), m.parameters().size()));
  const auto a = m.infer(x.view());
  const auto b = m2.infer(x.view());
  CHECK(bits(a.data_handle(), a.numel()) == bits(b.data_handle(), b.numel()));
  // a checkpoint and resume
  locus::train::save_checkpoint(dir / "ckpt.safetensors", t, 1);
  nn::model<small_resnet<cpu, P>> m3;
  optim::adamw<cpu> opt3(m3.parameters(), {.lr = 3e-2});
  locus::train::trainer t3(m3, opt3, nn::cross_entropy{});
  CHECK(locus::train::resume(dir / "ckpt.safetensors", t3) == 1);
  t.step(x, y);
  t3.step(x, y);
  CHECK(bits(m3.parameters().master().data_handle(), m3.parameters().size()) ==
        bits(m.parameters().master().data_handle(), m.parameters().size()));
  std::filesystem::remove_all(dir);
}

namespace {
template <class D, class P>
struct branchy : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> a{this, "a", 5, 6};
  nn::layer<nn::tanh<D, P>> ta{this, "ta"};
  nn::layer<nn::linear<D, P>> b{this, "b", 5, 6};
  nn::layer<nn::linear<D, P>> c{this, "c", 6, 6};
  nn::layer<nn::gelu<D, P>> gc{this, "gc"};
  nn::layer<nn::linear<D, P>> head{this, "head", 6, 3};
  bool use_b = true;
  auto forward(const typename branchy::template var<2>& x) {
    auto h = ta(a(x));
    if (use_b) h = h * b(x);         // a branch, taken or not at run time
    auto k = gc(c(h)) + h;           // a skip connection
    for (int i = 0; i < 2; ++i) k = k * 0.5 + 1.0;  // a loop
    return head(k);
  }
};
}  // namespace

TEST_CASE("modules: parameter gradients through branches, a loop and a skip connection match f64 finite differences") {
  using P = locus::amp::fp64;
  nn::model<branchy<cpu, P>> m;
  m.reset_parameters(3);
  const auto x = locus::randn<double, cpu>({4, 5}, 1);
  const auto s = locus::randn<double, cpu>({4, 3}, 2);  // L = sum(out * s)
  for (const bool use_b : {true, false}) {
    m.net().use_b = use_b;
    m.parameters().zero_grad();
    (void)m.forward(x.view());
    m.backward(s.view());
    const auto g = m.parameters().grad();
    const auto loss = [&] {
      const auto out = m.forward(x.view());
      double l = 0;
      for (index_t i = 0; i < out.numel(); ++i) l += out.data_handle()[i] * s.data_handle()[i];
      return l;
    };
    auto w = m.parameters().master();
    const double h = 1e-6;
    for (const auto& e : m.parameters().entries()) {
      for (index_t k = 0; k < e.numel; ++k) {
        const index_t i = e.offset + k;
        const double keep = w(i);
        w(i) = keep + h;
        const double up = loss();
        w(i) = keep - h;
        const double down = loss();
        w(i) = keep;
        const double numeric = (up - down) / (2 * h);
        INFO(e.name << "[" << k << "] use_b " << use_b);
        CHECK(g(i) == doctest::Approx(numeric).epsilon(1e-6).scale(1.0));
      }
    }
    if (!use_b) {  // the branch not taken: its parameters get zero gradients
      const auto& eb = m.parameters().entries()[m.parameters().index_of("b.weight")];
      for (index_t k = 0; k < eb.numel; ++k) CHECK(g(eb.offset + k) == 0.0);
    }
  }
}

namespace {
template <class D, class P>
struct twice : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> fc{this, "fc", 4, 4};
  auto forward(const typename twice::template var<2>& x) { return fc(fc(x)); }
};
template <class D, class P>
struct mismatched : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> a{this, "a", 4, 3};
  nn::layer<nn::linear<D, P>> b{this, "b", 4, 2};
  auto forward(const typename mismatched::template var<2>& x) { return a(x) + b(x); }
};
}  // namespace

TEST_CASE("modules: a layer called twice, branches of two shapes, and a module outside a model are errors") {
  using P = locus::amp::fp32;
  const auto x = locus::randn<float, cpu>({2, 4}, 1);
  nn::model<twice<cpu, P>> t;
  CHECK_THROWS_WITH_AS((void)t.forward(x.view()), doctest::Contains("'fc' was called twice in one forward"),
                       locus::autograd_error);
  nn::model<mismatched<cpu, P>> m;
  CHECK_THROWS_WITH_AS((void)m.forward(x.view()), doctest::Contains("[2, 3] and [2, 2]"), locus::shape_error);
  using bare = mlp<cpu, P>;
  CHECK_THROWS_WITH_AS((void)bare(), doctest::Contains("built by nn::model"), locus::error);
}

// ---- the cases of the hostile review of modules (kept as tests) --------------------------
namespace {
template <class D, class P>
struct dup_names : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> a{this, "fc", 4, 4};
  nn::layer<nn::linear<D, P>> b{this, "fc", 4, 4};
  auto forward(const typename dup_names::template var<2>& x) { return b(a(x)); }
};
template <class D, class P>
struct inner : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> b{this, "b", 4, 4};
  auto forward(const typename inner::template var<2>& x) { return b(x); }
};
template <class D, class P>
struct dotted : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> ab{this, "a.b", 4, 4};
  nn::child<inner<D, P>> a{this, "a"};
  auto forward(const typename dotted::template var<2>& x) { return a(ab(x)); }
};
template <class D, class P>
struct unnamed : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> a{this, "", 4, 4};
  auto forward(const typename unnamed::template var<2>& x) { return a(x); }
};
template <class D, class P>
struct local_helper : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> a{this, "a", 4, 4};
  local_helper() { inner<D, P> helper; (void)helper; }  // a module that would not live as long as the model
  auto forward(const typename local_helper::template var<2>& x) { return a(x); }
};
template <class D, class P>
struct late_layer : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> a{this, "a", 4, 4};
  auto forward(const typename late_layer::template var<2>& x) {
    nn::layer<nn::relu<D, P>> r{this, "r"};  // made in forward
    return r(a(x));
  }
};
template <class D, class P>
struct flat_net : nn::module<D, P> {
  nn::layer<nn::flatten<D, P>> f{this, "flatten"};
  nn::layer<nn::linear<D, P>> fc{this, "fc", 12, 2};
  auto forward(const typename flat_net::template var<4>& x) { return fc(f(x)); }
};
}  // namespace

TEST_CASE("modules review: names that would repeat or are empty, modules outside the tree and layers made late are refused") {
  using P = locus::amp::fp32;
  using dup_model = nn::model<dup_names<cpu, P>>;
  using dotted_model = nn::model<dotted<cpu, P>>;
  using unnamed_model = nn::model<unnamed<cpu, P>>;
  using local_model = nn::model<local_helper<cpu, P>>;
  CHECK_THROWS_WITH_AS((void)dup_model(), doctest::Contains("layer 'fc' collides"), locus::value_error);
  CHECK_THROWS_WITH_AS((void)dotted_model(), doctest::Contains("collides"), locus::value_error);
  CHECK_THROWS_WITH_AS((void)unnamed_model(), doctest::Contains("must be non-empty"), locus::value_error);
  CHECK_THROWS_WITH_AS((void)local_model(), doctest::Contains("not on its own"), locus::error);
  nn::model<late_layer<cpu, P>> m;
  const auto x = locus::randn<float, cpu>({2, 4}, 1);
  CHECK_THROWS_WITH_AS((void)m.forward(x.view()), doctest::Contains("was made after its model was built"),
                       locus::error);
  nn::model<inner<cpu, P>> fresh;
  const auto g = locus::randn<float, cpu>({2, 4}, 2);
  CHECK_THROWS_WITH_AS((void)fresh.backward(g.view()), doctest::Contains("before any forward"), locus::autograd_error);
}

TEST_CASE("modules review: a module called on a fresh tape each time, and an empty batch through flatten") {
  using P = locus::amp::fp32;
  nn::model<inner<cpu, P>> m;
  const auto x = locus::randn<float, cpu>({3, 4}, 3);
  for (int i = 0; i < 3; ++i) {  // the input's gradient through the module, a new tape each time
    ag::tape<float, cpu> t;
    const auto xv = t.leaf(x);
    t.backward(ag::sum(m.net().forward(xv)));
    CHECK(t.grad(xv).shape() == locus::extents<2>{3, 4});
  }
  nn::model<flat_net<cpu, P>> f;
  const auto empty = locus::zeros<float, cpu>({0, 3, 2, 2});
  const auto y = f.infer(empty.view());
  CHECK(y.shape() == locus::extents<2>{0, 2});
}

TEST_CASE("modules: a layer with a fused activation, fc(x, ag::fused::relu), trains bit for bit as nn::sequential") {
  using P = locus::amp::fp32;
  nn::model<mlp_fused<cpu, P>> m;
  nn::sequential s(nn::linear<cpu, P>(20, 16), nn::relu<cpu, P>(), nn::linear<cpu, P>(16, 12), nn::relu<cpu, P>(),
                   nn::linear<cpu, P>(12, 5));
  m.reset_parameters(7);
  s.reset_parameters(7);
  optim::adamw<cpu> om(m.parameters(), {.lr = 1e-2});
  optim::adamw<cpu> os(s.parameters(), {.lr = 1e-2});
  locus::train::trainer tm(m, om, nn::cross_entropy{});
  locus::train::trainer ts(s, os, nn::cross_entropy{});
  for (int step = 0; step < 6; ++step) {
    auto x = locus::randn<float, cpu>({9, 20}, 200 + static_cast<std::uint64_t>(step));
    std::vector<std::int64_t> labels;
    for (index_t i = 0; i < 9; ++i) labels.push_back((i * 3 + step) % 5);
    const auto y = locus::from_host<cpu>(labels, {9});
    tm.step(x, y);
    ts.step(x, y);
  }
  CHECK(bits(m.parameters().master().data_handle(), m.parameters().size()) ==
        bits(s.parameters().master().data_handle(), s.parameters().size()));
  CHECK(m.tape().values() < 8);  // input, three layers, the loss's: no separate relu values
  const auto x = locus::randn<float, cpu>({4, 20}, 9);
  const auto ym = m.infer(x.view());
  const auto ys = s.infer(x.view());
  CHECK(bits(ym.data_handle(), ym.numel()) == bits(ys.data_handle(), ys.numel()));

  nn::model<bn_gelu<cpu, P>> b;
  const auto xb = locus::randn<float, cpu>({3, 2, 2, 2}, 1);
  CHECK_THROWS_WITH_AS((void)b.forward(xb.view()), doctest::Contains("fuses relu only"), locus::value_error);
}

namespace {

// The main job's CNN (examples/fashion_mnist_job.hpp, make_cnn) written as a module, its
// layers named as nn::sequential numbers them, for 1 x 8 x 8 images.
template <class D, class P>
struct main_cnn : nn::module<D, P> {
  nn::layer<nn::conv2d<D, P>> c0{this, "0", 1, 32, 3, nn::conv2d_options{.padding = 1}};
  nn::layer<nn::batch_norm2d<D, P>> bn1{this, "1", 32};
  nn::layer<nn::relu<D, P>> r2{this, "2"};
  nn::layer<nn::max_pool2d<D, P>> p3{this, "3", 2};
  nn::layer<nn::conv2d<D, P>> c4{this, "4", 32, 64, 3, nn::conv2d_options{.padding = 1}};
  nn::layer<nn::batch_norm2d<D, P>> bn5{this, "5", 64};
  nn::layer<nn::relu<D, P>> r6{this, "6"};
  nn::layer<nn::max_pool2d<D, P>> p7{this, "7", 2};
  nn::layer<nn::flatten<D, P>> f8{this, "8"};
  nn::layer<nn::linear<D, P>> fc9{this, "9", 64 * 2 * 2, 128};
  nn::layer<nn::relu<D, P>> r10{this, "10"};
  nn::layer<nn::dropout<D, P>> d11{this, "11", 0.3f, std::uint64_t{5}};
  nn::layer<nn::linear<D, P>> fc12{this, "12", 128, 10};
  auto forward(const typename main_cnn::template var<4>& x) {
    return fc12(d11(r10(fc9(f8(p7(r6(bn5(c4(p3(r2(bn1(c0(x)))))))))))));
  }
};

/// Every buffer's name and bits (batch norm's running statistics and count).
template <class M>
std::vector<std::pair<std::string, std::vector<std::uint64_t>>> buffer_bits(const M& m) {
  std::vector<std::pair<std::string, std::vector<std::uint64_t>>> out;
  m.for_each_buffer([&](const std::string& name, auto v) { out.emplace_back(name, bits(v.data_handle(), v.numel())); });
  return out;
}

/// 3 epochs of `a` and `b` through the loader (shuffled, a smaller last batch), the
/// trainer with accumulation; every epoch's loss and the final weights and buffers must
/// be the same bits.
template <class A, class B, class Wrap>
void three_epochs_equal(A& a, B& b, index_t features, index_t classes, Wrap wrap) {
  auto x = locus::randn<float, cpu>({300, features}, 31);
  auto y = locus::zeros<std::int64_t, cpu>({300});
  for (index_t i = 0; i < 300; ++i) y(i) = (i * 7 + 3) % classes;
  locus::data::tensor_dataset set(std::move(x), std::move(y));
  optim::adamw<cpu> oa(a.parameters(), {.lr = 1e-3, .weight_decay = 1e-4});
  optim::adamw<cpu> ob(b.parameters(), {.lr = 1e-3, .weight_decay = 1e-4});
  locus::train::trainer ta(a, oa, nn::cross_entropy{}, {.accumulate = 2});
  locus::train::trainer tb(b, ob, nn::cross_entropy{}, {.accumulate = 2});
  locus::data::loader<cpu, locus::data::tensor_dataset> la(set, {.batch_size = 64, .shuffle = true, .seed = 9});
  locus::data::loader<cpu, locus::data::tensor_dataset> lb(set, {.batch_size = 64, .shuffle = true, .seed = 9});
  for (int e = 0; e < 3; ++e) {
    auto&& ia = wrap(la);
    auto&& ib = wrap(lb);
    const auto ma = ta.train_epoch(ia, {.epoch = e});
    const auto mb = tb.train_epoch(ib, {.epoch = e});
    CHECK(std::bit_cast<std::uint64_t>(ma.loss) == std::bit_cast<std::uint64_t>(mb.loss));
    CHECK(ma.optimizer_steps == mb.optimizer_steps);
  }
  CHECK(ta.optimizer_steps() == 9);  // 5 batches an epoch (4 of 64, one of 44), 2 per step, a short last step
  CHECK(bits(a.parameters().master().data_handle(), a.parameters().size()) ==
        bits(b.parameters().master().data_handle(), b.parameters().size()));
  const auto ba = buffer_bits(a), bb = buffer_bits(b);
  CHECK(!ba.empty() == (features == 64));  // the CNN's batch norms have buffers
  CHECK(ba == bb);
}

}  // namespace

TEST_CASE("modules: the main job's MLP and CNN as modules train 3 epochs bit for bit as nn::sequential (fp32, CPU)") {
  using P = locus::amp::fp32;
  SUBCASE("MLP") {
    nn::model<mlp<cpu, P>> m;
    nn::sequential s(nn::linear<cpu, P>(20, 16), nn::relu<cpu, P>(), nn::linear<cpu, P>(16, 12), nn::relu<cpu, P>(),
                     nn::linear<cpu, P>(12, 5));
    m.reset_parameters(3);
    s.reset_parameters(3);
    three_epochs_equal(m, s, 20, 5, [](auto& l) -> auto& { return l; });
  }
  SUBCASE("CNN, with batch norm and dropout") {
    nn::model<main_cnn<cpu, P>> m;
    nn::sequential s(nn::conv2d<cpu, P>(1, 32, 3, {.padding = 1}), nn::batch_norm2d<cpu, P>(32), nn::relu<cpu, P>(),
                     nn::max_pool2d<cpu, P>(2), nn::conv2d<cpu, P>(32, 64, 3, {.padding = 1}),
                     nn::batch_norm2d<cpu, P>(64), nn::relu<cpu, P>(), nn::max_pool2d<cpu, P>(2), nn::flatten<cpu, P>(),
                     nn::linear<cpu, P>(64 * 2 * 2, 128), nn::relu<cpu, P>(), nn::dropout<cpu, P>(0.3f, 5),
                     nn::linear<cpu, P>(128, 10));
    m.reset_parameters(4);
    s.reset_parameters(4);
    three_epochs_equal(m, s, 64, 10, [](auto& l) { return locus::data::images(l, 1, 8, 8); });
  }
}

namespace {

template <class D, class P>
struct bucket_inner : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> fc{this, "fc", 16, 16};
  nn::param<D, P, 1> scale{this, "scale", {16}, nn::param_init::uniform(0.5, 1.5)};
  auto forward(const typename bucket_inner::template var<2>& x) { return ag::tanh(fc(x)) * scale.on(x); }
};

// Declared in another order than it runs: `late` first but called last, a parameter used
// twice (early and late), a checkpointed child, a layer never called.
template <class D, class P>
struct tangled : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> late{this, "late", 16, 5};
  nn::param<D, P, 1> gain{this, "gain", {16}, nn::param_init::uniform(0.5, 1.5)};
  nn::layer<nn::linear<D, P>> first{this, "first", 8, 16};
  nn::child<bucket_inner<D, P>> body{this, "body"};
  nn::layer<nn::linear<D, P>> unused{this, "unused", 4, 4};
  bool checkpointed = true;
  auto forward(const typename tangled::template var<2>& x) {
    const auto h = first(x) * gain.on(x);
    const auto b = checkpointed ? nn::checkpoint(body, h) : body(h);
    return late((b + h) * gain.on(x));
  }
};

}  // namespace

TEST_CASE("modules: during backward, the gradients reported final (data parallel's buckets) are not written again") {
  using P = locus::amp::fp32;
  for (const bool ckpt : {true, false}) {
    CAPTURE(ckpt);
    nn::model<tangled<cpu, P>> m;
    m.net().checkpointed = ckpt;
    m.reset_parameters(2);
    auto grad = m.parameters().grad_unsettled();
    const index_t size = grad.numel();
    std::vector<std::pair<index_t, std::vector<std::uint64_t>>> reports;
    m.set_gradients_final([&](index_t first) {
      reports.emplace_back(first, bits(grad.data_handle() + first, size - first));
    });
    for (int step = 0; step < 2; ++step) {
      reports.clear();
      const auto x = locus::randn<float, cpu>({6, 8}, 10 + static_cast<std::uint64_t>(step));
      const auto g = locus::randn<float, cpu>({6, 5}, 20 + static_cast<std::uint64_t>(step));
      (void)m.forward(x.view());
      (void)m.backward(g.view());
      // the unused layer at the end is final at once; every later report reaches further
      // back; the last covers everything
      REQUIRE(reports.size() >= 2);
      const auto& entries = m.parameters().entries();
      CHECK(reports.front().first == entries[entries.size() - 2].offset);  // unused.weight, unused.bias
      for (std::size_t i = 1; i < reports.size(); ++i) CHECK(reports[i].first < reports[i - 1].first);
      CHECK(reports.back().first == 0);
      // nothing reported final changed afterwards
      for (const auto& [first, snap] : reports) {
        CAPTURE(first);
        CHECK(bits(grad.data_handle() + first, size - first) == snap);
      }
    }
  }
}
