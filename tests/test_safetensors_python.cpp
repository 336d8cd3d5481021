// safetensors files written by the Python `safetensors` package (Hugging Face's writer,
// not locus's) and corrupt files written byte by byte in Python, all by
// tests/python/safetensors_files.py, read with locus::io::load and nn::load:
//   * every dtype locus reads (F32, F64, F16, BF16, I32, I64, U8, BOOL), element by
//     element against the bit patterns and values Python wrote into expected.json
//     (every f16 and bf16 encoding, NaNs with payloads, infinities, -0.0, subnormals,
//     the largest finite values, i32 and i64 min and max, ranks 0 to 4, an empty
//     tensor), and locus's f32 -> f16 / bf16 rounding against numpy's and Python's;
//   * dtypes locus only carries (I8 ... C64, the F8 variants, F4): the file opens;
//   * a typed request of another dtype or rank: io_error naming the tensor, its dtype
//     and shape, and what was asked; nn::load of weights of another dtype, rank or name;
//   * corrupt and truncated files (every truncation of a valid file among them): each
//     an io_error naming the file and the fault, from io::load and from nn::load.
//
// The directory is named by LOCUS_SAFETENSORS_PY_DIR (the CTests "interop: ... written
// by the Python safetensors package ..." write it and set it); without it the cases
// say they are skipped and pass.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <string>
#include <type_traits>
#include <vector>

#include <locus/train.hpp>
#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
#include <nlohmann/json.hpp>

#include <locus/io/safetensors.hpp>
#include <locus/nn/serialize.hpp>
#endif

#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
namespace {

namespace fs = std::filesystem;
namespace nn = locus::nn;
using locus::index_t;
using D = locus::cpu;
using archive = locus::io::archive<D>;
using json = nlohmann::json;

/// The directory the Python script wrote; without one the case fails (it only runs when
/// asked for: the cases are doctest::skip() in the host suite's run).
fs::path python_dir() {
  const char* env = std::getenv("LOCUS_SAFETENSORS_PY_DIR");
  if (env == nullptr || *env == '\0')
    FAIL("LOCUS_SAFETENSORS_PY_DIR is not set (tests/python/safetensors_files.py DIR writes it; the CTests "
         "\"interop: ... written by the Python safetensors package ...\" run both)");
  if (!fs::exists(fs::path(env) / "expected.json"))
    FAIL("LOCUS_SAFETENSORS_PY_DIR names " << env << ", which holds no expected.json");
  return env;
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  REQUIRE_MESSAGE(f.good(), "cannot open " << p);
  return json::parse(f);
}

std::vector<index_t> shape_of(const json& j) { return j.at("shape").get<std::vector<index_t>>(); }

/// The encoding of one element as an unsigned integer.
template <class T>
std::uint64_t bits_of(T v) {
  if constexpr (std::is_same_v<T, float>) return std::bit_cast<std::uint32_t>(v);
  else if constexpr (std::is_same_v<T, double>) return std::bit_cast<std::uint64_t>(v);
  else return v.bits;  // f16, bf16
}

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

/// Float tensor `name` (rank R) against expected.json: dtype, shape, every element's
/// bits, and its value as double (locus's widening) against strtod of Python's repr.
template <class T, std::size_t R>
void check_floats(const archive& a, const json& expected, const std::string& name) {
  INFO(a.path() << ": " << name);
  const json& e = expected.at(name);
  REQUIRE(a.contains(name));
  CHECK(a.info(name).dtype == e.at("dtype").get<std::string>());
  CHECK(a.info(name).dtype == locus::io::detail::st_dtype<T>());
  const auto want_shape = shape_of(e);
  REQUIRE(a.info(name).shape == want_shape);
  const auto v = a.template get<T, R>(name);
  for (std::size_t d = 0; d < R; ++d) CHECK(v.shape()[d] == want_shape[d]);
  const auto& bits = e.at("bits");
  const auto& values = e.at("values");
  REQUIRE(static_cast<index_t>(bits.size()) == v.numel());
  index_t bad_bits = 0, bad_values = 0, first = -1;
  for (index_t i = 0; i < v.numel(); ++i) {
    const T x = v.data_handle()[i];
    const std::uint64_t want_bits = bits[static_cast<std::size_t>(i)].get<std::uint64_t>();
    const double got = static_cast<double>(x);
    const double want = std::strtod(values[static_cast<std::size_t>(i)].get<std::string>().c_str(), nullptr);
    const bool value_ok = std::isnan(want) ? std::isnan(got) && std::signbit(got) == std::signbit(want)
                                           : got == want && std::signbit(got) == std::signbit(want);
    if (bits_of(x) != want_bits) ++bad_bits;
    if (!value_ok) ++bad_values;
    if ((bits_of(x) != want_bits || !value_ok) && first < 0) first = i;
  }
  const auto fi = static_cast<std::size_t>(first < 0 ? 0 : first);
  CHECK_MESSAGE(bad_bits + bad_values == 0,
                name << ": " << bad_bits << " elements with other bits and " << bad_values << " with other values of "
                     << v.numel() << "; first at " << first << ": locus bits "
                     << hex(first < 0 ? 0 : bits_of(v.data_handle()[first])) << ", Python's "
                     << hex(bits[fi].get<std::uint64_t>()) << ", value " << std::setprecision(17)
                     << (first < 0 ? 0.0 : static_cast<double>(v.data_handle()[first])) << " vs "
                     << values[fi].get<std::string>());
  // flat() gives the same elements
  const auto f = a.template flat<T>(name);
  CHECK(f.numel() == v.numel());
  CHECK(f.data_handle() == v.data_handle());
}

/// Integer or bool tensor `name` (rank R) against expected.json's integers.
template <class T, std::size_t R>
void check_ints(const archive& a, const json& expected, const std::string& name) {
  INFO(a.path() << ": " << name);
  const json& e = expected.at(name);
  REQUIRE(a.contains(name));
  CHECK(a.info(name).dtype == e.at("dtype").get<std::string>());
  const auto want_shape = shape_of(e);
  REQUIRE(a.info(name).shape == want_shape);
  const auto v = a.template get<T, R>(name);
  const auto& values = e.at("values");
  REQUIRE(static_cast<index_t>(values.size()) == v.numel());
  index_t bad = 0, first = -1;
  for (index_t i = 0; i < v.numel(); ++i) {
    const auto want = values[static_cast<std::size_t>(i)].get<std::int64_t>();
    const auto got = static_cast<std::int64_t>(v.data_handle()[i]);
    if (got != want) {
      ++bad;
      if (first < 0) first = i;
    }
  }
  CHECK_MESSAGE(bad == 0, name << ": " << bad << " of " << v.numel() << " elements differ; first at " << first << ": locus "
                               << (first < 0 ? 0 : static_cast<std::int64_t>(v.data_handle()[first])) << ", Python "
                               << (first < 0 ? 0 : values[static_cast<std::size_t>(first)].get<std::int64_t>()));
}

/// Runs f, which must throw io_error (or E) whose message holds every fragment.
template <class E = locus::io_error>
void expect_error(const std::function<void()>& f, const std::vector<std::string>& fragments, const std::string& label) {
  INFO(label);
  try {
    f();
    FAIL_CHECK("no exception");
  } catch (const E& e) {
    const std::string what = e.what();
    for (const auto& frag : fragments)
      CHECK_MESSAGE(what.find(frag) != std::string::npos, "the message lacks \"" << frag << "\": " << what);
  } catch (const std::exception& e) {
    FAIL_CHECK("another exception than expected: " << std::string(e.what()));
  }
}

/// Every typed request for tensor `name` (held as Own, rank R) of another dtype, through
/// get<T, R> and flat<T>, and of another rank, through get<Own, R +- 1>.
template <class Own, std::size_t R, class... Other>
void check_refusals(const archive& a, const std::string& name) {
  const auto& e = a.info(name);
  const std::string file_dtype = e.dtype, shape = e.shape_string();
  const auto one = [&]<class Asked>() {
    if constexpr (!std::is_same_v<Asked, Own>) {
      const std::string asked = locus::io::detail::st_dtype<Asked>();
      const std::vector<std::string> frags = {"'" + name + "'", a.path(), file_dtype + " " + shape,
                                              "but " + asked + " (", "was asked for"};
      expect_error([&] { (void)a.template get<Asked, R>(name); }, frags, name + ": get<" + asked + ", R>");
      expect_error([&] { (void)a.template flat<Asked>(name); }, frags, name + ": flat<" + asked + ">");
    }
  };
  (one.template operator()<Other>(), ...);
  const auto ranks = [&]<std::size_t Asked>() {
    expect_error([&] { (void)a.template get<Own, Asked>(name); },
                 {"'" + name + "'", a.path(), "has rank " + std::to_string(R), shape,
                  "but rank " + std::to_string(Asked) + " was asked for"},
                 name + ": get<" + file_dtype + ", " + std::to_string(Asked) + ">");
  };
  ranks.template operator()<R + 1>();
  if constexpr (R > 0) ranks.template operator()<R - 1>();
}

template <class Own, std::size_t R>
void check_all_refusals(const archive& a, const std::string& name) {
  check_refusals<Own, R, float, double, locus::f16, locus::bf16, std::int32_t, std::int64_t, std::uint8_t, bool>(a, name);
}

using mlp32 = decltype(nn::sequential{nn::linear<D, locus::amp::fp32>(4, 3), nn::relu<D, locus::amp::fp32>(),
                                      nn::linear<D, locus::amp::fp32>(3, 2)});
mlp32 make_mlp32() {
  return nn::sequential{nn::linear<D, locus::amp::fp32>(4, 3), nn::relu<D, locus::amp::fp32>(),
                        nn::linear<D, locus::amp::fp32>(3, 2)};
}

std::vector<float> master_copy(const mlp32& m) {
  const auto v = m.parameters().master();
  return {v.data_handle(), v.data_handle() + v.numel()};
}

}  // namespace
#endif

// These cases need files a Python script writes: not part of the host suite's run
// (doctest::skip()); the interop CTests run the script, then one case with --no-skip.
TEST_CASE("safetensors from Python: every dtype locus has, element by element, as the Python package wrote it" *
          doctest::skip()) {
#if !defined(LOCUS_HAS_JSON) || !LOCUS_HAS_JSON
  FAIL("reading safetensors needs nlohmann-json");
#else
  const fs::path dir = python_dir();
  const json expected = read_json(dir / "expected.json");
  const auto v = locus::io::load<D>(dir / "values.safetensors");
  CHECK(v.metadata("writer") == "tests/python/safetensors_files.py");
  check_floats<float, 2>(v, expected, "f32");
  check_floats<double, 1>(v, expected, "f64");
  check_floats<locus::f16, 3>(v, expected, "f16");  // all 65536 encodings
  check_floats<double, 0>(v, expected, "scalar");
  check_floats<float, 2>(v, expected, "empty");
  check_floats<locus::f16, 1>(v, expected, "f16_rounded");
  check_floats<float, 1>(v, expected, "f16_source");
  check_ints<std::int32_t, 2>(v, expected, "i32");
  check_ints<std::int64_t, 1>(v, expected, "i64");
  check_ints<std::uint8_t, 4>(v, expected, "u8");
  check_ints<bool, 2>(v, expected, "bool");
  CHECK(v.entries().size() == 11);

  const auto b = locus::io::load<D>(dir / "bf16.safetensors");
  check_floats<locus::bf16, 2>(b, expected, "bf16_all");  // all 65536 encodings
  check_floats<locus::bf16, 1>(b, expected, "bf16_rounded");
  check_floats<float, 1>(b, expected, "bf16_source");

  // locus's f32 -> f16 and f32 -> bf16 rounding against numpy's (f16) and the Python
  // script's, which picks the nearer of the two candidate values (bf16)
  {
    const auto src = v.get<float, 1>("f16_source");
    const auto want = v.get<locus::f16, 1>("f16_rounded");
    index_t bad = 0;
    for (index_t i = 0; i < src.numel(); ++i) bad += locus::f16(src(i)).bits != want(i).bits;
    CHECK_MESSAGE(bad == 0, bad << " of " << src.numel() << " f32 values round to other f16 bits than numpy's");
  }
  {
    const auto src = b.get<float, 1>("bf16_source");
    const auto& want = expected.at("bf16_rounded").at("rounding");
    index_t bad = 0, nans = 0;
    for (index_t i = 0; i < src.numel(); ++i) {
      const auto w = want[static_cast<std::size_t>(i)].get<std::int64_t>();
      const locus::bf16 got(src(i));
      if (w < 0) {  // a NaN source: any NaN
        ++nans;
        bad += !std::isnan(static_cast<float>(got));
      } else {
        bad += got.bits != static_cast<std::uint16_t>(w);
      }
    }
    CHECK(nans >= 4);
    CHECK_MESSAGE(bad == 0, bad << " of " << src.numel() << " f32 values round to other bf16 bits than Python's");
  }

  // dtypes locus has no C++ type for: the file opens, each tensor is described as the
  // package wrote it, and a typed request says there is no C++ type for it
  const auto o = locus::io::load<D>(dir / "others.safetensors");
  const json& others = expected.at("__others__");
  CHECK(o.entries().size() == others.size());
  for (const auto& [name, e] : others.items()) {
    INFO("others.safetensors: " << name);
    REQUIRE(o.contains(name));
    const auto& info = o.info(name);
    CHECK(info.dtype == e.at("dtype").get<std::string>());
    CHECK(info.shape == shape_of(e));
    CHECK(info.bytes == e.at("bytes").size());
    expect_error([&] { (void)o.flat<std::uint8_t>(name); },
                 {"'" + name + "'", info.dtype + " " + info.shape_string(), "locus has no C++ type for " + info.dtype},
                 "flat<std::uint8_t>");
  }
#endif
}

TEST_CASE("safetensors from Python: a typed request of another dtype or rank names the tensor, what is there and what "
          "was asked" * doctest::skip()) {
#if !defined(LOCUS_HAS_JSON) || !LOCUS_HAS_JSON
  FAIL("reading safetensors needs nlohmann-json");
#else
  const fs::path dir = python_dir();
  const auto v = locus::io::load<D>(dir / "values.safetensors");
  const auto b = locus::io::load<D>(dir / "bf16.safetensors");
  check_all_refusals<float, 2>(v, "f32");
  check_all_refusals<double, 1>(v, "f64");
  check_all_refusals<locus::f16, 3>(v, "f16");
  check_all_refusals<double, 0>(v, "scalar");
  check_all_refusals<float, 2>(v, "empty");
  check_all_refusals<std::int32_t, 2>(v, "i32");
  check_all_refusals<std::int64_t, 1>(v, "i64");
  check_all_refusals<std::uint8_t, 4>(v, "u8");
  check_all_refusals<bool, 2>(v, "bool");
  check_all_refusals<locus::bf16, 2>(b, "bf16_all");
  expect_error([&] { (void)v.get<float, 2>("no_such"); }, {"holds no tensor named 'no_such'"}, "a missing name");

  // nn::load into an f32 model 4-3-2: the weights as Python wrote them
  const json mj = read_json(dir / "mlp.json");
  auto m = make_mlp32();
  nn::load(dir / "mlp.safetensors", m);
  for (const auto& e : m.parameters().entries()) {
    INFO(e.name);
    const auto& want = mj.at("weights").at(e.name);
    REQUIRE(static_cast<index_t>(want.size()) == e.numel);
    const float* p = m.parameters().master().data_handle() + e.offset;
    for (index_t i = 0; i < e.numel; ++i)
      CHECK(static_cast<double>(p[i]) == std::strtod(want[static_cast<std::size_t>(i)].get<std::string>().c_str(), nullptr));
  }
  {
    // the loaded model computes what numpy computed in f64 from the same weights: sums of 4
    // and 3 f32 products of O(1) values round by a few ulps of 1 (about 1e-6 at most);
    // 1e-5 * (1 + |y|) holds that with room and catches any weight in a wrong place
    const auto& xs = mj.at("x");
    auto x = locus::zeros<float, D>({5, 4});
    for (index_t i = 0; i < 20; ++i)
      x.data_handle()[i] = static_cast<float>(std::strtod(xs[static_cast<std::size_t>(i)].get<std::string>().c_str(), nullptr));
    const auto y = m.infer(std::as_const(x).view());
    const auto& ys = mj.at("y");
    REQUIRE(y.numel() == static_cast<index_t>(ys.size()));
    for (index_t i = 0; i < y.numel(); ++i) {
      const double want = std::strtod(ys[static_cast<std::size_t>(i)].get<std::string>().c_str(), nullptr);
      CHECK(std::abs(static_cast<double>(y.data_handle()[i]) - want) <= 1e-5 * (1.0 + std::abs(want)));
    }
  }
  // weights of another dtype, rank or name: refused, naming the tensor, what the file
  // holds and what the model has; the model keeps its weights
  const auto before = master_copy(m);
  expect_error([&] { nn::load(dir / "mlp_f64.safetensors", m); }, {"'0.weight'", "is F64", "weights are F32"},
               "f64 weights into an f32 model");
  expect_error([&] { nn::load(dir / "mlp_f16.safetensors", m); }, {"'0.weight'", "is F16", "weights are F32"},
               "f16 weights into an f32 model");
  expect_error([&] { nn::load(dir / "mlp_i32_bias.safetensors", m); }, {"'2.bias'", "is I32", "weights are F32"},
               "an i32 bias into an f32 model");
  expect_error<locus::shape_error>([&] { nn::load(dir / "mlp_rank1.safetensors", m); },
                                   {"0.weight: model [3, 4], file [12]"}, "a weight of rank 1");
  expect_error<locus::shape_error>([&] { nn::load(dir / "mlp_missing.safetensors", m); },
                                   {"2.bias: model [2], file has no such tensor"}, "a missing bias");
  CHECK(master_copy(m) == before);
  // the f64 file is an fp64 model's: it loads there, the values those of the f32 file
  nn::sequential m64{nn::linear<D, locus::amp::fp64>(4, 3), nn::relu<D, locus::amp::fp64>(),
                     nn::linear<D, locus::amp::fp64>(3, 2)};
  nn::load(dir / "mlp_f64.safetensors", m64);
  const auto w64 = m64.parameters().master();
  REQUIRE(w64.numel() == static_cast<index_t>(before.size()));
  for (index_t i = 0; i < w64.numel(); ++i) CHECK(w64(i) == static_cast<double>(before[static_cast<std::size_t>(i)]));
#endif
}

TEST_CASE("safetensors from Python: corrupt and truncated files written in Python are io_errors naming the fault" *
          doctest::skip()) {
#if !defined(LOCUS_HAS_JSON) || !LOCUS_HAS_JSON
  FAIL("reading safetensors needs nlohmann-json");
#else
  const fs::path dir = python_dir();
  const fs::path bad = dir / "bad";
  const json manifest = read_json(bad / "manifest.json");
  REQUIRE(manifest.size() > 40);
  {  // the control: the valid file the others are made from loads
    const auto g = locus::io::load<D>(bad / "good.safetensors");
    const auto ga = g.get<float, 2>("a");
    for (index_t i = 0; i < 6; ++i) CHECK(ga.data_handle()[i] == static_cast<float>(i));
    const auto gb = g.get<std::int64_t, 1>("b");
    CHECK(gb(0) == 1);
    CHECK(gb(3) == -4);
  }
  int python_loads = 0;
  for (const auto& c : manifest) {
    const std::string file = c.at("file").get<std::string>();
    const std::string what = c.at("what").get<std::string>();
    const std::string fragment = c.at("fragment").get<std::string>();
    const fs::path p = bad / file;
    if (c.at("python").get<std::string>() == "loads") {
      ++python_loads;
      MESSAGE(file << " (" << what << "): the Python package's reader loads it; locus must refuse it");
    }
    std::vector<std::string> frags = {"'" + p.string() + "'"};
    if (!fragment.empty()) frags.push_back(fragment);
    expect_error([&] { (void)locus::io::load<D>(p); }, frags, file + ": " + what + " (io::load)");
    auto m = make_mlp32();
    const auto before = master_copy(m);
    expect_error([&] { nn::load(p, m); }, frags, file + ": " + what + " (nn::load)");
    CHECK(master_copy(m) == before);
  }
  CHECK(python_loads <= 1);  // BOOL byte 2 only: the package refuses every other
#endif
}
