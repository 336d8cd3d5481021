// locus::ag: reverse-mode automatic differentiation over typed values.
//
//   locus::ag::tape<float, locus::cpu> t;
//   auto x = t.constant(batch.view());           // no gradient
//   auto w = t.leaf(weights.view());             // a gradient is computed for it
//   auto loss = locus::ag::mean(locus::ag::relu(locus::ag::matmul(x, w)));
//   t.backward(loss);                            // loss must be rank 0 (compile time)
//   auto gw = t.grad(w);                         // dL/dw, a view on the tape's device
//   t.reset();                                   // the next step reuses every buffer
//
// A value, ag::var<T, D, R>, is a view of a result plus its place on a tape; its device,
// dtype and rank are in its type exactly as a tensor's are, so two devices or two dtypes
// in one operation, or backward() on anything but a rank-0 loss, are compile errors with
// a `locus:` first line. What only the run can know is a typed error before anything
// changes: a value of another tape or of an earlier step (the tape was reset since),
// backward twice over one step, shapes that do not match (naming both).
//
// How the tape works. Each operation appends one entry: an output slot (its value
// buffer, and a gradient buffer made at backward when a gradient flows into it) and a
// node that knows its inputs' slots and computes their gradient contributions from its
// output's gradient. backward() seeds the loss's gradient with 1, runs the nodes from
// the last to the first, and each node adds into its inputs' gradient buffers: the first
// contribution to a buffer overwrites it (no memset), later ones add. A node whose
// output received no gradient, or whose inputs need none, does nothing. Fused operations
// (linear with its activation, log-softmax with the loss) are one node each, with the
// hand-written backward locus's layers use: the tape records operations, it does not
// choose kernels.
//
// Steady state. reset() keeps every slot's buffers and every node object: the next step
// at the same shapes reuses them by position (a node is reused when the operation at
// that position is of the same kind), so a training step at an unchanged shape allocates
// nothing on the tape. A value's view points into its slot's buffer: it is valid until
// the tape is reset (an operation on a value of an earlier step is refused by the
// step's generation number, which every value carries).
//
// Length (over 600 lines): the tape, its values and the liveness checks (a value of a
// destroyed or reset tape) are one state; the operations over it are ag/ops.hpp.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/rules.hpp"
#include "../core/shape.hpp"
#include "../ops/expr.hpp"
#include "../tensor/factories.hpp"
#include "../tensor/tensor.hpp"

namespace locus {

/// A misuse of the tape that only the run can see: backward twice over one step, a
/// value of another tape or of an earlier step. Raised before anything changes.
class autograd_error : public error {
 public:
  using error::error;
};

}  // namespace locus

namespace locus::ag {

template <class T, Device D>
class tape;

namespace detail {
struct access;

/// Step numbers unique in the process (every tape's every step): a value of a tape that
/// was destroyed is refused by a new tape at the same address.
inline std::uint64_t next_generation() noexcept {
  static std::atomic<std::uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

/// Where every live tape publishes its current step number, so that an operation checks
/// a value's tape alive before it touches it (a value that outlived its tape holds a
/// dangling pointer; reading the step through it would be a use after free). A tape
/// claims an entry when it is made and clears it when destroyed; an operation reads one
/// atomic. Chunks are never freed or moved, so a reader needs no lock; the directory
/// itself is never destroyed (tapes of static lifetime may outlive other statics).
class tape_directory {
 public:
  static constexpr std::uint32_t chunk_size = 1024;
  static constexpr std::uint32_t max_chunks = 4096;  // 4M tapes alive at once

  static tape_directory& get() {
    static auto* d = new tape_directory();  // never destroyed (see above)
    return *d;
  }
  std::uint32_t claim() {
    std::lock_guard<std::mutex> lock(m_);
    if (!free_.empty()) {
      const auto i = free_.back();
      free_.pop_back();
      return i;
    }
    const std::uint32_t i = next_++;
    const std::uint32_t c = i / chunk_size;
    if (c >= max_chunks) {
      --next_;
      throw autograd_error("locus: more than " + std::to_string(std::uint64_t{chunk_size} * max_chunks) +
                           " tapes alive at once");
    }
    if (chunks_[c].load(std::memory_order_acquire) == nullptr)
      chunks_[c].store(new std::atomic<std::uint64_t>[chunk_size](), std::memory_order_release);
    return i;
  }
  void release(std::uint32_t i) noexcept {
    at(i).store(0, std::memory_order_release);
    std::lock_guard<std::mutex> lock(m_);
    free_.push_back(i);  // (reserved at claim time: no allocation here)
  }
  std::atomic<std::uint64_t>& at(std::uint32_t i) const noexcept {
    return chunks_[i / chunk_size].load(std::memory_order_acquire)[i % chunk_size];
  }
  /// Reserves room so that release() never allocates (called by claim's caller).
  void reserve_free() {
    std::lock_guard<std::mutex> lock(m_);
    free_.reserve(next_);
  }

 private:
  tape_directory() = default;
  std::mutex m_;
  std::vector<std::uint32_t> free_;
  std::uint32_t next_ = 0;
  std::array<std::atomic<std::atomic<std::uint64_t>*>, max_chunks> chunks_{};
};

// Prevents: backward() from a value that is not a scalar loss (PyTorch: "grad can be
// implicitly created only for scalar outputs", at run time).
template <std::size_t R>
constexpr bool require_scalar_loss() {
  if constexpr (R == 1) {
    static_assert(R == 0, "locus: backward() needs a scalar (rank-0) loss, but this value has rank 1; reduce it "
                          "first: locus::ag::mean(v) or locus::ag::sum(v)");
  } else if constexpr (R == 2) {
    static_assert(R == 0, "locus: backward() needs a scalar (rank-0) loss, but this value has rank 2; reduce it "
                          "first: locus::ag::mean(v) or locus::ag::sum(v)");
  } else if constexpr (R == 3) {
    static_assert(R == 0, "locus: backward() needs a scalar (rank-0) loss, but this value has rank 3; reduce it "
                          "first: locus::ag::mean(v) or locus::ag::sum(v)");
  } else if constexpr (R >= 4) {
    static_assert(R == 0, "locus: backward() needs a scalar (rank-0) loss, but this value has rank 4 or more; "
                          "reduce it first: locus::ag::mean(v) or locus::ag::sum(v)");
  }
  return R == 0;
}

// Prevents: a tape over a dtype that has no gradient (integers, bool).
template <class T>
constexpr bool require_differentiable_dtype() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, ::locus::bf16> ||
                    std::is_same_v<T, ::locus::f16>,
                "locus: a tape differentiates f32, f64, bf16 or f16 values; integer and bool tensors have no "
                "gradient (pass them to the operations that take them, e.g. the labels of ag::cross_entropy)");
  return true;
}
}  // namespace detail

/// A differentiable value: a view of a result of dtype T, rank R on device D, and its
/// place on a tape (see the header). Cheap to copy; valid until its tape is reset.
template <class T, class D, std::size_t R>
class var {
 public:
  using value_type = T;
  using device = D;
  static constexpr std::size_t rank = R;

  var() = default;

  /// The value (a view into the tape's buffer, or of the tensor given to constant/leaf).
  [[nodiscard]] tensor_view<const T, D, R> value() const noexcept { return value_; }
  [[nodiscard]] extents<R> shape() const noexcept { return value_.shape(); }
  [[nodiscard]] index_t numel() const noexcept { return value_.numel(); }
  /// Whether backward computes a gradient for it (a leaf, or a result of one).
  [[nodiscard]] bool requires_grad() const noexcept { return requires_grad_; }
  /// The GPU its value lives on (-1 on host devices).
  [[nodiscard]] int device_index() const noexcept { return value_.device_index(); }
  /// The tape it belongs to (nullptr for a default-constructed value).
  [[nodiscard]] const tape<T, D>* owner() const noexcept { return tape_; }

 private:
  friend struct detail::access;
  tape<T, D>* tape_ = nullptr;
  std::uint32_t id_ = 0;
  std::uint32_t directory_ = 0;  // its tape's entry in detail::tape_directory
  std::uint64_t generation_ = 0;
  bool requires_grad_ = false;
  tensor_view<const T, D, R> value_;
};

template <class X>
inline constexpr bool is_var_v = false;
template <class T, class D, std::size_t R>
inline constexpr bool is_var_v<var<T, D, R>> = true;

/// Integer ids (token ids, positions) of dtype I (int32 or int64), rank R on device D, as
/// an input of a forward recorded on a tape of compute dtype T: what an embedding takes
/// (tape.ids(x); nn::model passes one to a forward that takes it). No gradient flows
/// into ids. A view: the ids are read again in backward, so they stay alive until then.
template <class T, class D, std::size_t R, class I = std::int64_t>
class ids {
 public:
  using value_type = I;
  using compute_type = T;
  using device = D;
  static constexpr std::size_t rank = R;

  ids() = default;

  [[nodiscard]] tensor_view<const I, D, R> value() const noexcept { return value_; }
  [[nodiscard]] extents<R> shape() const noexcept { return value_.shape(); }
  [[nodiscard]] index_t numel() const noexcept { return value_.numel(); }
  /// The tape it belongs to (nullptr for a default-constructed one).
  [[nodiscard]] const tape<T, D>* owner() const noexcept { return tape_; }

 private:
  friend struct detail::access;
  tape<T, D>* tape_ = nullptr;
  std::uint32_t directory_ = 0;
  std::uint64_t generation_ = 0;
  tensor_view<const I, D, R> value_;
};

template <class X>
inline constexpr bool is_ids_v = false;
template <class T, class D, std::size_t R, class I>
inline constexpr bool is_ids_v<ids<T, D, R, I>> = true;

/// One recorded operation: computes its inputs' gradient contributions from its
/// output's gradient.
template <class T, class D>
struct node {
  virtual ~node() = default;
  virtual void backward(tape<T, D>& t) = 0;
};

namespace detail {
/// What the operations reach inside a var and a tape (not for users).
struct access {
  template <class V>
  static auto& tape_of(V& v) noexcept {
    return v.tape_;
  }
  template <class V>
  static std::uint32_t id(const V& v) noexcept {
    return v.id_;
  }
  template <class V>
  static std::uint64_t generation(const V& v) noexcept {
    return v.generation_;
  }
  /// A tape that frees each value and gradient during backward once no node left to run
  /// reads it (activation checkpointing's segment tapes; tape::set_releasing).
  template <class T, class D>
  static void set_releasing(tape<T, D>& t, bool on) noexcept {
    t.set_releasing(on);
  }
  template <class T, class D>
  static bool releasing(const tape<T, D>& t) noexcept {
    return t.releasing();
  }
  /// Whether v's tape is alive and still at v's step, read without touching the tape.
  template <class V>
  static bool tape_current(const V& v) noexcept {
    return tape_directory::get().at(v.directory_).load(std::memory_order_acquire) == v.generation_;
  }
  template <class T, class D, std::size_t R, class I>
  static ids<T, D, R, I> make_ids(tape<T, D>* t, std::uint64_t gen, tensor_view<const I, D, R> value) noexcept {
    ids<T, D, R, I> v;
    v.tape_ = t;
    v.directory_ = t->directory_;
    v.generation_ = gen;
    v.value_ = value;
    return v;
  }
  template <class T, class D, std::size_t R>
  static var<T, D, R> make(tape<T, D>* t, std::uint32_t id, std::uint64_t gen, bool rg,
                           tensor_view<const T, D, R> value) noexcept {
    var<T, D, R> v;
    v.tape_ = t;
    v.id_ = id;
    v.directory_ = t->directory_;
    v.generation_ = gen;
    v.requires_grad_ = rg;
    v.value_ = value;
    return v;
  }
};

template <std::size_t R>
std::string shape_text(const extents<R>& s) {
  return ::locus::detail::shape_string(s);
}
}  // namespace detail

/// The record of one forward pass (see the header). Not copyable or movable: values
/// point at it. T is the compute dtype (a policy's `compute`), D the device.
template <class T, Device D>
class tape {
  static_assert(detail::require_differentiable_dtype<T>());

 public:
  using value_type = T;
  using device = D;

  friend struct detail::access;

 public:
  tape() : directory_(detail::tape_directory::get().claim()) {
    detail::tape_directory::get().reserve_free();
    publish();
  }
  ~tape() { detail::tape_directory::get().release(directory_); }
  tape(const tape&) = delete;
  tape& operator=(const tape&) = delete;

  /// A value that needs no gradient (a batch, a mask): x is used by reference and must
  /// stay alive until backward.
  template <std::size_t R>
  var<T, D, R> constant(const tensor_view<const T, D, R>& x) {
    return external(x, false);
  }
  template <std::size_t R>
  var<T, D, R> constant(const tensor<T, D, R>& x) {
    return external(x.view(), false);
  }
  /// A view of mutable elements (t.slice(0, 4) of a named tensor) is taken as const.
  template <std::size_t R>
  var<T, D, R> constant(const tensor_view<T, D, R>& x) {
    return external(tensor_view<const T, D, R>(x), false);
  }
  template <std::size_t R>
  var<T, D, R> leaf(const tensor_view<T, D, R>& x) {
    return external(tensor_view<const T, D, R>(x), true);
  }
  // Prevents: constant/leaf of another device's or dtype's tensor (one tape, one device
  // and one dtype), and of a const temporary tensor.
  template <class X>
    requires(::locus::detail::tensor_traits<std::remove_cvref_t<X>>::is_tensor ||
             ::locus::detail::tensor_traits<std::remove_cvref_t<X>>::is_view)
  auto constant(const X& x) {
    return foreign<X>(x, false);
  }
  template <class X>
    requires(::locus::detail::tensor_traits<std::remove_cvref_t<X>>::is_tensor ||
             ::locus::detail::tensor_traits<std::remove_cvref_t<X>>::is_view)
  auto leaf(const X& x) {
    return foreign<X>(x, true);
  }
  template <std::size_t R>
  var<T, D, R> constant(const tensor<T, D, R>&& x) {
    static_assert(::locus::detail::always_false_v<R>, "locus: tape.constant() of a temporary tensor would dangle: the tape reads it until "
                              "backward, but it is freed at the end of the statement; keep it in a variable first: "
                              "auto x = ...; then tape.constant(x)");
    return external(x.view(), false);
  }
  template <std::size_t R>
  var<T, D, R> leaf(const tensor<T, D, R>&& x) {
    static_assert(::locus::detail::always_false_v<R>, "locus: tape.leaf() of a temporary tensor would dangle: the tape reads it until "
                              "backward, but it is freed at the end of the statement; keep it in a variable first: "
                              "auto x = ...; then tape.leaf(x)");
    return external(x.view(), true);
  }
  template <std::size_t R>
  var<T, D, R> constant(tensor<T, D, R>&& x) {
    static_assert(::locus::detail::always_false_v<R>, "locus: tape.constant() of a temporary tensor would dangle: the tape reads it until "
                              "backward, but it is freed at the end of the statement; keep it in a variable first: "
                              "auto x = ...; then tape.constant(x)");
    return external(x.view(), false);
  }

  /// Integer ids (int32 or int64) as an input of this step's forward: what an embedding
  /// and ag::gather_rows take (ag::ids). x is used by reference and must stay alive
  /// until backward.
  template <class I, std::size_t R>
  ::locus::ag::ids<T, D, R, I> ids(const tensor_view<const I, D, R>& x) {
    static_assert(std::is_same_v<I, std::int32_t> || std::is_same_v<I, std::int64_t>,
                  "locus: tape.ids() takes int32 or int64 ids (token ids, positions); convert others first: "
                  "auto i = locus::eval(locus::cast<std::int64_t>(x))");
    return detail::access::make_ids(this, generation_, x);
  }
  template <class I, std::size_t R>
  ::locus::ag::ids<T, D, R, I> ids(const tensor_view<I, D, R>& x) {
    return ids(tensor_view<const I, D, R>(x));
  }
  template <class I, std::size_t R>
  ::locus::ag::ids<T, D, R, I> ids(const tensor<I, D, R>& x) {
    return ids(x.view());
  }
  template <class I, std::size_t R>
  ::locus::ag::ids<T, D, R, I> ids(const tensor<I, D, R>&& x) {
    static_assert(::locus::detail::always_false_v<R>, "locus: tape.ids() of a temporary tensor would dangle: the tape reads the ids until "
                              "backward, but they are freed at the end of the statement; keep them in a variable "
                              "first: auto ids = ...; then tape.ids(ids)");
    return ids(x.view());
  }
  // Prevents: ids of another device than the tape's (one forward, one device).
  template <class X>
    requires(::locus::detail::tensor_traits<std::remove_cvref_t<X>>::is_tensor ||
             ::locus::detail::tensor_traits<std::remove_cvref_t<X>>::is_view)
  int ids(const X&) {
    using tr = ::locus::detail::tensor_traits<std::remove_cvref_t<X>>;
    if constexpr (::locus::detail::require_same_operand_device<typename tr::device, D>())
      static_assert(::locus::detail::always_false<X>, "locus: tape.ids() takes int32 or int64 ids (token ids, "
                                                      "positions); convert others first: auto i = "
                                                      "locus::eval(locus::cast<std::int64_t>(x))");
    return 0;
  }

  /// A value whose gradient backward computes (read it with grad(v)): x is used by
  /// reference and must stay alive until backward.
  template <std::size_t R>
  var<T, D, R> leaf(const tensor_view<const T, D, R>& x) {
    return external(x, true);
  }
  template <std::size_t R>
  var<T, D, R> leaf(const tensor<T, D, R>& x) {
    return external(x.view(), true);
  }
  template <std::size_t R>
  var<T, D, R> leaf(tensor<T, D, R>&& x) {
    static_assert(::locus::detail::always_false_v<R>, "locus: tape.leaf() of a temporary tensor would dangle: the tape reads it until "
                              "backward, but it is freed at the end of the statement; keep it in a variable first: "
                              "auto x = ...; then tape.leaf(x)");
    return external(x.view(), true);
  }

  /// Backpropagates from `loss` (rank 0: a compile error otherwise): every value that
  /// requires a gradient gets dL/dvalue. Once per step: a second backward before
  /// reset() is an autograd_error, as is a loss of another tape or an earlier step.
  template <class V>
    requires is_var_v<V>
  void backward(const V& loss) {
    if constexpr (detail::require_scalar_loss<V::rank>() && check_same_types<V>()) {
      check_owned(loss, "backward", true);
      if (done_)
        throw autograd_error(
            "locus: backward() was already run for this step of the tape; call tape.reset() and run the forward "
            "again before the next backward (PyTorch: \"Trying to backward through the graph a second time\")");
      done_ = true;
      if (!loss.requires_grad()) return;  // nothing depends on a leaf: no gradient anywhere
      auto [g, fresh] = grad_out<0>(detail::access::id(loss), extents<0>{});
      (void)fresh;
      ::locus::detail::launch_n<D>(1, ::locus::detail::fill_value<T>{g.data_handle(), ::locus::detail::scalar_cast<T>(1.0)});
      run_nodes();
      for (auto& h : after_backward_) h();
    }
  }

  /// Backpropagates from a value of any rank whose gradient is given: `seed` is
  /// dL/d(out), of out's shape (what a loss computed outside the tape hands back: the
  /// trainer's loss gradient). The rules of backward(loss) otherwise.
  template <class V>
    requires is_var_v<V>
  void backward(const V& out, const tensor_view<const T, D, V::rank>& seed) {
    if constexpr (check_same_types<V>()) {
      check_owned(out, "backward", true);
      if (seed.shape() != out.shape())
        throw shape_error("locus: backward got a gradient of shape " + detail::shape_text(seed.shape()) +
                          " for a value of shape " + detail::shape_text(out.shape()));
      if (done_)
        throw autograd_error(
            "locus: backward() was already run for this step of the tape; call tape.reset() and run the forward "
            "again before the next backward (PyTorch: \"Trying to backward through the graph a second time\")");
      done_ = true;
      if (!out.requires_grad()) return;
      auto [g, fresh] = grad_out<V::rank>(detail::access::id(out), out.shape());
      (void)fresh;
      ::locus::detail::assign_expr(g, ::locus::detail::to_expr(seed));
      run_nodes();
      for (auto& h : after_backward_) h();
    }
  }

  /// Training (the default) or inference: layers that behave differently (batch norm's
  /// batch statistics, dropout) ask the tape; an inference forward records no backward
  /// for layers whose parameters then enter as constants.
  void set_training(bool on) noexcept { training_ = on; }
  [[nodiscard]] bool training() const noexcept { return training_; }

  /// dL/dv after backward, of v's shape (zeros when no gradient reached it). An
  /// autograd_error before backward, or for a value that does not require one.
  template <std::size_t R>
  tensor_view<const T, D, R> grad(const var<T, D, R>& v) {
    check_owned(v, "grad", true);
    if (!done_) throw autograd_error("locus: grad() before backward(); run tape.backward(loss) first");
    if (!v.requires_grad())
      throw autograd_error("locus: grad() of a value that requires no gradient (a constant, or computed from "
                           "constants only); make it with tape.leaf(x) to get its gradient");
    slot& s = slots_[detail::access::id(v)];
    if (s.freed)
      throw autograd_error("locus: grad() of a value whose buffers this tape freed during backward (a checkpointed "
                           "segment's tape keeps the gradients of its leaves only)");
    if (s.grad_alias != nullptr) return {::locus::detail::raw_view_key{}, s.grad_alias, v.shape(), s.alias_device};
    if (!s.grad_written) {
      ensure(s.grad, s.numel);
      ::locus::detail::launch_n<D>(s.grad.numel(),
                                   ::locus::detail::fill_value<T>{s.grad.data_handle(), ::locus::detail::scalar_cast<T>(0.0)});
      s.grad_written = true;
    }
    return {::locus::detail::raw_view_key{}, s.grad.data_handle(), v.shape(), s.grad.device_index()};
  }

  // Prevents: grad() of a value of another tape's device or dtype.
  template <class V>
    requires(is_var_v<V> && !std::is_same_v<typename V::value_type, T>) ||
            (is_var_v<V> && !std::is_same_v<typename V::device, D>)
  int grad(const V&) {
    (void)check_same_types<V>();
    return 0;
  }

  /// Forgets the step: values of it are refused from now on; buffers and nodes are
  /// kept for the next step (no allocation at unchanged shapes).
  void reset() noexcept {
    generation_ = detail::next_generation();
    publish();
    used_ = 0;
    nodes_used_ = 0;
    done_ = false;
    after_backward_.clear();
  }
  /// Starts a new step, like reset(), and frees every value's and gradient's buffer (to
  /// the caching allocator; the next step allocates them again). Activation
  /// checkpointing releases a segment's tape this way between its forward and backward.
  void release() noexcept {
    reset();
    for (auto& s : slots_) s.free_buffers();
  }

  /// Recorded operations and values of this step.
  [[nodiscard]] std::size_t operations() const noexcept { return nodes_used_; }
  [[nodiscard]] std::size_t values() const noexcept { return used_; }
  /// The shape of value i of this step (0 <= i < values(), in the order recorded).
  [[nodiscard]] std::vector<index_t> value_shape(std::size_t i) const {
    if (i >= used_)
      throw autograd_error("locus: value_shape(" + std::to_string(i) + ") of a tape step with " +
                           std::to_string(used_) + " values");
    const slot& s = slots_[i];
    return {s.dims.begin(), s.dims.begin() + static_cast<std::ptrdiff_t>(s.rank)};
  }
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }
  [[nodiscard]] bool backward_done() const noexcept { return done_; }

  // ---- for operations (ag/ops.hpp) and modules -------------------------------------
  /// Refuses a value of another tape or an earlier step (what: the operation).
  template <class V>
  void check_owned(const V& v, const char* what, bool after_backward_ok = false) const {
    const auto* owner = detail::access::tape_of(const_cast<V&>(v));
    if (owner == nullptr)
      throw autograd_error(std::string("locus: ") + what + " got an empty value (default-constructed); make values "
                           "with a tape: tape.constant(x), tape.leaf(x), or an operation");
    if (owner != this)
      throw autograd_error(std::string("locus: ") + what + " got a value of another tape; one forward pass records "
                           "on one tape");
    if (detail::access::generation(v) != generation_)
      throw autograd_error(std::string("locus: ") + what + " got a value of an earlier step: the tape was reset "
                           "since (its memory is reused); compute it again in this step's forward");
    if (done_ && !after_backward_ok)
      throw autograd_error(std::string("locus: ") + what + " after backward() of this step; call tape.reset() "
                           "before the next forward");
  }

  /// A new result of `shape`: its value buffer (reused from the last step at this
  /// position) and whether it requires a gradient.
  template <std::size_t R>
  var<T, D, R> result(const extents<R>& shape, bool requires_grad) {
    const index_t n = ::locus::detail::checked_numel(shape, sizeof(T));
    slot& s = next_slot(n, requires_grad);
    s.set_shape(shape);
    ensure(s.value, n);
    const tensor_view<const T, D, R> v{::locus::detail::raw_view_key{}, s.value.data_handle(), shape,
                                       s.value.device_index()};
    return detail::access::make(this, static_cast<std::uint32_t>(used_ - 1), generation_, requires_grad, v);
  }
  /// A result whose memory the caller owns and keeps until reset (a view of an input,
  /// a node's own buffer): no value buffer is made for it.
  template <std::size_t R>
  var<T, D, R> alias(const tensor_view<const T, D, R>& v, bool requires_grad) {
    return external(v, requires_grad);
  }
  /// The value of a result as writable (the operation fills it).
  template <std::size_t R>
  tensor_view<T, D, R> writable(const var<T, D, R>& v) noexcept {
    const auto c = v.value();
    return {::locus::detail::raw_view_key{}, const_cast<T*>(c.data_handle()), c.shape(), c.device_index()};
  }

  /// The node of the operation being recorded, reused from the last step when the
  /// operation at this position was of the same kind.
  template <class N>
  N& record() {
    if (marks_.size() <= nodes_used_) marks_.resize(nodes_used_ + 1);
    marks_[nodes_used_] = used_;
    if (nodes_used_ < nodes_.size() && nodes_[nodes_used_] && typeid(*nodes_[nodes_used_]) == typeid(N)) {
      return static_cast<N&>(*nodes_[nodes_used_++]);
    }
    if (nodes_used_ == nodes_.size()) nodes_.emplace_back();
    nodes_[nodes_used_] = std::make_unique<N>();
    return static_cast<N&>(*nodes_[nodes_used_++]);
  }

  /// Takes back the node record() just gave (the operation then failed before it
  /// changed anything: nothing of it stays on the tape).
  void unrecord() noexcept {
    if (nodes_used_ > 0) --nodes_used_;
  }
  /// Takes back the value result()/alias() just made.
  void unresult() noexcept {
    if (used_ > 0) --used_;
  }

  /// The gradient that reached value `id` (a view of `shape`), or a null view when none
  /// did (then the node has nothing to propagate).
  template <std::size_t R>
  tensor_view<const T, D, R> grad_in(std::uint32_t id, const extents<R>& shape) const noexcept {
    const slot& s = slots_[id];
    if (!s.grad_written) return {};
    if (s.grad_alias != nullptr) return {::locus::detail::raw_view_key{}, s.grad_alias, shape, s.alias_device};
    return {::locus::detail::raw_view_key{}, s.grad.data_handle(), shape, s.grad.device_index()};
  }
  /// Whether value `id` wants a gradient.
  [[nodiscard]] bool wants_grad(std::uint32_t id) const noexcept { return slots_[id].requires_grad; }
  /// Where a node writes its contribution to value `id`'s gradient, and true when it is
  /// the first (then overwrite it: the buffer holds the last step's bits), false when it
  /// must add. Either way the gradient counts as written afterwards.
  template <std::size_t R>
  std::pair<tensor_view<T, D, R>, bool> grad_out(std::uint32_t id, const extents<R>& shape) {
    slot& s = slots_[id];
    ensure(s.grad, s.numel);
    bool fresh = !s.grad_written;
    if (s.grad_alias != nullptr) {  // adopted: into the slot's own buffer before anything adds to it
      const tensor_view<const T, D, 1> from{::locus::detail::raw_view_key{}, s.grad_alias, extents<1>{s.numel},
                                            s.alias_device};
      ::locus::copy(from, s.grad.view().slice(0, s.numel));
      s.grad_alias = nullptr;
      fresh = false;
    }
    s.grad_written = true;
    return {{::locus::detail::raw_view_key{}, s.grad.data_handle(), shape, s.grad.device_index()}, fresh};
  }
  /// A node's whole gradient for value `id` as a buffer the node keeps until the next
  /// step (a layer's input gradient): when it is the first contribution, the slot refers
  /// to it instead of copying it (true); otherwise nothing happens (false: add it through
  /// grad_out). A later contribution copies it into the slot's own buffer first, so
  /// `g` is never written by the tape. A releasing tape adopts nothing (false): the node
  /// may free `g` right after its backward.
  template <std::size_t R>
  bool grad_adopt(std::uint32_t id, const tensor_view<const T, D, R>& g) noexcept {
    slot& s = slots_[id];
    if (releasing_ || s.grad_written || !g.is_contiguous() || g.numel() != s.numel || g.data_handle() == nullptr) return false;
    s.grad_alias = g.data_handle();
    s.alias_device = g.device_index();
    s.grad_written = true;
    return true;
  }
  /// Runs `f` after the nodes of the next backward (modules move parameter gradients
  /// into their store there). Cleared by reset().
  void after_backward(std::function<void()> f) { after_backward_.push_back(std::move(f)); }

 private:
  struct slot {
    tensor<T, D, 1> value, grad;
    const T* grad_alias = nullptr;  // grad_adopt: the gradient lives in a node's buffer
    int alias_device = 0;
    index_t numel = 0;
    bool requires_grad = false;
    bool grad_written = false;
    bool external = false;  // a leaf or constant (kept when releasing)
    bool freed = false;     // its buffers freed by a releasing backward
    std::size_t rank = 0;  // the value's shape, for value_shape() (ranks above 8: numel alone)
    std::array<index_t, 8> dims{};
    void free_buffers() noexcept {
      value = tensor<T, D, 1>();
      grad = tensor<T, D, 1>();
      grad_alias = nullptr;
    }
    template <std::size_t R>
    void set_shape(const extents<R>& s) noexcept {
      if constexpr (R <= 8) {
        rank = R;
        for (std::size_t i = 0; i < R; ++i) dims[i] = s[i];
      } else {
        rank = 1;
        dims[0] = numel;
      }
    }
  };

  template <class X>
  int foreign(const X&, bool) {
    using tr = ::locus::detail::tensor_traits<std::remove_cvref_t<X>>;
    if constexpr (::locus::detail::require_same_operand_device<typename tr::device, D>()) {
      if constexpr (::locus::detail::require_same_operand_dtype<typename tr::value_type, T>())
        static_assert(::locus::detail::always_false<X>, "locus: this tensor cannot enter the tape");
    }
    return 0;
  }

  template <class V>
  static constexpr bool check_same_types() {
    if constexpr (!::locus::detail::require_same_operand_device<typename V::device, D>()) return false;
    else return ::locus::detail::require_same_operand_dtype<typename V::value_type, T>();
  }

  template <std::size_t R>
  var<T, D, R> external(const tensor_view<const T, D, R>& x, bool requires_grad) {
    slot& s = next_slot(x.numel(), requires_grad);
    s.set_shape(x.shape());
    s.external = true;
    return detail::access::make(this, static_cast<std::uint32_t>(used_ - 1), generation_, requires_grad, x);
  }

  slot& next_slot(index_t numel, bool requires_grad) {
    if (done_)
      throw autograd_error("locus: an operation recorded after backward() of this step; call tape.reset() before the "
                           "next forward");
    if (used_ == slots_.size()) slots_.emplace_back();
    slot& s = slots_[used_++];
    s.numel = numel;
    s.requires_grad = requires_grad;
    s.grad_written = false;
    s.grad_alias = nullptr;
    s.external = false;
    s.freed = false;
    return s;
  }

  /// Frees values and gradients during backward as soon as no node left to run can read
  /// them (activation checkpointing's segments; off by default, where the buffers stay for
  /// the next step). After node i's backward, every value recorded after node i was (and
  /// its gradient) belongs to node i or to a later node, whose backward has run: those of
  /// them the tape owns are freed, leaves and constants (external values) are kept, so
  /// grad() of a leaf still works. Such a tape adopts no node's buffer (grad_adopt copies
  /// instead), so layers inside modules may free their activations after their backward
  /// (they ask releasing()). Not for users (the step's values other than leaves dangle
  /// after such a backward): through detail::access.
  void set_releasing(bool on) noexcept { releasing_ = on; }
  [[nodiscard]] bool releasing() const noexcept { return releasing_; }

  // The nodes from last to first; when releasing, after node i the values recorded after
  // it (marks_[i] on) are freed, those already freed skipped.
  void run_nodes() {
    std::size_t live = used_;
    for (std::size_t i = nodes_used_; i-- > 0;) {
      nodes_[i]->backward(*this);
      if (!releasing_) continue;
      for (std::size_t id = marks_[i]; id < live; ++id) {
        slot& s = slots_[id];
        if (s.external) continue;
        s.free_buffers();
        s.freed = true;
      }
      if (marks_[i] < live) live = marks_[i];
    }
  }

  static void ensure(tensor<T, D, 1>& t, index_t n) {
    if (t.numel() < n || t.data_handle() == nullptr) {
      t = tensor<T, D, 1>();
      t = tensor<T, D, 1>(extents<1>{n > 0 ? n : 1});
    }
  }

  std::vector<slot> slots_;
  std::size_t used_ = 0;
  std::vector<std::unique_ptr<node<T, D>>> nodes_;
  std::vector<std::size_t> marks_;  // values recorded when node i was (used_ at record())
  std::size_t nodes_used_ = 0;
  std::vector<std::function<void()>> after_backward_;
  void publish() noexcept {
    detail::tape_directory::get().at(directory_).store(generation_, std::memory_order_release);
  }

  std::uint32_t directory_;  // this tape's entry in detail::tape_directory (before generation_)
  std::uint64_t generation_ = detail::next_generation();
  bool done_ = false;
  bool training_ = true;
  bool releasing_ = false;
};

}  // namespace locus::ag
