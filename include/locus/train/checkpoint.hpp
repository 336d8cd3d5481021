// Checkpoints of a trainer as safetensors files (io/safetensors.hpp).
//
//   locus::train::save_checkpoint("ckpt/epoch-3.safetensors", t, 3);   // atomic
//   std::int64_t epoch = locus::train::resume("ckpt/epoch-3.safetensors", t);
//
// A file holds
//   "<name>"                         master weights, as PyTorch's state_dict names them
//                                    ("0.weight", "0.bias", ...): safetensors.torch.load_file
//                                    + model.load_state_dict reads them into an nn.Sequential
//   "optimizer.<state>.<name>"       optimizer state per parameter (exp_avg, exp_avg_sq,
//                                    momentum_buffer), and "optimizer.step" (i64 [1])
//   "scaler.state"                   grad scaler: scale, growth tracker, skipped steps (f32 [3])
// and in __metadata__: format, epoch (epochs finished), micro_steps, optimizer_steps,
// base_lr, lr, seed, policy, optimizer, the dropout layers' RNG counters ("rng.<i>") and
// the caller's run options ("run.<key>", see save_checkpoint and run_options).
// Resuming from the checkpoint written after epoch k and training on gives the same
// losses, bit for bit on the CPU, as a run that never stopped: the loader's order is a
// function of (seed, epoch), dropout's of (seed, counter), and everything else is state
// in the file. Loading into a model of another shape throws shape_error listing every
// mismatched tensor with both shapes. The metadata is read strictly (io_error
// otherwise): counters are decimal digits only (no sign, space or exponent) within
// their range, learning rates finite numbers as written (no space, '+', hex, inf or
// nan), and format, policy and optimizer, when present, must be this trainer's.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "../io/safetensors.hpp"
#include "../nn/serialize.hpp"
#include "trainer.hpp"

namespace locus::train {

namespace detail {
using nn::detail::with_shape;

/// A double as text that reads back to the same double.
inline std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

/// The largest step or epoch count a checkpoint may hold: far beyond any run, and far
/// enough from INT64_MAX that counting on cannot overflow.
inline constexpr std::int64_t max_count = std::int64_t{1} << 62;

/// v, a counter the file calls `what`, when it is in [0, max_count]; io_error otherwise.
inline std::int64_t checked_count(std::int64_t v, const std::string& what, const std::string& path) {
  if (v < 0 || v > max_count)
    throw io_error("locus: '" + path + "' is corrupt: " + what + " is " + std::to_string(v) +
                   ", expected a count in [0, 2^62]");
  return v;
}

/// s as a whole number written in decimal digits and nothing else (no sign, no space,
/// no exponent): what std::to_string wrote. nullopt when it is not one or exceeds
/// UINT64_MAX. std::stoll would take " 5" and "-5" (and wrap "-5" in a u64 counter).
inline std::optional<std::uint64_t> decimal_digits(const std::string& s) {
  if (s.empty()) return std::nullopt;
  for (const char c : s)
    if (c < '0' || c > '9') return std::nullopt;
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

/// A counter from __metadata__ (0 when absent): decimal digits of a count in
/// [0, max_count] ("-3" is said to be -3, outside the range; " 5" is not a number).
inline std::int64_t meta_count(const std::map<std::string, std::string>& m, const std::string& k, const std::string& path) {
  auto it = m.find(k);
  if (it == m.end()) return 0;
  const std::string& text = it->second;
  const bool minus = !text.empty() && text[0] == '-';
  const std::string digits = minus ? text.substr(1) : text;
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
    throw io_error("locus: '" + path + "' is corrupt: __metadata__ '" + k + "' is '" + io::detail::printable(text) +
                   "', not a number written in decimal digits");
  const auto v = decimal_digits(digits);  // nullopt: beyond UINT64_MAX
  if (minus || !v || *v > static_cast<std::uint64_t>(max_count))
    throw io_error("locus: '" + path + "' is corrupt: __metadata__ '" + k + "' is " + io::detail::printable(text) +
                   ", expected a count in [0, 2^62]");
  return static_cast<std::int64_t>(*v);
}

/// A dropout layer's RNG counter from __metadata__ (0 when absent): decimal digits of
/// any u64.
inline std::uint64_t meta_counter(const std::map<std::string, std::string>& m, const std::string& k, const std::string& path) {
  auto it = m.find(k);
  if (it == m.end()) return 0;
  const auto v = decimal_digits(it->second);
  if (!v)
    throw io_error("locus: '" + path + "' is corrupt: __metadata__ '" + k + "' is '" +
                   io::detail::printable(it->second) + "', expected an RNG counter in decimal digits in [0, 2^64)");
  return *v;
}

/// A finite double from __metadata__ (def when absent), as exact() wrote it: no
/// leading space or '+', no hexadecimal, inf or nan.
inline double meta_real(const std::map<std::string, std::string>& m, const std::string& k, double def, const std::string& path) {
  auto it = m.find(k);
  if (it == m.end()) return def;
  const std::string& text = it->second;
  double v = 0.0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size())
    throw io_error("locus: '" + path + "' is corrupt: __metadata__ '" + k + "' is '" + io::detail::printable(text) +
                   "', not a number");
  if (!std::isfinite(v))
    throw io_error("locus: '" + path + "' is corrupt: __metadata__ '" + k + "' is '" + io::detail::printable(text) +
                   "', not a finite number");
  return v;
}

/// A name the trainer wrote (policy, optimizer, format) must be this trainer's when
/// the file has it: a checkpoint of another policy or optimizer is refused by name,
/// before its tensors are compared.
inline void meta_name(const std::map<std::string, std::string>& m, const std::string& k, std::string_view want,
                      const std::string& path, const char* fix) {
  auto it = m.find(k);
  if (it == m.end() || it->second == want) return;
  throw io_error("locus: checkpoint '" + path + "' was saved with " + k + " '" + io::detail::printable(it->second) +
                 "' but this trainer's " + k + " is '" + std::string(want) + "'; " + fix);
}

/// The grad scaler's [scale, growth_tracker, skipped] as saved, checked by the scaler's
/// own rule before anything is loaded: anything it would refuse is a corrupt file.
template <class Scaler>
void check_scaler_state(const tensor<float, cpu, 1>& s, const std::string& path) {
  if (!Scaler::valid_state(std::as_const(s).view()))
    throw io_error("locus: checkpoint '" + path + "' is corrupt: tensor 'scaler.state' is [" + exact(s(0)) + ", " +
                   exact(s(1)) + ", " + exact(s(2)) +
                   "], expected [scale > 0, growth tracker >= 0, skipped steps >= 0] (finite, the counts whole)");
}
}  // namespace detail

/// Writes the trainer's model, optimizer, scaler and counters to `path` (atomically).
/// `epoch`: the number of epochs finished. `run`: the options of the run that a resume
/// should match (total epochs, batch size, ...), stored as "run.<key>" in __metadata__
/// and read back with run_options(archive); keys are non-empty and printable.
template <class Trainer>
void save_checkpoint(const std::filesystem::path& path, Trainer& t, std::int64_t epoch,
                     const std::map<std::string, std::string>& run = {}) {
  if (epoch < 0 || epoch > (std::int64_t{1} << 62))
    throw value_error("locus: save_checkpoint: epoch " + std::to_string(epoch) +
                      " is not a count in [0, 2^62] (resume would refuse the file); pass the number of epochs done");
  for (const auto& [k, v] : run) {
    bool printable = !k.empty();
    for (const char ch : k) printable = printable && ch > ' ' && ch < 127;
    if (!printable)
      throw value_error("locus: save_checkpoint: run option key '" + io::detail::printable(k) +
                        "' must be non-empty printable text without spaces");
  }
  using D = typename Trainer::device;
  using P = typename Trainer::policy;
  auto& model = t.model();
  auto& store = model.parameters();
  io::writer w;
  const auto& entries = store.entries();
  for (std::size_t i = 0; i < entries.size(); ++i)
    detail::with_shape<typename P::master, D>(store.master().data_handle(), entries[i],
                                                    [&](const auto& v) { w.add(entries[i].name, v); });
  t.optimizer().for_each_state([&](const char* name, tensor_view<float, D, 1> flat) {
    for (const auto& e : entries)
      detail::with_shape<float, D>(flat.data_handle(), e, [&](const auto& v) {
        w.add(std::string("optimizer.") + name + "." + e.name, v);
      });
  });
  nn::detail::add_buffers(w, std::as_const(model));
  w.add("optimizer.step", t.optimizer().step_tensor());
  if constexpr (Trainer::has_scaler) w.add("scaler.state", t.scaler()->state_dict());
  w.metadata("format", "locus-checkpoint-2");
  w.metadata("epoch", std::to_string(epoch));
  w.metadata("micro_steps", std::to_string(t.micro_steps()));
  w.metadata("optimizer_steps", std::to_string(t.optimizer_steps()));
  w.metadata("base_lr", detail::exact(t.base_lr()));
  w.metadata("lr", detail::exact(t.optimizer().lr()));
  w.metadata("seed", std::to_string(model.seed()));
  w.metadata("policy", std::string(P::name));
  w.metadata("optimizer", Trainer::optimizer_kind);
  if constexpr (requires { t.optimizer().weight_decay_record(); })  // (an optimizer of one's own may have none)
    w.metadata("optimizer.weight_decay", t.optimizer().weight_decay_record());
  model.for_each_layer([&](std::size_t i, auto& layer) {
    if constexpr (requires { layer.counter(); }) w.metadata("rng." + std::to_string(i), std::to_string(layer.counter()));
  });
  for (const auto& [k, v] : run) w.metadata("run." + k, v);
  io::detail::make_parent_directories(path);
  w.save(path);
}

/// The run options save_checkpoint stored ("run.<key>" in __metadata__, without the
/// prefix); empty for files written without them.
template <Device AD>
std::map<std::string, std::string> run_options(const io::archive<AD>& a) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : a.metadata())
    if (k.rfind("run.", 0) == 0) out[k.substr(4)] = v;
  return out;
}

namespace detail {
// Prevents: a candidate list ("no matching function") for a checkpoint loaded onto
// another device than the trainer's model (A: the archive's device, T: the trainer's).
// Written out per pair, as rules_train.hpp's rules are, so the message names both.
template <class A, class T>
constexpr bool require_archive_on_trainer_device() {
  if constexpr (std::is_same_v<A, T>) {
    return true;
  } else if constexpr (std::is_same_v<A, cpu> && std::is_same_v<T, pinned>) {
    static_assert(locus::detail::always_false<A>, "locus: the checkpoint was loaded onto cpu but the trainer's model lives on pinned; load it where the model lives: locus::train::load_checkpoint(locus::io::load<locus::pinned>(path), t), or locus::train::resume(path, t)");
    return false;
  } else if constexpr (std::is_same_v<A, cpu> && std::is_same_v<T, cuda>) {
    static_assert(locus::detail::always_false<A>, "locus: the checkpoint was loaded onto cpu but the trainer's model lives on cuda; load it where the model lives: locus::train::load_checkpoint(locus::io::load<locus::cuda>(path), t), or locus::train::resume(path, t)");
    return false;
  } else if constexpr (std::is_same_v<A, pinned> && std::is_same_v<T, cpu>) {
    static_assert(locus::detail::always_false<A>, "locus: the checkpoint was loaded onto pinned but the trainer's model lives on cpu; load it where the model lives: locus::train::load_checkpoint(locus::io::load<locus::cpu>(path), t), or locus::train::resume(path, t)");
    return false;
  } else if constexpr (std::is_same_v<A, pinned> && std::is_same_v<T, cuda>) {
    static_assert(locus::detail::always_false<A>, "locus: the checkpoint was loaded onto pinned but the trainer's model lives on cuda; load it where the model lives: locus::train::load_checkpoint(locus::io::load<locus::cuda>(path), t), or locus::train::resume(path, t)");
    return false;
  } else if constexpr (std::is_same_v<A, cuda> && std::is_same_v<T, cpu>) {
    static_assert(locus::detail::always_false<A>, "locus: the checkpoint was loaded onto cuda but the trainer's model lives on cpu; load it where the model lives: locus::train::load_checkpoint(locus::io::load<locus::cpu>(path), t), or locus::train::resume(path, t)");
    return false;
  } else if constexpr (std::is_same_v<A, cuda> && std::is_same_v<T, pinned>) {
    static_assert(locus::detail::always_false<A>, "locus: the checkpoint was loaded onto cuda but the trainer's model lives on pinned; load it where the model lives: locus::train::load_checkpoint(locus::io::load<locus::pinned>(path), t), or locus::train::resume(path, t)");
    return false;
  } else {
    static_assert(locus::detail::always_false<A>, "locus: the checkpoint was loaded onto another device than the trainer's model; load it with locus::io::load<D>(path), D the model's device, or call locus::train::resume(path, t)");
    return false;
  }
}

template <class Trainer>
std::int64_t load_into(const io::archive<typename Trainer::device>& a, Trainer& t);
}  // namespace detail

/// Restores a trainer from an archive on its device; returns the epochs finished.
/// An archive loaded onto another device does not compile (the message names both);
/// a file of another model is shape_error listing every mismatch; anything else wrong
/// (a corrupt file, another policy or optimizer, state of the wrong dtype or size) is
/// io_error. A failed load changes nothing in the trainer.
template <Device AD, class Trainer>
std::int64_t load_checkpoint(const io::archive<AD>& a, Trainer& t) {
  static_assert(!std::is_const_v<Trainer>,
                "locus: load_checkpoint writes the checkpoint into the trainer, but this one is const; pass "
                "a non-const trainer");
  if constexpr (!std::is_const_v<Trainer> &&
                detail::require_archive_on_trainer_device<AD, typename Trainer::device>())
    return detail::load_into<Trainer>(a, t);
  else
    return 0;
}

/// Anything but an io::archive: a path is resume()'s.
template <class NotArchive, class Trainer>
std::int64_t load_checkpoint(const NotArchive&, Trainer&) {
  static_assert(locus::detail::always_false<NotArchive>,
                "locus: load_checkpoint takes a loaded file, locus::io::archive<D> (from locus::io::load<D>(path)); "
                "to load a checkpoint from a path write locus::train::resume(path, t)");
  return 0;
}

namespace detail {
template <class Trainer>
std::int64_t load_into(const io::archive<typename Trainer::device>& a, Trainer& t) {
  using D = typename Trainer::device;
  using P = typename Trainer::policy;
  using M = typename P::master;
  auto& model = t.model();
  auto& store = model.parameters();
  const auto& entries = store.entries();

  // Every difference first, then one error that lists them all.
  const std::string mismatches =
      nn::detail::weight_mismatches(a, store, "checkpoint", nn::detail::buffers_of(std::as_const(model))) +
      nn::detail::buffer_mismatches(a, std::as_const(model), "checkpoint");
  if (!mismatches.empty())
    throw shape_error("locus: checkpoint '" + a.path() + "' was saved from a model of another shape:" + mismatches);

  // The counters, read (and checked) before anything in the trainer changes.
  const auto& meta = a.metadata();
  const std::string& path = a.path();
  // -2: with checksums (required by io::load); -1: written before them, read unverified
  if (const auto f = meta.find("format");
      f != meta.end() && f->second != "locus-checkpoint-1" && f->second != "locus-checkpoint-2")
    throw io_error("locus: checkpoint '" + path + "' was saved with format '" + io::detail::printable(f->second) +
                   "'; this version of locus reads locus-checkpoint-1 and locus-checkpoint-2 files");
  detail::meta_name(meta, "policy", P::name, path,
                    "resume with the precision policy the checkpoint was saved with");
  detail::meta_name(meta, "optimizer", Trainer::optimizer_kind, path,
                    "resume with the optimizer the checkpoint was saved with");
  // the parameter groups' weight decay (files before them recorded none)
  if constexpr (requires { t.optimizer().weight_decay_difference(std::string{}); }) {
    if (const auto f = meta.find("optimizer.weight_decay"); f != meta.end()) {
      const std::string diff = t.optimizer().weight_decay_difference(f->second);
      if (!diff.empty())
        throw value_error("locus: checkpoint '" + path + "' was saved by an optimizer with another weight decay per "
                          "parameter (" + io::detail::printable(diff) + "); resume with the weight_decay option and "
                          "the parameter groups it was saved with");
    }
  }
  if (meta.count("seed")) (void)detail::meta_counter(meta, "seed", path);
  std::map<std::size_t, std::uint64_t> rng;
  model.for_each_layer([&](std::size_t i, auto& layer) {
    if constexpr (requires { layer.set_counter(std::uint64_t{}); })
      rng[i] = detail::meta_counter(meta, "rng." + std::to_string(i), path);
  });
  const double base_lr = detail::meta_real(meta, "base_lr", t.base_lr(), path);
  const double lr = detail::meta_real(meta, "lr", t.optimizer().lr(), path);
  // The update kernels take the rate as a float: 1e300 would step by inf.
  for (const auto& [key, v] : {std::pair{"base_lr", base_lr}, std::pair{"lr", lr}})
    if (!(v >= 0.0 && v <= static_cast<double>(std::numeric_limits<float>::max())))
      throw io_error("locus: checkpoint '" + path + "' is corrupt: __metadata__ '" + key + "' is " +
                     std::to_string(v) + ", expected a learning rate in [0, FLT_MAX]");
  const std::int64_t epoch = detail::meta_count(meta, "epoch", path);
  const std::int64_t micro_steps = detail::meta_count(meta, "micro_steps", path);
  const std::int64_t optimizer_steps = detail::meta_count(meta, "optimizer_steps", path);

  // Everything the trainer needs must be there, of the dtype and shape it was saved
  // with, before anything is overwritten: a failed load leaves the trainer as it was.
  std::string missing;
  t.optimizer().for_each_state([&](const char* name, tensor_view<float, D, 1>) {
    for (const auto& e : entries) {
      const std::string key = std::string("optimizer.") + name + "." + e.name;
      if (!a.contains(key)) missing += " " + key;
    }
  });
  if (!a.contains("optimizer.step")) missing += " optimizer.step";
  if constexpr (Trainer::has_scaler)
    if (!a.contains("scaler.state")) missing += " scaler.state";
  if (!missing.empty())
    throw io_error("locus: checkpoint '" + a.path() + "' lacks the state this trainer needs:" + missing +
                   " (saved with another optimizer or without a grad scaler?)");
  auto expect = [&](const std::string& key, const char* dtype, const std::vector<index_t>& shape) {
    const io::tensor_info& f = a.info(key);
    if (f.dtype != dtype || f.shape != shape)
      throw io_error("locus: checkpoint '" + a.path() + "' is corrupt: tensor '" + key + "' is " +
                     io::detail::printable(f.dtype) + " " +
                     f.shape_string() + ", expected " + dtype + " " + io::detail::shape_text(shape));
  };
  for (const auto& e : entries) expect(e.name, io::detail::st_dtype<M>(), e.shape);
  nn::detail::check_buffer_values(a, std::as_const(model));
  t.optimizer().for_each_state([&](const char* name, tensor_view<float, D, 1>) {
    for (const auto& e : entries) expect(std::string("optimizer.") + name + "." + e.name, "F32", e.shape);
  });
  expect("optimizer.step", "I64", {1});
  detail::checked_count(to<cpu>(a.template get<std::int64_t, 1>("optimizer.step"))(0), "tensor 'optimizer.step'",
                        a.path());
  [[maybe_unused]] tensor<float, cpu, 1> scaler_state;
  if constexpr (Trainer::has_scaler) {
    expect("scaler.state", "F32", {3});
    scaler_state = to<cpu>(a.template get<float, 1>("scaler.state"));
    detail::check_scaler_state<std::remove_pointer_t<decltype(t.scaler())>>(scaler_state, a.path());
  }

  for (std::size_t i = 0; i < entries.size(); ++i) copy(a.template flat<M>(entries[i].name), store.master_flat(i));
  t.optimizer().for_each_state([&](const char* name, tensor_view<float, D, 1> flat) {
    for (const auto& e : entries)
      copy(a.template flat<float>(std::string("optimizer.") + name + "." + e.name),
           tensor_view<float, D, 1>(::locus::detail::raw_view_key{}, flat.data_handle() + e.offset, extents<1>{e.numel}));
  });
  copy(a.template get<std::int64_t, 1>("optimizer.step"), t.optimizer().step_tensor());
  if constexpr (Trainer::has_scaler) t.scaler()->load_state_dict(std::as_const(scaler_state).view());
  nn::detail::load_buffers(a, model);
  t.optimizer().after_load();  // the compute copy of the weights

  model.for_each_layer([&](std::size_t i, auto& layer) {
    if constexpr (requires { layer.set_counter(std::uint64_t{}); }) layer.set_counter(rng.at(i));
  });
  t.optimizer().set_lr(lr);
  t.restore_counters(micro_steps, optimizer_steps, epoch, base_lr);
  return epoch;
}
}  // namespace detail

/// load_checkpoint(io::load<D>(path), t) with D the trainer's device: the checkpoint's
/// tensors go straight to where the model lives.
template <class Trainer>
std::int64_t resume(const std::filesystem::path& path, Trainer& t) {
  return load_checkpoint(io::load<typename Trainer::device>(path), t);
}

}  // namespace locus::train
