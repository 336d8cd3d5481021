// Host suite: files written by an adversary, byte by byte. Every one must be a
// locus::io_error naming the file, with nothing allocated beyond what the input can
// hold: safetensors headers nested 100000 deep (a recursive parser or dump() would
// overflow the stack), BOOL bytes other than 0 and 1, FIFOs and devices that claim
// gigabytes, duplicate keys, NULs in dtype strings, data sections with holes or tails,
// gzip IDX files followed by garbage, and checkpoint metadata that std::stoll would
// have taken (" 5", "-5") or names of another policy or optimizer.
#include <doctest/doctest.h>

#include "resign_header.hpp"

#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <locus/data/idx.hpp>
#include <locus/train.hpp>

namespace {

namespace fs = std::filesystem;
namespace nn = locus::nn;
using P32 = locus::amp::fp32;

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("locus-hostile-" + std::to_string(::getpid()) + "-" + name);
}
void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
std::string le64(std::uint64_t n) {
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return b;
}
/// A safetensors file by hand: the 8-byte little-endian header length, the header, the data.
std::string st_file(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }
std::string f32_bytes(std::initializer_list<float> v) {
  std::string s;
  for (float x : v) s.append(reinterpret_cast<const char*>(&x), sizeof x);
  return s;
}
std::string nest(std::size_t depth, const std::string& inner = "1") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

/// The io_error text of f(), or a failed check when f() throws nothing or another type.
template <class F>
std::string io_error_of(F&& f) {
  try {
    f();
  } catch (const locus::io_error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected locus::io_error, got another exception: " << e.what());
    return {};
  }
  FAIL("expected locus::io_error, nothing was thrown");
  return {};
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// The process's peak resident memory (kB): a buffer sized by a file's claim would
/// show here even where memory_stats does not see it (a std::vector).
long max_rss_kb() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

/// Checks that the cpu allocator's peak and the process's peak memory grew by less
/// than `limit` bytes while f() ran.
template <class F>
void within_memory(std::size_t limit, F&& f) {
  locus::reset_peak_memory_stats<locus::cpu>();
  const auto before = locus::memory_stats<locus::cpu>().peak_allocated_bytes;
  const long rss = max_rss_kb();
  f();
  CHECK(locus::memory_stats<locus::cpu>().peak_allocated_bytes - before < limit);
  CHECK(static_cast<std::size_t>(max_rss_kb() - rss) * 1024 < limit + (std::size_t{64} << 20));
}

/// A FIFO at `path` whose writer (a thread) sends `bytes` and closes it. SIGPIPE is
/// ignored meanwhile: a reader that gives up early closes its end first.
class fifo {
 public:
  fifo(fs::path path, std::string bytes) : path_(std::move(path)) {
    fs::remove(path_);
    REQUIRE(::mkfifo(path_.c_str(), 0600) == 0);
    old_ = std::signal(SIGPIPE, SIG_IGN);
    writer_ = std::thread([p = path_, b = std::move(bytes)] {
      const int fd = ::open(p.c_str(), O_WRONLY);
      if (fd < 0) return;
      std::size_t at = 0;
      while (at < b.size()) {
        const ssize_t w = ::write(fd, b.data() + at, b.size() - at);
        if (w <= 0) break;  // EPIPE: the reader is gone
        at += static_cast<std::size_t>(w);
      }
      ::close(fd);
    });
  }
  fifo(const fifo&) = delete;
  fifo& operator=(const fifo&) = delete;
  ~fifo() {
    writer_.join();
    std::signal(SIGPIPE, old_);
    fs::remove(path_);
  }
  [[nodiscard]] const fs::path& path() const noexcept { return path_; }

 private:
  fs::path path_;
  std::thread writer_;
  void (*old_)(int) = SIG_DFL;
};

std::string gzip_bytes(const std::string& b) {
  const fs::path p = temp_file("scratch.gz");
  gzFile g = gzopen(p.c_str(), "wb");
  REQUIRE(g != nullptr);
  if (!b.empty()) REQUIRE(gzwrite(g, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  REQUIRE(gzclose(g) == Z_OK);
  std::string out = slurp(p);
  fs::remove(p);
  return out;
}
/// An IDX file of u8 elements: magic 00 00 08 rank, big-endian extents, the bytes.
std::string idx_u8(const std::vector<std::uint32_t>& dims, const std::string& data) {
  std::string b = {'\0', '\0', '\x08', static_cast<char>(dims.size())};
  for (std::uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>((d >> s) & 0xff));
  return b + data;
}

const std::string good_w = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

}  // namespace

// ---- safetensors: nesting ---------------------------------------------------------------

TEST_CASE("hostile safetensors: JSON nested 100000 deep is an io_error, not a stack overflow") {
  const auto path = temp_file("deep.safetensors");
  const std::string deep = nest(100000);
  for (const auto& [header, where] : {
           std::pair{R"({"__metadata__":{"k":)" + deep + "}," + good_w + "}", "metadata"},
           std::pair{R"({"w":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,8]}})", "shape"},
           std::pair{R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,)" + deep + "]}}", "offset"},
           std::pair{R"({"w":{"dtype":)" + std::string(100000, '{') + std::string(100000, '}') + "}}", "objects"},
           std::pair{deep, "top level"},
       }) {
    const std::string case_text = where;
    CAPTURE(case_text);
    spit(path, st_file(header, f32_bytes({1.0f, 2.0f})));
    const auto m = io_error_of([&] { (void)locus::io::load<locus::cpu>(path); });
    CHECK(has(m, path.string()));
    CHECK(has(m, "nests JSON arrays and objects more than 16 deep"));
    CHECK(m.size() < 1000);  // the value is not serialised into the message
  }
  // Through train::resume as well (the same reader, before any tensor is compared).
  nn::sequential model(nn::linear<locus::cpu, P32>(2, 1));
  model.reset_parameters(1);
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  spit(path, st_file(R"({"__metadata__":{"epoch":)" + deep + "}," + good_w + "}", f32_bytes({1.0f, 2.0f})));
  CHECK(has(io_error_of([&] { (void)locus::train::resume(path, t); }), "more than 16 deep"));
  fs::remove(path);
}

TEST_CASE("hostile safetensors: brackets inside strings do not count as nesting, and the limit is exact") {
  const auto path = temp_file("strings.safetensors");
  // 100000 brackets, quotes and backslashes inside a metadata string: a valid file.
  const std::string text = std::string(50000, '[') + "\\\"" + std::string(50000, '{');
  spit(path, st_file(R"({"__metadata__":{"note":")" + text + R"("},)" + good_w + "}", f32_bytes({1.0f, 2.0f})));
  {
    const auto a = locus::io::load<locus::cpu>(path);
    CHECK(a.metadata("note") == std::string(50000, '[') + "\"" + std::string(50000, '{'));
    CHECK(a.get<float, 1>("w")(1) == 2.0f);
  }
  // An unknown member of a tensor, nested to 16 levels in all, is ignored; 17 is refused.
  auto with_extra = [&](std::size_t levels) {  // header (1) + tensor (1) + levels
    return st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":)" + nest(levels) + "}}",
                   f32_bytes({1.0f, 2.0f}));
  };
  spit(path, with_extra(14));
  CHECK(locus::io::load<locus::cpu>(path).info("w").bytes == 8);
  spit(path, with_extra(15));
  CHECK(has(io_error_of([&] { (void)locus::io::load<locus::cpu>(path); }), "more than 16 deep"));
  fs::remove(path);
}

// ---- safetensors: values ------------------------------------------------------------------

TEST_CASE("hostile safetensors: a BOOL element other than 0 or 1 is an io_error naming the tensor") {
  // Reading byte 2 as a bool is undefined behaviour; normalising it to true would make
  // a corrupt file load as something it does not say. Refused.
  const auto path = temp_file("bool.safetensors");
  const std::string header = R"({"flags":{"dtype":"BOOL","shape":[2,2],"data_offsets":[0,4]}})";
  for (const char bad : {'\x02', '\xff', '\x80'}) {
    std::string data = std::string("\x01\x00\x01", 3) + bad;
    spit(path, st_file(header, data));
    const auto m = io_error_of([&] { (void)locus::io::load<locus::cpu>(path); });
    CHECK(has(m, "BOOL tensor 'flags'"));
    CHECK(has(m, "byte " + std::to_string(static_cast<unsigned char>(bad)) + " at element 3"));
    CHECK(has(m, path.string()));
  }
  spit(path, st_file(header, std::string("\x01\x00\x00\x01", 4)));
  const auto a = locus::io::load<locus::cpu>(path);
  const auto v = a.get<bool, 2>("flags");
  CHECK(v(0, 0));
  CHECK_FALSE(v(0, 1));
  CHECK_FALSE(v(1, 0));
  CHECK(v(1, 1));
  fs::remove(path);
}

TEST_CASE("hostile safetensors: duplicate keys, NULs in dtypes, non-string metadata and odd shapes are io_errors") {
  const auto path = temp_file("values.safetensors");
  const std::string two = f32_bytes({1.0f, 2.0f});
  for (const auto& [header, what] : {
           // nlohmann keeps the last of two equal keys: which "w" is meant is a guess
           std::pair{"{" + good_w + "," + good_w + "}", R"(the key "w" twice)"},
           std::pair{std::string(R"({"w":{"dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8]}})"),
                     R"(the key "dtype" twice)"},
           std::pair{R"({"__metadata__":{"a":"1","a":"2"},)" + good_w + "}", R"(the key "a" twice)"},
           std::pair{std::string(R"({"w":{"dtype":"F32\u0000","shape":[2],"data_offsets":[0,8]}})"),
                     R"(unknown dtype F32\x00)"},
           std::pair{std::string(R"({"w":{"dtype":"","shape":[2],"data_offsets":[0,8]}})"), "unknown dtype"},
           std::pair{std::string(R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})"), "has dtype 7, expected a string"},
           std::pair{std::string(R"({"w":{"shape":[2],"data_offsets":[0,8]}})"), "'w' has no dtype"},
           std::pair{std::string(R"({"w":[1,2]})"), "described by an array of 2 elements"},
           std::pair{R"({"__metadata__":{"k":[1,[2]]},)" + good_w + "}", "'k' is an array of 2 elements, expected a string"},
           std::pair{R"({"__metadata__":{"k":3},)" + good_w + "}", "'k' is 3, expected a string"},
           std::pair{R"({"__metadata__":"x",)" + good_w + "}", "__metadata__ is \"x\""},
           std::pair{std::string(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})"), "negative extent (-2)"},
           std::pair{std::string(R"({"w":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})"), "negative extent (-1)"},
           std::pair{std::string(R"({"w":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})"),
                     "extent an array of 1 elements"},
           std::pair{std::string(R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})"), "extent \"2\""},
           std::pair{std::string(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,true]}})"), "data offset true"},
           std::pair{std::string(R"([])"), "its header is an array of 0 elements, not a JSON object"},
           std::pair{std::string(R"("{}")"), "not a JSON object"},
           std::pair{std::string(R"({"w":)"), "not valid JSON"},
       }) {
    const std::string case_text = header;
    CAPTURE(case_text);
    spit(path, st_file(header, two));
    const auto m = io_error_of([&] { (void)locus::io::load<locus::cpu>(path); });
    CHECK(has(m, what));
    CHECK(has(m, path.string()));
  }
  // A name with a NUL and a newline is escaped in messages, not printed raw.
  spit(path, st_file(R"({"a\u0000b\nc":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", two));
  const auto m = io_error_of([&] { (void)locus::io::load<locus::cpu>(path); });
  CHECK(has(m, R"('a\x00b\x0Ac')"));
  CHECK(m.find('\0') == std::string::npos);
  fs::remove(path);
}

TEST_CASE("hostile safetensors: header lengths and data sections that do not fit the file are io_errors") {
  const auto path = temp_file("layout.safetensors");
  const std::string two = f32_bytes({1.0f, 2.0f});
  const std::string header = "{" + good_w + "}";
  // Header length 0, longer than the file, 2^60, 2^64 - 1.
  spit(path, le64(0) + header + two);
  CHECK(has(io_error_of([&] { (void)locus::io::load<locus::cpu>(path); }), "header length is 0"));
  for (std::uint64_t n : {std::uint64_t{header.size() + 9}, std::uint64_t{1} << 60, ~std::uint64_t{0}}) {
    CAPTURE(n);
    spit(path, le64(n) + header + two);
    within_memory(1 << 20, [&] {
      CHECK(has(io_error_of([&] { (void)locus::io::load<locus::cpu>(path); }),
                "header claims " + std::to_string(n) + " bytes but only"));
    });
  }
  for (const auto& [file, what] : {
           std::pair{st_file(header, two.substr(0, 7)), "spans bytes [0, 8) of a 7-byte data section"},
           std::pair{st_file(header, two + "x"), "the last 1 bytes of its 9-byte data section belong to no tensor"},
           std::pair{st_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", two),
                     "bytes [0, 4) of the data section belong to no tensor"},
           std::pair{st_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                             two),
                     "bytes [2, 4) of the data section belong to no tensor"},
           std::pair{st_file(R"({"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]},)"
                             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                             two),
                     "overlap"},
           std::pair{st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", two), "spans bytes [8, 0)"},
           std::pair{st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})", two),
                     "spans bytes [0, 18446744073709551615)"},
           std::pair{st_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", two),
                     "shape too large"},
           std::pair{std::string("\x05\x00\x00", 3), "3 bytes, too short"},
       }) {
    const std::string case_text = what;
    CAPTURE(case_text);
    spit(path, file);
    within_memory(1 << 20, [&] { CHECK(has(io_error_of([&] { (void)locus::io::load<locus::cpu>(path); }), case_text)); });
  }
  // An empty tensor may sit anywhere inside the data section, an empty file of tensors
  // is fine, and a header padded with spaces (as locus writes it) too.
  spit(path, st_file(R"({"e":{"dtype":"F32","shape":[0,3],"data_offsets":[8,8]},)" + good_w + "}   ", two));
  {
    const auto a = locus::io::load<locus::cpu>(path);
    CHECK(a.get<float, 2>("e").numel() == 0);
    CHECK(a.get<float, 1>("w")(0) == 1.0f);
  }
  spit(path, st_file(R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[9,9]},)" + good_w + "}", two));
  CHECK(has(io_error_of([&] { (void)locus::io::load<locus::cpu>(path); }), "spans bytes [9, 9) of a 8-byte"));
  spit(path, st_file("{}", ""));
  CHECK(locus::io::load<locus::cpu>(path).entries().empty());
  fs::remove(path);
}

// ---- safetensors: files that are not regular -----------------------------------------------

TEST_CASE("hostile safetensors: a FIFO is read as it arrives, and its claims size nothing") {
  const auto path = temp_file("fifo.safetensors");
  const std::string two = f32_bytes({1.0f, 2.0f});
  {  // a valid file through a pipe loads
    fifo f(path, st_file(R"({"__metadata__":{"epoch":"3"},)" + good_w + "}", two));
    const auto a = locus::io::load<locus::cpu>(f.path());
    CHECK(a.get<float, 1>("w")(1) == 2.0f);
    CHECK(a.metadata("epoch") == "3");
  }
  // A 16 GiB tensor and a 2^60-byte one announced, 8 bytes sent.
  for (const std::string claim : {"17179869184", "1152921504606846976"}) {
    CAPTURE(claim);
    fifo f(path, st_file(R"({"w":{"dtype":"U8","shape":[)" + claim + R"(],"data_offsets":[0,)" + claim + "]}}", two));
    within_memory(1 << 20, [&] {
      const auto m = io_error_of([&] { (void)locus::io::load<locus::cpu>(f.path()); });
      CHECK(has(m, "truncated: its tensors need a " + claim + "-byte data section but only 8 bytes follow"));
    });
  }
  {  // a 16 GiB header announced, 10 bytes sent
    fifo f(path, le64(std::uint64_t{1} << 34) + "{\"a\":\"b\"}");
    const auto m = io_error_of([&] { (void)locus::io::load<locus::cpu>(f.path()); });
    CHECK(has(m, "header claims 17179869184 bytes, more than the 100000000"));
  }
  {  // 50 MB of header announced, 9 bytes sent
    fifo f(path, le64(50'000'000) + "{\"a\":\"b\"}");
    within_memory(1 << 20, [&] {
      CHECK(has(io_error_of([&] { (void)locus::io::load<locus::cpu>(f.path()); }),
                "header claims 50000000 bytes but only 9 follow"));
    });
  }
  {  // bytes after the data section
    fifo f(path, st_file("{" + good_w + "}", two + "zz"));
    CHECK(has(io_error_of([&] { (void)locus::io::load<locus::cpu>(f.path()); }), "bytes follow the 8-byte data section"));
  }
}

TEST_CASE("hostile safetensors: devices and directories are io_errors") {
  CHECK(has(io_error_of([] { (void)locus::io::load<locus::cpu>("/dev/zero"); }), "header length is 0"));
  CHECK(has(io_error_of([] { (void)locus::io::load<locus::cpu>("/dev/null"); }), "0 bytes, too short"));
  const auto dir = temp_file("dir");
  fs::create_directories(dir);
  CHECK(has(io_error_of([&] { (void)locus::io::load<locus::cpu>(dir); }), dir.string()));
  fs::remove(dir);
  CHECK(has(io_error_of([] { (void)locus::io::load<locus::cpu>("/nonexistent/x.safetensors"); }), "cannot open"));
}

TEST_CASE("safetensors: members of a temporary archive that would return references return values") {
  const auto path = temp_file("temporary.safetensors");
  spit(path, st_file(R"({"__metadata__":{"k":"v"},)" + good_w + "}", f32_bytes({1.0f, 2.0f})));
  // Each binds a temporary's member to a name: safe only because && gives values.
  const auto& meta = locus::io::load<locus::cpu>(path).metadata();
  const auto& entries = locus::io::load<locus::cpu>(path).entries();
  const auto& info = locus::io::load<locus::cpu>(path).info("w");
  const auto& where = locus::io::load<locus::cpu>(path).path();
  static_assert(!std::is_reference_v<decltype(locus::io::load<locus::cpu>(path).metadata())>);
  static_assert(!std::is_reference_v<decltype(locus::io::load<locus::cpu>(path).info("w"))>);
  CHECK(meta.at("k") == "v");
  CHECK(entries.at("w").shape == std::vector<locus::index_t>{2});
  CHECK(info.bytes == 8);
  CHECK(where == path.string());
  fs::remove(path);
}

// ---- IDX -----------------------------------------------------------------------------------

TEST_CASE("hostile IDX: bytes after the gzip stream are an io_error, another gzip member is not") {
  const auto path = temp_file("trail.gz");
  const std::string idx = idx_u8({3}, "\x01\x02\x03");
  const std::string gz = gzip_bytes(idx);
  for (const auto& [tail, what] : {std::pair{std::string("garbage"), "g"}, std::pair{std::string(1, '\0'), "NUL"},
                                   std::pair{std::string(1, '\x1f'), "half a gzip magic"},
                                   std::pair{std::string(4096, '\0'), "zero padding"}}) {
    const std::string case_text = what;
    CAPTURE(case_text);
    spit(path, gz + tail);
    const auto m = io_error_of([&] { (void)locus::data::read_idx<std::uint8_t, 1>(path); });
    CHECK(has(m, "bytes after the end of its gzip stream"));
    CHECK(has(m, path.string()));
  }
  // gzip allows several members (cat a.gz b.gz): they read as one stream.
  spit(path, gzip_bytes(idx.substr(0, 5)) + gzip_bytes(idx.substr(5)) + gzip_bytes(""));
  const auto t = locus::data::read_idx<std::uint8_t, 1>(path);
  REQUIRE(t.numel() == 3);
  CHECK(t(2) == 3);
  // A second member that is itself broken is a corrupt stream.
  std::string bad = gzip_bytes("x");
  bad[bad.size() - 8] ^= 0x55;  // its CRC
  spit(path, gz + bad);
  CHECK(has(io_error_of([&] { (void)locus::data::read_idx<std::uint8_t, 1>(path); }), "corrupt gzip stream"));
  fs::remove(path);
}

TEST_CASE("hostile IDX: a FIFO claiming 16 GiB or 2^60 bytes is an io_error with nothing allocated") {
  const auto path = temp_file("fifo-idx");
  for (const auto& dims : {std::vector<std::uint32_t>{4, 1u << 30, 4}, std::vector<std::uint32_t>{1u << 30, 1u << 30}}) {
    for (bool gz : {false, true}) {
      CAPTURE(gz);
      const std::string bytes = idx_u8(dims, "abcdefgh");
      fifo f(path, gz ? gzip_bytes(bytes) : bytes);
      within_memory(1 << 20, [&] {
        const auto m = dims.size() == 3
                           ? io_error_of([&] { (void)locus::data::read_idx<std::uint8_t, 3>(f.path()); })
                           : io_error_of([&] { (void)locus::data::read_idx<std::uint8_t, 2>(f.path()); });
        CHECK(has(m, "truncated"));
        CHECK(has(m, "found only 8"));
      });
    }
  }
  for (bool gz : {false, true}) {  // a valid file through a pipe loads
    CAPTURE(gz);
    const std::string bytes = idx_u8({2, 2}, "\x05\x06\x07\x08");
    fifo f(path, gz ? gzip_bytes(bytes) : bytes);
    const auto t = locus::data::read_idx<std::uint8_t, 2>(f.path());
    CHECK(t(1, 0) == 7);
  }
  CHECK(has(io_error_of([] { (void)locus::data::read_idx<std::uint8_t, 1>("/dev/zero"); }), "not an IDX file"));
  CHECK(has(io_error_of([] { (void)locus::data::read_idx<std::uint8_t, 1>("/dev/null"); }), "truncated"));
}

// ---- checkpoint metadata -----------------------------------------------------------------

TEST_CASE("hostile checkpoints: metadata numbers are decimal digits, names are the trainer's") {
  nn::sequential model(nn::linear<locus::cpu, P32>(4, 2), nn::dropout<locus::cpu, P32>(0.5f, 3),
                       nn::linear<locus::cpu, P32>(2, 2));
  model.reset_parameters(3);
  locus::optim::adamw<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, nn::cross_entropy{});
  auto x = locus::rand<float, locus::cpu>({8, 4}, 3);
  auto y = locus::zeros<std::int64_t, locus::cpu>({8});
  t.step(x, y);
  const auto path = temp_file("meta.safetensors");
  locus::train::save_checkpoint(path, t, 5);
  const std::string saved = slurp(path);
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t{static_cast<unsigned char>(saved[static_cast<std::size_t>(i)])} << (8 * i);
  const auto header = nlohmann::json::parse(saved.substr(8, n));
  REQUIRE(header["__metadata__"].contains("rng.1"));
  const std::string data = saved.substr(8 + n);
  t.step(x, y);
  const auto steps = t.micro_steps();
  const double lr = opt.lr();
  for (const auto& [key, value, what] : {
           std::tuple{"epoch", " 5", "'epoch' is ' 5', not a number"},
           std::tuple{"epoch", "5 ", "'epoch' is '5 ', not a number"},
           std::tuple{"epoch", "+5", "'epoch' is '+5', not a number"},
           std::tuple{"epoch", "5e0", "'epoch' is '5e0', not a number"},
           std::tuple{"epoch", "0x5", "'epoch' is '0x5', not a number"},
           std::tuple{"epoch", "", "'epoch' is '', not a number"},
           std::tuple{"epoch", "-", "'epoch' is '-', not a number"},
           std::tuple{"epoch", "-0", "'epoch' is -0, expected a count in [0, 2^62]"},
           std::tuple{"micro_steps", "99999999999999999999999", "expected a count in [0, 2^62]"},
           std::tuple{"optimizer_steps", "4611686018427387905", "expected a count in [0, 2^62]"},
           std::tuple{"rng.1", "-5", "'rng.1' is '-5', expected an RNG counter"},
           std::tuple{"rng.1", " 1", "'rng.1' is ' 1', expected an RNG counter"},
           std::tuple{"rng.1", "18446744073709551616", "expected an RNG counter"},
           std::tuple{"seed", "banana", "'seed' is 'banana'"},
           std::tuple{"lr", " 0.001", "'lr' is ' 0.001', not a number"},
           std::tuple{"lr", "+0.001", "not a number"},
           std::tuple{"lr", "0x1p-10", "not a number"},
           std::tuple{"lr", "nan", "not a finite number"},
           std::tuple{"base_lr", "inf", "not a finite number"},
           std::tuple{"policy", "fp16", "saved with policy 'fp16' but this trainer's policy is 'fp32'"},
           std::tuple{"policy", "fp32 ", "policy 'fp32 '"},
           std::tuple{"optimizer", "sgd", "saved with optimizer 'sgd' but this trainer's optimizer is 'adamw'"},
           std::tuple{"optimizer", "adamw\n", R"(optimizer 'adamw\x0A')"},
           std::tuple{"format", "locus-checkpoint-3", "format 'locus-checkpoint-3'"},
       }) {
    const std::string case_text = std::string(key) + " = '" + value + "'";
    CAPTURE(case_text);
    auto h = header;
    h["__metadata__"][key] = value;
    locus_test::resign(h);  // past the header's checksum, to the parser's own checks
    spit(path, st_file(h.dump(), data));
    const auto before = std::vector<float>(std::as_const(model.parameters()).master().data_handle(),
                                           std::as_const(model.parameters()).master().data_handle() +
                                               model.parameters().size());
    const auto m = io_error_of([&] { (void)locus::train::resume(path, t); });
    CHECK(has(m, what));
    CHECK(has(m, path.string()));
    const auto after = std::as_const(model.parameters()).master();
    CHECK(std::equal(before.begin(), before.end(), after.data_handle()));  // a failed load changes nothing
    CHECK(t.micro_steps() == steps);
    CHECK(opt.lr() == lr);
  }
  // The saved file itself, and the largest values each field takes, load.
  auto h = header;
  h["__metadata__"]["rng.1"] = "18446744073709551615";
  h["__metadata__"]["epoch"] = "4611686018427387904";
  h["__metadata__"]["lr"] = "1e-3";
  locus_test::resign(h);
  spit(path, st_file(h.dump(), data));
  CHECK(locus::train::resume(path, t) == (std::int64_t{1} << 62));
  CHECK(model.get<1>().counter() == 18446744073709551615u);
  spit(path, saved);
  CHECK(locus::train::resume(path, t) == 5);
  fs::remove(path);
}
