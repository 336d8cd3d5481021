// Host suite for training errors that must name the batch to blame: a bad label deep in
// an epoch, and a non-finite loss inside an accumulation window (the gradient check
// runs once per optimizer step, after N micro-batches were summed).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include <locus/train.hpp>

namespace {

namespace nn = locus::nn;
using P32 = locus::amp::fp32;

std::vector<float> masters(auto& model) {
  const auto m = std::as_const(model.parameters()).master();
  return {m.data_handle(), m.data_handle() + m.numel()};
}

}  // namespace

TEST_CASE("training: a bad label names its micro-batch as well as the sample and the value") {
  nn::sequential model(nn::linear<locus::cpu, P32>(16, 3));
  model.reset_parameters(3);
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  auto x = locus::rand<float, locus::cpu>({8, 16}, 1);
  auto y = locus::zeros<std::int64_t, locus::cpu>({8});
  t.step(x, y);
  t.step(x, y);
  y(6) = -4;
  try {
    t.step(x, y);
    FAIL("no error for label -4");
  } catch (const locus::index_error& e) {
    const std::string m = e.what();
    CHECK(m.find("label -4 of sample 6 in micro-batch 2 ") != std::string::npos);
    CHECK(m.find("[0, 3)") != std::string::npos);
  }
}

TEST_CASE("training: with accumulation a non-finite loss is blamed on its own micro-batch") {
  nn::sequential model(nn::linear<locus::cpu, P32>(16, 8), nn::relu<locus::cpu, P32>(),
                       nn::linear<locus::cpu, P32>(8, 3));
  model.reset_parameters(4);
  locus::optim::sgd<locus::cpu> opt(model.parameters(), {.lr = 0.1});
  locus::train::trainer t(model, opt, nn::cross_entropy{}, {.accumulate = 2});
  auto x = locus::rand<float, locus::cpu>({8, 16}, 2);
  auto y = locus::zeros<std::int64_t, locus::cpu>({8});
  t.step(x, y);
  t.step(x, y);  // micro-batches 0 and 1: one optimizer step
  CHECK(t.optimizer_steps() == 1);
  const auto before = masters(model);
  auto bad = x.clone();
  bad(3, 5) = std::numeric_limits<float>::quiet_NaN();
  t.step(bad, y);  // micro-batch 2: the first of the next window; no check yet
  try {
    t.step(x, y);  // micro-batch 3 ends the window: the check sees the sum
    FAIL("no error for a NaN input");
  } catch (const locus::train::non_finite_error& e) {
    CHECK(e.step() == 2);  // not 3, the micro-batch that ended the window
    const std::string m = e.what();
    CHECK(m.find("at step 2 (micro-batch, counted from 0; its loss was not finite)") != std::string::npos);
    CHECK(e.parameter() == "2.bias");
  }
  CHECK(masters(model) == before);  // the bad window was not applied
}

namespace {
std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("locus-test-errors-" + std::to_string(::getpid()) + "-" + name);
}
std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void spit(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
}  // namespace

TEST_CASE("training: a checkpoint whose metadata is not a number is an io_error and changes nothing") {
  nn::sequential model(nn::linear<locus::cpu, P32>(16, 3));
  model.reset_parameters(5);
  locus::optim::adamw<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  auto x = locus::rand<float, locus::cpu>({8, 16}, 3);
  auto y = locus::zeros<std::int64_t, locus::cpu>({8});
  t.step(x, y);
  const auto path = temp_file("meta.safetensors");
  locus::train::save_checkpoint(path, t, 7);
  std::string bytes = slurp(path);
  const std::string good = "\"epoch\":\"7\"";
  const auto at = bytes.find(good);
  REQUIRE(at != std::string::npos);
  bytes.replace(at, good.size(), "\"epoch\":\"x\"");  // same length: the header stays valid JSON
  spit(path, bytes);

  t.step(x, y);  // the trainer moves on: the failed load must not bring it back
  const auto before = masters(model);
  const auto steps = t.micro_steps();
  try {
    locus::train::resume(path, t);
    FAIL("no error for epoch 'x'");
  } catch (const locus::io_error& e) {
    const std::string m = e.what();
    CHECK(m.find("'epoch' is 'x', not a number") != std::string::npos);
    CHECK(m.find(path.string()) != std::string::npos);
  }
  CHECK(masters(model) == before);
  CHECK(t.micro_steps() == steps);
  std::filesystem::remove(path);
}

TEST_CASE("io: a safetensors shape whose byte count overflows is corrupt, not a tiny tensor") {
  // 2^62 x 4 f32 elements: count * 4 bytes wraps to 0 in 64 bits, which would match the
  // empty span [0, 0) if the product were not checked.
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header;
  const auto path = temp_file("overflow.safetensors");
  spit(path, bytes);
  try {
    (void)locus::io::load<locus::cpu>(path);
    FAIL("no error for an overflowing shape");
  } catch (const locus::io_error& e) {
    CHECK(std::string(e.what()).find("shape too large") != std::string::npos);
  }
  std::filesystem::remove(path);
}
