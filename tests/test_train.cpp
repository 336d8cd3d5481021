// Host suite for training: the device-generic bodies on cpu, plus what needs the host:
// bf16_mixed against fp32 on a Fashion-MNIST slice, checkpoints (round trip, resume
// equals no stop, bad files, another model's shape), bad labels, non-finite gradients,
// out-of-memory in the middle of a step, --batch-size auto, and the lr schedules.
#define LOCUS_TEST_DEVICES locus::cpu
#include "generic/train_cases.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numbers>

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

TEST_CASE("checkpoints: round trip and resuming after epoch k gives the same losses bit for bit") {
  const fs::path dir = temp_dir("ckpt");
  auto data = synthetic(512, 9);
  auto losses_of = [&](auto& t, auto& dl, int from, int to, std::vector<double>& out) {
    for (int e = from; e < to; ++e) {
      dl.set_epoch(static_cast<std::uint64_t>(e));
      for (auto& b : dl) {
        t.step(b.x, b.y);
        out.push_back(t.report().loss);
      }
      t.flush();
    }
  };

  std::vector<double> straight, resumed;
  {
    auto model = synthetic_model(4);
    locus::optim::adamw<locus::cpu> opt(model.parameters(), {.lr = 3e-3});
    locus::train::trainer t(model, opt, nn::cross_entropy{}, {.accumulate = 2});
    locus::data::loader<locus::cpu> dl(data, {.batch_size = 48, .shuffle = true, .seed = 8});
    losses_of(t, dl, 0, 1, straight);
    locus::train::save_checkpoint(dir / "after-1.safetensors", t, 1);
    losses_of(t, dl, 1, 3, straight);
  }
  {
    auto model = synthetic_model(99);  // other weights: the checkpoint must replace them
    locus::optim::adamw<locus::cpu> opt(model.parameters(), {.lr = 3e-3});
    locus::train::trainer t(model, opt, nn::cross_entropy{}, {.accumulate = 2});
    locus::data::loader<locus::cpu> dl(data, {.batch_size = 48, .shuffle = true, .seed = 8});
    losses_of(t, dl, 0, 1, resumed);  // overwritten by the load below
    resumed.clear();
    const auto epoch = locus::train::resume(dir / "after-1.safetensors", t);
    CHECK(epoch == 1);
    losses_of(t, dl, 1, 3, resumed);
  }
  REQUIRE(straight.size() > resumed.size());
  const std::vector<double> tail(straight.end() - static_cast<std::ptrdiff_t>(resumed.size()), straight.end());
  CHECK(tail == resumed);  // bit for bit

  // round trip: the file holds exactly the model's weights
  auto model = synthetic_model(4);
  locus::optim::adamw<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  locus::train::resume(dir / "after-1.safetensors", t);
  auto a = locus::io::load<locus::cpu>(dir / "after-1.safetensors");
  const auto w = a.get<float, 2>("0.weight");
  const auto mw = model.parameters().template master<2>(0);
  REQUIRE(w.shape() == mw.shape());
  for (index_t i = 0; i < w.shape()[0]; ++i)
    for (index_t j = 0; j < w.shape()[1]; ++j) CHECK(w(i, j) == mw(i, j));
  CHECK(a.metadata("format") == "locus-checkpoint-1");
  CHECK(a.metadata("policy") == "fp32");
  CHECK(a.contains("optimizer.exp_avg.3.weight"));
  CHECK(a.info("3.bias").shape == std::vector<index_t>{3});
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
  // a crash while writing never touches the previous file: the write goes to a
  // temporary file first (here: a directory where the file should be is unwritable)
  CHECK_THROWS_AS(locus::train::save_checkpoint(dir / "no-such-dir" / "x" / ".." / ".." / "good.safetensors" / "y", t, 0),
                  std::exception);
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
  const auto before = locus_train_test::host_values(std::as_const(model.parameters()).master());
  const auto used = locus::memory_stats<locus::cpu>().allocated_bytes;
  locus::set_memory_limit<locus::cpu>(used + 170000);  // the forward fits, not all of backward
  CHECK_THROWS_AS(t.step(x, y), locus::out_of_memory);
  locus::set_memory_limit<locus::cpu>(std::numeric_limits<std::size_t>::max());
  CHECK(locus_train_test::host_values(std::as_const(model.parameters()).master()) == before);
  CHECK(locus_train_test::host_values(std::as_const(model.parameters()).grad()) ==
        std::vector<double>(static_cast<std::size_t>(model.parameters().size()), 0.0));
  CHECK_NOTHROW(t.step(x, y));  // and training goes on
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
