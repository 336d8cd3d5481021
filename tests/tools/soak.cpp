// Soak: many epochs of a small model, the memory measured every epoch (docs/reliability.md).
//
//   soak EPOCHS [CSV]
//
// An MLP (with dropout), a CNN (with batch norm) and a module with a skip connection
// (a residual block, nn::module) train on synthetic data through the loader (prefetching on its background thread) and are evaluated every epoch. After
// the first epoch, per epoch: the allocator's reserved and allocated bytes must not
// change, and the training steps must make no allocation at all (every request a
// device's allocator sees from a step is counted: on the host each would be a malloc),
// nor may evaluation's count grow. Writes the curve (one row per model and epoch) to CSV
// when asked. Exit status 0 when the memory stayed flat, 1 otherwise.
#include <locus/data/loader.hpp>
#include <locus/data/tensor_dataset.hpp>
#include <locus/nn/conv.hpp>
#include <locus/nn/module.hpp>
#include <locus/train.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>

namespace {

namespace nn = locus::nn;
using D = locus::cpu;
using P = locus::amp::fp32;
using locus::index_t;

locus::data::tensor_dataset make_set(index_t n, index_t features, std::uint64_t seed) {
  auto x = locus::randn<float, locus::cpu>({n, features}, seed);
  auto y = locus::zeros<std::int64_t, locus::cpu>({n});
  for (index_t i = 0; i < n; ++i) y(i) = (i * 7 + static_cast<index_t>(seed)) % 10;
  return locus::data::tensor_dataset(std::move(x), std::move(y));
}

/// A module with a skip connection: stem, a residual block (conv-bn-relu-conv-bn plus
/// its input), dropout, a head; its tape's entries and buffers are reused every step.
template <class D, class P>
struct residual : nn::module<D, P> {
  nn::layer<nn::conv2d<D, P>> stem{this, "stem", 1, 8, 3, nn::conv2d_options{.padding = 1}};
  nn::layer<nn::relu<D, P>> relu0{this, "relu0"};
  nn::layer<nn::conv2d<D, P>> conv1{this, "conv1", 8, 8, 3, nn::conv2d_options{.padding = 1, .bias = false}};
  nn::layer<nn::batch_norm2d<D, P>> bn1{this, "bn1", 8};
  nn::layer<nn::conv2d<D, P>> conv2{this, "conv2", 8, 8, 3, nn::conv2d_options{.padding = 1, .bias = false}};
  nn::layer<nn::batch_norm2d<D, P>> bn2{this, "bn2", 8};
  nn::layer<nn::relu<D, P>> relu2{this, "relu2"};
  nn::layer<nn::max_pool2d<D, P>> pool{this, "pool", 2};
  nn::layer<nn::flatten<D, P>> flat{this, "flat"};
  nn::layer<nn::dropout<D, P>> drop{this, "drop", 0.2f, std::uint64_t{6}};
  nn::layer<nn::linear<D, P>> fc{this, "fc", 8 * 4 * 4, 10};
  auto forward(const typename residual::template var<4>& x) {
    const auto h = relu0(stem(x));
    return fc(drop(flat(pool(relu2(bn2(conv2(bn1(conv1(h), locus::ag::fused::relu))) + h)))));
  }
};

/// Counts the allocation requests of `f` (the fault counter armed with a k no run reaches).
template <class F>
std::int64_t requests_of(F&& f) {
  locus::fault::fail_allocation(std::int64_t{1} << 62);
  f();
  const std::int64_t n = locus::fault::requests();
  locus::fault::fail_allocation(0);
  return n;
}

struct row {
  int epoch;
  std::size_t allocated, reserved, peak;
  std::int64_t train_requests, eval_requests, steps;
  double loss;
};

template <class Model, class Wrap>
bool soak(const std::string& name, Model& model, Wrap wrap, index_t features, int epochs, bool drop_last,
          std::ofstream* csv) {
  auto train = make_set(2048, features, 1);
  auto test = make_set(512, features, 2);
  locus::optim::adamw<D> opt(model.parameters(), {.lr = 1e-3});
  locus::train::trainer t(model, opt, nn::cross_entropy{}, {.accumulate = 2});
  // 2048 = 15 batches of 136 and one of 8: the last, smaller batch of every epoch, and
  // the shuffle, exercise a changing shape
  locus::data::loader<D, locus::data::tensor_dataset> tl(
      train, {.batch_size = 136, .shuffle = true, .seed = 3, .drop_last = drop_last, .prefetch = 2});
  locus::data::loader<D, locus::data::tensor_dataset> vl(test, {.batch_size = 256});
  bool ok = true;
  row first{}, second{};
  for (int e = 0; e < epochs; ++e) {
    locus::train::metrics m;
    const std::int64_t train_req = requests_of([&] {
      auto&& in = wrap(tl);
      m = t.train_epoch(in, {.epoch = e});
    });
    const std::int64_t eval_req = requests_of([&] {
      auto&& in = wrap(vl);
      (void)t.evaluate(in);
    });
    const auto s = locus::memory_stats<D>();
    const row r{e + 1, s.allocated_bytes, s.reserved_bytes, s.peak_allocated_bytes, train_req, eval_req,
                m.optimizer_steps, m.loss};
    std::printf("%-26s epoch %3d  allocated %8zu B  reserved %8zu B  peak %8zu B  allocation requests: training %lld, "
                "evaluation %lld  (%lld steps, loss %.4f)\n",
                name.c_str(), r.epoch, r.allocated, r.reserved, r.peak, static_cast<long long>(train_req),
                static_cast<long long>(eval_req), static_cast<long long>(r.steps), r.loss);
    if (csv)
      *csv << name << ',' << r.epoch << ',' << r.allocated << ',' << r.reserved << ',' << r.peak << ',' << train_req << ','
           << eval_req << ',' << r.steps << ',' << r.loss << '\n';
    if (e == 0) {
      first = r;
      continue;
    }
    if (r.allocated != first.allocated || r.reserved != first.reserved || r.peak != first.peak) {
      std::fprintf(stderr, "soak: FAILED: %s epoch %d: memory moved (allocated %zu, reserved %zu, peak %zu after epoch 1: "
                   "%zu, %zu, %zu)\n", name.c_str(), r.epoch, r.allocated, r.reserved, r.peak, first.allocated, first.reserved,
                   first.peak);
      ok = false;
    }
    // Every batch of one shape (drop_last): no request at all after epoch 1. With the
    // epoch's last, smaller batch, the buffers change shape twice an epoch: a constant
    // number of requests per epoch from epoch 2 on (the epoch before set the shape).
    if (drop_last && r.train_requests != 0) {
      std::fprintf(stderr, "soak: FAILED: %s epoch %d: %lld allocation requests while training (0 expected)\n",
                   name.c_str(), r.epoch, static_cast<long long>(r.train_requests));
      ok = false;
    }
    if (e == 1) second = r;
    if (e >= 2 && r.train_requests != second.train_requests) {
      std::fprintf(stderr, "soak: FAILED: %s epoch %d: %lld allocation requests while training, %lld in epoch 2\n",
                   name.c_str(), r.epoch, static_cast<long long>(r.train_requests),
                   static_cast<long long>(second.train_requests));
      ok = false;
    }
    if (e >= 2 && r.eval_requests != second.eval_requests) {
      std::fprintf(stderr, "soak: FAILED: %s epoch %d: evaluation's requests moved from %lld to %lld\n", name.c_str(),
                   r.epoch, static_cast<long long>(second.eval_requests), static_cast<long long>(r.eval_requests));
      ok = false;
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 5;
  if (epochs < 3) {
    std::fprintf(stderr, "usage: soak EPOCHS [CSV] (EPOCHS >= 3)\n");
    return 2;
  }
  std::ofstream csv;
  if (argc > 2) {
    csv.open(argv[2]);
    csv << "model,epoch,allocated_bytes,reserved_bytes,peak_bytes,train_requests,eval_requests,optimizer_steps,loss\n";
  }
  bool ok = true;
  for (const bool drop_last : {true, false}) {
    const std::string tag = drop_last ? " drop_last" : " last<136";
    {
      nn::sequential mlp(nn::linear<D, P>(64, 128), nn::relu<D, P>(), nn::dropout<D, P>(0.2f, 1),
                         nn::linear<D, P>(128, 10));
      mlp.reset_parameters(4);
      ok = soak("mlp" + tag, mlp, [](auto& l) -> auto& { return l; }, 64, epochs, drop_last, argc > 2 ? &csv : nullptr) &&
           ok;
    }
    {
      nn::sequential cnn(nn::conv2d<D, P>(1, 8, 3, {.padding = 1}), nn::batch_norm2d<D, P>(8), nn::relu<D, P>(),
                         nn::max_pool2d<D, P>(2), nn::flatten<D, P>(), nn::linear<D, P>(8 * 4 * 4, 10));
      cnn.reset_parameters(5);
      ok = soak("cnn" + tag, cnn, [](auto& l) { return locus::data::images(l, 1, 8, 8); }, 64, epochs, drop_last,
                argc > 2 ? &csv : nullptr) &&
           ok;
    }
    {
      nn::model<residual<D, P>> res;
      res.reset_parameters(6);
      ok = soak("residual module" + tag, res, [](auto& l) { return locus::data::images(l, 1, 8, 8); }, 64, epochs,
                drop_last, argc > 2 ? &csv : nullptr) &&
           ok;
    }
  }
  std::printf(ok ? "soak: memory flat after the first epoch, no allocation in steady-state training\n"
                 : "soak: FAILED\n");
  return ok ? 0 : 1;
}
