// Checkpoints that detect their own corruption (issue 28): every tensor's CRC32C in the
// safetensors metadata, verified on every load. CRC32C itself against the published
// check values (RFC 3720 B.4 and "123456789") and a bitwise reference; files with bits
// flipped in each tensor, malformed checksum metadata, and files without checksums.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include <locus/io/crc32c.hpp>
#include <locus/train.hpp>

namespace {
namespace fs = std::filesystem;
namespace nn = locus::nn;
using P32 = locus::amp::fp32;

/// The definition, one bit at a time (the reflected polynomial 0x82F63B78).
std::uint32_t crc32c_bitwise(const unsigned char* p, std::size_t n) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("locus-integrity-" + std::to_string(::getpid()) + "-" + name);
}
std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
struct parsed {
  std::uint64_t n = 0;
  nlohmann::json header;
  std::string data;
};
parsed parse(const std::string& file) {
  parsed p;
  for (int i = 0; i < 8; ++i) p.n |= std::uint64_t{static_cast<unsigned char>(file[static_cast<std::size_t>(i)])} << (8 * i);
  p.header = nlohmann::json::parse(file.substr(8, p.n));
  p.data = file.substr(8 + p.n);
  return p;
}
std::string assemble(const nlohmann::json& header, const std::string& data) {
  const std::string h = header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  return out + h + data;
}
std::string io_error_of(auto&& f) {
  try {
    f();
  } catch (const locus::io_error& e) {
    return e.what();
  }
  return "(no io_error)";
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("crc32c equals the published check values and the bitwise definition") {
  CHECK(locus::io::crc32c("123456789", 9) == 0xE3069283u);
  unsigned char zeros[32] = {}, ones[32], up[32], down[32];
  for (int i = 0; i < 32; ++i) {
    ones[i] = 0xFF;
    up[i] = static_cast<unsigned char>(i);
    down[i] = static_cast<unsigned char>(31 - i);
  }
  // RFC 3720 (iSCSI), appendix B.4
  CHECK(locus::io::crc32c(zeros, 32) == 0x8A9136AAu);
  CHECK(locus::io::crc32c(ones, 32) == 0x62A8AB43u);
  CHECK(locus::io::crc32c(up, 32) == 0x46DD794Eu);
  CHECK(locus::io::crc32c(down, 32) == 0x113FDB5Cu);
  CHECK(locus::io::crc32c(nullptr, 0) == 0u);

  // every length around the hardware path's thresholds, at odd alignments, against the
  // definition and the table path; and in pieces
  std::mt19937_64 rng(28);
  std::vector<unsigned char> buf(3 * 4096 * 4 + 64);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  int mismatches = 0;
  for (std::size_t n : {1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 4095, 12287, 12288, 12289, 12296, 24583, 49151}) {
    for (std::size_t off : {0, 1, 3, 7}) {
      const unsigned char* p = buf.data() + off;
      const std::uint32_t want = crc32c_bitwise(p, n);
      mismatches += locus::io::crc32c(p, n) != want;
      mismatches += ~locus::io::detail::crc32c_update_sw(~0u, p, n) != want;
      const std::size_t cut = n / 3;
      mismatches += locus::io::crc32c(p + cut, n - cut, locus::io::crc32c(p, cut)) != want;
    }
  }
  CHECK(mismatches == 0);
  MESSAGE("crc32c uses the crc32 instruction: " << locus::io::crc32c_uses_hardware());
}

TEST_CASE("every tensor a writer saves carries its CRC32C, and a flipped bit in any tensor is an io_error naming it") {
  const auto path = temp_file("flip.safetensors");
  auto a = locus::randn<float, locus::cpu>({16, 8}, 1);
  auto b = locus::randn<double, locus::cpu>({5}, 2);
  auto c = locus::zeros<std::int64_t, locus::cpu>({3});
  locus::io::writer w;
  w.add("layer.weight", a);
  w.add("layer.bias", b);
  w.add("counts", c);
  w.metadata("epoch", "1");
  w.save(path);
  const std::string good = slurp(path);
  const parsed p = parse(good);
  // the checksum keys, computed here independently from the file's own bytes
  for (const char* name : {"layer.weight", "layer.bias", "counts"}) {
    const auto& off = p.header[name]["data_offsets"];
    const std::size_t beg = off[0].get<std::size_t>(), end = off[1].get<std::size_t>();
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x",
                  crc32c_bitwise(reinterpret_cast<const unsigned char*>(p.data.data()) + beg, end - beg));
    CHECK(p.header["__metadata__"][std::string("locus.crc32c.") + name].get<std::string>() == hex);
  }
  CHECK(locus::io::load<locus::cpu>(path).verified_tensors() == 3);

  // one bit at a time: a float's exponent and lowest mantissa bit, the double's sign,
  // an integer's low bit, at the first, a middle and the last element
  for (const char* name : {"layer.weight", "layer.bias", "counts"}) {
    const auto& off = p.header[name]["data_offsets"];
    const std::size_t beg = off[0].get<std::size_t>(), end = off[1].get<std::size_t>();
    for (std::size_t at : {beg, beg + (end - beg) / 2, end - 1}) {
      for (int bit : {0, 6, 7}) {
        std::string bad = good;
        bad[8 + p.n + at] = static_cast<char>(bad[8 + p.n + at] ^ (1 << bit));
        spit(path, bad);
        const std::string m = io_error_of([&] { (void)locus::io::load<locus::cpu>(path); });
        CAPTURE(m);
        CHECK(has(m, path.string()));
        CHECK(has(m, std::string("tensor '") + name + "' does not match its CRC32C checksum"));
      }
    }
  }
  fs::remove(path);
}

TEST_CASE("a trainer checkpoint with a flipped exponent bit in a weight is refused and the trainer is unchanged") {
  nn::sequential model(nn::linear<locus::cpu, P32>(6, 8), nn::relu<locus::cpu, P32>(), nn::linear<locus::cpu, P32>(8, 3));
  model.reset_parameters(7);
  locus::optim::adamw<locus::cpu> opt(model.parameters(), {.lr = 1e-2});
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  auto x = locus::randn<float, locus::cpu>({10, 6}, 8);
  auto y = locus::zeros<std::int64_t, locus::cpu>({10});
  t.step(x, y);
  const auto path = temp_file("ckpt.safetensors");
  locus::train::save_checkpoint(path, t, 1);
  const std::string good = slurp(path);
  const parsed p = parse(good);
  t.step(x, y);  // the trainer moves on: a failed resume must leave it here
  const auto master = std::as_const(model.parameters()).master();
  const std::vector<float> before(master.data_handle(), master.data_handle() + model.parameters().size());
  const auto steps = t.optimizer_steps();

  // the exponent's top bit of 0.weight's element 5 (a float: byte 3 of 4, bit 6 of it)
  const std::size_t beg = p.header["0.weight"]["data_offsets"][0].get<std::size_t>();
  std::string bad = good;
  bad[8 + p.n + beg + 5 * 4 + 3] = static_cast<char>(bad[8 + p.n + beg + 5 * 4 + 3] ^ 0x40);
  float flipped;
  std::memcpy(&flipped, bad.data() + 8 + p.n + beg + 5 * 4, 4);
  CHECK(std::abs(flipped) > 1e30f);  // what training would have gone on from
  spit(path, bad);
  const std::string m = io_error_of([&] { (void)locus::train::resume(path, t); });
  CHECK(has(m, path.string()));
  CHECK(has(m, "tensor '0.weight' does not match its CRC32C checksum"));
  const auto after = std::as_const(model.parameters()).master();
  CHECK(std::equal(before.begin(), before.end(), after.data_handle()));
  CHECK(t.optimizer_steps() == steps);

  // the good file resumes
  spit(path, good);
  CHECK(locus::train::resume(path, t) == 1);
  fs::remove(path);
}

TEST_CASE("files without checksums load unverified, and malformed checksum metadata is corrupt") {
  const auto path = temp_file("meta.safetensors");
  locus::io::writer w;
  w.add("a", locus::randn<float, locus::cpu>({4}, 3));
  w.add("b", locus::randn<float, locus::cpu>({2, 2}, 4));
  w.metadata("writer", "test");
  w.save(path);
  const parsed p = parse(slurp(path));

  auto without = p.header;
  without["__metadata__"].erase("locus.crc32c.a");
  without["__metadata__"].erase("locus.crc32c.b");
  spit(path, assemble(without, p.data));
  {
    const auto a = locus::io::load<locus::cpu>(path);  // another program's file
    CHECK(a.verified_tensors() == 0);
    CHECK(a.get<float, 1>("a")(0) == locus::randn<float, locus::cpu>({4}, 3)(0));
  }
  const std::string ok = p.header["__metadata__"]["locus.crc32c.a"].get<std::string>();
  std::string upper = ok;
  for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  for (const auto& [key, value, what] : {
           std::tuple{std::string("locus.crc32c.a"), std::string("xyz"), std::string("not 8 lowercase hex digits")},
           std::tuple{std::string("locus.crc32c.a"), ok + "0", std::string("not 8 lowercase hex digits")},
           std::tuple{std::string("locus.crc32c.a"), std::string(""), std::string("not 8 lowercase hex digits")},
           std::tuple{std::string("locus.crc32c.a"), std::string(" ") + ok.substr(1), std::string("not 8 lowercase hex digits")},
           std::tuple{std::string("locus.crc32c.nothere"), ok, std::string("a tensor 'nothere' that the file does not hold")},
       }) {
    CAPTURE(key);
    CAPTURE(value);
    auto h = p.header;
    h["__metadata__"][key] = value;
    spit(path, assemble(h, p.data));
    CHECK(has(io_error_of([&] { (void)locus::io::load<locus::cpu>(path); }), what));
  }
  if (upper != ok) {  // upper-case hex is not what locus writes
    auto h = p.header;
    h["__metadata__"]["locus.crc32c.a"] = upper;
    spit(path, assemble(h, p.data));
    CHECK(has(io_error_of([&] { (void)locus::io::load<locus::cpu>(path); }), "not 8 lowercase hex digits"));
  }
  auto partial = p.header;
  partial["__metadata__"].erase("locus.crc32c.b");
  spit(path, assemble(partial, p.data));
  CHECK(has(io_error_of([&] { (void)locus::io::load<locus::cpu>(path); }),
            "tensor 'b' has no checksum although 1 of its other tensors"));
  // the checksum keys are the writer's own
  CHECK_THROWS_AS(w.metadata("locus.crc32c.a", ok), locus::value_error);
  fs::remove(path);
}
