// Host suite for training errors that must name the batch to blame: a bad label deep in
// an epoch, and a non-finite loss inside an accumulation window (the gradient check
// runs once per optimizer step, after N micro-batches were summed).
#include <doctest/doctest.h>

#include "resign_header.hpp"

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
  spit(path, locus_test::resign_bytes(bytes));  // past the header's checksum, to the number check

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

namespace {
/// A safetensors file by hand: the 8-byte little-endian header length, the header, the data.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return bytes + header + data;
}
std::string f32_bytes(std::initializer_list<float> v) {
  std::string s;
  for (float x : v) s.append(reinterpret_cast<const char*>(&x), sizeof x);
  return s;
}
}  // namespace

TEST_CASE("checkpoints: a grad scaler state that is no scale and counts is an io_error and changes nothing") {
  // Found by tests/fuzz/fuzz_safetensors.cpp: skipped = 2.7e23 went through a float to
  // int64 conversion (undefined behaviour) in grad_scaler::load_state_dict.
  using F16 = locus::amp::fp16_mixed;
  nn::sequential model(nn::linear<locus::cpu, F16>(2, 1));
  model.reset_parameters(6);
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  locus::amp::grad_scaler<locus::cpu> scaler({.init_scale = 256.0f});
  locus::train::trainer t(model, opt, nn::cross_entropy{}, scaler);
  const std::string header =
      R"({"0.bias":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("0.weight":{"dtype":"F32","shape":[1,2],"data_offsets":[4,12]},)"
      R"("optimizer.step":{"dtype":"I64","shape":[1],"data_offsets":[12,20]},)"
      R"("scaler.state":{"dtype":"F32","shape":[3],"data_offsets":[20,32]}})";
  const std::string params = f32_bytes({0.5f, 1.0f, 2.0f}) + std::string(8, '\0');
  const auto path = temp_file("scaler.safetensors");
  const auto before = masters(model);
  for (const auto& [state, what] :
       {std::pair{f32_bytes({128.0f, 1.0f, 2.7205e23f}), "e+23"}, std::pair{f32_bytes({128.0f, 1.0f, -1.0f}), "-1"},
        std::pair{f32_bytes({0.0f, 1.0f, 0.0f}), "[0, 1, 0]"},
        std::pair{f32_bytes({128.0f, std::numeric_limits<float>::quiet_NaN(), 0.0f}), "nan"}}) {
    const std::string case_text = what;  // a named copy: clang 14 cannot capture a structured binding
    CAPTURE(case_text);
    spit(path, safetensors_bytes(header, params + state));
    try {
      locus::train::resume(path, t);
      FAIL("no error for scaler state " << what);
    } catch (const locus::io_error& e) {
      const std::string m = e.what();
      CHECK(m.find("'scaler.state'") != std::string::npos);
      CHECK(m.find(what) != std::string::npos);
      CHECK(m.find(path.string()) != std::string::npos);
    }
    CHECK(masters(model) == before);
    CHECK(scaler.scale() == 256.0f);
    CHECK(scaler.skipped_steps() == 0);
  }
  spit(path, safetensors_bytes(header, params + f32_bytes({128.0f, 1.0f, 3.0f})));
  CHECK(locus::train::resume(path, t) == 0);  // the same file with a sound state loads
  CHECK(scaler.scale() == 128.0f);
  CHECK(scaler.skipped_steps() == 3);
  const auto& store = std::as_const(model.parameters());
  CHECK(store.master_flat(0)(0) == 1.0f);  // 0.weight
  CHECK(store.master_flat(0)(1) == 2.0f);
  CHECK(store.master_flat(1)(0) == 0.5f);  // 0.bias
  std::filesystem::remove(path);
}

TEST_CASE("io: a safetensors extent or offset that is not a non-negative integer is corrupt") {
  // nlohmann's get<int64_t>() of 1e30 converts a double out of range (undefined
  // behaviour); 2^63 as an unsigned number would wrap to a negative extent.
  const auto path = temp_file("integers.safetensors");
  for (const auto& [header, what] : {
           std::pair{std::string(R"({"w":{"dtype":"F32","shape":[1e30],"data_offsets":[0,4]}})"), "extent 1e+30"},
           std::pair{std::string(R"({"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})"), "extent 1.0"},
           std::pair{std::string(R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}})"),
                     "extent too large"},
           std::pair{std::string(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})"), "negative extent (-1)"},
           std::pair{std::string(R"({"w":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})"), "shape 1, expected"},
           std::pair{std::string(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-1e300,4]}})"), "data offset -1e+300"},
           std::pair{std::string(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})"), "negative data offset"},
           std::pair{std::string(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})"), "expected [begin, end]"},
       }) {
    const std::string case_text = header;  // a named copy: clang 14 cannot capture a structured binding
    CAPTURE(case_text);
    spit(path, safetensors_bytes(header, f32_bytes({1.0f, 2.0f})));
    try {
      (void)locus::io::load<locus::cpu>(path);
      FAIL("no error");
    } catch (const locus::io_error& e) {
      const std::string m = e.what();
      CHECK(m.find(what) != std::string::npos);
      CHECK(m.find(path.string()) != std::string::npos);
    }
  }
  std::filesystem::remove(path);
}

TEST_CASE("io: safetensors tensors that share bytes are corrupt, not one copy each") {
  // 300 tensors spanning the same 3000 bytes (a 21 kB file) made a 900 kB buffer; a
  // 1 MB file of this kind asked for gigabytes.
  std::string header = "{";
  for (int i = 0; i < 300; ++i) {
    if (i) header += ',';
    header += "\"w" + std::to_string(i);
    header += R"(":{"dtype":"U8","shape":[3000],"data_offsets":[0,3000]})";
  }
  header += "}";
  const auto path = temp_file("overlap.safetensors");
  spit(path, safetensors_bytes(header, std::string(3000, '\x01')));
  try {
    (void)locus::io::load<locus::cpu>(path);
    FAIL("no error for tensors sharing bytes");
  } catch (const locus::io_error& e) {
    const std::string m = e.what();
    CHECK(m.find("overlap") != std::string::npos);
    CHECK(m.find("[0, 3000)") != std::string::npos);
    CHECK(m.find(path.string()) != std::string::npos);
  }
  // Adjacent and empty tensors are fine.
  spit(path, safetensors_bytes(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                               R"("b":{"dtype":"U8","shape":[0],"data_offsets":[1,1]},)"
                               R"("c":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                               "\x01\x02\x03\x04"));
  const auto a = locus::io::load<locus::cpu>(path);
  CHECK(a.get<std::uint8_t, 1>("c")(1) == 4);
  CHECK(a.get<std::uint8_t, 1>("b").numel() == 0);
  std::filesystem::remove(path);
}

TEST_CASE("checkpoints: a step count or counter outside [0, 2^62] is an io_error and changes nothing") {
  // optimizer.step = INT64_MAX loaded, and the next step's ++ overflowed (undefined
  // behaviour in update_begin_kernel); micro_steps = INT64_MAX likewise in the trainer.
  nn::sequential model(nn::linear<locus::cpu, P32>(2, 1));
  model.reset_parameters(7);
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  auto i64_bytes = [](std::int64_t v) { return std::string(reinterpret_cast<const char*>(&v), sizeof v); };
  auto file = [&](const std::string& meta, std::int64_t step) {
    return safetensors_bytes(R"({"__metadata__":{)" + meta + R"(},)"
                             R"("0.bias":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("0.weight":{"dtype":"F32","shape":[1,2],"data_offsets":[4,12]},)"
                             R"("optimizer.step":{"dtype":"I64","shape":[1],"data_offsets":[12,20]}})",
                             f32_bytes({0.5f, 1.0f, 2.0f}) + i64_bytes(step));
  };
  const auto path = temp_file("counts.safetensors");
  const auto before = masters(model);
  for (const auto& [bytes, what] : {
           std::pair{file(R"("epoch":"1")", std::numeric_limits<std::int64_t>::max()),
                     "'optimizer.step' is 9223372036854775807"},
           std::pair{file(R"("epoch":"1")", -1), "'optimizer.step' is -1"},
           std::pair{file(R"("micro_steps":"9223372036854775807")", 3), "'micro_steps' is 9223372036854775807"},
           std::pair{file(R"("epoch":"-3")", 3), "'epoch' is -3"},
       }) {
    const std::string case_text = what;  // a named copy: clang 14 cannot capture a structured binding
    CAPTURE(case_text);
    spit(path, bytes);
    try {
      locus::train::resume(path, t);
      FAIL("no error");
    } catch (const locus::io_error& e) {
      const std::string m = e.what();
      CHECK(m.find(what) != std::string::npos);
      CHECK(m.find("[0, 2^62]") != std::string::npos);
      CHECK(m.find(path.string()) != std::string::npos);
    }
    CHECK(masters(model) == before);
    CHECK(opt.steps() == 0);
    CHECK(t.micro_steps() == 0);
  }
  spit(path, file(R"("epoch":"1","micro_steps":"4")", 4));
  CHECK(locus::train::resume(path, t) == 1);
  CHECK(opt.steps() == 4);
  CHECK(t.micro_steps() == 4);
  std::filesystem::remove(path);
}

TEST_CASE("checkpoints: a learning rate a float cannot hold, or a negative one, is an io_error and changes nothing") {
  // The update kernels take the rate as a float: lr = 1e300 in the metadata would step
  // every weight by inf on the next update.
  nn::sequential model(nn::linear<locus::cpu, P32>(4, 2));
  model.reset_parameters(3);
  locus::optim::adamw<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  auto x = locus::rand<float, locus::cpu>({8, 4}, 3);
  auto y = locus::zeros<std::int64_t, locus::cpu>({8});
  t.step(x, y);
  const auto path = temp_file("lr.safetensors");
  locus::train::save_checkpoint(path, t, 1);
  const std::string saved = slurp(path);
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(saved[static_cast<std::size_t>(i)])) << (8 * i);
  const auto header = nlohmann::json::parse(saved.substr(8, n));
  const std::string data = saved.substr(8 + n);
  t.step(x, y);
  const auto before = masters(model);
  const double lr_before = opt.lr();
  for (const auto& [key, value] : {std::pair{"lr", "1e300"}, std::pair{"base_lr", "-0.5"}, std::pair{"lr", "1e39"}}) {
    const std::string case_text = std::string(key) + " = " + value;
    CAPTURE(case_text);
    auto h = header;
    h["__metadata__"][key] = value;
    locus_test::resign(h);  // past the header's checksum, to the learning-rate check
    spit(path, safetensors_bytes(h.dump(), data));
    try {
      locus::train::resume(path, t);
      FAIL("no error for " << case_text);
    } catch (const locus::io_error& e) {
      const std::string m = e.what();
      CHECK(m.find("'" + std::string(key) + "'") != std::string::npos);
      CHECK(m.find("expected a learning rate") != std::string::npos);
    }
    CHECK(masters(model) == before);
    CHECK(opt.lr() == lr_before);
  }
  auto h = header;
  h["__metadata__"]["lr"] = "3.0e38";  // large, but a float holds it
  locus_test::resign(h);
  spit(path, safetensors_bytes(h.dump(), data));
  CHECK(locus::train::resume(path, t) == 1);
  CHECK(opt.lr() == 3.0e38);
  std::filesystem::remove(path);
}

TEST_CASE("grad_scaler: load_state_dict refuses a state that is no scale and counts, and keeps its own") {
  // The rule checkpoints apply before loading lives in the scaler: a direct call with
  // skipped = 2.7e23 would otherwise convert a float beyond int64 (undefined behaviour).
  locus::amp::grad_scaler<locus::cpu> scaler({.init_scale = 256.0f});
  for (const auto& bad : {std::vector<float>{128.0f, 1.0f, 2.7205e23f}, std::vector<float>{128.0f, 0.5f, 0.0f},
                          std::vector<float>{0.0f, 1.0f, 0.0f}, std::vector<float>{128.0f, 1.0f, -1.0f}}) {
    const auto t = locus::from_host<locus::cpu>(bad, {3});
    CHECK_FALSE(locus::amp::grad_scaler<locus::cpu>::valid_state(t.view()));
    CHECK_THROWS_AS(scaler.load_state_dict(t.view()), locus::value_error);
    CHECK(scaler.scale() == 256.0f);
  }
  const auto good = locus::from_host<locus::cpu>(std::vector<float>{128.0f, 3.0f, 2.0f}, {3});
  scaler.load_state_dict(good.view());
  CHECK(scaler.scale() == 128.0f);
  CHECK(scaler.skipped_steps() == 2);
}
