// Fault injection (locus::fault::fail_allocation, memory/host_allocator.hpp): the k-th
// allocation request fails with out_of_memory, for every k a step makes, in turn.
//
// A training step (forward, loss, backward, grad scaler, optimizer, accumulation of two
// micro-batches, a batch that grows) for an MLP with dropout, a CNN with batch norm and a
// module with a skip connection (nn::module), under fp32 and fp16_mixed or bf16_mixed: each time out_of_memory reaches the caller, the trainer's
// state (master weights, optimizer moments and step, scaler state, step counters, dropout
// counters, batch norm's running statistics: everything a checkpoint holds) is byte for
// byte what it was before the step; the same step retried without a fault succeeds, and
// the run then ends in exactly the state and running loss of a run that never failed.
// Also: a checkpoint save that fails leaves the previous file intact; a checkpoint load
// that fails changes nothing; a loader whose batch fails rethrows at that batch and
// serves the same batches when restarted.
#include <doctest/doctest.h>

#include <locus/data/loader.hpp>
#include <locus/data/tensor_dataset.hpp>
#include <locus/nn/conv.hpp>
#include <locus/nn/module.hpp>
#include <locus/train.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
namespace {

namespace nn = locus::nn;
using D = locus::cpu;
using locus::index_t;

/// Disarms the fault whatever happens in the test body.
struct disarm_at_exit {
  ~disarm_at_exit() { locus::fault::fail_allocation(0); }
};

std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::filesystem::path scratch(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("locus-faults-" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d / name;
}

/// Everything a checkpoint holds, as bytes (the trainer's state without its gradients
/// and running loss, which the final comparison covers).
template <class Trainer>
std::string state_of(Trainer& t, const std::string& tag) {
  const auto p = scratch(tag + ".safetensors");
  locus::train::save_checkpoint(p, t, 1);
  return file_bytes(p);
}

template <class P>
auto make_mlp() {
  nn::sequential m(nn::linear<D, P>(12, 16), nn::relu<D, P>(), nn::dropout<D, P>(0.25f, 3), nn::linear<D, P>(16, 4));
  m.reset_parameters(5);
  return m;
}
template <class P>
auto make_cnn() {
  nn::sequential m(nn::conv2d<D, P>(1, 4, 3, {.padding = 1}), nn::batch_norm2d<D, P>(4), nn::relu<D, P>(),
                   nn::max_pool2d<D, P>(2), nn::flatten<D, P>(), nn::dropout<D, P>(0.2f, 9),
                   nn::linear<D, P>(4 * 4 * 4, 4));
  m.reset_parameters(6);
  return m;
}

/// Micro-batches: two of 8 samples (one optimizer step), then two of 16 (a batch that
/// grows: every activation buffer is reallocated in a warm trainer).
template <std::size_t R>
struct batches {
  std::vector<locus::tensor<float, D, R>> x;
  std::vector<locus::tensor<std::int64_t, D, 1>> y;
};
template <std::size_t R>
batches<R> make_batches(const locus::extents<R>& sample) {
  batches<R> b;
  const index_t sizes[] = {8, 8, 16, 16};
  std::uint64_t seed = 100;
  for (const index_t n : sizes) {
    locus::extents<R> s = sample;
    s[0] = n;
    b.x.push_back(locus::randn<float, D>(s, seed++));
    auto y = locus::zeros<std::int64_t, D>({n});
    for (index_t i = 0; i < n; ++i) y(i) = (i * 7 + static_cast<index_t>(seed)) % 4;
    b.y.push_back(std::move(y));
  }
  return b;
}

/// Runs the four micro-batches with accumulate = 2; `make` builds a fresh trainer
/// bundle (model, optimizer, scaler, trainer). For each micro-batch j and every
/// allocation request k of step j: the fault, the unchanged state, the retry, and the
/// final state against the run without faults. Returns the positions tried.
///
/// `steady_allocates`: the policy's steps allocate even at an unchanged shape (f16/bf16
/// GEMMs on the host widen into temporaries). A failed step there keeps everything but
/// the window's earlier gradients (no per-step copy of them: the window restarts), so
/// for a later micro-batch of a window at the last step's shape only the state before
/// the step and the retry are checked, not the final state.
template <class Make, std::size_t R>
int fault_every_allocation(Make make, const batches<R>& b, const std::string& what, bool steady_allocates) {
  disarm_at_exit guard;
  const std::size_t n = b.x.size();
  std::string final_ref;
  double loss_ref = 0;
  {
    auto bundle = make();
    auto& t = *bundle.t;
    for (std::size_t i = 0; i < n; ++i) t.step(b.x[i], b.y[i]);
    final_ref = state_of(t, "ref");
    loss_ref = t.report().loss;
  }
  int positions = 0;
  for (std::size_t j = 0; j < n; ++j) {
    for (std::int64_t k = 1;; ++k) {
      CAPTURE(what);
      CAPTURE(j);
      CAPTURE(k);
      REQUIRE(k < 2000);  // a step makes far fewer requests
      auto bundle = make();
      auto& t = *bundle.t;
      for (std::size_t i = 0; i < j; ++i) t.step(b.x[i], b.y[i]);
      const std::string before = state_of(t, "before");
      bool threw = false;
      locus::fault::fail_allocation(k);
      try {
        t.step(b.x[j], b.y[j]);
      } catch (const locus::out_of_memory& e) {
        threw = true;
        const std::string what = e.what();
        CHECK(what.find("(injected fault). This failure was injected by locus::fault::fail_allocation, a test hook; "
                        "memory was not short.") != std::string::npos);
        CHECK(what.find("smaller batch") == std::string::npos);  // no advice for a shortage there is not
      }
      const bool fired = locus::fault::fired();
      locus::fault::fail_allocation(0);
      if (!fired) {  // step j makes fewer than k requests: every position was tried
        CHECK(!threw);
        break;
      }
      ++positions;
      CHECK(threw);  // the fault reached the caller, nothing swallowed it
      if (!threw) break;
      const bool same = state_of(t, "after") == before;
      CHECK(same);
      t.step(b.x[j], b.y[j]);  // the same step again, without a fault
      for (std::size_t i = j + 1; i < n; ++i) t.step(b.x[i], b.y[i]);
      const bool window_kept = !steady_allocates || j % 2 == 0 || b.x[j].shape() != b.x[j - 1].shape();
      if (window_kept) {
        CHECK(state_of(t, "final") == final_ref);
        CHECK(t.report().loss == loss_ref);
      }
    }
  }
  return positions;
}

template <class Model>
struct fp32_bundle {
  Model m;
  locus::optim::adamw<D> opt;
  std::unique_ptr<locus::train::trainer<Model, locus::optim::adamw<D>, nn::cross_entropy>> t;
  explicit fp32_bundle(Model model) : m(std::move(model)), opt(m.parameters(), {.lr = 1e-2}) {
    t = std::make_unique<locus::train::trainer<Model, locus::optim::adamw<D>, nn::cross_entropy>>(
        m, opt, nn::cross_entropy{}, locus::train::options{.accumulate = 2});
  }
};

template <class Model>
struct fp16_bundle {
  using scaler_t = locus::amp::grad_scaler<D>;
  using trainer_t = locus::train::trainer<Model, locus::optim::sgd<D>, nn::cross_entropy, scaler_t>;
  Model m;
  locus::optim::sgd<D> opt;
  scaler_t scaler{{.init_scale = 1024, .growth_interval = 1}};  // the scale moves every step
  std::unique_ptr<trainer_t> t;
  explicit fp16_bundle(Model model) : m(std::move(model)), opt(m.parameters(), {.lr = 1e-2, .momentum = 0.9}) {
    t = std::make_unique<trainer_t>(m, opt, nn::cross_entropy{}, scaler, locus::train::options{.accumulate = 2});
  }
};

/// A module with a skip connection: conv, a residual pair with batch norm around it,
/// dropout and a head (nn::model is built in place: its layers point into it).
template <class P>
struct residual : nn::module<D, P> {
  nn::layer<nn::conv2d<D, P>> stem{this, "stem", 1, 4, 3, nn::conv2d_options{.padding = 1}};
  nn::layer<nn::relu<D, P>> relu0{this, "relu0"};
  nn::layer<nn::conv2d<D, P>> conv1{this, "conv1", 4, 4, 3, nn::conv2d_options{.padding = 1, .bias = false}};
  nn::layer<nn::batch_norm2d<D, P>> bn1{this, "bn1", 4};
  nn::layer<nn::relu<D, P>> relu1{this, "relu1"};
  nn::layer<nn::max_pool2d<D, P>> pool{this, "pool", 2};
  nn::layer<nn::flatten<D, P>> flat{this, "flat"};
  nn::layer<nn::dropout<D, P>> drop{this, "drop", 0.2f, std::uint64_t{9}};
  nn::layer<nn::linear<D, P>> fc{this, "fc", 4 * 4 * 4, 4};
  auto forward(const typename residual::template var<4>& x) {
    const auto h = relu0(stem(x));
    return fc(drop(flat(pool(relu1(bn1(conv1(h)) + h)))));
  }
};

template <class P>
struct module_bundle {
  using trainer_t = locus::train::trainer<nn::model<residual<P>>, locus::optim::adamw<D>, nn::cross_entropy>;
  nn::model<residual<P>> m;
  locus::optim::adamw<D> opt;
  std::unique_ptr<trainer_t> t;
  module_bundle() : opt((m.reset_parameters(7), m.parameters()), {.lr = 1e-2}) {
    t = std::make_unique<trainer_t>(m, opt, nn::cross_entropy{}, locus::train::options{.accumulate = 2});
  }
};

}  // namespace

TEST_CASE("faults: every allocation of a training step of a module with a skip connection fails in turn, the "
          "state is untouched and the run recovers bit for bit") {
  const auto b = make_batches<4>(locus::extents<4>{1, 1, 8, 8});
  const int p32 = fault_every_allocation([] { return module_bundle<locus::amp::fp32>(); }, b,
                                         "residual module fp32", false);
  const int pb = fault_every_allocation([] { return module_bundle<locus::amp::bf16_mixed>(); }, b,
                                        "residual module bf16_mixed", true);
  MESSAGE("residual module: " << p32 << " fault positions under fp32, " << pb << " under bf16_mixed");
  CHECK(p32 > 10);
  CHECK(pb > 10);
}

TEST_CASE("faults: every allocation of an MLP training step fails in turn, the state is untouched and the run "
          "recovers bit for bit (fp32 adamw, fp16_mixed sgd with a grad scaler)") {
  const auto b = make_batches<2>(locus::extents<2>{1, 12});
  using M32 = decltype(make_mlp<locus::amp::fp32>());
  using M16 = decltype(make_mlp<locus::amp::fp16_mixed>());
  const int p32 =
      fault_every_allocation([] { return fp32_bundle<M32>(make_mlp<locus::amp::fp32>()); }, b, "mlp fp32", false);
  const int p16 = fault_every_allocation([] { return fp16_bundle<M16>(make_mlp<locus::amp::fp16_mixed>()); }, b,
                                         "mlp fp16_mixed", true);
  MESSAGE("MLP: " << p32 << " fault positions under fp32, " << p16 << " under fp16_mixed");
  CHECK(p32 > 10);  // the cold step allocates every buffer
  CHECK(p16 > 10);
}

TEST_CASE("faults: every allocation of a CNN training step fails in turn, the state (batch norm's running "
          "statistics included) is untouched and the run recovers bit for bit") {
  const auto b = make_batches<4>(locus::extents<4>{1, 1, 8, 8});
  using M32 = decltype(make_cnn<locus::amp::fp32>());
  using M16 = decltype(make_cnn<locus::amp::fp16_mixed>());
  const int p32 =
      fault_every_allocation([] { return fp32_bundle<M32>(make_cnn<locus::amp::fp32>()); }, b, "cnn fp32", false);
  const int p16 = fault_every_allocation([] { return fp16_bundle<M16>(make_cnn<locus::amp::fp16_mixed>()); }, b,
                                         "cnn fp16_mixed", true);
  // a forward hook that allocates (a reduction of the activation) in every step: the
  // trainer saves batch norm's buffers for every step then (user code may allocate)
  auto hooked = [] {
    auto m = make_cnn<locus::amp::fp32>();
    m.get<2>().add_forward_hook([](const auto&, const auto& y) {
      auto s = locus::mean(y);
      (void)s;
    });
    return fp32_bundle<M32>(std::move(m));
  };
  const int ph = fault_every_allocation(hooked, b, "cnn fp32 with an allocating hook", true);
  MESSAGE("CNN: " << p32 << " fault positions under fp32, " << p16 << " under fp16_mixed, " << ph
                  << " with an allocating hook");
  CHECK(p32 > 10);
  CHECK(p16 > 10);
  CHECK(ph > p32);
}

TEST_CASE("faults: find_max_batch_size trains nothing: batch norm's statistics and dropout counters are put back") {
  disarm_at_exit guard;
  using M = decltype(make_cnn<locus::amp::fp32>());
  fp32_bundle<M> a(make_cnn<locus::amp::fp32>());
  const auto b = make_batches<4>(locus::extents<4>{1, 1, 8, 8});
  a.t->step(b.x[0], b.y[0]);
  a.t->step(b.x[1], b.y[1]);
  const std::string before = state_of(*a.t, "probe-before");
  locus::set_memory_limit<D>(locus::memory_stats<D>().allocated_bytes + (std::size_t{4} << 20));
  const index_t best = locus::train::find_max_batch_size(*a.t, [](index_t n) {
    return std::pair{locus::randn<float, D>({n, 1, 8, 8}, 5), locus::zeros<std::int64_t, D>({n})};
  });
  locus::set_memory_limit<D>(std::numeric_limits<std::size_t>::max());
  CHECK(best > 1);
  CHECK(state_of(*a.t, "probe-after") == before);
}

TEST_CASE("faults: a checkpoint save that fails leaves the previous file intact, a failed load changes nothing") {
  disarm_at_exit guard;
  using M = decltype(make_mlp<locus::amp::fp32>());
  fp32_bundle<M> a(make_mlp<locus::amp::fp32>());
  const auto b = make_batches<2>(locus::extents<2>{1, 12});
  for (std::size_t i = 0; i < 2; ++i) a.t->step(b.x[i], b.y[i]);
  const auto path = scratch("save.safetensors");
  locus::train::save_checkpoint(path, *a.t, 1);
  const std::string first = file_bytes(path);
  for (std::size_t i = 2; i < 4; ++i) a.t->step(b.x[i], b.y[i]);  // new state to save
  int save_faults = 0;
  for (std::int64_t k = 1; k < 1000; ++k) {
    CAPTURE(k);
    locus::fault::fail_allocation(k);
    bool threw = false;
    try {
      locus::train::save_checkpoint(path, *a.t, 2);
    } catch (const locus::out_of_memory&) {
      threw = true;
    }
    const bool fired = locus::fault::fired();
    locus::fault::fail_allocation(0);
    if (!fired) {
      CHECK(!threw);
      CHECK(file_bytes(path) != first);  // the save went through: the new state
      break;
    }
    ++save_faults;
    CHECK(threw);
    CHECK(file_bytes(path) == first);  // the previous checkpoint, whole
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(path.parent_path(), ec))
      CHECK_MESSAGE(e.path().filename().string().find(".tmp") == std::string::npos, "a temporary file was left: " << e.path());
  }
  MESSAGE("checkpoint save: " << save_faults << " fault positions");
  CHECK(save_faults > 0);

  // Loads: every request of io::load and load_checkpoint fails in turn.
  const std::string target = state_of(*a.t, "load-target");
  int load_faults = 0;
  for (std::int64_t k = 1; k < 1000; ++k) {
    CAPTURE(k);
    fp32_bundle<M> c(make_mlp<locus::amp::fp32>());
    c.t->step(b.x[0], b.y[0]);
    const std::string before = state_of(*c.t, "load-before");
    locus::fault::fail_allocation(k);
    bool threw = false;
    try {
      (void)locus::train::resume(path, *c.t);
    } catch (const locus::out_of_memory&) {
      threw = true;
    }
    const bool fired = locus::fault::fired();
    locus::fault::fail_allocation(0);
    if (!fired) {
      CHECK(!threw);
      CHECK(state_of(*c.t, "load-after") == target);
      break;
    }
    ++load_faults;
    CHECK(threw);
    CHECK(state_of(*c.t, "load-after") == before);
  }
  MESSAGE("checkpoint load: " << load_faults << " fault positions");
  CHECK(load_faults > 0);
}

TEST_CASE("faults: a loader batch that fails is rethrown at that batch, restarted, the loader serves the same "
          "batches") {
  disarm_at_exit guard;
  auto x = locus::randn<float, locus::cpu>({96, 5}, 3);
  auto y = locus::zeros<std::int64_t, locus::cpu>({96});
  for (index_t i = 0; i < 96; ++i) y(i) = i % 3;
  locus::data::tensor_dataset set(std::move(x), std::move(y));
  for (const int prefetch : {1, 3}) {
    CAPTURE(prefetch);
    const locus::data::loader_options o{.batch_size = 16, .shuffle = true, .seed = 4, .prefetch = prefetch};
    std::vector<std::vector<float>> ref;
    {
      locus::data::loader<D, locus::data::tensor_dataset> l(set, o);
      for (auto& bt : l) ref.emplace_back(bt.x.span().begin(), bt.x.span().end());
    }
    REQUIRE(ref.size() == 6);
    int faults = 0;
    for (std::int64_t k = 1; k < 200; ++k) {
      CAPTURE(k);
      locus::data::loader<D, locus::data::tensor_dataset> l(set, o);
      locus::fault::fail_allocation(k);
      std::size_t got = 0;
      bool threw = false;
      try {
        for (auto& bt : l) {
          CHECK(std::vector<float>(bt.x.span().begin(), bt.x.span().end()) == ref[got]);
          ++got;
        }
      } catch (const locus::out_of_memory&) {
        threw = true;
      }
      const bool fired = locus::fault::fired();
      locus::fault::fail_allocation(0);
      if (!fired) {
        CHECK(!threw);
        CHECK(got == ref.size());
        break;
      }
      ++faults;
      CHECK(threw);
      CHECK(got < ref.size());
      // restarted: the whole epoch, the same batches
      std::size_t again = 0;
      for (auto& bt : l) {
        REQUIRE(again < ref.size());
        CHECK(std::vector<float>(bt.x.span().begin(), bt.x.span().end()) == ref[again]);
        ++again;
      }
      CHECK(again == ref.size());
    }
    MESSAGE("loader (prefetch " << prefetch << "): " << faults << " fault positions");
    CHECK(faults > 0);
  }
}
#endif
