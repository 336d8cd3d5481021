// Host suite for training: the device-generic bodies on cpu, plus what needs the host:
// bf16_mixed against fp32 on a Fashion-MNIST slice, checkpoints (round trip, resume
// from another state equals no stop, a write failing partway, grad scaler state, bad
// files, another model's shape), bad labels, non-finite gradients,
// out-of-memory in the middle of a step, --batch-size auto, and the lr schedules.
#define LOCUS_TEST_DEVICES locus::cpu
#include "generic/train_cases.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numbers>

#include <csignal>
#include <sys/resource.h>
#include <unistd.h>

#include <locus/data/loader.hpp>

namespace {

namespace fs = std::filesystem;
using locus::index_t;
using P32 = locus::amp::fp32;
namespace nn = locus::nn;

fs::path fashion_dir() {
  if (const char* d = std::getenv("LOCUS_FASHION_MNIST_DIR")) return d;
  return "/usr/share/datasets/fashion-mnist";
}

fs::path temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("locus-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

/// The first n images and labels of a Fashion-MNIST file pair.
locus::data::idx_dataset fashion_slice(const std::string& prefix, index_t n) {
  auto full = locus::data::idx_dataset::from_directory(fashion_dir(), prefix);
  auto images = locus::zeros<std::uint8_t, locus::cpu>({n, full.rows(), full.cols()});
  auto labels = locus::zeros<std::int64_t, locus::cpu>({n});
  const auto src = full.images().span();
  std::copy(src.begin(), src.begin() + n * full.rows() * full.cols(), images.span().begin());
  for (index_t i = 0; i < n; ++i) labels(i) = full.labels()(i);
  return locus::data::idx_dataset(std::move(images), std::move(labels));
}

template <class P>
auto small_mlp(std::uint64_t seed) {
  nn::sequential m(nn::linear<locus::cpu, P>(784, 64), nn::relu<locus::cpu, P>(), nn::linear<locus::cpu, P>(64, 10));
  m.reset_parameters(seed);
  return m;
}

/// A synthetic dataset of n samples with `features` floats: class = argmax of a fixed
/// random projection, so a small MLP can learn it.
locus::data::idx_dataset synthetic(index_t n, std::uint64_t seed) {
  auto images = locus::rand<float, locus::cpu>({n, 4, 4}, seed);
  auto img8 = locus::zeros<std::uint8_t, locus::cpu>({n, 4, 4});
  auto labels = locus::zeros<std::int64_t, locus::cpu>({n});
  for (index_t i = 0; i < n; ++i) {
    double best = -1e9;
    for (index_t c = 0; c < 3; ++c) {
      double s = 0;
      for (index_t j = 0; j < 16; ++j) s += images(i, j / 4, j % 4) * std::sin(1.0 + 3.0 * static_cast<double>(c * 16 + j));
      if (s > best) {
        best = s;
        labels(i) = c;
      }
    }
    for (index_t j = 0; j < 16; ++j) img8(i, j / 4, j % 4) = static_cast<std::uint8_t>(images(i, j / 4, j % 4) * 255.0f);
  }
  return locus::data::idx_dataset(std::move(img8), std::move(labels));
}

template <class P = P32>
auto synthetic_model(std::uint64_t seed) {
  nn::sequential m(nn::linear<locus::cpu, P>(16, 32), nn::relu<locus::cpu, P>(), nn::dropout<locus::cpu, P>(0.1f, 3),
                   nn::linear<locus::cpu, P>(32, 3));
  m.reset_parameters(seed);
  return m;
}

using locus_train_test::host_values;

/// A trainer's optimizer state by name ("exp_avg", "exp_avg_sq", ...), read back to the host.
template <class Trainer>
std::map<std::string, std::vector<double>> optimizer_state(Trainer& t) {
  std::map<std::string, std::vector<double>> out;
  t.optimizer().for_each_state([&](const char* name, const auto& flat) { out[name] = host_values(flat); });
  return out;
}

/// Losses of every micro-batch of epochs [from, to), read back after each step.
template <class Trainer, class Loader>
void losses_of(Trainer& t, Loader& dl, int from, int to, std::vector<double>& out) {
  for (int e = from; e < to; ++e) {
    dl.set_epoch(static_cast<std::uint64_t>(e));
    for (auto& b : dl) {
      t.step(b.x, b.y);
      out.push_back(t.report().loss);
    }
    t.flush();
  }
}

std::vector<char> file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

/// While alive, a write that would make a file larger than `bytes` fails with EFBIG
/// (SIGXFSZ ignored, the soft RLIMIT_FSIZE lowered); both are restored on destruction.
/// Write nothing else (doctest output included) while one is alive.
class file_size_limit {
 public:
  explicit file_size_limit(rlim_t bytes) {
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    if (::getrlimit(RLIMIT_FSIZE, &old_) != 0) return;
    if (old_.rlim_cur != RLIM_INFINITY && old_.rlim_cur <= bytes) return;  // already lower: not ours to test
    rlimit r = old_;
    r.rlim_cur = bytes;
    active_ = ::setrlimit(RLIMIT_FSIZE, &r) == 0;
  }
  ~file_size_limit() {
    if (active_) (void)::setrlimit(RLIMIT_FSIZE, &old_);
    if (old_handler_ != SIG_ERR) std::signal(SIGXFSZ, old_handler_);
  }
  file_size_limit(const file_size_limit&) = delete;
  file_size_limit& operator=(const file_size_limit&) = delete;
  [[nodiscard]] bool active() const noexcept { return active_; }

 private:
  rlimit old_{};
  void (*old_handler_)(int) = SIG_ERR;
  bool active_ = false;
};

}  // namespace

TEST_CASE("training: bf16_mixed reaches within 1 percentage point of fp32 on a Fashion-MNIST slice") {
  INFO("Fashion-MNIST is expected in " << fashion_dir().string()
                                       << " (Debian package dataset-fashion-mnist, installed by scripts/install-deps)");
  REQUIRE(fs::exists(fashion_dir() / "train-labels-idx1-ubyte.gz"));
  auto train = fashion_slice("train", 4000);
  auto test = fashion_slice("t10k", 2000);
  auto run = [&](auto policy_tag) {
    using P = decltype(policy_tag);
    auto model = small_mlp<P>(1);
    locus::optim::adamw<locus::cpu> opt(model.parameters(), {.lr = 2e-3});
    locus::train::trainer t(model, opt, nn::cross_entropy{});
    locus::data::loader<locus::cpu> tl(train, {.batch_size = 64, .shuffle = true, .seed = 3});
    locus::data::loader<locus::cpu> vl(test, {.batch_size = 500});
    for (int e = 0; e < 3; ++e) t.train_epoch(tl, {.epoch = e});
    return t.evaluate(vl);
  };
  const auto f32 = run(locus::amp::fp32{});
  const auto b16 = run(locus::amp::bf16_mixed{});
  MESSAGE("test accuracy: fp32 " << f32.accuracy << ", bf16_mixed " << b16.accuracy);
  CHECK(f32.accuracy > 0.75);  // it did learn
  CHECK(std::abs(f32.accuracy - b16.accuracy) <= 0.01);
}

TEST_CASE("training: the progress callback reports every report_every batches and the last batch once") {
  auto data = synthetic(1024, 5);
  auto model = synthetic_model<P32>(2);
  locus::optim::adamw<locus::cpu> opt(model.parameters(), {.lr = 1e-3});
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  locus::data::loader<locus::cpu> dl(data, {.batch_size = 64, .shuffle = true, .seed = 1});  // 16 batches
  REQUIRE(dl.size() == 16);
  for (const auto& [every, want] : {std::pair<std::int64_t, std::vector<std::int64_t>>{4, {4, 8, 12, 16}},
                                   {5, {5, 10, 15, 16}}, {16, {16}}, {100, {16}}}) {
    CAPTURE(every);
    std::vector<std::int64_t> seen;
    double last_loss = -1;
    const auto r = t.train_epoch(dl, {.epoch = 0, .report_every = every, .on_progress = [&](const locus::train::progress& p) {
                                        seen.push_back(p.batch);
                                        CHECK(p.batches == 16);
                                        last_loss = p.loss;
                                      }});
    CHECK(seen == want);
    CHECK(last_loss == r.loss);  // the last call carries the epoch's figures
  }
}

TEST_CASE("training: the trainer's on_progress option serves every epoch without one, an epoch's own wins") {
  auto data = synthetic(512, 6);
  auto model = synthetic_model<P32>(3);
  locus::optim::adamw<locus::cpu> opt(model.parameters(), {.lr = 1e-3});
  std::vector<std::int64_t> from_trainer, from_epoch;
  locus::train::trainer t(model, opt, nn::cross_entropy{},
                          {.on_progress = [&](const locus::train::progress& p) { from_trainer.push_back(p.batch); }});
  locus::data::loader<locus::cpu> dl(data, {.batch_size = 64});  // 8 batches
  t.train_epoch(dl, {.epoch = 0, .report_every = 4});
  CHECK(from_trainer == std::vector<std::int64_t>{4, 8});
  t.train_epoch(dl, {.epoch = 1, .report_every = 3,
                     .on_progress = [&](const locus::train::progress& p) { from_epoch.push_back(p.batch); }});
  CHECK(from_trainer == std::vector<std::int64_t>{4, 8});  // not called: the epoch brought its own
  CHECK(from_epoch == std::vector<std::int64_t>{3, 6, 8});
  // the library's bar as the trainer's option: one line per update, the last ends it
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  auto model2 = synthetic_model<P32>(3);
  locus::optim::adamw<locus::cpu> opt2(model2.parameters(), {.lr = 1e-3});
  locus::train::trainer t2(model2, opt2, nn::cross_entropy{},
                           {.on_progress = locus::train::progress_bar{.out = f, .always = true}});
  t2.train_epoch(dl, {.epoch = 0, .report_every = 4});
  std::rewind(f);
  std::string text;
  for (int c = std::fgetc(f); c != EOF; c = std::fgetc(f)) text += static_cast<char>(c);
  std::fclose(f);
  CHECK(std::count(text.begin(), text.end(), '\r') == 2);
  CHECK(text.find("epoch 1 [##########..........] 4/8") != std::string::npos);
  CHECK(text.find("] 8/8") != std::string::npos);
  CHECK(text.back() == '\n');
}

TEST_CASE("parameters by name: read and edit a weight by PyTorch's name, infer sees it after sync_compute") {
  using PB = locus::amp::bf16_mixed;
  nn::sequential m(nn::linear<locus::cpu, PB>(3, 2), nn::relu<locus::cpu, PB>(), nn::linear<locus::cpu, PB>(2, 1));
  auto& ps = m.parameters();
  CHECK(ps.index_of("0.weight") == 0);
  CHECK(ps.index_of("2.bias") == 3);
  auto w = ps.master<2>("0.weight");
  REQUIRE(w.shape() == locus::extents<2>{2, 3});
  // y = relu(W0 x + b0) . W2 + b2 with weights written by name
  const double W0[2][3] = {{0.5, -1.0, 2.0}, {1.5, 0.25, -0.75}}, b0[2] = {0.125, -0.5}, W2[2] = {2.0, -3.0};
  for (index_t i = 0; i < 2; ++i)
    for (index_t j = 0; j < 3; ++j) w(i, j) = static_cast<float>(W0[i][j]);
  auto b = ps.master<1>("0.bias");
  b(0) = 0.125f;
  b(1) = -0.5f;
  auto w2 = ps.master<2>("2.weight");
  w2(0, 0) = 2.0f;
  w2(0, 1) = -3.0f;
  ps.master<1>("2.bias")(0) = 0.75f;
  ps.sync_compute();  // the bf16 copy the forward reads
  const double x[2][3] = {{1.0, 2.0, 0.5}, {-1.0, 0.5, 1.0}};
  auto xt = locus::zeros<locus::bf16, locus::cpu>({2, 3});
  for (index_t r = 0; r < 2; ++r)
    for (index_t j = 0; j < 3; ++j) xt(r, j) = locus::bf16(static_cast<float>(x[r][j]));
  const auto y = m.infer(xt);
  for (index_t r = 0; r < 2; ++r) {
    double out = 0.75;
    for (index_t i = 0; i < 2; ++i) {
      double h = b0[i];
      for (index_t j = 0; j < 3; ++j) h += W0[i][j] * x[r][j];
      out += W2[i] * std::max(h, 0.0);
    }
    CHECK(static_cast<double>(static_cast<float>(y(r, 0))) == doctest::Approx(out).epsilon(1e-2));  // bf16 output
  }
  // const access, and the errors
  const auto& cps = std::as_const(m).parameters();
  CHECK(cps.master<1>("0.bias")(1) == -0.5f);
  CHECK_THROWS_WITH_AS((void)ps.index_of("1.weight"),
                       doctest::Contains("no parameter named '1.weight'; its parameters: 0.weight [2, 3], 0.bias [2], "
                                         "2.weight [1, 2], 2.bias [1]"),
                       locus::index_error);
  CHECK_THROWS_WITH_AS((void)ps.master<1>("0.weight"),
                       doctest::Contains("parameter '0.weight' has rank 2 [2, 3], not 1; write master<2>(\"0.weight\")"),
                       locus::shape_error);
  CHECK_THROWS_AS((void)ps.master<2>(""), locus::index_error);
}

TEST_CASE("training: fp16_mixed with a grad scaler learns and its scale moves") {
  auto data = synthetic(1024, 5);
  auto model = synthetic_model<locus::amp::fp16_mixed>(2);
  locus::optim::adamw<locus::cpu> opt(model.parameters(), {.lr = 5e-3});
  locus::amp::grad_scaler<locus::cpu> scaler({.init_scale = 65536.0f, .growth_interval = 10});
  locus::train::trainer t(model, opt, nn::cross_entropy{}, scaler);
  locus::data::loader<locus::cpu> dl(data, {.batch_size = 64, .shuffle = true, .seed = 1});
  const auto first = t.train_epoch(dl, {.epoch = 0});
  locus::train::metrics last;
  for (int e = 1; e < 6; ++e) last = t.train_epoch(dl, {.epoch = e});
  CHECK(last.loss < first.loss * 0.7);
  CHECK(scaler.scale() != 65536.0f);  // grew after clean steps or backed off
  const auto ev = t.evaluate(dl);
  CHECK(ev.accuracy > 0.8);
}

TEST_CASE("checkpoints: resuming after epoch k from another state gives the same losses bit for bit as no stop") {
  // The resumed trainer starts elsewhere: other weights, another lr, micro-batches of
  // other data (an optimizer step taken, a gradient pending, dropout's RNG advanced).
  // Only what the checkpoint restores can make its losses equal the uninterrupted run's.
  const fs::path dir = temp_dir("resume");
  auto data = synthetic(512, 9);
  auto other = synthetic(96, 10);
  const locus::optim::warmup_lr<locus::optim::cosine_lr> schedule{.warmup_steps = 3,
                                                                  .after = {.total_steps = 20, .min_lr = 1e-4}};
  for (const bool scheduled : {true, false}) {
    CAPTURE(scheduled);
    struct counters {
      std::int64_t micro = 0, steps = 0, opt_steps = 0;
      double lr = 0, base_lr = 0;
      std::uint64_t rng = 0;
    };
    auto counters_of = [](auto& t) {
      return counters{t.micro_steps(), t.optimizer_steps(), t.optimizer().steps(), t.optimizer().lr(), t.base_lr(),
                      t.model().template get<2>().counter()};
    };
    const fs::path file = dir / (scheduled ? "scheduled.safetensors" : "constant.safetensors");

    std::vector<double> straight, resumed;
    counters saved;
    std::vector<double> straight_master;
    std::map<std::string, std::vector<double>> straight_state;
    {
      auto model = synthetic_model(4);  // with dropout (layer 2)
      locus::optim::adamw<locus::cpu> opt(model.parameters(), {.lr = 3e-3});
      locus::train::trainer t(model, opt, nn::cross_entropy{}, {.accumulate = 2});
      if (scheduled) t.set_schedule(schedule);
      locus::data::loader<locus::cpu> dl(data, {.batch_size = 48, .shuffle = true, .seed = 8});
      std::vector<double> first;
      losses_of(t, dl, 0, 1, first);
      locus::train::save_checkpoint(file, t, 1);
      saved = counters_of(t);
      losses_of(t, dl, 1, 3, straight);
      straight_master = host_values(std::as_const(model.parameters()).master());
      straight_state = optimizer_state(t);
    }
    {
      auto model = synthetic_model(99);  // other weights: the checkpoint must replace them
      locus::optim::adamw<locus::cpu> opt(model.parameters(), {.lr = 1e-2});  // another base lr
      locus::train::trainer t(model, opt, nn::cross_entropy{}, {.accumulate = 2});
      locus::data::loader<locus::cpu> ol(other, {.batch_size = 32, .shuffle = true, .seed = 1});
      for (auto& b : ol) t.step(b.x, b.y);  // 3 micro-batches: 1 optimizer step, 1 pending
      if (scheduled) t.set_schedule(schedule);
      const counters before = counters_of(t);
      CHECK(before.micro != saved.micro);
      CHECK(before.steps != saved.steps);
      CHECK(before.opt_steps != saved.opt_steps);
      CHECK(before.lr != saved.lr);
      CHECK(before.base_lr != saved.base_lr);
      CHECK(before.rng != saved.rng);
      CHECK(host_values(std::as_const(model.parameters()).grad()) !=
            std::vector<double>(static_cast<std::size_t>(model.parameters().size()), 0.0));  // pending

      CHECK(locus::train::resume(file, t) == 1);
      const counters after = counters_of(t);
      CHECK(after.micro == saved.micro);
      CHECK(after.steps == saved.steps);
      CHECK(after.opt_steps == saved.opt_steps);
      CHECK(after.lr == saved.lr);
      CHECK(after.base_lr == saved.base_lr);
      CHECK(after.rng == saved.rng);
      CHECK(t.epochs_done() == 1);
      CHECK(host_values(std::as_const(model.parameters()).grad()) ==
            std::vector<double>(static_cast<std::size_t>(model.parameters().size()), 0.0));  // dropped

      locus::data::loader<locus::cpu> dl(data, {.batch_size = 48, .shuffle = true, .seed = 8});
      losses_of(t, dl, 1, 3, resumed);
      CHECK(host_values(std::as_const(model.parameters()).master()) == straight_master);
      CHECK(optimizer_state(t) == straight_state);
    }
    REQUIRE(straight.size() == 22);  // 2 epochs of 11 micro-batches
    REQUIRE(resumed.size() == 22);
    // Bit for bit, the first loss after resume included: the running loss of the
    // batches stepped before the load must not leak into it.
    CHECK(resumed == straight);
  }
  fs::remove_all(dir);
}

TEST_CASE("checkpoints: the file holds the state from before the save and a fresh trainer gets exactly that") {
  const fs::path dir = temp_dir("roundtrip");
  auto data = synthetic(256, 9);
  auto model = synthetic_model(4);
  locus::optim::adamw<locus::cpu> opt(model.parameters(), {.lr = 3e-3});
  locus::train::trainer t(model, opt, nn::cross_entropy{},
                          {.accumulate = 2, .schedule = locus::optim::step_lr{.step_size = 2, .gamma = 0.5}});
  locus::data::loader<locus::cpu> dl(data, {.batch_size = 40, .shuffle = true, .seed = 8});
  t.train_epoch(dl, {.epoch = 0});
  t.train_epoch(dl, {.epoch = 1});

  // Everything the file should hold, captured before it is written.
  const auto& entries = model.parameters().entries();
  std::map<std::string, std::vector<double>> master;
  for (std::size_t i = 0; i < entries.size(); ++i)
    master[entries[i].name] = host_values(std::as_const(model.parameters()).master_flat(i));
  const auto state = optimizer_state(t);
  const auto opt_steps = opt.steps();
  const auto micro = t.micro_steps(), steps = t.optimizer_steps();
  const double lr = opt.lr(), base_lr = t.base_lr();
  const auto rng = model.get<2>().counter();
  REQUIRE(opt_steps == 8);  // 2 epochs of 7 micro-batches: 4 optimizer steps each
  REQUIRE(lr != base_lr);   // the schedule moved it
  REQUIRE(state.size() == 2);

  const fs::path file = dir / "after-2.safetensors";
  locus::train::save_checkpoint(file, t, 2);

  // what io::load reads back is that state
  const auto a = locus::io::load<locus::cpu>(file);
  std::size_t tensors = 0;
  for (const auto& e : entries) {
    CAPTURE(e.name);
    REQUIRE(a.contains(e.name));
    CHECK(a.info(e.name).dtype == "F32");
    CHECK(a.info(e.name).shape == e.shape);
    CHECK(host_values(a.flat<float>(e.name)) == master.at(e.name));
    ++tensors;
    for (const auto& [name, flat] : state) {
      const std::string key = "optimizer." + name + "." + e.name;
      CAPTURE(key);
      REQUIRE(a.contains(key));
      CHECK(a.info(key).shape == e.shape);
      const std::vector<double> expect(flat.begin() + e.offset, flat.begin() + e.offset + e.numel);
      CHECK(host_values(a.flat<float>(key)) == expect);
      ++tensors;
    }
  }
  REQUIRE(a.contains("optimizer.step"));
  CHECK(a.get<std::int64_t, 1>("optimizer.step")(0) == opt_steps);
  ++tensors;
  CHECK_FALSE(a.contains("scaler.state"));
  CHECK(a.entries().size() == tensors);  // nothing else
  CHECK(a.metadata("format") == "locus-checkpoint-2");
  CHECK(a.metadata("policy") == "fp32");
  CHECK(a.metadata("optimizer") == "adamw");
  CHECK(a.metadata("epoch") == "2");
  CHECK(a.metadata("seed") == "4");
  CHECK(std::stoll(a.metadata("micro_steps")) == micro);
  CHECK(std::stoll(a.metadata("optimizer_steps")) == steps);
  CHECK(std::stod(a.metadata("lr")) == lr);  // exactly
  CHECK(std::stod(a.metadata("base_lr")) == base_lr);
  CHECK(std::stoull(a.metadata("rng.2")) == rng);

  // and a fresh trainer that loads it has that state
  auto fresh = synthetic_model(99);
  locus::optim::adamw<locus::cpu> fresh_opt(fresh.parameters(), {.lr = 1e-2});
  locus::train::trainer ft(fresh, fresh_opt, nn::cross_entropy{});
  CHECK(host_values(std::as_const(fresh.parameters()).master_flat(0)) != master.at("0.weight"));
  CHECK(locus::train::resume(file, ft) == 2);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    CAPTURE(entries[i].name);
    CHECK(host_values(std::as_const(fresh.parameters()).master_flat(i)) == master.at(entries[i].name));
  }
  CHECK(optimizer_state(ft) == state);
  CHECK(fresh_opt.steps() == opt_steps);
  CHECK(fresh_opt.lr() == lr);
  CHECK(ft.base_lr() == base_lr);
  CHECK(ft.micro_steps() == micro);
  CHECK(ft.optimizer_steps() == steps);
  CHECK(ft.epochs_done() == 2);
  CHECK(fresh.get<2>().counter() == rng);
  fs::remove_all(dir);
}

TEST_CASE("checkpoints: a write that fails partway leaves the previous file byte for byte and no temporary file") {
  const fs::path dir = temp_dir("atomic");
  // big enough (~800 KB) that the file size limit below sits in the middle of its data
  nn::sequential model(nn::linear<locus::cpu, P32>(256, 256), nn::relu<locus::cpu, P32>(),
                       nn::linear<locus::cpu, P32>(256, 3));
  model.reset_parameters(1);
  locus::optim::adamw<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  auto x = locus::rand<float, locus::cpu>({8, 256}, 1);
  auto y = locus::zeros<std::int64_t, locus::cpu>({8});
  t.step(x, y);
  const fs::path file = dir / "ckpt.safetensors";
  locus::train::save_checkpoint(file, t, 1);
  const auto before = file_bytes(file);
  REQUIRE(before.size() > 600000);
  t.step(x, y);  // the next checkpoint holds other bytes

  bool limited = false, threw_io_error = false, threw_other = false;
  std::string what;
  {
    // Nothing but the save runs while the limit is in force.
    const file_size_limit limit(static_cast<rlim_t>(before.size() / 2));
    limited = limit.active();
    try {
      locus::train::save_checkpoint(file, t, 2);
    } catch (const locus::io_error& e) {
      threw_io_error = true;
      what = e.what();
    } catch (const std::exception& e) {
      threw_other = true;
      what = e.what();
    }
  }
  REQUIRE(limited);
  INFO("save_checkpoint under the limit: " << what);
  CHECK(threw_io_error);
  CHECK_FALSE(threw_other);
  CHECK(what.find("writing") != std::string::npos);  // it failed partway, while writing
  CHECK(file_bytes(file) == before);
  CHECK(files_in(dir) == std::vector<std::string>{"ckpt.safetensors"});  // no temporary file left
  CHECK(locus::train::resume(file, t) == 1);

  // without the limit the same save goes through and replaces the file
  locus::train::save_checkpoint(file, t, 2);
  CHECK(file_bytes(file) != before);
  CHECK(files_in(dir) == std::vector<std::string>{"ckpt.safetensors"});
  fs::remove_all(dir);
}

TEST_CASE("checkpoints: a grad scaler's state survives resume and a skipped step leaves AdamW's moments and the weights as they were") {
  using F16 = locus::amp::fp16_mixed;
  const fs::path dir = temp_dir("scaler");
  auto batch = [](std::uint64_t k) {
    auto x = locus::rand<float, locus::cpu>({32, 16}, 500 + k);
    auto y = locus::zeros<std::int64_t, locus::cpu>({32});
    for (index_t i = 0; i < 32; ++i) y(i) = (i * 7 + static_cast<index_t>(k)) % 3;
    return std::pair{std::move(x), std::move(y)};
  };
  auto step = [&](auto& t, std::uint64_t k) {
    auto [x, y] = batch(k);
    t.step(x, y);
    return t.report().loss;
  };
  const fs::path file = dir / "scaler.safetensors";

  auto model = synthetic_model<F16>(2);
  locus::optim::adamw<locus::cpu> opt(model.parameters(), {.lr = 5e-3});
  locus::amp::grad_scaler<locus::cpu> scaler({.init_scale = 1024.0f, .growth_interval = 4});
  locus::train::trainer t(model, opt, nn::cross_entropy{}, scaler);
  for (std::uint64_t k = 0; k < 5; ++k) step(t, k);
  CHECK(scaler.scale() == 2048.0f);  // grew after 4 clean steps
  CHECK(scaler.growth_tracker() == 1);
  CHECK(scaler.skipped_steps() == 0);

  // a batch with an inf: its step is skipped and the scale backs off
  {
    const auto master = host_values(std::as_const(model.parameters()).master());
    const auto weight16 = host_values(model.get<0>().weight());
    const auto state = optimizer_state(t);
    const auto steps = opt.steps();
    auto [x, y] = batch(5);
    x(3, 4) = std::numeric_limits<float>::infinity();
    t.step(x, y);
    CHECK(scaler.scale() == 1024.0f);
    CHECK(scaler.growth_tracker() == 0);
    CHECK(scaler.skipped_steps() == 1);
    CHECK(opt.steps() == steps);
    CHECK(optimizer_state(t) == state);  // exp_avg, exp_avg_sq
    CHECK(host_values(std::as_const(model.parameters()).master()) == master);
    CHECK(host_values(model.get<0>().weight()) == weight16);  // the f16 copy too
    // and a clean step does move them (the comparisons above can fail)
    step(t, 6);
    CHECK(optimizer_state(t) != state);
    CHECK(host_values(std::as_const(model.parameters()).master()) != master);
  }
  step(t, 7);
  const float scale = scaler.scale();
  const int tracker = scaler.growth_tracker();
  const auto skipped = scaler.skipped_steps();
  CHECK(scale == 1024.0f);
  CHECK(tracker == 2);
  CHECK(skipped == 1);
  locus::train::save_checkpoint(file, t, 1);
  {
    const auto a = locus::io::load<locus::cpu>(file);
    REQUIRE(a.contains("scaler.state"));
    CHECK(host_values(a.get<float, 1>("scaler.state")) == std::vector<double>{1024.0, 2.0, 1.0});
    CHECK(a.metadata("policy") == "fp16");
  }
  std::vector<double> straight;
  for (std::uint64_t k = 8; k < 16; ++k) straight.push_back(step(t, k));  // the scale grows on the way

  auto model2 = synthetic_model<F16>(77);
  locus::optim::adamw<locus::cpu> opt2(model2.parameters(), {.lr = 5e-3});
  locus::amp::grad_scaler<locus::cpu> scaler2({.init_scale = 256.0f, .growth_interval = 4});
  locus::train::trainer t2(model2, opt2, nn::cross_entropy{}, scaler2);
  step(t2, 100);  // another state: scale 256, tracker 1, nothing skipped
  CHECK(scaler2.scale() != scale);
  CHECK(scaler2.growth_tracker() != tracker);
  CHECK(scaler2.skipped_steps() != skipped);
  CHECK(locus::train::resume(file, t2) == 1);
  CHECK(scaler2.scale() == scale);
  CHECK(scaler2.growth_tracker() == tracker);
  CHECK(scaler2.skipped_steps() == skipped);
  std::vector<double> resumed;
  for (std::uint64_t k = 8; k < 16; ++k) resumed.push_back(step(t2, k));
  CHECK(resumed == straight);  // bit for bit
  CHECK(host_values(std::as_const(model2.parameters()).master()) ==
        host_values(std::as_const(model.parameters()).master()));
  CHECK(scaler2.scale() == scaler.scale());
  CHECK(scaler2.scale() == 4096.0f);  // grew twice more, after steps 9 and 13
  CHECK(scaler2.growth_tracker() == scaler.growth_tracker());
  CHECK(scaler2.skipped_steps() == scaler.skipped_steps());
  fs::remove_all(dir);
}

TEST_CASE("checkpoints: the file format is safetensors as read back independently") {
  const fs::path dir = temp_dir("format");
  locus::io::writer w;
  auto a = locus::arange<float, locus::cpu>(6);
  w.add("a", a.reshape({2, 3}));
  auto b = locus::full<locus::bf16, locus::cpu>({4}, 1.5);
  w.add("b", b);
  w.metadata("note", "hello");
  w.save(dir / "x.safetensors");

  // An independent reading: header length, JSON (parsed here with nlohmann directly) and bytes.
  std::ifstream f(dir / "x.safetensors", std::ios::binary);
  const std::vector<unsigned char> raw((std::istreambuf_iterator<char>(f)), {});
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(raw[static_cast<std::size_t>(i)]) << (8 * i);
  REQUIRE(8 + n <= raw.size());
  CHECK((8 + n) % 8 == 0);
  const auto header = nlohmann::json::parse(std::string(raw.begin() + 8, raw.begin() + 8 + static_cast<std::ptrdiff_t>(n)));
  CHECK(header["__metadata__"]["note"] == "hello");
  CHECK(header["a"]["dtype"] == "F32");
  CHECK(header["a"]["shape"] == nlohmann::json::array({2, 3}));
  CHECK(header["b"]["dtype"] == "BF16");
  const auto begin = header["a"]["data_offsets"][0].get<std::size_t>();
  float v[6];
  std::memcpy(v, raw.data() + 8 + n + begin, sizeof v);
  for (int i = 0; i < 6; ++i) CHECK(v[i] == static_cast<float>(i));
  const auto bb = header["b"]["data_offsets"][0].get<std::size_t>();
  CHECK(raw[8 + n + bb] == 0xC0);      // bf16 1.5 = 0x3FC0, little-endian
  CHECK(raw[8 + n + bb + 1] == 0x3F);
  fs::remove_all(dir);
}

TEST_CASE("checkpoints: missing or truncated or corrupt files throw io_error and another model's shape lists every mismatch") {
  const fs::path dir = temp_dir("bad");
  auto model = synthetic_model(1);
  locus::optim::adamw<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  locus::train::save_checkpoint(dir / "good.safetensors", t, 0);

  CHECK_THROWS_AS(locus::train::resume(dir / "missing.safetensors", t), locus::io_error);
  {
    std::ifstream f(dir / "good.safetensors", std::ios::binary);
    std::vector<char> raw((std::istreambuf_iterator<char>(f)), {});
    std::ofstream(dir / "short.safetensors", std::ios::binary).write(raw.data(), static_cast<std::streamsize>(raw.size() / 2));
    std::ofstream(dir / "tiny.safetensors", std::ios::binary).write(raw.data(), 5);
    auto corrupt = raw;
    corrupt[10] = '#';
    std::ofstream(dir / "corrupt.safetensors", std::ios::binary).write(corrupt.data(), static_cast<std::streamsize>(corrupt.size()));
  }
  for (const char* name : {"short.safetensors", "tiny.safetensors", "corrupt.safetensors"}) {
    CAPTURE(name);
    CHECK_THROWS_AS(locus::train::resume(dir / name, t), locus::io_error);
  }
  // (a write that fails partway: "checkpoints: a write that fails partway leaves ...")
  CHECK_NOTHROW(locus::train::resume(dir / "good.safetensors", t));

  nn::sequential other(nn::linear<locus::cpu, P32>(16, 40), nn::relu<locus::cpu, P32>(),
                       nn::linear<locus::cpu, P32>(40, 3));
  locus::optim::adamw<locus::cpu> opt2(other.parameters());
  locus::train::trainer t2(other, opt2, nn::cross_entropy{});
  try {
    locus::train::resume(dir / "good.safetensors", t2);
    FAIL("loading another model's checkpoint did not throw");
  } catch (const locus::shape_error& e) {
    const std::string m = e.what();
    CHECK(m.find("0.weight: model [40, 16], checkpoint [32, 16]") != std::string::npos);
    CHECK(m.find("0.bias: model [40], checkpoint [32]") != std::string::npos);
    CHECK(m.find("2.weight: model [3, 40], checkpoint has no such tensor") != std::string::npos);
    CHECK(m.find("3.weight: checkpoint [3, 32], model has no such parameter") != std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("training: a label outside the classes throws naming the sample and the value") {
  auto model = synthetic_model(1);
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  auto x = locus::rand<float, locus::cpu>({8, 16}, 1);
  auto y = locus::zeros<std::int64_t, locus::cpu>({8});
  y(5) = 7;
  try {
    t.step(x, y);
    FAIL("no error for label 7 of 3 classes");
  } catch (const locus::index_error& e) {
    const std::string m = e.what();
    CHECK(m.find("label 7 of sample 5") != std::string::npos);
    CHECK(m.find("[0, 3)") != std::string::npos);
  }
}

TEST_CASE("training: a non-finite gradient in fp32 stops with the step and the layer and the weights as before it") {
  nn::sequential model(nn::linear<locus::cpu, P32>(16, 8), nn::relu<locus::cpu, P32>(),
                       nn::linear<locus::cpu, P32>(8, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters(), {.lr = 0.1});
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  auto x = locus::rand<float, locus::cpu>({8, 16}, 1);
  auto y = locus::zeros<std::int64_t, locus::cpu>({8});
  for (int s = 0; s < 3; ++s) t.step(x, y);
  const auto before = locus_train_test::host_values(std::as_const(model.parameters()).master());
  x(0, 0) = std::numeric_limits<float>::quiet_NaN();
  try {
    t.step(x, y);
    FAIL("no error for a NaN input");
  } catch (const locus::train::non_finite_error& e) {
    CHECK(e.step() == 3);
    CHECK(e.parameter() == "2.bias");  // the last layer's gradients are computed first
    const std::string m = e.what();
    CHECK(m.find("step 3") != std::string::npos);
    CHECK(m.find("0.weight") != std::string::npos);
  }
  CHECK(locus_train_test::host_values(std::as_const(model.parameters()).master()) == before);
}

TEST_CASE("training: out of memory in the middle of a step leaves the weights as they were") {
  auto model = synthetic_model(1);
  locus::optim::adamw<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  auto x = locus::rand<float, locus::cpu>({512, 16}, 1);
  auto y = locus::zeros<std::int64_t, locus::cpu>({512});
  t.step(x.slice(0, 8), y.slice(0, 8));
  // The last layer's forward hook: the whole forward of the failing step ran.
  int forwards = 0;
  index_t rows = 0;
  model.get<3>().add_forward_hook([&](const auto&, const auto& out) {
    ++forwards;
    rows = out.shape()[0];
  });
  const auto before = locus_train_test::host_values(std::as_const(model.parameters()).master());
  const auto used = locus::memory_stats<locus::cpu>().allocated_bytes;
  locus::set_memory_limit<locus::cpu>(used + 170000);  // the forward fits, not all of backward
  CHECK_THROWS_AS(t.step(x, y), locus::out_of_memory);
  locus::set_memory_limit<locus::cpu>(std::numeric_limits<std::size_t>::max());
  CHECK(forwards == 1);  // the failure came after the forward: in the middle of the step
  CHECK(rows == 512);
  CHECK(locus_train_test::host_values(std::as_const(model.parameters()).master()) == before);
  CHECK(locus_train_test::host_values(std::as_const(model.parameters()).grad()) ==
        std::vector<double>(static_cast<std::size_t>(model.parameters().size()), 0.0));
  CHECK_NOTHROW(t.step(x, y));  // and training goes on
  CHECK(forwards == 2);
}

TEST_CASE("training: find_max_batch_size returns the largest batch that fits a memory limit") {
  auto model = synthetic_model(1);
  locus::optim::adamw<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  auto make = [](index_t b) {
    return std::pair{locus::zeros<float, locus::cpu>({b, 16}), locus::zeros<std::int64_t, locus::cpu>({b})};
  };
  t.probe(make(4).first, make(4).second);  // buffers of a small batch exist, as in training
  const auto used = locus::memory_stats<locus::cpu>().allocated_bytes;
  locus::set_memory_limit<locus::cpu>(used + 300000);
  const index_t b = locus::train::find_max_batch_size(t, make, 16, 100000);
  auto fits = [&](index_t n) {
    try {
      auto [x, y] = make(n);
      t.probe(x, y);
      return true;
    } catch (const locus::out_of_memory&) {
      return false;
    }
  };
  const bool b_fits = fits(b), next_fits = fits(b + 1);
  locus::set_memory_limit<locus::cpu>(std::numeric_limits<std::size_t>::max());
  MESSAGE("largest batch under a " << used + 300000 << "-byte limit: " << b);
  CHECK(b > 16);
  CHECK(b < 100000);
  CHECK(b_fits);
  CHECK_FALSE(next_fits);
}

TEST_CASE("training: learning-rate schedules follow their closed forms") {
  const locus::optim::step_lr s{.step_size = 10, .gamma = 0.5};
  CHECK(s(0, 0.1) == doctest::Approx(0.1));
  CHECK(s(25, 0.1) == doctest::Approx(0.025));
  const locus::optim::cosine_lr c{.total_steps = 100, .min_lr = 0.001};
  CHECK(c(0, 0.1) == doctest::Approx(0.1));
  CHECK(c(50, 0.1) == doctest::Approx((0.1 + 0.001) / 2));
  CHECK(c(25, 0.1) == doctest::Approx(0.001 + 0.099 * 0.5 * (1 + std::cos(std::numbers::pi / 4))));
  CHECK(c(100, 0.1) == doctest::Approx(0.001));
  const locus::optim::warmup_lr<locus::optim::cosine_lr> w{.warmup_steps = 4, .after = c};
  CHECK(w(0, 0.1) == doctest::Approx(0.025));
  CHECK(w(3, 0.1) == doctest::Approx(0.1));
  CHECK(w(4 + 50, 0.1) == doctest::Approx(c(50, 0.1)));

  // the trainer applies a schedule before each optimizer step
  auto model = synthetic_model(1);
  locus::optim::sgd<locus::cpu> opt(model.parameters(), {.lr = 0.2});
  locus::train::trainer t(model, opt, nn::cross_entropy{}, {.schedule = s});
  auto x = locus::rand<float, locus::cpu>({8, 16}, 1);
  auto y = locus::zeros<std::int64_t, locus::cpu>({8});
  for (int k = 0; k < 21; ++k) t.step(x, y);
  CHECK(opt.lr() == doctest::Approx(0.2 * 0.25));  // step 20 -> gamma^2
}

TEST_CASE("nn::save and nn::load: a model's weights alone, round trip, bf16 compute copy, checkpoints, mismatches") {
  const fs::path dir = temp_dir("model-save");
  auto x = locus::randn<float, locus::cpu>({9, 16}, 77);
  const auto out = [](auto& model, const auto& in) {
    const auto y = model.infer(in.view());
    return host_values(y.view());
  };
  SUBCASE("fp32: a fresh model gives the same outputs, bit for bit") {
    auto a = synthetic_model(5);
    auto b = synthetic_model(6);
    const auto ya = out(a, std::as_const(x));
    CHECK(out(b, std::as_const(x)) != ya);
    nn::save(dir / "m.safetensors", a);
    nn::load(dir / "m.safetensors", b);
    CHECK(out(b, std::as_const(x)) == ya);
    // the file holds only the weights, under PyTorch's names
    const auto arch = locus::io::load<locus::cpu>(dir / "m.safetensors");
    CHECK(arch.entries().size() == 4);
    CHECK(arch.contains("0.weight"));
    CHECK(arch.contains("3.bias"));
    CHECK(arch.metadata().at("format") == "locus-model-2");
  }
  SUBCASE("bf16_mixed: infer() uses the loaded weights at once (the compute copy is refreshed)") {
    using PB = locus::amp::bf16_mixed;
    auto xb = locus::cast<locus::bf16>(x);
    locus::tensor<locus::bf16, locus::cpu, 2> xbt = xb;
    auto a = synthetic_model<PB>(5);
    auto b = synthetic_model<PB>(6);
    const auto ya = out(a, std::as_const(xbt));
    nn::save(dir / "b.safetensors", a);
    nn::load(dir / "b.safetensors", b);
    CHECK(out(b, std::as_const(xbt)) == ya);
  }
  SUBCASE("a training checkpoint's weights load too; its optimizer state is ignored") {
    auto a = synthetic_model(5);
    locus::optim::adamw<locus::cpu> opt(a.parameters(), {.lr = 1e-2});
    locus::train::trainer t(a, opt, nn::cross_entropy{});
    auto data = synthetic(256, 5);
    locus::data::loader<locus::cpu> dl(data, {.batch_size = 64});
    t.train_epoch(dl, {.epoch = 0});
    locus::train::save_checkpoint(dir / "ckpt.safetensors", t, 1);
    auto b = synthetic_model(6);
    nn::load(dir / "ckpt.safetensors", b);
    CHECK(out(b, std::as_const(x)) == out(a, std::as_const(x)));
  }
  SUBCASE("another model's file is shape_error listing every mismatch, and the model is unchanged") {
    nn::sequential other(nn::linear<locus::cpu, P32>(16, 8), nn::relu<locus::cpu, P32>(), nn::linear<locus::cpu, P32>(8, 3));
    nn::save(dir / "other.safetensors", other);
    auto b = synthetic_model(6);
    const auto before = host_values(std::as_const(b.parameters()).master());
    try {
      nn::load(dir / "other.safetensors", b);
      FAIL("no error");
    } catch (const locus::shape_error& e) {
      const std::string m = e.what();
      CHECK(m.find("0.weight: model [32, 16], file [8, 16]") != std::string::npos);
      CHECK(m.find("3.weight: model [3, 32], file has no such tensor") != std::string::npos);
      CHECK(m.find("2.weight: file [3, 8], model has no such parameter") != std::string::npos);
    }
    CHECK(host_values(std::as_const(b.parameters()).master()) == before);
  }
  SUBCASE("f32 weights into an fp64 model are io_error naming both dtypes; a missing file is io_error") {
    auto a = synthetic_model(5);
    nn::save(dir / "f32.safetensors", a);
    auto d = synthetic_model<locus::amp::fp64>(5);
    CHECK_THROWS_WITH_AS(nn::load(dir / "f32.safetensors", d), doctest::Contains("is F32, but this model's weights are F64"),
                         locus::io_error);
    CHECK_THROWS_AS(nn::load(dir / "missing.safetensors", d), locus::io_error);
  }
  fs::remove_all(dir);
}

TEST_CASE("checkpoints: the run's options are stored beside the state and read back, bad keys are refused") {
  const fs::path dir = temp_dir("run-options");
  auto m = synthetic_model(5);
  locus::optim::adamw<locus::cpu> opt(m.parameters(), {.lr = 1e-2});
  locus::train::trainer t(m, opt, nn::cross_entropy{});
  locus::train::save_checkpoint(dir / "a.safetensors", t, 1, {{"epochs", "15"}, {"batch-size", "128"}});
  const auto opts = locus::train::run_options(locus::io::load<locus::cpu>(dir / "a.safetensors"));
  CHECK(opts == std::map<std::string, std::string>{{"batch-size", "128"}, {"epochs", "15"}});
  locus::train::save_checkpoint(dir / "b.safetensors", t, 1);
  CHECK(locus::train::run_options(locus::io::load<locus::cpu>(dir / "b.safetensors")).empty());
  CHECK(locus::train::resume(dir / "a.safetensors", t) == 1);  // the extra metadata does not disturb a resume
  for (const char* bad : {"", "two words", "tab\there"})
    CHECK_THROWS_AS(locus::train::save_checkpoint(dir / "c.safetensors", t, 1, {{bad, "1"}}), locus::value_error);
  CHECK_FALSE(fs::exists(dir / "c.safetensors"));
  fs::remove_all(dir);
}

// Reference values printed by PyTorch 2.15 (torch.optim.lr_scheduler.OneCycleLR and
// ReduceLROnPlateau on an SGD optimizer; the script is in the comment of each table).
TEST_CASE("training: one_cycle_lr and reduce_on_plateau follow PyTorch's schedules") {
  // OneCycleLR(opt, max_lr=0.1, total_steps=20, pct_start=0.3): the lr of steps 0..19
  const double one[] = {0.0040000000000000036, 0.013167184270002533, 0.037167184270002526, 0.06683281572999747,
                        0.09083281572999748,   0.1,                  0.09874640062350874,  0.09504846320134738,
                        0.089091617757105,     0.0811745653949763,   0.07169430017913009,  0.06112620219362893,
                        0.0500002,             0.03887419780637107,  0.028306099820869922, 0.0188258346050237,
                        0.010908782242895003,  0.004951936798652629, 0.0012539993764912555, 4e-07};
  const locus::optim::one_cycle_lr oc{.total_steps = 20, .pct_start = 0.3};
  for (int i = 0; i < 20; ++i) {
    CAPTURE(i);
    CHECK(oc(i, 0.1) == doctest::Approx(one[i]).epsilon(1e-12));
  }
  CHECK(oc(25, 0.1) == doctest::Approx(4e-07));  // past the end: the final lr
  // OneCycleLR(opt, max_lr=0.1, total_steps=10, pct_start=0.25, div_factor=10, final_div_factor=100)
  const double two[] = {0.009999999999999995, 0.07749999999999999, 0.0989084726566536,  0.09046039886902862,
                        0.07502500000000001,  0.0552711967402193,  0.03461460113097138, 0.01662692621237505,
                        0.004418404390752082, 0.0001};
  const locus::optim::one_cycle_lr oc2{.total_steps = 10, .pct_start = 0.25, .div_factor = 10, .final_div_factor = 100};
  for (int i = 0; i < 10; ++i) {
    CAPTURE(i);
    CHECK(oc2(i, 0.1) == doctest::Approx(two[i]).epsilon(1e-12));
  }
  // ReduceLROnPlateau(opt(lr=1), mode="min", factor=0.5, patience=2, threshold=1e-2, cooldown=1,
  // min_lr=0.1), stepped with these metrics: the lr after each
  const double metrics[] = {1.0, 0.9, 0.95, 0.899, 0.91, 0.92, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6};
  const double after[] = {1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25, 0.125, 0.125, 0.125, 0.125, 0.1};
  locus::optim::reduce_on_plateau plateau({.factor = 0.5, .patience = 2, .threshold = 1e-2, .cooldown = 1, .min_lr = 0.1});
  for (int i = 0; i < 18; ++i) {
    CAPTURE(i);
    plateau.observe(metrics[i]);
    CHECK(plateau(0, 1.0) == doctest::Approx(after[i]).epsilon(1e-15));
  }
  CHECK_THROWS_AS(locus::optim::reduce_on_plateau({.factor = 1.5}), locus::value_error);
  CHECK_THROWS_AS(locus::optim::reduce_on_plateau({.patience = -1}), locus::value_error);
}

TEST_CASE("training: reduce_on_plateau attached by reference drives the trainer's lr") {
  auto data = synthetic(256, 5);
  auto model = synthetic_model(2);
  locus::optim::adamw<locus::cpu> opt(model.parameters(), {.lr = 1e-2});
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  locus::optim::reduce_on_plateau plateau({.factor = 0.5, .patience = 0});
  t.set_schedule(std::ref(plateau));
  locus::data::loader<locus::cpu> dl(data, {.batch_size = 64});
  t.train_epoch(dl, {.epoch = 0});
  CHECK(opt.lr() == doctest::Approx(1e-2));
  plateau.observe(1.0);  // the first epoch's metric: an improvement on infinity
  plateau.observe(2.0);  // worse: patience 0, so the lr halves
  t.train_epoch(dl, {.epoch = 1});
  CHECK(opt.lr() == doctest::Approx(5e-3));
}

TEST_CASE("sequential::summary lists each layer, its output shape and parameters, and the total") {
  nn::sequential m(nn::linear<locus::cpu, P32>(784, 512), nn::relu<locus::cpu, P32>(), nn::dropout<locus::cpu, P32>(0.25f),
                   nn::linear<locus::cpu, P32>(512, 10, nn::bias::without));
  const std::string s = m.summary(128, 784);
  CHECK(s.find("linear(784, 512)") != std::string::npos);
  CHECK(s.find("[128, 512]") != std::string::npos);
  CHECK(s.find("401920") != std::string::npos);  // 784 * 512 + 512
  CHECK(s.find("dropout(0.25)") != std::string::npos);
  CHECK(s.find("linear(512, 10, bias::without)") != std::string::npos);
  CHECK(s.find("[128, 10]") != std::string::npos);
  CHECK(s.find("total: 407040 parameters") != std::string::npos);  // 401920 + 5120
  CHECK(static_cast<std::int64_t>(m.parameters().size()) >= 407040);
  CHECK_THROWS_WITH_AS((void)m.summary(1, 100), "locus: sequential layer 0: linear(784, 512) takes 784 features, but its input has 100",
                       locus::shape_error);
}

TEST_CASE("train::progress_bar draws one line per update, ends it at the epoch's end, and writes nothing to a non-terminal") {
  using locus::train::progress;
  using locus::train::progress_bar;
  const progress mid{2, 78, 234, 0.41234, 41200.4, 1.2};
  CHECK(progress_bar::line(mid, 20) == "epoch 3 [######..............] 78/234  loss 0.4123  41,200/s  1.2 s (2.4 s left)");
  CHECK(progress_bar::line(mid, 20).size() <= 80);  // the default fits a terminal
  CHECK(progress_bar::line(mid, 20, 2.0) ==
        "epoch 3 [######..............] 78/234  loss 0.4123  82,401/s  1.2 s (2.4 s left)");
  const progress done{0, 10, 10, 1.5, 1234567.0, 3.25, true};
  CHECK(progress_bar::line(done, 4) == "epoch 1 [####] 10/10  loss 1.5000  1,234,567/s  3.2 s");
  const progress unknown{0, 73, 0, 0.0, 0.0, 2.0, false};  // a loader without size()
  CHECK(progress_bar::line(unknown, 3) == "epoch 1 [...] 73/?  loss 0.0000  0/s  2.0 s");
  CHECK(progress_bar::line(mid, 0).find("[.]") != std::string::npos);  // width clamped to 1
  CHECK(progress_bar::line(mid, 100000).find("78/234  loss 0.4123") != std::string::npos);  // clamped to 200
  CHECK(progress_bar::line({0, 1, 2, 0.0, 1e300, 1.0}, 4).find("1e+300/s") != std::string::npos);
  CHECK(progress_bar::line({0, 1, 2, 0.0, std::numeric_limits<double>::quiet_NaN(), 1.0}, 4).find("nan/s") !=
        std::string::npos);

  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  progress_bar quiet{.out = f};
  quiet(mid);  // a file is no terminal: nothing
  CHECK(std::ftell(f) == 0);
  progress_bar loud{.out = f, .width = 4, .always = true};
  loud({0, 5, 10, 1.0, 100.0, 1.0});
  loud(done);
  std::rewind(f);
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const std::string text(buf, n);
  CHECK(text == "\repoch 1 [##..] 5/10  loss 1.0000  100/s  1.0 s (1.0 s left)\033[K"
                "\repoch 1 [####] 10/10  loss 1.5000  1,234,567/s  3.2 s\033[K\n");
}

TEST_CASE("training: clip_grad_norm's reported norm belongs to the run: a checkpoint load clears it") {
  namespace nn = locus::nn;
  using P = locus::amp::fp32;
  nn::sequential m(nn::linear<locus::cpu, P>(6, 3));
  m.reset_parameters(1);
  locus::optim::adamw<locus::cpu> opt(m.parameters(), {.lr = 1e-2});
  locus::train::trainer t(m, opt, nn::cross_entropy{}, {.clip_grad_norm = 1e-3});
  const auto x = locus::randn<float, locus::cpu>({8, 6}, 2);
  auto y = locus::zeros<std::int64_t, locus::cpu>({8});
  for (locus::index_t i = 0; i < 8; ++i) y(i) = i % 3;
  const auto path = std::filesystem::temp_directory_path() / ("locus_clip_" + std::to_string(::getpid()) + ".safetensors");
  locus::train::save_checkpoint(path, t, 0);
  t.step(x, y);
  CHECK(t.grad_norm() > 0.0);
  locus::train::resume(path, t);
  CHECK(t.grad_norm() == 0.0);
  t.step(x, y);  // and the next step reports its own
  CHECK(t.grad_norm() > 0.0);
  std::filesystem::remove(path);
}
