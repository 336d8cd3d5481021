// Saving and loading a model's weights alone, for inference or to start another run:
//
//   locus::nn::save("mlp.safetensors", model);   // weights only, PyTorch's names
//   locus::nn::load("mlp.safetensors", model);   // onto the model's device; infer() at once
//
// The file is safetensors with the master weights under the names PyTorch's
// nn.Sequential gives them ("0.weight", "0.bias", ...), and the buffers (batch norm's
// "1.running_mean", "1.running_var", "1.num_batches_tracked"), so torch's
// `model.load_state_dict(safetensors.torch.load_file(path))` reads it, and
// __metadata__ {"format": "locus-model-2", "policy": ...} (-2: with checksums; nn::load
// reads -1 files, written before checksums, unverified). nn::load also reads a
// training checkpoint (train::save_checkpoint), taking its weights and ignoring the
// optimizer and scaler state. A file of another model is shape_error listing every
// mismatched tensor with both shapes; weights of another dtype (f32 for an fp64 model)
// or a corrupt file are io_error; a failed load changes nothing in the model. After a
// load the compute copy (bf16/f16 policies) is refreshed, so infer() uses the new
// weights. Like the trainer's checkpoints, nn::load onto a cuda model needs nvcc (it
// refreshes the compute copy with a kernel). Needs nlohmann-json (LOCUS_HAS_JSON).
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include "../core/error.hpp"
#include "../io/safetensors.hpp"
#include "../transfer/copy.hpp"
#include "parameters.hpp"

namespace locus::nn {

namespace detail {
/// A flat range of the store reshaped to a parameter's shape (rank 1 to 4), given to f.
template <class T, class D, class F>
void with_shape(T* base, const parameter_info& e, F&& f) {
  const auto& s = e.shape;
  T* p = base + e.offset;
  using ::locus::detail::raw_view_key;
  if (s.size() == 4)
    f(tensor_view<T, D, 4>(raw_view_key{}, p, extents<4>{s[0], s[1], s[2], s[3]}));
  else if (s.size() == 3)
    f(tensor_view<T, D, 3>(raw_view_key{}, p, extents<3>{s[0], s[1], s[2]}));
  else if (s.size() == 2)
    f(tensor_view<T, D, 2>(raw_view_key{}, p, extents<2>{s[0], s[1]}));
  else
    f(tensor_view<T, D, 1>(raw_view_key{}, p, extents<1>{e.numel}));
}

/// One buffer of a model (batch norm's running statistics): name, dtype, shape.
struct buffer_info {
  std::string name;
  std::string dtype;
  std::vector<index_t> shape;
};

/// The model's buffers (Model::for_each_buffer), in order; empty for models without.
template <class Model>
std::vector<buffer_info> buffers_of(const Model& m) {
  std::vector<buffer_info> out;
  if constexpr (requires { m.for_each_buffer([](const std::string&, const auto&) {}); }) {
    m.for_each_buffer([&](const std::string& name, const auto& v) {
      using T = std::remove_cv_t<typename std::remove_cvref_t<decltype(v)>::element_type>;
      buffer_info b{name, io::detail::st_dtype<T>(), {}};
      for (const index_t e : v.shape()) b.shape.push_back(e);
      out.push_back(std::move(b));
    });
  }
  return out;
}

/// Adds every buffer of the model to a safetensors writer.
template <class Model>
void add_buffers(io::writer& w, const Model& m) {
  if constexpr (requires { m.for_each_buffer([](const std::string&, const auto&) {}); })
    m.for_each_buffer([&](const std::string& name, const auto& v) { w.add(name, v); });
}

/// Every buffer the archive lacks or holds with another dtype or shape, one line each.
template <Device AD, class Model>
std::string buffer_mismatches(const io::archive<AD>& a, const Model& m, const std::string& what) {
  std::string out;
  for (const auto& b : buffers_of(m)) {
    if (!a.contains(b.name)) {
      out += "\n  " + b.name + ": model " + b.dtype + " " + io::detail::shape_text(b.shape) + ", " + what +
             " has no such tensor";
      continue;
    }
    const io::tensor_info& f = a.info(b.name);
    if (f.shape != b.shape)
      out += "\n  " + b.name + ": model " + b.dtype + " " + io::detail::shape_text(b.shape) + ", " + what + " " +
             io::detail::printable(f.dtype) + " " + f.shape_string();
  }
  return out;
}

/// After buffer_mismatches found none: io_error for a buffer of another dtype, or with
/// values no run writes (a negative running variance, a negative num_batches_tracked):
/// a corrupt file. NaN is kept: a run fed a NaN batch writes it (as PyTorch's does).
template <Device AD, class Model>
void check_buffer_values(const io::archive<AD>& a, const Model& m) {
  for (const auto& b : buffers_of(m)) {
    const io::tensor_info& f = a.info(b.name);
    if (f.dtype != b.dtype)
      throw io_error("locus: '" + a.path() + "': buffer '" + b.name + "' is " + io::detail::printable(f.dtype) +
                     ", but this model's is " + b.dtype + "; load it into a model of the policy it was saved from");
    const auto ends = [&](const std::string& suffix) {
      return b.name.size() >= suffix.size() && b.name.compare(b.name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const auto bad = [&](const std::string& why) {
      throw io_error("locus: '" + a.path() + "' is corrupt: buffer '" + b.name + "' " + why);
    };
    if (b.dtype == "I64") {
      const auto h = to<cpu>(a.template flat<std::int64_t>(b.name));
      for (index_t i = 0; i < h.numel(); ++i)
        if (ends("num_batches_tracked") && h.data_handle()[i] < 0) bad("is negative");
    } else if (b.dtype == "F32" || b.dtype == "F64") {
      const auto check = [&](const auto& h) {
        for (index_t i = 0; i < h.numel(); ++i) {
          const double v = static_cast<double>(h.data_handle()[i]);
          if (ends("running_var") && v < 0.0) bad("holds a negative variance");
        }
      };
      if (b.dtype == "F32") check(to<cpu>(a.template flat<float>(b.name)));
      else check(to<cpu>(a.template flat<double>(b.name)));
    }
  }
}

/// Copies the archive's buffers into the model (after buffer_mismatches found none).
template <Device AD, class Model>
void load_buffers(const io::archive<AD>& a, Model& m) {
  if constexpr (requires { m.for_each_buffer([](const std::string&, const auto&) {}); }) {
    m.for_each_buffer([&](const std::string& name, const auto& v) {
      using T = std::remove_cv_t<typename std::remove_cvref_t<decltype(v)>::element_type>;
      copy(a.template flat<T>(name), v.reshape(extents<1>{v.numel()}));
    });
  }
}
/// Every difference between the store's parameters and the archive's weights, one line
/// each ("\n  name: model [..], <what> [..]" or "... has no such ..."), empty when they
/// match; `what` names the file in the lines ("checkpoint", "file"). Optimizer and
/// scaler state ("optimizer.*", "scaler.*") is not a weight.
template <Device AD, class Store>
std::string weight_mismatches(const io::archive<AD>& a, const Store& store, const std::string& what,
                              const std::vector<buffer_info>& buffers = {}) {
  std::string out;
  for (const auto& e : store.entries()) {
    if (!a.contains(e.name)) {
      out += "\n  " + e.name + ": model " + e.shape_string() + ", " + what + " has no such tensor";
      continue;
    }
    const io::tensor_info& f = a.info(e.name);
    if (f.shape != e.shape) out += "\n  " + e.name + ": model " + e.shape_string() + ", " + what + " " + f.shape_string();
  }
  for (const auto& [name, f] : a.entries()) {
    if (name.rfind("optimizer.", 0) == 0 || name.rfind("scaler.", 0) == 0) continue;
    bool known = false;
    for (const auto& e : store.entries()) known = known || e.name == name;
    for (const auto& b : buffers) known = known || b.name == name;
    if (!known)
      out += "\n  " + io::detail::printable(name) + ": " + what + " " + f.shape_string() + ", model has no such parameter";
  }
  return out;
}
}  // namespace detail

/// Writes the model's weights to `path` (atomically: a temporary file, fsync, rename).
template <class Model>
void save(const std::filesystem::path& path, const Model& model) {
  using D = typename Model::device;
  using P = typename Model::policy;
  using M = typename P::master;
  const auto& store = model.parameters();
  io::writer w;
  const M* base = store.master().data_handle();
  for (const auto& e : store.entries())
    detail::with_shape<const M, D>(base, e, [&](const auto& v) { w.add(e.name, v); });
  detail::add_buffers(w, model);
  w.metadata("format", "locus-model-2");
  w.metadata("policy", std::string(P::name));
  io::detail::make_parent_directories(path);
  w.save(path);
}

namespace detail {
/// nn::load's work, for a non-const model.
template <class Model>
void load_into(const std::filesystem::path& path, Model& model) {
  using D = typename Model::device;
  using P = typename Model::policy;
  using M = typename P::master;
  const auto a = io::load<D>(path);
  auto& store = model.parameters();
  const std::string mismatches = detail::weight_mismatches(a, store, "file", detail::buffers_of(model)) +
                                 detail::buffer_mismatches(a, model, "file");
  if (!mismatches.empty())
    throw shape_error("locus: '" + a.path() + "' holds the weights of a model of another shape:" + mismatches);
  detail::check_buffer_values(a, model);
  for (const auto& e : store.entries()) {
    const io::tensor_info& f = a.info(e.name);
    if (f.dtype != io::detail::st_dtype<M>())
      throw io_error("locus: '" + a.path() + "': tensor '" + e.name + "' is " + io::detail::printable(f.dtype) +
                     ", but this model's weights are " + io::detail::st_dtype<M>() + " (policy " + std::string(P::name) +
                     "); load it into a model of the policy it was saved from");
  }
  for (std::size_t i = 0; i < store.entries().size(); ++i)
    copy(a.template flat<M>(store.entries()[i].name), store.master_flat(i));
  detail::load_buffers(a, model);
  store.sync_compute();
}
}  // namespace detail

/// Reads weights saved by nn::save or train::save_checkpoint into the model, onto its
/// device. Throws shape_error (another model) or io_error (dtype, corrupt file); a failed
/// load leaves the model as it was.
template <class Model>
void load(const std::filesystem::path& path, Model& model) {
  static_assert(!std::is_const_v<Model>,
                "locus: nn::load writes the weights into the model, but this one is const; pass a non-const model");
  if constexpr (!std::is_const_v<Model>) detail::load_into(path, model);
}

}  // namespace locus::nn
