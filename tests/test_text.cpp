// Host suite: text for character-level models (<locus/data/text.hpp>): the vocabulary of
// bytes and the ids, files and directories read in name order (fortune's .dat indexes
// and symbolic links left out), the deterministic split, random and in-order windows
// whose targets are the next tokens, and hostile input: a missing path, a binary file, an
// empty corpus, a context of zero or longer than the text.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <locus/data/text.hpp>

namespace {
namespace data = locus::data;
using locus::index_t;

struct temp_dir {
  std::filesystem::path path;
  explicit temp_dir(const char* name) : path(std::filesystem::temp_directory_path() / name) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path / name, std::ios::binary) << bytes;
  }
};

template <class F>
std::string what_of(F&& f) {
  try {
    f();
  } catch (const locus::error& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("text corpus: the vocabulary is the bytes it holds in byte order, and encode and decode invert each other") {
  const auto c = data::text_corpus::from_text("cab\nba");
  CHECK(c.vocabulary_size() == 4);  // '\n' < 'a' < 'b' < 'c'
  CHECK(c.symbol(0) == '\n');
  CHECK(c.symbol(3) == 'c');
  const std::vector<std::int64_t> want{3, 1, 2, 0, 2, 1};
  CHECK(std::vector<std::int64_t>(c.ids().begin(), c.ids().end()) == want);
  CHECK(c.decode(c.ids()) == "cab\nba");
  CHECK(c.encode("abc") == std::vector<std::int64_t>{1, 2, 3});
  CHECK(what_of([&] { (void)c.encode("abz"); }).find("byte 122 at offset 2") != std::string::npos);
  CHECK(what_of([&] { (void)c.decode(std::vector<std::int64_t>{4}); }).find("id 4 is outside") != std::string::npos);
  CHECK(what_of([&] { (void)c.decode(std::vector<std::int64_t>{-1}); }).find("id -1 is outside") != std::string::npos);
  // bytes above 127 (UTF-8) are tokens too
  const auto u = data::text_corpus::from_text("\xc3\xa9t\xc3\xa9");
  CHECK(u.vocabulary_size() == 3);
  CHECK(u.decode(u.ids()) == "\xc3\xa9t\xc3\xa9");
}

TEST_CASE("text corpus: a directory is read in name order without .dat files and symbolic links, and bad paths are refused") {
  temp_dir d("locus-test-text-corpus");
  d.write("b", "BB");
  d.write("a", "AA");
  d.write("a.dat", std::string("\0\1\2", 3));  // fortune's binary index: left out
  std::filesystem::create_symlink(d.path / "a", d.path / "a.u8");
  const auto c = data::text_corpus::from_path(d.path);
  CHECK(c.decode(c.ids()) == "AABB");
  CHECK(data::text_corpus::from_path(d.path / "b").size() == 2);
  // missing, binary, empty, a directory without text
  CHECK(what_of([&] { (void)data::text_corpus::from_path(d.path / "nothing"); }).find("does not exist") !=
        std::string::npos);
  CHECK(what_of([&] { (void)data::text_corpus::from_path("/no/such/fortunes"); }).find("package fortunes") !=
        std::string::npos);
  d.write("c", std::string("ok\0no", 5));
  CHECK(what_of([&] { (void)data::text_corpus::from_path(d.path / "c"); }).find("NUL byte at offset 2; it is not text") !=
        std::string::npos);
  CHECK(what_of([&] { (void)data::text_corpus::from_path(d.path); }).find("'" + (d.path / "c").string() + "'") !=
        std::string::npos);
  temp_dir e("locus-test-text-empty");
  e.write("empty", "");
  CHECK(what_of([&] { (void)data::text_corpus::from_path(e.path / "empty"); }).find("is empty") != std::string::npos);
  temp_dir f("locus-test-text-index-only");
  f.write("x.dat", "abc");
  CHECK(what_of([&] { (void)data::text_corpus::from_path(f.path); }).find("holds no text file") != std::string::npos);
  CHECK(what_of([&] { (void)data::text_corpus::from_text(std::string("a\0", 2)); }).find("NUL byte at offset 1") !=
        std::string::npos);
}

TEST_CASE("text corpus: the split keeps the order, and a fraction outside 0 to 1 (1 excluded) is refused") {
  std::string text;
  for (int i = 0; i < 100; ++i) text.push_back(static_cast<char>('a' + i % 26));
  const auto c = data::text_corpus::from_text(text);
  const auto [train, val] = c.split(0.1);
  CHECK(train.size() == 90);
  CHECK(val.size() == 10);
  CHECK(train.data() == c.ids().data());
  CHECK(val.data() == c.ids().data() + 90);
  CHECK(c.split(0.0).second.empty());
  for (const double bad : {1.0, -0.1, std::nan("")}) CHECK_THROWS_AS((void)c.split(bad), locus::value_error);
}

TEST_CASE("text windows: targets are the next tokens, the same seed gives the same batches, bad sizes are refused") {
  std::string text;
  for (int i = 0; i < 500; ++i) text.push_back(static_cast<char>(' ' + (i * 7) % 90));
  const auto c = data::text_corpus::from_text(text);
  const auto ids = c.ids();
  data::token_windows w(ids, 4, 16, 3), same(ids, 4, 16, 3), other(ids, 4, 16, 4);
  std::set<index_t> starts;
  bool differs = false;
  for (int n = 0; n < 20; ++n) {
    const auto b = w.next();
    const auto b2 = same.next();
    const auto b3 = other.next();
    REQUIRE(b.x.shape() == locus::extents<2>{4, 16});
    REQUIRE(b.y.shape() == locus::extents<1>{64});
    for (index_t r = 0; r < 4; ++r) {
      // find the window in the text: x is ids[s, s + 16), y is ids[s + 1, s + 17)
      index_t s = -1;
      for (index_t k = 0; k + 16 < static_cast<index_t>(ids.size()) && s < 0; ++k) {
        bool match = true;
        for (index_t j = 0; j < 16 && match; ++j) match = ids[static_cast<std::size_t>(k + j)] == b.x(r, j);
        if (match) s = k;
      }
      REQUIRE(s >= 0);
      starts.insert(s);
      for (index_t j = 0; j < 16; ++j) CHECK(b.y(r * 16 + j) == ids[static_cast<std::size_t>(s + j + 1)]);
    }
    for (index_t i = 0; i < 64; ++i) {
      CHECK(b.x.data_handle()[i] == b2.x.data_handle()[i]);
      differs = differs || b.x.data_handle()[i] != b3.x.data_handle()[i];
    }
  }
  CHECK(differs);
  CHECK(starts.size() > 40);  // 80 windows drawn over 484 offsets: spread out
  CHECK(w.draws() == 80);
  // in order: every window once, the last batch smaller
  const auto all = data::windows_in_order(ids, 8, 16);
  CHECK(all.size() == 4);  // 499 / 16 = 31 windows: 8 + 8 + 8 + 7
  CHECK(all.back().x.shape()[0] == 7);
  CHECK(all[1].x(0, 0) == ids[8 * 16]);
  CHECK(all[1].y(0) == ids[8 * 16 + 1]);
  CHECK(data::windows_in_order(ids, 8, 16, 2).size() == 2);
  // a context of zero, a batch of zero, a context as long as the text
  CHECK(what_of([&] { data::token_windows(ids, 4, 0, 1); }).find("positive context length, got 0") != std::string::npos);
  CHECK(what_of([&] { data::token_windows(ids, 0, 4, 1); }).find("positive batch size") != std::string::npos);
  CHECK(what_of([&] { data::token_windows(ids, 4, 500, 1); }).find("a context of 500 tokens needs at least 501") !=
        std::string::npos);
  CHECK_NOTHROW(data::token_windows(ids, 4, 499, 1).next());
}
