// Host suite: IDX files (plain and gzip, good and broken), idx_dataset, the real
// Fashion-MNIST files, and data::loader on cpu and pinned (order, shards, prefetch
// memory bound, errors from the background thread). The cuda loader and the
// asynchronous copies are in tests/cuda/test_async.cu (they need a GPU).
#include <doctest/doctest.h>

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <ranges>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <locus/locus.hpp>
#include <locus/data/idx.hpp>
#include <locus/data/loader.hpp>

#include "host_devices.hpp"

namespace fs = std::filesystem;

namespace {

using bytes = std::vector<unsigned char>;

/// A fresh directory per test process, removed at exit.
struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("locus_test_data_" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};
const fs::path& tmp() {
  static temp_dir d;
  return d.path;
}

void put_be32(bytes& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
}

/// An IDX image: magic, extents, then the elements big-endian.
template <class T>
bytes idx_bytes(unsigned code, const std::vector<std::uint32_t>& dims, const std::vector<T>& values) {
  bytes b = {0, 0, static_cast<unsigned char>(code), static_cast<unsigned char>(dims.size())};
  for (auto d : dims) put_be32(b, d);
  for (const T& v : values) {
    unsigned char raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    for (std::size_t k = sizeof(T); k-- > 0;) b.push_back(raw[k]);  // little-endian host
  }
  return b;
}

fs::path write_plain(const std::string& name, const bytes& b) {
  const fs::path p = tmp() / name;
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  return p;
}

bytes gzip(const bytes& b) {
  const fs::path p = tmp() / "gzip_scratch.gz";
  gzFile g = gzopen(p.string().c_str(), "wb");
  REQUIRE(g != nullptr);
  if (!b.empty()) REQUIRE(gzwrite(g, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  REQUIRE(gzclose(g) == Z_OK);
  std::ifstream f(p, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(f), {});
}

fs::path write_gz(const std::string& name, const bytes& b) { return write_plain(name, gzip(b)); }

std::span<const std::byte> as_span(const bytes& b) { return std::as_bytes(std::span(b)); }

template <class F>
std::string io_error_text(F&& f) {
  try {
    f();
  } catch (const locus::io_error& e) {
    return e.what();
  }
  FAIL("expected locus::io_error");
  return {};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// A synthetic dataset for the loader: sample i has features() copies of float(i)
/// and label i. Optionally throws at one index (the background-thread error seam).
struct counting_source {
  locus::index_t n = 0;
  locus::index_t f = 3;
  locus::index_t throw_at = -1;
  locus::index_t size() const { return n; }
  locus::index_t features() const { return f; }
  std::int64_t load(locus::index_t i, std::span<float> x) const {
    if (i == throw_at) throw std::runtime_error("sample " + std::to_string(i) + " is unreadable");
    for (auto& v : x) v = static_cast<float>(i);
    return i;
  }
};

template <class D, class S>
std::vector<std::int64_t> all_labels(locus::data::loader<D, S>& l) {
  std::vector<std::int64_t> out;
  for (auto& [x, y] : l) {
    auto hy = locus::to<locus::cpu>(y);
    for (auto v : hy.span()) out.push_back(v);
  }
  return out;
}

}  // namespace

// ---- read_idx -------------------------------------------------------------------------

TEST_CASE("read_idx reads every supported element type from plain and gzip files") {
  const std::vector<std::uint8_t> u8v = {0, 1, 2, 127, 128, 255};
  const std::vector<std::int32_t> i32v = {-2147483647 - 1, -1, 0, 1, 0x01020304, 2147483647};
  const std::vector<float> f32v = {-1.5f, 0.0f, 3.25f, 1e-30f, -7e20f, 0.1f};
  const std::vector<double> f64v = {-1.5, 0.1, 1e300};
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    auto write = [&](const std::string& n, const bytes& b) { return gz ? write_gz(n + ".gz", b) : write_plain(n, b); };
    auto a = locus::data::read_idx<std::uint8_t, 3>(write("u8", idx_bytes(0x08, {1, 2, 3}, u8v)));
    static_assert(std::is_same_v<decltype(a), locus::tensor<std::uint8_t, locus::cpu, 3>>);
    CHECK(a.shape() == locus::extents<3>{1, 2, 3});
    CHECK(std::equal(u8v.begin(), u8v.end(), a.span().begin()));
    CHECK(a(0, 1, 2) == 255);

    auto b = locus::data::read_idx<std::int32_t, 1>(write("i32", idx_bytes(0x0C, {6}, i32v)));
    CHECK(std::equal(i32v.begin(), i32v.end(), b.span().begin(), b.span().end()));

    auto c = locus::data::read_idx<float, 2>(write("f32", idx_bytes(0x0D, {3, 2}, f32v)));
    CHECK(c.shape() == locus::extents<2>{3, 2});
    CHECK(std::equal(f32v.begin(), f32v.end(), c.span().begin(), c.span().end()));

    auto d = locus::data::read_idx<double, 1>(write("f64", idx_bytes(0x0E, {3}, f64v)));
    CHECK(std::equal(f64v.begin(), f64v.end(), d.span().begin(), d.span().end()));
  }
  // The same parser over a buffer.
  auto m = locus::data::read_idx_from_memory<std::int32_t, 1>(as_span(idx_bytes(0x0C, {6}, i32v)));
  CHECK(std::equal(i32v.begin(), i32v.end(), m.span().begin(), m.span().end()));
}

TEST_CASE("read_idx of a zero extent gives an empty tensor of the announced shape") {
  auto t = locus::data::read_idx<std::uint8_t, 3>(write_plain("empty", idx_bytes<std::uint8_t>(0x08, {0, 28, 28}, {})));
  CHECK(t.shape() == locus::extents<3>{0, 28, 28});
  CHECK(t.empty());
}

TEST_CASE("read_idx of a missing file is io_error naming the file") {
  const auto p = tmp() / "does-not-exist-idx1-ubyte.gz";
  const auto msg = io_error_text([&] { (void)locus::data::read_idx<std::uint8_t, 1>(p); });
  CHECK(contains(msg, p.string()));
  CHECK(contains(msg, "cannot open"));
  CHECK(contains(msg, "No such file"));
}

TEST_CASE("read_idx of a wrong magic number is io_error naming file and expected magic") {
  bytes b = idx_bytes<std::uint8_t>(0x08, {2}, {1, 2});
  b[0] = 0x1f;  // not two zero bytes
  for (bool gz : {false, true}) {
    const auto p = gz ? write_gz("magic.gz", b) : write_plain("magic", b);
    const auto msg = io_error_text([&] { (void)locus::data::read_idx<std::uint8_t, 1>(p); });
    CHECK(contains(msg, p.string()));
    CHECK(contains(msg, "not an IDX file"));
    CHECK(contains(msg, "0x1F000801"));
    CHECK(contains(msg, "expected 0x00000801"));
  }
  b = idx_bytes<std::uint8_t>(0x08, {2}, {1, 2});
  b[2] = 0x07;  // no such type code
  CHECK(contains(io_error_text([&] { (void)locus::data::read_idx_from_memory<std::uint8_t, 1>(as_span(b), "x.idx"); }),
                 "'x.idx' is not an IDX file"));
  // Text is not IDX either (an HTML error page saved under the right name).
  const std::string html = "<html>404</html>";
  const bytes h(html.begin(), html.end());
  CHECK(contains(io_error_text([&] { (void)locus::data::read_idx_from_memory<std::uint8_t, 3>(as_span(h)); }),
                 "not an IDX file"));
}

TEST_CASE("read_idx of another element type or rank is io_error saying which") {
  const auto p = write_plain("i32-rank2", idx_bytes<std::int32_t>(0x0C, {1, 2}, {5, 6}));
  auto msg = io_error_text([&] { (void)locus::data::read_idx<std::uint8_t, 2>(p); });
  CHECK(contains(msg, p.string()));
  CHECK(contains(msg, "holds i32 elements"));
  CHECK(contains(msg, "expected u8"));
  msg = io_error_text([&] { (void)locus::data::read_idx<std::int32_t, 3>(p); });
  CHECK(contains(msg, "holds a rank-2 array, expected rank 3"));
  CHECK_NOTHROW((void)locus::data::read_idx<std::int32_t, 2>(p));
  // i8 and i16 exist in IDX but not in locus.
  msg = io_error_text([&] {
    (void)locus::data::read_idx_from_memory<std::uint8_t, 1>(as_span(idx_bytes<std::int16_t>(0x0B, {1}, {7})));
  });
  CHECK(contains(msg, "holds i16 elements"));
}

TEST_CASE("read_idx of a truncated file is io_error at every cut point") {
  const bytes full = idx_bytes<std::int32_t>(0x0C, {2, 3}, {1, 2, 3, 4, 5, 6});
  REQUIRE_NOTHROW((void)locus::data::read_idx_from_memory<std::int32_t, 2>(as_span(full)));
  for (std::size_t cut = 0; cut < full.size(); ++cut) {
    CAPTURE(cut);
    const bytes part(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(cut));
    const auto msg = io_error_text(
        [&] { (void)locus::data::read_idx_from_memory<std::int32_t, 2>(as_span(part), "cut.idx"); });
    CHECK(contains(msg, "'cut.idx' is truncated"));
  }
  // Through files too, plain and gzip-compressed (the data cut short, then compressed).
  const bytes part(full.begin(), full.end() - 5);
  for (bool gz : {false, true}) {
    const auto p = gz ? write_gz("cut.gz", part) : write_plain("cut", part);
    const auto msg = io_error_text([&] { (void)locus::data::read_idx<std::int32_t, 2>(p); });
    CHECK(contains(msg, p.string()));
    CHECK(contains(msg, "truncated"));
    // A plain file's size is known up front; a gzip file's only when it ends.
    CHECK(contains(msg, gz ? "expected 24 bytes of data for shape [2, 3], found only 19"
                           : "announces shape [2, 3] of i32 (24 bytes of data), but only 19 bytes follow"));
  }
}

TEST_CASE("read_idx of a gzip stream cut short is io_error") {
  bytes big(5000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<unsigned char>((i * 7919u) >> 3);
  const bytes gz = gzip(idx_bytes(0x08, {5000}, std::vector<std::uint8_t>(big.begin(), big.end())));
  for (std::size_t keep : {std::size_t{12}, gz.size() / 2, gz.size() - 4}) {
    CAPTURE(keep);
    const auto p = write_plain("gzcut.gz", bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(keep)));
    const auto msg = io_error_text([&] { (void)locus::data::read_idx<std::uint8_t, 1>(p); });
    CHECK(contains(msg, p.string()));
    CHECK(contains(msg, "truncated"));
  }
}

TEST_CASE("read_idx of a corrupt gzip stream is io_error naming zlib's reason") {
  const bytes plain = idx_bytes(0x08, {64}, std::vector<std::uint8_t>(64, 42));
  bytes gz = gzip(plain);
  // The CRC-32 in the trailer no longer matches the data.
  bytes bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 0xFF;
  auto p = write_plain("crc.gz", bad_crc);
  auto msg = io_error_text([&] { (void)locus::data::read_idx<std::uint8_t, 1>(p); });
  CHECK(contains(msg, p.string()));
  CHECK(contains(msg, "corrupt gzip stream"));
  CHECK(contains(msg, "incorrect data check"));
  // Garbage inside the deflate data: some error, never a crash or a silent success.
  for (std::size_t at = 10; at + 8 < gz.size(); ++at) {
    bytes bad = gz;
    bad[at] ^= 0x5A;
    p = write_plain("flip.gz", bad);
    CAPTURE(at);
    try {
      auto t = locus::data::read_idx<std::uint8_t, 1>(p);
      // A flip may still inflate to the same bytes (e.g. in unused bits): then the
      // data must be right.
      CHECK(std::equal(t.span().begin(), t.span().end(), plain.begin() + 8));
    } catch (const locus::io_error& e) {
      CHECK(contains(e.what(), p.string()));
    }
  }
}

TEST_CASE("read_idx of a file with bytes after its data is io_error") {
  bytes b = idx_bytes<std::uint8_t>(0x08, {2}, {1, 2});
  b.push_back(3);
  const auto msg = io_error_text([&] { (void)locus::data::read_idx<std::uint8_t, 1>(write_plain("long", b)); });
  CHECK(contains(msg, "has bytes after the 2 bytes of data"));
}

TEST_CASE("read_idx refuses a header announcing more data than the file holds before allocating") {
  locus::reset_peak_memory_stats<locus::cpu>();
  const auto before = locus::memory_stats<locus::cpu>().peak_allocated_bytes;
  bytes b = {0, 0, 0x08, 3};  // 8.6 GB of u8 announced, 1 byte present
  for (std::uint32_t d : {0xFFFFFFFFu, 2u, 1u}) put_be32(b, d);
  b.push_back(1);
  CHECK(contains(io_error_text([&] { (void)locus::data::read_idx<std::uint8_t, 3>(write_plain("huge", b)); }),
                 "(8589934590 bytes of data), but only 1 bytes follow"));
  CHECK(contains(io_error_text([&] { (void)locus::data::read_idx<std::uint8_t, 3>(write_gz("huge.gz", b)); }),
                 "gzip file cannot hold"));
  bytes c = {0, 0, 0x0E, 1};
  put_be32(c, 1000);  // 8000 bytes of f64 announced, 3 present
  c.insert(c.end(), {1, 2, 3});
  CHECK(contains(io_error_text([&] { (void)locus::data::read_idx_from_memory<double, 1>(as_span(c)); }),
                 "only 3 bytes follow"));
  // Extents whose product does not even fit in 64 bits.
  bytes o = {0, 0, 0x08, 3};
  for (int k = 0; k < 3; ++k) put_be32(o, 0xFFFFFFFFu);
  CHECK(contains(io_error_text([&] { (void)locus::data::read_idx_from_memory<std::uint8_t, 3>(as_span(o)); }),
                 "more than 2^62 bytes"));
  CHECK(locus::memory_stats<locus::cpu>().peak_allocated_bytes == before);
}

TEST_CASE("read_idx of a zero extent next to huge ones neither overflows nor allocates") {
  // Found by tests/fuzz/fuzz_idx.cpp: the element count of such a shape, multiplied
  // left to right, overflowed before reaching the zero.
  bytes b = {0, 0, 0x0E, 4};
  for (std::uint32_t d : {0xFFFF0100u, 0x03000D02u, 0x000D0204u, 0u}) put_be32(b, d);
  CHECK(contains(io_error_text([&] { (void)locus::data::read_idx_from_memory<double, 4>(as_span(b)); }),
                 "more than 2^62 bytes"));
  bytes z = {0, 0, 0x08, 3};
  for (std::uint32_t d : {0xFFFFFFFFu, 0xFFFFu, 0u}) put_be32(z, d);
  auto t = locus::data::read_idx_from_memory<std::uint8_t, 3>(as_span(z));
  CHECK(t.shape() == locus::extents<3>{0xFFFFFFFF, 0xFFFF, 0});
  CHECK(t.empty());
}

// ---- idx_dataset ------------------------------------------------------------------------

TEST_CASE("idx_dataset pairs images with labels as u8 or x/255 floats and i64 labels") {
  std::vector<std::uint8_t> px(3 * 2 * 2);
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>(i * 23);
  const auto img = write_gz("ds-images.gz", idx_bytes(0x08, {3, 2, 2}, px));
  const auto lab = write_plain("ds-labels", idx_bytes<std::uint8_t>(0x08, {3}, {7, 0, 9}));
  locus::data::idx_dataset ds(img, lab);
  CHECK(ds.size() == 3);
  CHECK(ds.rows() == 2);
  CHECK(ds.cols() == 2);
  CHECK(ds.features() == 4);
  static_assert(std::is_same_v<decltype(ds.images()), locus::tensor_view<const std::uint8_t, locus::cpu, 3>>);
  static_assert(std::is_same_v<decltype(ds.labels()), locus::tensor_view<const std::int64_t, locus::cpu, 1>>);
  CHECK(ds.images()(2, 1, 1) == px[11]);
  auto f = ds.images_normalized();
  static_assert(std::is_same_v<decltype(f), locus::tensor<float, locus::cpu, 3>>);
  for (std::size_t i = 0; i < px.size(); ++i) CHECK(f.span()[i] == static_cast<float>(px[i]) / 255.0f);
  CHECK(ds.labels()(0) == 7);
  CHECK(ds.labels()(2) == 9);
  std::vector<float> x(4);
  CHECK(ds.load(1, x) == 0);
  CHECK(x[3] == static_cast<float>(px[7]) / 255.0f);
  CHECK_THROWS_AS((void)ds.load(3, x), locus::index_error);
}

TEST_CASE("idx_dataset of image and label files with different counts is io_error naming both") {
  const auto img = write_plain("n3-images", idx_bytes(0x08, {3, 1, 1}, std::vector<std::uint8_t>{1, 2, 3}));
  const auto lab = write_plain("n2-labels", idx_bytes<std::uint8_t>(0x08, {2}, {0, 1}));
  const auto msg = io_error_text([&] { locus::data::idx_dataset ds(img, lab); });
  CHECK(contains(msg, img.string()));
  CHECK(contains(msg, lab.string()));
  CHECK(contains(msg, "holds 3 images"));
  CHECK(contains(msg, "holds 2 labels"));
  // A labels file given as the images file: rank 1 where rank 3 is expected.
  CHECK(contains(io_error_text([&] { locus::data::idx_dataset ds(lab, lab); }), "expected rank 3"));
}

// ---- the real Fashion-MNIST files ---------------------------------------------------------

namespace {

fs::path fashion_dir() {
  if (const char* d = std::getenv("LOCUS_FASHION_MNIST_DIR")) return d;
  return "/usr/share/datasets/fashion-mnist";
}

/// The first `n` decompressed bytes of a gzip file, decoded here with zlib's inflate
/// (not with read_idx), to check the reader against.
bytes inflate_prefix(const fs::path& p, std::size_t n) {
  std::ifstream f(p, std::ios::binary);
  const bytes in((std::istreambuf_iterator<char>(f)), {});
  bytes out(n);
  z_stream z{};
  REQUIRE(inflateInit2(&z, 16 + MAX_WBITS) == Z_OK);
  z.next_in = const_cast<unsigned char*>(in.data());
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(n);
  const int rc = inflate(&z, Z_SYNC_FLUSH);
  inflateEnd(&z);
  REQUIRE((rc == Z_OK || rc == Z_STREAM_END));
  REQUIRE(z.avail_out == 0);
  return out;
}

std::uint32_t be32_at(const bytes& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) | (std::uint32_t{b[at + 2]} << 8) | b[at + 3];
}

}  // namespace

TEST_CASE("Fashion-MNIST: the installed files read as the independently decoded bytes") {
  const fs::path dir = fashion_dir();
  INFO("Fashion-MNIST is expected in " << dir.string()
       << " (Debian package dataset-fashion-mnist, installed by scripts/install-deps; or set LOCUS_FASHION_MNIST_DIR)");
  REQUIRE(fs::exists(dir / "train-labels-idx1-ubyte.gz"));

  // Labels of the training set: decoded independently first.
  const auto raw = inflate_prefix(dir / "train-labels-idx1-ubyte.gz", 8 + 100);
  CHECK(be32_at(raw, 0) == 0x00000801u);
  CHECK(be32_at(raw, 4) == 60000u);
  CHECK(raw[8] == 9);  // the first training image is an ankle boot (class 9)

  auto train_labels = locus::data::read_idx<std::uint8_t, 1>(dir / "train-labels-idx1-ubyte.gz");
  REQUIRE(train_labels.numel() == 60000);
  for (int i = 0; i < 100; ++i) CHECK(train_labels(i) == raw[8 + static_cast<std::size_t>(i)]);
  std::vector<int> per_class(10, 0);
  for (auto v : train_labels.span()) {
    REQUIRE(v < 10);
    ++per_class[v];
  }
  for (int c = 0; c < 10; ++c) CHECK(per_class[static_cast<std::size_t>(c)] == 6000);  // balanced classes

  // The test split as a dataset: counts, shape, and the first image byte for byte.
  auto test = locus::data::idx_dataset::from_directory(dir, "t10k");
  CHECK(test.size() == 10000);
  CHECK(test.rows() == 28);
  CHECK(test.cols() == 28);
  const auto img = inflate_prefix(dir / "t10k-images-idx3-ubyte.gz", 16 + 2 * 784);
  CHECK(be32_at(img, 0) == 0x00000803u);
  CHECK(be32_at(img, 4) == 10000u);
  CHECK(be32_at(img, 8) == 28u);
  CHECK(be32_at(img, 12) == 28u);
  const auto images = test.images();
  CHECK(std::equal(img.begin() + 16, img.end(), images.data(), images.data() + 2 * 784));
  const auto lab = inflate_prefix(dir / "t10k-labels-idx1-ubyte.gz", 8 + 10);
  for (int i = 0; i < 10; ++i) CHECK(test.labels()(i) == lab[8 + static_cast<std::size_t>(i)]);
  std::int64_t lo = 99, hi = -1;
  for (auto v : test.labels().span()) lo = std::min(lo, v), hi = std::max(hi, v);
  CHECK(lo == 0);
  CHECK(hi == 9);
}

// ---- loader ---------------------------------------------------------------------------------

static_assert(locus::data::SampleSource<locus::data::idx_dataset>);
static_assert(locus::data::SampleSource<counting_source>);
static_assert(std::ranges::input_range<locus::data::loader<locus::cpu, counting_source>>);

TEST_CASE_TEMPLATE("loader yields batches of the requested size in dataset order without shuffle", D,
                   LOCUS_TEST_DEVICES) {
  counting_source src{.n = 10, .f = 3};
  locus::data::loader<D, counting_source> l(src, {.batch_size = 4});
  CHECK(l.size() == 3);
  std::vector<locus::index_t> sizes;
  std::int64_t next = 0;
  for (auto& [x, y] : l) {
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(x)>, locus::tensor<float, D, 2>>);
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(y)>, locus::tensor<std::int64_t, D, 1>>);
    REQUIRE(x.extent(0) == y.extent(0));
    CHECK(x.extent(1) == 3);
    sizes.push_back(y.extent(0));
    for (locus::index_t k = 0; k < y.extent(0); ++k, ++next) {
      CHECK(y(k) == next);
      CHECK(x(k, 2) == static_cast<float>(next));
    }
  }
  CHECK(sizes == std::vector<locus::index_t>{4, 4, 2});

  locus::data::loader<D, counting_source> dropped(src, {.batch_size = 4, .drop_last = true});
  CHECK(dropped.size() == 2);
  CHECK(all_labels(dropped) == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("loader order is a function of seed and epoch only") {
  counting_source src{.n = 1000, .f = 1};
  auto order = [&](std::uint64_t seed, std::uint64_t epoch) {
    locus::data::loader<locus::cpu, counting_source> l(src, {.batch_size = 64, .shuffle = true, .seed = seed, .prefetch = 3});
    l.set_epoch(epoch);
    return all_labels(l);
  };
  const auto a = order(42, 0);
  std::vector<std::int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  CHECK(sorted == iota);  // a permutation
  CHECK(a != iota);
  CHECK(order(42, 0) == a);  // same seed, same order
  CHECK(order(43, 0) != a);  // another seed
  CHECK(order(42, 1) != a);  // another epoch
  CHECK(order(42, 1) == order(42, 1));

  // One loader, epochs re-shuffled by set_epoch and reproducible when revisited.
  locus::data::loader<locus_test::staging, counting_source> l(src, {.batch_size = 100, .shuffle = true, .seed = 42});
  const auto e0 = all_labels(l);
  CHECK(e0 == a);
  CHECK(all_labels(l) == a);  // no set_epoch: the same order again
  l.set_epoch(1);
  CHECK(all_labels(l) == order(42, 1));
  l.set_epoch(0);
  CHECK(all_labels(l) == a);
  CHECK(l.indices() == std::vector<locus::index_t>(a.begin(), a.end()));
}

TEST_CASE("loader order is pinned down: Fisher-Yates driven by philox4x32") {
  // The specified algorithm, so the order is the same on every platform: a golden
  // value guards it against accidental change.
  const auto order = locus::data::detail::epoch_order(10, true, 42, 0);
  std::vector<locus::index_t> expect(10);
  std::iota(expect.begin(), expect.end(), 0);
  for (locus::index_t i = 9; i > 0; --i) {
    const auto r = locus::detail::philox4x32(42, static_cast<std::uint64_t>(i), 0);
    const std::uint64_t u = (std::uint64_t{r.v[0]} << 32) | r.v[1];
    std::swap(expect[static_cast<std::size_t>(i)], expect[u % static_cast<std::uint64_t>(i + 1)]);
  }
  CHECK(order == expect);
  CHECK(order == std::vector<locus::index_t>{4, 1, 6, 3, 7, 9, 0, 5, 2, 8});
}

TEST_CASE("loader shards of N ranks partition the dataset exactly") {
  for (locus::index_t n : {0, 1, 10, 101, 1000}) {
    for (int world : {1, 2, 3, 4, 7}) {
      for (bool shuffle : {false, true}) {
        CAPTURE(n);
        CAPTURE(world);
        CAPTURE(shuffle);
        counting_source src{.n = n, .f = 1};
        std::vector<std::int64_t> seen;
        for (int r = 0; r < world; ++r) {
          locus::data::loader<locus::cpu, counting_source> l(
              src, {.batch_size = 8, .shuffle = shuffle, .seed = 7, .rank = r, .world_size = world});
          l.set_epoch(3);
          const auto mine = all_labels(l);
          // The first n % world ranks read one sample more.
          CHECK(static_cast<locus::index_t>(mine.size()) == n / world + (r < n % world ? 1 : 0));
          CHECK(static_cast<locus::index_t>(mine.size()) == l.shard_size());
          seen.insert(seen.end(), mine.begin(), mine.end());
        }
        std::sort(seen.begin(), seen.end());
        std::vector<std::int64_t> all(static_cast<std::size_t>(n));
        std::iota(all.begin(), all.end(), 0);
        CHECK(seen == all);  // every sample exactly once
      }
    }
  }
}

#if LOCUS_HAS_CUDA  // the pinned device exists only in builds with CUDA
TEST_CASE("loader prefetch depth bounds pinned memory") {
  // 64 samples of 1000 floats in batches of 4: 16 batches of ~16 KB. The loader may
  // hold `prefetch` prepared batches plus the one handed out, never the epoch.
  counting_source src{.n = 64, .f = 1000};
  const int depth = 2;
  const std::size_t batch_bytes =
      locus::detail::size_class(4 * 1000 * sizeof(float)) + locus::detail::size_class(4 * sizeof(std::int64_t));
  locus::empty_cache<locus::pinned>();
  const auto base = locus::memory_stats<locus::pinned>().allocated_bytes;
  locus::reset_peak_memory_stats<locus::pinned>();
  {
    locus::data::loader<locus::pinned, counting_source> l(src, {.batch_size = 4, .prefetch = depth});
    int batches = 0;
    for (auto& [x, y] : l) {
      (void)x;
      (void)y;
      if (batches++ == 0) {
        // Give the background thread time to fill its queue: it then holds `depth`.
        for (int w = 0; w < 200 && locus::memory_stats<locus::pinned>().allocated_bytes < base + (depth + 1) * batch_bytes; ++w)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        CHECK(locus::memory_stats<locus::pinned>().allocated_bytes == base + (depth + 1) * batch_bytes);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a slow consumer
    }
    CHECK(batches == 16);
  }
  const auto s = locus::memory_stats<locus::pinned>();
  CHECK(s.peak_allocated_bytes - base <= (depth + 1) * batch_bytes);
  CHECK(s.allocated_bytes == base);  // nothing left behind
}
#endif

TEST_CASE("loader prefetch depth bounds cpu memory") {
  // The same bound as for pinned memory, in every build: the loader may hold `prefetch`
  // prepared batches plus the one handed out, never the epoch. The cpu allocator
  // counts each allocation rounded up to 64 bytes (host_alignment) and caches nothing.
  counting_source src{.n = 64, .f = 1000};
  for (const int depth : {1, 2, 3}) {
    CAPTURE(depth);
    const std::size_t batch_bytes = locus::detail::round_up(4 * 1000 * sizeof(float), locus::detail::host_alignment) +
                                    locus::detail::round_up(4 * sizeof(std::int64_t), locus::detail::host_alignment);
    REQUIRE(batch_bytes == 16000 + 64);
    const auto base = locus::memory_stats<locus::cpu>().allocated_bytes;
    const std::size_t bound = base + static_cast<std::size_t>(depth + 1) * batch_bytes;
    locus::reset_peak_memory_stats<locus::cpu>();
    {
      locus::data::loader<locus::cpu, counting_source> l(src, {.batch_size = 4, .prefetch = depth});
      int batches = 0;
      std::size_t held_after_first = 0;
      for (auto& [x, y] : l) {
        (void)x;
        (void)y;
        if (batches++ == 0) {
          // Give the background thread time to fill its queue: it then holds `depth`.
          for (int w = 0; w < 200 && locus::memory_stats<locus::cpu>().allocated_bytes < bound; ++w)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          std::this_thread::sleep_for(std::chrono::milliseconds(20));  // and would it go on?
          held_after_first = locus::memory_stats<locus::cpu>().allocated_bytes;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a slow consumer
      }
      CHECK(batches == 16);
      CHECK(held_after_first == bound);  // exactly depth + 1 batches
    }
    const auto s = locus::memory_stats<locus::cpu>();
    CHECK(s.peak_allocated_bytes == bound);  // never more
    CHECK(s.allocated_bytes == base);        // nothing left behind
  }
}

TEST_CASE("loader rethrows an exception of the background thread with its message") {
  counting_source src{.n = 100, .f = 2, .throw_at = 37};
  locus::data::loader<locus::cpu, counting_source> l(src, {.batch_size = 8, .prefetch = 2});
  for (int attempt = 0; attempt < 2; ++attempt) {  // a new epoch fails the same way
    std::vector<std::int64_t> got;
    try {
      for (auto& [x, y] : l)
        for (auto v : y.span()) got.push_back(v);
      FAIL("expected the dataset's exception");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "sample 37 is unreadable");
    }
    // The four batches before the failing one (samples 32..39) were delivered first.
    CHECK(got.size() == 32);
  }
  // A failing first batch throws from begin().
  counting_source first{.n = 5, .f = 1, .throw_at = 0};
  locus::data::loader<locus::cpu, counting_source> l0(first, {.batch_size = 2});
  CHECK_THROWS_WITH_AS((void)l0.begin(), "sample 0 is unreadable", std::runtime_error);
}

TEST_CASE("loader can stop mid-epoch and start again") {
  counting_source src{.n = 50, .f = 4};
  locus::data::loader<locus_test::staging, counting_source> l(src, {.batch_size = 5, .shuffle = true, .seed = 1, .prefetch = 4});
  for (auto& [x, y] : l) {
    (void)x;
    (void)y;
    break;  // the background thread is blocked on a full queue
  }
  CHECK(all_labels(l).size() == 50);
  auto it = l.begin();
  ++it;
  // destroyed with an epoch in progress: must not hang or leak
}

TEST_CASE("loader: shard loaders on several threads while another thread reads the memory statistics") {
  // Concurrency coverage for ThreadSanitizer: four ranks, each a loader consumed on
  // its own thread (so four background threads allocate at once), while a fifth
  // thread reads and resets the cpu allocator's statistics; then a loader stopped
  // while its background thread is inside a slow load(). Each rank's batches must
  // still be right, and together the ranks must partition the dataset.
  counting_source src{.n = 203, .f = 8};
  const auto base = locus::memory_stats<locus::cpu>().allocated_bytes;
  std::atomic<bool> done{false};
  std::thread poller([&] {
    while (!done.load()) {
      const auto s = locus::memory_stats<locus::cpu>();
      (void)s;
      locus::reset_peak_memory_stats<locus::cpu>();
      std::this_thread::yield();
    }
  });
  constexpr int world = 4;
  std::vector<std::vector<std::int64_t>> labels(world);
  std::vector<int> bad_rows(world, 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      locus::data::loader<locus::cpu, counting_source> l(
          src, {.batch_size = 5, .shuffle = true, .seed = 11, .rank = r, .world_size = world, .prefetch = 2});
      for (std::uint64_t e = 0; e < 2; ++e) {
        l.set_epoch(e);
        labels[static_cast<std::size_t>(r)].clear();
        for (auto& [x, y] : l)
          for (locus::index_t k = 0; k < y.extent(0); ++k) {
            if (x(k, 7) != static_cast<float>(y(k))) ++bad_rows[static_cast<std::size_t>(r)];
            labels[static_cast<std::size_t>(r)].push_back(y(k));
          }
      }
    });
  for (auto& t : ranks) t.join();
  done = true;
  poller.join();
  std::vector<std::int64_t> all;
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(bad_rows[static_cast<std::size_t>(r)] == 0);
    all.insert(all.end(), labels[static_cast<std::size_t>(r)].begin(), labels[static_cast<std::size_t>(r)].end());
  }
  std::sort(all.begin(), all.end());
  std::vector<std::int64_t> expect(203);
  std::iota(expect.begin(), expect.end(), 0);
  CHECK(all == expect);
  CHECK(locus::memory_stats<locus::cpu>().allocated_bytes == base);

  // Stopped (by begin() and by the destructor) while load() is running.
  struct slow_source : counting_source {
    std::int64_t load(locus::index_t i, std::span<float> x) const {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      return counting_source::load(i, x);
    }
  };
  slow_source slow{{.n = 40, .f = 4}};
  for (int round = 0; round < 3; ++round) {
    locus::data::loader<locus::cpu, slow_source> l(slow, {.batch_size = 4, .prefetch = 2});
    auto it = l.begin();
    CHECK(it->y(0) == 0);
    ++it;
    CHECK(it->y(0) == 4);
    if (round == 1) {
      auto again = l.begin();  // stops the running epoch, starts a new one
      CHECK(again->y(0) == 0);
    }
  }
  CHECK(locus::memory_stats<locus::cpu>().allocated_bytes == base);
}

TEST_CASE("loader over an idx_dataset yields x/255 rows and labels") {
  std::vector<std::uint8_t> px(5 * 2 * 3);
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>(255 - i * 8);
  const auto img = write_plain("ld-images", idx_bytes(0x08, {5, 2, 3}, px));
  const auto lab = write_gz("ld-labels.gz", idx_bytes<std::uint8_t>(0x08, {5}, {4, 3, 2, 1, 0}));
  locus::data::idx_dataset ds(img, lab);
  locus::data::loader<locus::cpu> l(ds, {.batch_size = 2, .shuffle = true, .seed = 5});
  const auto order = l.indices();
  std::size_t pos = 0;
  for (auto& [x, y] : l) {
    CHECK(x.extent(1) == 6);
    for (locus::index_t k = 0; k < y.extent(0); ++k, ++pos) {
      const auto i = order[pos];
      CHECK(y(k) == 4 - i);
      for (locus::index_t j = 0; j < 6; ++j)
        CHECK(x(k, j) == static_cast<float>(px[static_cast<std::size_t>(i * 6 + j)]) / 255.0f);
    }
  }
  CHECK(pos == 5);
}

TEST_CASE("loader rejects bad options") {
  counting_source src{.n = 10};
  using L = locus::data::loader<locus::cpu, counting_source>;
  CHECK_THROWS_AS(L(src, {.batch_size = 0}), locus::error);
  CHECK_THROWS_AS(L(src, {.rank = 2, .world_size = 2}), locus::error);
  CHECK_THROWS_AS(L(src, {.rank = -1}), locus::error);
  CHECK_THROWS_AS(L(src, {.prefetch = 0}), locus::error);
}

TEST_CASE_TEMPLATE("tensor_dataset: a loader over in-memory tensors yields their rows and labels in the epoch's order",
                   D, LOCUS_TEST_DEVICES) {
  const locus::index_t n = 37, f = 5;
  locus::tensor<float, locus::cpu, 2> x(locus::extents<2>{n, f});
  locus::tensor<std::int64_t, locus::cpu, 1> y(locus::extents<1>{n});
  for (locus::index_t i = 0; i < n; ++i) {
    y(i) = (i * 7) % 10;
    for (locus::index_t j = 0; j < f; ++j) x(i, j) = static_cast<float>(i * 100 + j);
  }
  locus::data::tensor_dataset set(std::move(x), std::move(y));
  CHECK(set.size() == n);
  CHECK(set.features() == f);
  locus::data::loader<D, locus::data::tensor_dataset> l(set, {.batch_size = 8, .shuffle = true, .seed = 3});
  l.set_epoch(2);
  const auto order = locus::data::detail::epoch_order(n, true, 3, 2);
  std::size_t at = 0;
  int wrong = 0;
  for (auto& [xb, yb] : l) {
    const auto hx = locus::to<locus::cpu>(xb);
    const auto hy = locus::to<locus::cpu>(yb);
    for (locus::index_t k = 0; k < hy.extent(0); ++k, ++at) {
      const locus::index_t i = order[at];
      wrong += hy(k) != (i * 7) % 10;
      for (locus::index_t j = 0; j < f; ++j) wrong += hx(k, j) != static_cast<float>(i * 100 + j);
    }
  }
  CHECK(at == static_cast<std::size_t>(n));
  CHECK(wrong == 0);
}

TEST_CASE("tensor_dataset: a label count that is not the row count, and loads out of range, are errors") {
  locus::tensor<float, locus::cpu, 2> x(locus::extents<2>{4, 3});
  locus::tensor<std::int64_t, locus::cpu, 1> y(locus::extents<1>{5});
  CHECK_THROWS_WITH_AS(locus::data::tensor_dataset(std::move(x), std::move(y)),
                       "locus: tensor_dataset has 4 rows of features but 5 labels; give one label per row",
                       locus::shape_error);
  locus::data::tensor_dataset ok(locus::zeros<float, locus::cpu>({4, 3}), locus::zeros<std::int64_t, locus::cpu>({4}));
  std::vector<float> buf(3), small(2);
  CHECK(ok.load(3, buf) == 0);
  CHECK_THROWS_AS(ok.load(4, buf), locus::index_error);
  CHECK_THROWS_AS(ok.load(-1, buf), locus::index_error);
  CHECK_THROWS_AS(ok.load(0, small), locus::index_error);
  // empty: a loader of no batches
  locus::data::tensor_dataset empty(locus::zeros<float, locus::cpu>({0, 3}), locus::zeros<std::int64_t, locus::cpu>({0}));
  locus::data::loader<locus::cpu, locus::data::tensor_dataset> l(empty, {.batch_size = 4});
  CHECK(l.size() == 0);
  int batches = 0;
  for (auto& b : l) {
    (void)b;
    ++batches;
  }
  CHECK(batches == 0);
}
