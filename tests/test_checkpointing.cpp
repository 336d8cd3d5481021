// Host suite: activation checkpointing (nn::checkpoint). The main job's ResNet with every
// block checkpointed trains bit for bit as without (parameters, batch norm's running
// statistics and counts after several steps of the trainer) and holds less memory at its
// peak; a dropout inside a checkpointed segment draws the same mask on the recompute
// (gradients bit for bit those of the plain model, and the masks still change from step
// to step); inference through it is the plain forward; the rules (a checkpoint inside
// another, a forward that returns a value of another tape) are autograd_errors.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <locus/nn/module.hpp>
#include <locus/train.hpp>

#include "../examples/resnet.hpp"

namespace {
namespace nn = locus::nn;
namespace ag = locus::ag;
using locus::cpu;
using locus::index_t;
using P = locus::amp::fp32;

template <class T>
std::vector<T> host_copy(const T* p, index_t n) {
  return std::vector<T>(p, p + n);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct trained {
  std::vector<float> params, grads, buffers;
  std::vector<std::int64_t> counts;
  std::size_t peak = 0, before = 0;
  std::vector<float> logits;
};

trained train_resnet(bool checkpointing, int steps) {
  nn::model<locus_examples::resnet<cpu, P>> m(10, 4, std::array<int, 3>{2, 1, 1});
  m.reset_parameters(3);
  m.net().checkpointing = checkpointing;
  locus::optim::adamw<cpu> opt(m.parameters(), {.lr = 1e-2});
  locus::train::trainer t(m, opt, nn::cross_entropy{});
  const auto x = locus::randn<float, cpu>({16, 1, 12, 12}, 5);
  locus::tensor<std::int64_t, cpu, 1> y({16});
  for (index_t i = 0; i < 16; ++i) y(i) = (3 * i) % 10;
  trained r;
  t.step(x, y);  // the first step allocates what the next ones reuse
  locus::reset_peak_memory_stats<cpu>();
  r.before = locus::memory_stats<cpu>().allocated_bytes;
  for (int s = 1; s < steps; ++s) t.step(x, y);
  r.peak = locus::memory_stats<cpu>().peak_allocated_bytes;
  const auto mv = m.parameters().master();
  r.params = host_copy(mv.data_handle(), mv.numel());
  const auto gv = m.parameters().grad();
  r.grads = host_copy(gv.data_handle(), gv.numel());
  m.for_each_buffer([&](const std::string&, auto v) {
    using T = std::remove_const_t<typename decltype(v)::value_type>;
    if constexpr (std::is_same_v<T, float>) {
      const auto h = host_copy(v.data_handle(), v.numel());
      r.buffers.insert(r.buffers.end(), h.begin(), h.end());
    } else {
      r.counts.push_back(*v.data_handle());
    }
  });
  const auto logits = m.infer(x);
  r.logits = host_copy(logits.data_handle(), logits.numel());
  return r;
}

// A child with a dropout between two linear layers, checkpointed or not.
template <class D, class Pol>
struct mlp_block : nn::module<D, Pol> {
  nn::layer<nn::linear<D, Pol>> fc1{this, "fc1", 12, 24};
  nn::layer<nn::relu<D, Pol>> relu{this, "relu"};
  nn::layer<nn::dropout<D, Pol>> drop{this, "drop", 0.5f, std::uint64_t{9}};
  nn::layer<nn::linear<D, Pol>> fc2{this, "fc2", 24, 12};
  auto forward(const typename mlp_block::template var<2>& x) { return fc2(drop(relu(fc1(x)))); }
};

template <class D, class Pol>
struct with_dropout : nn::module<D, Pol> {
  nn::layer<nn::linear<D, Pol>> in{this, "in", 6, 12};
  nn::child<mlp_block<D, Pol>> body{this, "body"};
  nn::layer<nn::linear<D, Pol>> out{this, "out", 12, 4};
  bool checkpointing = false;
  auto forward(const typename with_dropout::template var<2>& x) {
    const auto h = in(x);
    return out((checkpointing ? nn::checkpoint(body, h) : body(h)) + h);  // a skip around the segment
  }
};

// Checkpoints a child inside a checkpointed child.
template <class D, class Pol>
struct inner : nn::module<D, Pol> {
  nn::layer<nn::linear<D, Pol>> fc{this, "fc", 4, 4};
  auto forward(const typename inner::template var<2>& x) { return fc(x); }
};
template <class D, class Pol>
struct outer : nn::module<D, Pol> {
  nn::child<inner<D, Pol>> a{this, "a"};
  auto forward(const typename outer::template var<2>& x) { return nn::checkpoint(a, x); }
};
template <class D, class Pol>
struct nested : nn::module<D, Pol> {
  nn::child<outer<D, Pol>> o{this, "o"};
  auto forward(const typename nested::template var<2>& x) { return nn::checkpoint(o, x); }
};
// A child that reads its input twice (fc(x) + x), and an outer skip around it: the
// input's gradient is a sum of three parts, which must be added in the plain order.
template <class D, class Pol>
struct twice : nn::module<D, Pol> {
  nn::layer<nn::linear<D, Pol>> fc{this, "fc", 8, 8};
  auto forward(const typename twice::template var<2>& x) { return fc(x) + x; }
};
template <class D, class Pol>
struct skip_around : nn::module<D, Pol> {
  nn::layer<nn::linear<D, Pol>> in{this, "in", 5, 8};
  nn::child<twice<D, Pol>> body{this, "body"};
  nn::layer<nn::linear<D, Pol>> out{this, "out", 8, 3};
  bool checkpointing = false;
  auto forward(const typename skip_around::template var<2>& x) {
    const auto h = in(x);
    return out((checkpointing ? nn::checkpoint(body, h) : body(h)) + h);
  }
};

// One child used twice in one forward, in the ways a user might.
template <class D, class Pol>
struct reuse : nn::module<D, Pol> {
  nn::child<mlp_block<D, Pol>> b{this, "b"};
  int mode = 0;
  auto forward(const typename reuse::template var<2>& x) {
    if (mode == 0) return nn::checkpoint(b, nn::checkpoint(b, x));
    if (mode == 1) return b(nn::checkpoint(b, x));
    return nn::checkpoint(b, b(x));
  }
};

template <class D, class Pol>
struct with_block : nn::module<D, Pol> {
  nn::child<mlp_block<D, Pol>> b{this, "b"};
  auto forward(const typename with_block::template var<2>& x) { return nn::checkpoint(b, x); }
};
}  // namespace

TEST_CASE("checkpointing: a segment that reads its input twice, inside a skip, sums the input's gradient in the plain order") {
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    nn::model<skip_around<cpu, P>> plain, ck;
    plain.reset_parameters(seed);
    ck.reset_parameters(seed);
    ck.net().checkpointing = true;
    const auto x = locus::randn<float, cpu>({6, 5}, seed + 10);
    const auto gy = locus::randn<float, cpu>({6, 3}, seed + 20);
    for (auto* m : {&plain, &ck}) {
      m->parameters().zero_grad();
      (void)m->forward(x.view());
      (void)m->backward(gy.view());
    }
    const auto a = plain.parameters().grad(), b = ck.parameters().grad();
    CHECK_MESSAGE(same_bits(host_copy(a.data_handle(), a.numel()), host_copy(b.data_handle(), b.numel())),
                  "seed " << seed);
  }
}

TEST_CASE("checkpointing: one child checkpointed twice, or called plainly beside its checkpoint, is an autograd_error") {
  const auto x = locus::randn<float, cpu>({4, 12}, 1);
  for (int mode = 0; mode < 3; ++mode) {
    nn::model<reuse<cpu, P>> m;
    m.net().mode = mode;
    CAPTURE(mode);
    CHECK_THROWS_AS((void)m.forward(x.view()), locus::autograd_error);
  }
}

TEST_CASE("checkpointing: a recompute that fails leaves the dropout counter and statistics as the forward left them") {
  nn::model<with_block<cpu, P>> m;
  bool armed = false;
  m.net().b->drop.get().add_forward_pre_hook([&](const auto&) {
    if (armed) throw std::runtime_error("a hook that fails in the recompute");
  });
  const auto x = locus::randn<float, cpu>({4, 12}, 3);
  const auto g = locus::randn<float, cpu>({4, 12}, 4);
  (void)m.forward(x.view());
  REQUIRE(m.net().b->drop.get().counter() == 1);
  armed = true;
  CHECK_THROWS_AS((void)m.backward(g.view()), std::runtime_error);
  armed = false;
  CHECK(m.net().b->drop.get().counter() == 1);  // not rewound to 0: the next step draws a new mask
  // and the model trains on afterwards
  (void)m.forward(x.view());
  CHECK_NOTHROW((void)m.backward(g.view()));
  CHECK(m.net().b->drop.get().counter() == 2);
}

TEST_CASE("checkpointing: the ResNet with every block checkpointed trains bit for bit as without, in less memory") {
  const trained plain = train_resnet(false, 4);
  const trained ck = train_resnet(true, 4);
  REQUIRE(plain.params.size() == ck.params.size());
  CHECK(same_bits(plain.params, ck.params));
  CHECK(same_bits(plain.grads, ck.grads));
  CHECK(same_bits(plain.buffers, ck.buffers));  // the running statistics updated once per step
  CHECK(plain.counts == ck.counts);             // num_batches_tracked: 4 steps, not 8
  CHECK(ck.counts.front() == 4);
  CHECK(same_bits(plain.logits, ck.logits));
  // memory: the blocks' activations live only while their segment runs
  INFO("plain: " << plain.before << " bytes held between steps, peak " << plain.peak << "; checkpointed: "
                 << ck.before << ", peak " << ck.peak);
  CHECK(ck.before < plain.before);
  CHECK(ck.peak < plain.peak);
}

TEST_CASE("checkpointing: a dropout inside a checkpointed segment draws the same mask on the recompute") {
  using M = nn::model<with_dropout<cpu, P>>;
  M plain, ck;
  ck.net().checkpointing = true;
  const auto x = locus::randn<float, cpu>({8, 6}, 1);
  const auto gy = locus::randn<float, cpu>({8, 4}, 2);
  std::vector<float> first_grads;
  for (int step = 0; step < 3; ++step) {
    for (M* m : {&plain, &ck}) {
      m->parameters().zero_grad();
      (void)m->forward(x.view());
      (void)m->backward(gy.view());
    }
    const auto a = plain.parameters().grad(), b = ck.parameters().grad();
    const auto ga = host_copy(a.data_handle(), a.numel()), gb = host_copy(b.data_handle(), b.numel());
    CHECK_MESSAGE(same_bits(ga, gb), "step " << step);
    if (step == 0) first_grads = ga;
    else CHECK_MESSAGE(!same_bits(ga, first_grads), "the dropout mask should change from step to step");
    CHECK(plain.net().body->drop.get().counter() == ck.net().body->drop.get().counter());
  }
  CHECK(ck.net().body->drop.get().counter() == 3);  // one draw per step, the recompute's replayed
  // inference: the plain forward (no dropout, nothing kept)
  const auto yi = plain.infer(x.view()), yc = ck.infer(x.view());
  CHECK(same_bits(host_copy(yi.data_handle(), yi.numel()), host_copy(yc.data_handle(), yc.numel())));
}

TEST_CASE("checkpointing: a checkpoint inside a checkpointed segment is an autograd_error") {
  nn::model<nested<cpu, P>> m;
  const auto x = locus::randn<float, cpu>({2, 4}, 1);
  CHECK_THROWS_WITH_AS((void)m.forward(x.view()), doctest::Contains("inside another checkpointed segment"),
                       locus::autograd_error);
  // the model still works afterwards in inference (nothing is left half-set)
  CHECK(m.infer(x.view()).shape() == locus::extents<2>{2, 4});
}

// A checkpointed segment's tape frees each value and gradient during backward once no node
// left to run reads it (ag::detail::access::set_releasing): the same gradients, bit for bit,
// in less memory at backward's peak; its leaves keep their gradients, other values' grad()
// is an autograd_error, and the next step allocates again and gives the same bits.
TEST_CASE("checkpointing: a releasing tape frees during backward, keeps its leaves' gradients, and gives the same bits") {
  const auto xt = locus::randn<float, cpu>({256, 256}, 11);
  struct run {
    std::vector<float> grad;
    std::size_t peak = 0, after = 0;
  };
  const auto once = [&](ag::tape<float, cpu>& t, bool releasing) {
    ag::detail::access::set_releasing(t, releasing);
    t.reset();
    const auto x = t.leaf(xt);
    auto h = x;
    for (int i = 0; i < 6; ++i) h = ag::relu(h * 1.5f + x);  // six values of 256 KiB each, and their gradients
    const auto mid = h;
    const auto loss = ag::sum(ag::exp(h * 0.01f));
    const std::size_t base = locus::memory_stats<cpu>().allocated_bytes;
    locus::reset_peak_memory_stats<cpu>();
    t.backward(loss);
    run r;
    r.peak = locus::memory_stats<cpu>().peak_allocated_bytes - base;
    r.after = locus::memory_stats<cpu>().allocated_bytes;
    const auto g = t.grad(x);
    r.grad = host_copy(g.data_handle(), g.numel());
    if (releasing) {
      CHECK_THROWS_WITH_AS((void)t.grad(mid), doctest::Contains("freed during backward"), locus::autograd_error);
    } else {
      CHECK(t.grad(mid).numel() == xt.numel());
    }
    return r;
  };
  ag::tape<float, cpu> plain_tape, releasing_tape;
  const run plain = once(plain_tape, false);
  const run rel = once(releasing_tape, true);
  CHECK(same_bits(plain.grad, rel.grad));
  INFO("backward's extra peak: plain " << plain.peak << " bytes, releasing " << rel.peak);
  CHECK(rel.peak < plain.peak);
  const run again = once(releasing_tape, true);  // the freed buffers are made again
  CHECK(same_bits(plain.grad, again.grad));
}
