// parameter_store<D, Policy>: every parameter of a model in three flat buffers on D,
// master weights (Policy::master), gradients (master dtype) and, for mixed policies, the
// compute copy (Policy::compute). Layers hold views into them. One flat buffer makes
// the whole-model passes single kernels: zero_grad is one memset (or none: discard_grad
// defers it, and the next backward overwrites each gradient), the non-finite check
// of the grad scaler is one pass, the optimizer update (and the cast of master weights
// to the compute dtype) is one fused pass over every parameter: a multi-tensor update
// without a list of tensors.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../amp/policy.hpp"
#include "../core/error.hpp"
#include "../core/shape.hpp"
#include "../tensor/factories.hpp"
#include "../tensor/tensor.hpp"
#include "kernels.hpp"

namespace locus::nn {

/// One parameter: its stable name ("0.weight", "2.bias", ...), where it lives in the
/// flat buffers, and its shape (rank 1 or 2).
struct parameter_info {
  std::string name;
  index_t offset = 0;
  index_t numel = 0;
  std::vector<index_t> shape;
  /// An embedding table (nn::embedding's, nn::positional_embedding's): what
  /// optim::no_decay_group leaves without weight decay, as transformer recipes do.
  bool embedding = false;

  [[nodiscard]] std::string shape_string() const {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

template <Device D, class Policy>
class parameter_store {
  static_assert(detail::check_policy<Policy>());

 public:
  using device = D;
  using policy = Policy;
  using master_type = typename Policy::master;
  using compute_type = typename Policy::compute;
  static constexpr bool separate_compute = !std::is_same_v<master_type, compute_type>;
  /// Parameters start at multiples of this many elements (256-byte aligned in f32).
  static constexpr index_t alignment = 64;

  /// Declares a parameter (before allocate()); returns its index.
  std::size_t add(std::string name, std::initializer_list<index_t> shape) {
    if (allocated_) throw ::locus::error("locus: parameter '" + name + "' declared after allocate()");
    parameter_info p;
    p.name = std::move(name);
    p.shape.assign(shape.begin(), shape.end());
    p.numel = 1;
    for (index_t e : p.shape) {
      if (e < 0 || __builtin_mul_overflow(p.numel, e, &p.numel))
        throw shape_error("locus: parameter '" + p.name + "' of shape " + p.shape_string() +
                          " has a negative extent or more elements than 64-bit indices address");
    }
    p.offset = size_;
    const index_t padded = (p.numel / alignment + (p.numel % alignment != 0 ? 1 : 0)) * alignment;
    if (padded < p.numel || __builtin_add_overflow(size_, padded, &size_) ||
        size_ > std::numeric_limits<index_t>::max() / static_cast<index_t>(sizeof(master_type)))
      throw shape_error("locus: parameter '" + p.name + "' of shape " + p.shape_string() +
                        " makes the model's parameters larger than 64-bit byte offsets address");
    entries_.push_back(std::move(p));
    return entries_.size() - 1;
  }

  /// Marks parameter i as an embedding table (parameter_info::embedding).
  void mark_embedding(std::size_t i) {
    if (i >= entries_.size()) throw index_error("locus: mark_embedding of parameter " + std::to_string(i) + " of " + std::to_string(entries_.size()));
    entries_[i].embedding = true;
  }

  /// Allocates the flat buffers (gradients zeroed, weights uninitialised).
  void allocate() {
    master_ = tensor<master_type, D, 1>(extents<1>{size_});
    detail::zero_bytes<D>(master_.data_handle(), master_.size_bytes());
    grad_ = zeros<master_type, D>(extents<1>{size_});
    if constexpr (separate_compute) compute_ = zeros<compute_type, D>(extents<1>{size_});
    std::vector<index_t> offs;
    for (const auto& e : entries_) offs.push_back(e.offset);
    offs.push_back(size_);
    tensor<index_t, cpu, 1> h(extents<1>{static_cast<index_t>(offs.size())});
    for (std::size_t i = 0; i < offs.size(); ++i) h(static_cast<index_t>(i)) = offs[i];
    offsets_ = to<D>(h);
    allocated_ = true;
  }

  [[nodiscard]] const std::vector<parameter_info>& entries() const noexcept { return entries_; }
  [[nodiscard]] std::size_t count() const noexcept { return entries_.size(); }
  /// Elements in each flat buffer (parameters plus alignment padding).
  [[nodiscard]] index_t size() const noexcept { return size_; }
  /// Parameter elements (no padding): what PyTorch's numel() sum reports.
  [[nodiscard]] index_t parameter_count() const noexcept {
    index_t n = 0;
    for (const auto& e : entries_) n += e.numel;
    return n;
  }

  [[nodiscard]] tensor_view<master_type, D, 1> master() noexcept { return master_.view(); }
  [[nodiscard]] tensor_view<const master_type, D, 1> master() const noexcept { return master_.view(); }
  /// Every gradient as one flat buffer (what discard_grad deferred is zeroed first).
  [[nodiscard]] tensor_view<master_type, D, 1> grad() {
    settle_grad();
    return grad_.view();
  }
  [[nodiscard]] tensor_view<const master_type, D, 1> grad() const {
    settle_grad();
    return grad_.view();
  }
  /// The compute copy as a flat buffer (the master buffer when they share a dtype).
  [[nodiscard]] compute_type* compute_data() noexcept {
    if constexpr (separate_compute) return compute_.data_handle();
    else return master_.data_handle();
  }
  [[nodiscard]] const index_t* offsets_data() const noexcept { return offsets_.data_handle(); }

  /// Parameter i as a view of rank R (its declared rank).
  template <std::size_t R>
  [[nodiscard]] tensor_view<master_type, D, R> master(std::size_t i) noexcept {
    return {::locus::detail::raw_view_key{}, master_.data_handle() + entries_[i].offset, shape_of<R>(i), master_.device_index()};
  }
  template <std::size_t R>
  [[nodiscard]] tensor_view<master_type, D, R> grad(std::size_t i) {
    settle_grad(i);
    return {::locus::detail::raw_view_key{}, grad_.data_handle() + entries_[i].offset, shape_of<R>(i), grad_.device_index()};
  }
  template <std::size_t R>
  [[nodiscard]] tensor_view<const compute_type, D, R> compute(std::size_t i) const noexcept {
    const compute_type* base;
    if constexpr (separate_compute) base = compute_.data_handle();
    else base = master_.data_handle();
    return {::locus::detail::raw_view_key{}, base + entries_[i].offset, shape_of<R>(i), master_.device_index()};
  }
  /// The index of the parameter called `name` (PyTorch's name: "0.weight", "3.bias"); an
  /// index_error listing every name when the model has none of that name.
  [[nodiscard]] std::size_t index_of(std::string_view name) const {
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].name == name) return i;
    std::string known;
    for (const auto& e : entries_) known += (known.empty() ? "" : ", ") + e.name + " " + e.shape_string();
    throw index_error("locus: the model has no parameter named '" + std::string(name) +
                      "'; its parameters: " + (known.empty() ? std::string("none") : known));
  }
  /// Parameter `name`'s master weights as a view of its rank R, to read or edit by name:
  /// model.parameters().master<2>("0.weight"). Another rank is a shape_error naming the
  /// right one. After writing the master weights of a bf16/f16 model, call sync_compute()
  /// (the forward reads the compute copy); an optimizer step needs nothing more.
  template <std::size_t R>
  [[nodiscard]] tensor_view<master_type, D, R> master(std::string_view name) {
    const std::size_t i = index_of(name);
    check_rank(i, R);
    return master<R>(i);
  }
  template <std::size_t R>
  [[nodiscard]] tensor_view<const master_type, D, R> master(std::string_view name) const {
    const std::size_t i = index_of(name);
    check_rank(i, R);
    return {::locus::detail::raw_view_key{}, master_.data_handle() + entries_[i].offset, shape_of<R>(i), master_.device_index()};
  }
  /// Parameter i's master weights and gradient as flat views.
  [[nodiscard]] tensor_view<master_type, D, 1> master_flat(std::size_t i) noexcept {
    return {::locus::detail::raw_view_key{}, master_.data_handle() + entries_[i].offset, extents<1>{entries_[i].numel}, master_.device_index()};
  }
  [[nodiscard]] tensor_view<const master_type, D, 1> master_flat(std::size_t i) const noexcept {
    return {::locus::detail::raw_view_key{}, master_.data_handle() + entries_[i].offset, extents<1>{entries_[i].numel}, master_.device_index()};
  }
  [[nodiscard]] tensor_view<master_type, D, 1> grad_flat(std::size_t i) {
    settle_grad(i);
    return {::locus::detail::raw_view_key{}, grad_.data_handle() + entries_[i].offset, extents<1>{entries_[i].numel}, grad_.device_index()};
  }

  /// Whether parameter i's gradient is discarded: it counts as zero and the next backward
  /// overwrites it (discard_grad).
  [[nodiscard]] bool grad_discarded(std::size_t i) const noexcept {
    return any_discarded_ && i < discarded_.size() && discarded_[i] != 0;
  }
  /// Where the flat gradient buffer lives (no settling: for identity checks).
  [[nodiscard]] const master_type* grad_address() const noexcept { return grad_.data_handle(); }
  /// The flat gradient buffer as it is, discarded gradients not zeroed (for code that
  /// reads only gradients a backward has just written: data-parallel buckets).
  [[nodiscard]] tensor_view<master_type, D, 1> grad_unsettled() noexcept { return grad_.view(); }

  /// For a backward that writes parameter i's whole gradient: the gradient, and true
  /// when discard_grad left it unwritten (then the backward stores dL/dw instead of
  /// adding it: the GEMM's beta = 0, no memset before it and no read of the old values).
  /// Either way the parameter counts as written afterwards.
  template <std::size_t R>
  [[nodiscard]] std::pair<tensor_view<master_type, D, R>, bool> grad_out(std::size_t i) noexcept {
    return {{::locus::detail::raw_view_key{}, grad_.data_handle() + entries_[i].offset, shape_of<R>(i), grad_.device_index()}, take(i)};
  }
  [[nodiscard]] std::pair<tensor_view<master_type, D, 1>, bool> grad_flat_out(std::size_t i) noexcept {
    return {{::locus::detail::raw_view_key{}, grad_.data_handle() + entries_[i].offset, extents<1>{entries_[i].numel}, grad_.device_index()},
            take(i)};
  }

  /// The compute copy from the master weights (one pass; nothing for fp32 and fp64).
  void sync_compute() {
    if constexpr (separate_compute)
      detail::launch_n<D>(size_, detail::cast_kernel<master_type, compute_type>{master_.data_handle(),
                                                                                 compute_.data_handle()});
  }

  /// Sets every gradient to zero (one memset).
  void zero_grad() {
    detail::zero_bytes<D>(grad_.data_handle(), grad_.size_bytes());
    discarded_.assign(entries_.size(), 0);
    any_discarded_ = false;
  }

  /// zero_grad without the memset: every gradient counts as zero but keeps its bytes;
  /// the next backward overwrites each one (grad_out), and any read of a gradient
  /// before that (grad(), grad<R>(i), grad_flat(i), settle_grad()) zeroes it first.
  /// What the trainer does between steps on host devices, where the memset and the
  /// GEMMs' read of the old gradient are memory traffic the step pays for. Code that
  /// reads the flat buffer through a pointer taken earlier (an optimizer's step) must
  /// call settle_grad() first when a parameter might have had no backward.
  void discard_grad() {
    discarded_.assign(entries_.size(), 1);
    any_discarded_ = !entries_.empty();
  }
  /// What a failed training step puts back (train::trainer): the deferred-zero flags,
  /// and with `values` a copy of the gradient buffer (the micro-batches an accumulation
  /// window already added). Without values, the restore zeroes the buffer: what it holds
  /// at the start of a window wherever a flag does not defer it.
  struct grad_snapshot {
    std::vector<unsigned char> discarded;
    bool any_discarded = false;
    bool with_values = false;          // false: restore zeros
    tensor<master_type, D, 1> values;
  };
  /// Fills `s` (its copy buffer allocated on first use, then reused: no allocation in
  /// steady state).
  void snapshot_grad(grad_snapshot& s, bool values) const {
    s.discarded.assign(discarded_.begin(), discarded_.end());
    s.any_discarded = any_discarded_;
    s.with_values = values;
    if (!values) return;
    if (s.values.numel() != size_) s.values = tensor<master_type, D, 1>(extents<1>{size_});
    detail::copy_bytes<D, D>(s.values.data_handle(), grad_.data_handle(), grad_.size_bytes());
  }
  void restore_grad(const grad_snapshot& s) {
    if (s.with_values)
      detail::copy_bytes<D, D>(grad_.data_handle(), s.values.data_handle(), grad_.size_bytes());
    else
      detail::zero_bytes<D>(grad_.data_handle(), grad_.size_bytes());
    discarded_ = s.discarded;
    any_discarded_ = s.any_discarded;
  }

  /// Writes the zeros that discard_grad deferred, for the parameters no backward has
  /// written since (none left after a full backward: then it costs a flag test).
  void settle_grad() const {
    if (!any_discarded_) return;
    for (std::size_t i = 0; i < entries_.size(); ++i) settle_grad(i);
    any_discarded_ = false;
  }

 private:
  bool take(std::size_t i) noexcept {
    if (!any_discarded_ || !discarded_[i]) return false;
    discarded_[i] = 0;
    return true;
  }
  void settle_grad(std::size_t i) const {
    if (!any_discarded_ || !discarded_[i]) return;
    // through the alignment padding after it too: the same bytes as zero_grad
    const index_t end = i + 1 < entries_.size() ? entries_[i + 1].offset : size_;
    detail::zero_bytes<D>(const_cast<master_type*>(grad_.data_handle()) + entries_[i].offset,
                          static_cast<std::size_t>(end - entries_[i].offset) * sizeof(master_type));
    discarded_[i] = 0;
  }

 public:

 private:
  void check_rank(std::size_t i, std::size_t r) const {
    const auto& e = entries_[i];
    if (e.shape.size() != r)
      throw shape_error("locus: parameter '" + e.name + "' has rank " + std::to_string(e.shape.size()) + " " +
                        e.shape_string() + ", not " + std::to_string(r) + "; write master<" +
                        std::to_string(e.shape.size()) + ">(\"" + e.name + "\")");
  }
  template <std::size_t R>
  extents<R> shape_of(std::size_t i) const noexcept {
    extents<R> s{};
    for (std::size_t a = 0; a < R && a < entries_[i].shape.size(); ++a) s[a] = entries_[i].shape[a];
    return s;
  }

  std::vector<parameter_info> entries_;
  index_t size_ = 0;
  bool allocated_ = false;
  // discard_grad's deferred zeros: which parameters' gradients count as zero but were
  // not written (mutable: a const read of the gradients writes them first).
  mutable std::vector<unsigned char> discarded_;
  mutable bool any_discarded_ = false;
  tensor<master_type, D, 1> master_, grad_;
  tensor<compute_type, D, 1> compute_;
  tensor<index_t, D, 1> offsets_;
};

}  // namespace locus::nn
