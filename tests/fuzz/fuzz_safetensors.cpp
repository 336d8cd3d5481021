// libFuzzer target for the safetensors reader (include/locus/io/safetensors.hpp) and the
// checkpoint loader on top of it (include/locus/train/checkpoint.hpp).
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -DLOCUS_ENABLE_CUDA=0 \
//           -DLOCUS_HAS_JSON=1 -Iinclude tests/fuzz/fuzz_safetensors.cpp -o fuzz_safetensors
//   LOCUS_FUZZ_SEED_DIR=corpus ./fuzz_safetensors -max_total_time=60 -rss_limit_mb=2048 corpus/
//
// With LOCUS_FUZZ_SEED_DIR set, start-up writes valid files into that directory first
// (checkpoints of the two trainers below, and a file of every dtype and rank), so the
// fuzzer starts from well-formed JSON headers.
//
// Each input goes through a file (an in-memory memfd, read by io::load<cpu>). The only
// acceptable failure of io::load is locus::io_error. On success the tensors' bytes must
// add up to at most the data section (no two share bytes), every tensor must lie inside
// the archive's buffer and be readable through get<T, R> and flat<T> (touched byte by
// byte, so ASan sees any read past the end), and a mismatching dtype or rank must be an
// io_error. The archive is then loaded into two small trainers (fp32 +
// AdamW + dropout; fp16_mixed + SGD with momentum + grad scaler) with
// train::load_checkpoint:
//   * shape_error is the documented answer exactly when the file's parameters differ
//     from the model's (a parameter missing, of another shape, or one the model lacks):
//     the checkpoint was saved from another model, the file itself may be fine. The
//     fuzzer checks that independently and both ways.
//   * anything else wrong (optimizer or scaler state of the wrong dtype, size or value,
//     bad metadata) is a corrupt file: io_error.
//   * a failed load changes nothing in the trainer (weights, optimizer state and step,
//     scaler state, counters, lr, dropout counters), compared byte for byte.
//   * after a successful load the weights are the file's, and one more training step
//     runs (a non-finite gradient is allowed: any float weights are accepted).
// Any other exception, a crash or a sanitizer report is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <locus/train.hpp>

namespace {

namespace nn = locus::nn;
using locus::index_t;

// ---- the archive ---------------------------------------------------------------------

volatile unsigned sink = 0;

template <class T, std::size_t R>
void touch_view(const locus::tensor_view<const T, locus::cpu, R>& v, const locus::io::tensor_info& e) {
  if (static_cast<std::size_t>(v.numel()) * sizeof(T) != e.bytes) std::abort();
  const auto* p = reinterpret_cast<const unsigned char*>(v.data_handle());
  unsigned s = 0;
  for (std::size_t i = 0; i < e.bytes; ++i) s += p[i];
  sink = sink + s;
}

template <class T>
void check_typed(const locus::io::archive<locus::cpu>& a, const std::string& name, const locus::io::tensor_info& e) {
  const auto f = a.flat<T>(name);
  touch_view<T, 1>(f, e);
  auto ranked = [&]<std::size_t R>() {
    try {
      const auto v = a.get<T, R>(name);
      if (e.shape.size() != R) std::abort();  // a rank mismatch must throw
      for (std::size_t i = 0; i < R; ++i)
        if (v.shape()[i] != e.shape[i]) std::abort();
      touch_view<T, R>(v, e);
    } catch (const locus::io_error&) {
      if (e.shape.size() == R) std::abort();  // the right dtype and rank must load
    }
  };
  ranked.template operator()<1>();
  ranked.template operator()<2>();
  ranked.template operator()<3>();
  ranked.template operator()<4>();
}

void check_archive(const locus::io::archive<locus::cpu>& a, std::uint64_t data_section) {
  // Tensors do not share bytes: together they fit in the data section (a file of many
  // tensors spanning the same bytes must not make the reader's buffer grow with their
  // number).
  std::uint64_t sum = 0;
  for (const auto& [name, e] : a.entries()) sum += e.bytes;
  if (sum > data_section) std::abort();
  for (const auto& [name, e] : a.entries()) {
    const auto& d = e.dtype;
    if (d == "F32") check_typed<float>(a, name, e);
    else if (d == "F64") check_typed<double>(a, name, e);
    else if (d == "I32") check_typed<std::int32_t>(a, name, e);
    else if (d == "I64") check_typed<std::int64_t>(a, name, e);
    else if (d == "U8") check_typed<std::uint8_t>(a, name, e);
    else if (d == "BOOL") check_typed<bool>(a, name, e);
    else if (d == "F16") check_typed<locus::f16>(a, name, e);
    else if (d == "BF16") check_typed<locus::bf16>(a, name, e);
    // Another dtype than stored is an io_error.
    try {
      (void)(d == "I64" ? a.flat<std::int32_t>(name).numel() : a.flat<std::int64_t>(name).numel());
      std::abort();
    } catch (const locus::io_error&) {
    }
  }
  try {
    (void)a.info("no such tensor \x01");
    std::abort();
  } catch (const locus::io_error&) {
  }
}

// ---- the trainers ----------------------------------------------------------------------

using P32 = locus::amp::fp32;
using F16 = locus::amp::fp16_mixed;

auto model32() {
  nn::sequential m(nn::linear<locus::cpu, P32>(3, 4), nn::relu<locus::cpu, P32>(), nn::dropout<locus::cpu, P32>(0.25f, 7),
                   nn::linear<locus::cpu, P32>(4, 2));
  m.reset_parameters(1);
  return m;
}
auto model16() {
  nn::sequential m(nn::linear<locus::cpu, F16>(3, 2));
  m.reset_parameters(2);
  return m;
}

template <class T>
void append(std::vector<unsigned char>& out, const T* p, std::size_t n) {
  const auto* c = reinterpret_cast<const unsigned char*>(p);
  out.insert(out.end(), c, c + n * sizeof(T));
}

/// Everything a checkpoint load may change, as bytes.
template <class Trainer>
std::vector<unsigned char> state_of(Trainer& t) {
  std::vector<unsigned char> s;
  const auto m = std::as_const(t.model().parameters()).master();
  append(s, m.data_handle(), static_cast<std::size_t>(m.numel()));
  t.optimizer().for_each_state([&](const char*, locus::tensor_view<float, locus::cpu, 1> v) {
    append(s, v.data_handle(), static_cast<std::size_t>(v.numel()));
  });
  const auto st = t.optimizer().step_tensor();
  append(s, st.data_handle(), static_cast<std::size_t>(st.numel()));
  if constexpr (Trainer::has_scaler) {
    const auto sd = t.scaler()->state_dict();
    append(s, sd.data_handle(), 3);
  }
  const std::int64_t c[3] = {t.micro_steps(), t.optimizer_steps(), t.epochs_done()};
  append(s, c, 3);
  const double l[2] = {t.base_lr(), t.optimizer().lr()};
  append(s, l, 2);
  t.model().for_each_layer([&](std::size_t, auto& layer) {
    if constexpr (requires { layer.counter(); }) {
      const std::uint64_t k = layer.counter();
      append(s, &k, 1);
    }
  });
  return s;
}

/// Does the file's set of parameters differ from the model's? (the shape_error case)
template <class Trainer>
bool other_model(const locus::io::archive<locus::cpu>& a, Trainer& t) {
  const auto& entries = t.model().parameters().entries();
  for (const auto& e : entries)
    if (!a.contains(e.name) || a.info(e.name).shape != e.shape) return true;
  for (const auto& [name, f] : a.entries()) {
    if (name.rfind("optimizer.", 0) == 0 || name.rfind("scaler.", 0) == 0) continue;
    bool known = false;
    for (const auto& e : entries) known = known || e.name == name;
    if (!known) return true;
  }
  return false;
}

// How far inputs got, printed when the fuzzer exits: how many reached the checkpoint
// loader, and how it answered.
struct reach {
  std::uint64_t inputs = 0, archives = 0, loads = 0, loaded = 0, shape_errors = 0, io_errors = 0;
} counts;

void print_counts() {
  std::fprintf(stderr,
               "fuzz_safetensors: %llu inputs, %llu read as archives; train::load_checkpoint called %llu times: "
               "%llu loaded (and trained a step), %llu shape_error (another model), %llu io_error\n",
               static_cast<unsigned long long>(counts.inputs), static_cast<unsigned long long>(counts.archives),
               static_cast<unsigned long long>(counts.loads), static_cast<unsigned long long>(counts.loaded),
               static_cast<unsigned long long>(counts.shape_errors), static_cast<unsigned long long>(counts.io_errors));
}

template <class Trainer>
void check_load(const locus::io::archive<locus::cpu>& a, Trainer& t) {
  ++counts.loads;
  const bool mismatch = other_model(a, t);
  const auto before = state_of(t);
  try {
    (void)locus::train::load_checkpoint(a, t);
    if (mismatch) std::abort();  // another model's checkpoint loaded
    // The weights are the file's.
    const auto& entries = t.model().parameters().entries();
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto f = a.flat<float>(entries[i].name);
      const auto m = std::as_const(t.model().parameters()).master_flat(i);
      if (f.numel() != m.numel() || std::memcmp(f.data_handle(), m.data_handle(), f.size_bytes()) != 0) std::abort();
    }
    // What was accepted must be a state training can go on from: one more step (the
    // counters, step count and scale advance). Weights of any float value are accepted,
    // so a non-finite gradient is a fair answer.
    static const auto x = locus::rand<float, locus::cpu>({4, 3}, 12);
    static const auto y = locus::zeros<std::int64_t, locus::cpu>({4});
    try {
      t.step(x, y);
      (void)t.report();
    } catch (const locus::train::non_finite_error&) {
    }
    ++counts.loaded;
    return;
  } catch (const locus::shape_error&) {
    if (!mismatch) std::abort();  // the model fits: a bad file is an io_error
    ++counts.shape_errors;
  } catch (const locus::io_error&) {
    if (mismatch) std::abort();  // another model's shape is reported as such
    ++counts.io_errors;
  }
  if (state_of(t) != before) std::abort();  // a failed load changed the trainer
}

struct trainers {
  decltype(model32()) m32 = model32();
  locus::optim::adamw<locus::cpu> adamw{m32.parameters(), {.lr = 1e-3}};
  locus::train::trainer<decltype(m32), decltype(adamw), nn::cross_entropy> t32{m32, adamw, nn::cross_entropy{}};

  decltype(model16()) m16 = model16();
  locus::optim::sgd<locus::cpu> sgd{m16.parameters(), {.lr = 0.1, .momentum = 0.9}};
  locus::amp::grad_scaler<locus::cpu> scaler{{.init_scale = 256.0f, .growth_interval = 2}};
  locus::train::trainer<decltype(m16), decltype(sgd), nn::cross_entropy, locus::amp::grad_scaler<locus::cpu>> t16{
      m16, sgd, nn::cross_entropy{}, scaler};

  /// A few steps, so the state is not all zeros.
  void warm_up() {
    auto x = locus::rand<float, locus::cpu>({4, 3}, 11);
    auto y = locus::zeros<std::int64_t, locus::cpu>({4});
    y(1) = 1;
    y(3) = 1;
    for (int i = 0; i < 3; ++i) {
      t32.step(x, y);
      t16.step(x, y);
    }
  }
};

// ---- seeds -----------------------------------------------------------------------------

void write_seeds(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  trainers t;
  t.warm_up();
  locus::train::save_checkpoint(dir / "seed-fp32-adamw.safetensors", t.t32, 3);
  locus::train::save_checkpoint(dir / "seed-fp16-sgd-scaler.safetensors", t.t16, 1);

  locus::io::writer w;
  const auto f32 = locus::arange<float, locus::cpu>(6);  // kept: a view of a temporary does not compile
  w.add("f32", f32.reshape({2, 3}));
  w.add("f64", locus::full<double, locus::cpu>({2, 1, 2}, 1.5));
  w.add("i32", locus::full<std::int32_t, locus::cpu>({3}, -7));
  w.add("i64", locus::full<std::int64_t, locus::cpu>({1, 1, 1, 2}, 1 << 20));
  w.add("u8", locus::full<std::uint8_t, locus::cpu>({5}, std::uint8_t{200}));
  w.add("bool", locus::full<bool, locus::cpu>({2, 2}, true));
  w.add("f16", locus::full<locus::f16, locus::cpu>({3}, locus::f16(0.5f)));
  w.add("bf16", locus::full<locus::bf16, locus::cpu>({1, 3}, locus::bf16(-2.0f)));
  w.add("empty", locus::zeros<float, locus::cpu>({0, 4}));
  w.metadata("epoch", "2");
  w.metadata("note", "seed");
  w.save(dir / "seed-dtypes.safetensors");

  locus::io::writer empty;
  empty.save(dir / "seed-empty.safetensors");
}

}  // namespace

// ---- structure-aware mutation ------------------------------------------------------
// Most byte-level mutations of a safetensors file break its JSON, and the parser rejects
// it before the reader's own checks run. Half the time (and always when the header is
// valid JSON), this mutator instead parses the header, changes one thing in it, and
// writes it back with a fresh length prefix (sometimes a wrong one), keeping the data
// section: a hostile number in a shape or an offset (0, -1, 2^31, 2^53 + 1, 2^63 - 1,
// 2^64, 1e308, a fraction, a string), offsets swapped, overlapping, past the end or
// reversed, a dtype from the list of every dtype name (and a few that are not), a
// duplicate-looking or unicode name, deep nesting, a rank changed, the metadata given a
// non-string value, an entry removed or copied. Otherwise libFuzzer's own mutation.
namespace {

std::uint64_t next(std::uint64_t& s) {  // splitmix64
  s += 0x9e3779b97f4a7c15ull;
  std::uint64_t z = s;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

nlohmann::json hostile_number(std::uint64_t& r) {
  switch (next(r) % 12) {
    case 0: return 0;
    case 1: return -1;
    case 2: return std::int64_t{1} << 31;
    case 3: return (std::int64_t{1} << 53) + 1;
    case 4: return std::numeric_limits<std::int64_t>::max();
    case 5: return std::numeric_limits<std::uint64_t>::max();
    case 6: return 1e308;
    case 7: return 2.5;
    case 8: return "7";
    case 9: return nullptr;
    case 10: return static_cast<std::int64_t>(next(r) % 64);
    default: return static_cast<std::int64_t>(next(r) % 100000);
  }
}

bool mutate_header(nlohmann::json& h, std::uint64_t& r, std::uint64_t data_bytes) {
  std::vector<std::string> names;
  for (auto it = h.begin(); it != h.end(); ++it)
    if (it.key() != "__metadata__" && it->is_object()) names.push_back(it.key());
  const std::uint64_t what = next(r) % 11;
  if (what == 0) {  // metadata with a value that is not a string, or nested
    h["__metadata__"]["epoch"] = next(r) % 2 ? nlohmann::json(hostile_number(r)) : nlohmann::json::array({1, {2}});
    return true;
  }
  if (what == 1) {  // deep nesting somewhere
    nlohmann::json deep = 1;
    for (int i = 0; i < 200; ++i) deep = nlohmann::json::array({deep});
    h[names.empty() ? std::string("x") : names[next(r) % names.size()]]["shape"] = deep;
    return true;
  }
  if (names.empty()) return false;
  nlohmann::json& e = h[names[next(r) % names.size()]];
  static const char* dtypes[] = {"F32", "F64", "F16", "BF16", "I32", "I64", "U8", "BOOL", "I8", "I16", "U16",
                                 "U32", "U64", "C64", "F8_E4M3", "F8_E5M2", "F4", "F6_E2M3", "f32", "", "F33"};
  switch (what) {
    case 2: e["dtype"] = dtypes[next(r) % (sizeof dtypes / sizeof *dtypes)]; break;
    case 3:
      if (e["shape"].is_array() && !e["shape"].empty()) e["shape"][next(r) % e["shape"].size()] = hostile_number(r);
      else e["shape"] = nlohmann::json::array({hostile_number(r)});
      break;
    case 4:  // rank changed: an extent added or removed
      if (e["shape"].is_array() && !e["shape"].empty() && next(r) % 2) e["shape"].erase(e["shape"].size() - 1);
      else e["shape"].push_back(next(r) % 4);
      break;
    case 5: e["data_offsets"][next(r) % 2] = hostile_number(r); break;
    case 6:  // reversed, past the end, or overlapping another tensor's
      if (next(r) % 3 == 0) e["data_offsets"] = {data_bytes, data_bytes + 1 + next(r) % 16};
      else if (next(r) % 2) e["data_offsets"] = {8, 4};
      else e["data_offsets"] = h[names[0]]["data_offsets"];
      break;
    case 7: h.erase(names[next(r) % names.size()]); break;
    case 8: h[names[next(r) % names.size()] + (next(r) % 2 ? " " : "\u00e9")] = e; break;
    case 9: e.erase(next(r) % 2 ? "shape" : "data_offsets"); break;
    default: e["extra"] = hostile_number(r); break;
  }
  return true;
}

}  // namespace

extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);

extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size, std::size_t max_size,
                                               unsigned int seed) {
  std::uint64_t r = seed;
  std::uint64_t n = 0;
  if (size >= 8)
    for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(data[i]) << (8 * i);
  nlohmann::json h;
  const bool json_ok = size >= 8 && n <= size - 8 &&
                       !(h = nlohmann::json::parse(data + 8, data + 8 + n, nullptr, false)).is_discarded() &&
                       h.is_object();
  if (!json_ok || next(r) % 4 == 0) return LLVMFuzzerMutate(data, size, max_size);
  std::string text;
  try {  // a header of unexpected types (a shape that is a string, ...) stops the edit
    if (!mutate_header(h, r, size - 8 - n)) return LLVMFuzzerMutate(data, size, max_size);
    text = h.dump();
  } catch (const nlohmann::json::exception&) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  const std::size_t body = size - 8 - n;
  const std::size_t out = 8 + text.size() + body;
  if (out > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::vector<std::uint8_t> tail(data + 8 + n, data + size);
  std::uint64_t len = text.size();
  if (next(r) % 16 == 0) len += (next(r) % 2 ? 1 : std::uint64_t{1} << 40);  // a wrong prefix, now and then
  for (int i = 0; i < 8; ++i) data[i] = static_cast<std::uint8_t>(len >> (8 * i));
  std::memcpy(data + 8, text.data(), text.size());
  if (!tail.empty()) std::memcpy(data + 8 + text.size(), tail.data(), tail.size());
  return out;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit(print_counts);
  if (const char* dir = std::getenv("LOCUS_FUZZ_SEED_DIR"); dir && *dir) write_seeds(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const int fd = memfd_create("fuzz_safetensors", 0);
  if (fd < 0) return 0;
  if (ftruncate(fd, 0) != 0) return 0;
  if (size && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  const std::string path = "/proc/self/fd/" + std::to_string(fd);

  ++counts.inputs;
  std::optional<locus::io::archive<locus::cpu>> a;
  try {
    a.emplace(locus::io::load<locus::cpu>(path));
  } catch (const locus::io_error&) {
    return 0;
  }
  ++counts.archives;
  std::uint64_t n = 0;  // the header's length (load checked that it fits)
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(data[i]) << (8 * i);
  check_archive(*a, size - 8 - n);

  trainers t;  // fresh each time: a successful load changes them
  check_load(*a, t.t32);
  check_load(*a, t.t16);
  return 0;
}
