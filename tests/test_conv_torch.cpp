// The CNN layers against PyTorch: tests/python/conv_torch.py writes, in f64, inputs,
// weights, an upstream gradient and what PyTorch computes (forward output, input and
// parameter gradients, batch norm's running statistics and eval-mode output) into one
// safetensors file; here the same layers, in locus::nn::sequential under amp::fp64 on
// the cpu, get the same weights and inputs and must give the same numbers. Every conv2d
// case runs twice: on the host path and on the device-generic path (what cuda runs).
//
// The file is named by LOCUS_CONV_TORCH_FILE (the CTest "interop: conv2d, pooling and
// batch norm against PyTorch (forward and backward)" writes it and sets it); without it
// the test says it is skipped and passes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iomanip>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <locus/train.hpp>
#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
#include <locus/io/safetensors.hpp>
#endif

#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
namespace {

using locus::extents;
using locus::index_t;
namespace nn = locus::nn;
using D = locus::cpu;
using P = locus::amp::fp64;
using archive = locus::io::archive<D>;

// Tolerance: |locus - PyTorch| <= kTol + kTol * |PyTorch| at every element. Both sides
// compute in f64 but sum in different orders (BLAS blocking, im2col, per-thread weight
// gradients, two-pass batch statistics), which moves results by a few ulps of the sums'
// magnitudes (the largest, 576-term sums of the 64-channel conv, by about 1e-14); 1e-10
// leaves room for that and still catches any real difference (a wrong tap, divisor,
// padding or statistic is off by far more than 1e-10).
constexpr double kTol = 1e-10;

struct generic_path {
  explicit generic_path(bool on) { nn::detail::conv_generic_path() = on; }
  ~generic_path() { nn::detail::conv_generic_path() = false; }
  generic_path(const generic_path&) = delete;
  generic_path& operator=(const generic_path&) = delete;
};

std::string shape_string(const std::vector<index_t>& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

template <std::size_t R>
std::vector<index_t> as_vector(const extents<R>& e) {
  std::vector<index_t> v(R);
  for (std::size_t i = 0; i < R; ++i) v[i] = e[i];
  return v;
}

/// Whether the file holds `key` with the shape `shape`; a failed check saying what is
/// wrong otherwise. (Checks, not REQUIREs: a broken case must not hide the others.)
bool has(const archive& a, const std::string& key, const std::vector<index_t>& shape) {
  if (!a.contains(key)) {
    FAIL_CHECK("the PyTorch file has no tensor " << key);
    return false;
  }
  const auto& want = a.info(key).shape;
  if (want != shape) {
    FAIL_CHECK(key << ": PyTorch's shape " << shape_string(want) << ", locus's " << shape_string(shape));
    return false;
  }
  return true;
}

/// Compares the values at `got` (shape got_shape) with the file's tensor `key`: the same
/// shape, and every element within the tolerance. One CHECK per comparison, naming the
/// case, the quantity, how many elements differ and the worst one.
void compare(const archive& a, const std::string& key, const double* got, const std::vector<index_t>& got_shape,
             const std::string& note = "") {
  if (!has(a, key, got_shape)) return;
  const auto want = a.template flat<double>(key);
  index_t bad = 0, worst_i = -1;
  double worst = 0.0;  // the largest |difference| / (kTol * (1 + |PyTorch|))
  for (index_t i = 0; i < want.numel(); ++i) {
    const double w = want(i), g = got[i];
    const double d = std::abs(g - w), allowed = kTol + kTol * std::abs(w);
    const double ratio = std::isnan(d) ? HUGE_VAL : d / allowed;
    if (!(d <= allowed)) ++bad;
    if (worst_i < 0 || ratio > worst) {
      worst = ratio;
      worst_i = i;
    }
  }
  const double w = worst_i >= 0 ? want(worst_i) : 0.0, g = worst_i >= 0 ? got[worst_i] : 0.0;
  CHECK_MESSAGE(bad == 0, std::setprecision(17) << key << note << ": " << bad << " of " << want.numel()
                              << " elements differ from PyTorch by more than 1e-10 * (1 + |PyTorch|); worst at flat index "
                              << worst_i << ": locus " << g << ", PyTorch " << w << " (difference " << (g - w)
                              << ")");
}

/// Builds `layer` alone in a sequential model, copies the case's weights into its master
/// parameters, runs forward (training), backward with the case's gy, and compares y, gx,
/// the parameter gradients and (batch norm) the running statistics and the eval output.
/// An exception (a locus error, a tensor of another dtype in the file) is a failed check.
template <class Layer>
void check_case_body(const archive& a, const std::string& name, Layer layer, const std::string& path) {
  const std::string label = name + " (" + layer.describe() + ", " + path + ")";
  INFO(label);
  nn::sequential m(std::move(layer));

  // weights: every parameter locus declares is in the file, with PyTorch's shape; the
  // file has no parameter the locus layer lacks (a conv without bias, a pool)
  auto master = m.parameters().master();
  for (const auto& e : m.parameters().entries()) {
    const std::string suffix = e.name.substr(e.name.find('.') + 1);  // "0.weight" -> "weight"
    const std::string key = name + "." + suffix;
    if (!has(a, key, e.shape)) return;
    const auto src = a.template flat<double>(key);
    for (index_t i = 0; i < e.numel; ++i) master.data_handle()[e.offset + i] = src(i);
  }
  for (const char* p : {"weight", "bias"}) {
    bool declared = false;
    for (const auto& e : m.parameters().entries()) declared = declared || e.name == std::string("0.") + p;
    CHECK_MESSAGE(declared == a.contains(name + "." + p),
                  name << "." << p << (declared ? ": locus declares it, the PyTorch file lacks it"
                                                : ": in the PyTorch file, but the locus layer has no such parameter"));
  }

  if (!a.contains(name + ".x")) {
    FAIL_CHECK("the PyTorch file has no case " << name << " (no " << name << ".x)");
    return;
  }
  const auto x = a.template get<double, 4>(name + ".x");
  if (!has(a, name + ".gy", m.output_shape(as_vector(x.shape())))) return;
  const auto gy = a.template get<double, 4>(name + ".gy");

  // forward, training mode
  const auto y = m.forward(x);
  compare(a, name + ".y", y.data_handle(), as_vector(y.shape()));

  // backward of L = sum(y * gy)
  m.parameters().zero_grad();
  const auto gx = m.backward(gy, true);
  compare(a, name + ".gx", gx.data_handle(), as_vector(gx.shape()));
  const auto grad = m.parameters().grad();
  for (const auto& e : m.parameters().entries()) {
    const std::string suffix = e.name.substr(e.name.find('.') + 1);
    compare(a, name + ".g" + suffix, grad.data_handle() + e.offset, e.shape);
  }

  using L = std::remove_cvref_t<decltype(m.template get<0>())>;
  if constexpr (requires(const L& l) { l.running_mean(); }) {
    const auto& bn = m.template get<0>();
    compare(a, name + ".running_mean", bn.running_mean().data_handle(), as_vector(bn.running_mean().shape()));
    compare(a, name + ".running_var", bn.running_var().data_handle(), as_vector(bn.running_var().shape()));
    const auto ye = m.infer(x);  // eval mode: the running statistics just updated
    compare(a, name + ".y_eval", ye.data_handle(), as_vector(ye.shape()));
  } else {
    const auto yi = m.infer(x);  // no state: inference equals the training forward
    compare(a, name + ".y", yi.data_handle(), as_vector(yi.shape()), " (infer)");
  }
}

template <class Layer>
void check_case(const archive& a, const std::string& name, Layer layer, const std::string& path) {
  try {
    check_case_body(a, name, std::move(layer), path);
  } catch (const std::exception& e) {
    FAIL_CHECK(name << " (" << path << ") threw: " << e.what());
  }
}

}  // namespace
#endif

// Not part of the host suite's run (doctest::skip(): it needs a file a Python script
// writes): the interop CTest named below runs the script, then this case with --no-skip.
TEST_CASE("CNN layers equal PyTorch in f64: conv2d, pooling and batch norm, forward and backward" *
          doctest::skip()) {
#if !defined(LOCUS_HAS_JSON) || !LOCUS_HAS_JSON
  FAIL("reading the PyTorch file needs locus/io/safetensors.hpp, which needs nlohmann-json");
#else
  const char* env = std::getenv("LOCUS_CONV_TORCH_FILE");
  if (env == nullptr || *env == '\0') {
    FAIL("LOCUS_CONV_TORCH_FILE is not set (tests/python/conv_torch.py FILE writes it; the CTest "
         "\"interop: conv2d, pooling and batch norm against PyTorch (forward and backward)\" runs both)");
  }
  const std::filesystem::path file = env;
  if (!std::filesystem::exists(file)) {
    FAIL("LOCUS_CONV_TORCH_FILE names " << file << ", which does not exist");
  }
  // the same cases, names and arguments as tests/python/conv_torch.py; one subcase each,
  // so a case that fails (or is missing from the file) does not hide the others
  const auto a = locus::io::load<D>(file);
  const auto conv = [&](const char* name, index_t in, index_t out, index_t k, nn::conv2d_options o) {
    SUBCASE(name) {
      for (const bool generic : {false, true}) {
        generic_path on(generic);
        check_case(a, name, nn::conv2d<D, P>(in, out, k, o), generic ? "device-generic path" : "host path");
      }
    }
  };
  const auto layer = [&](const char* name, auto l) {
    SUBCASE(name) { check_case(a, name, std::move(l), "host"); }
  };
  conv("conv_plain", 3, 4, 3, {});
  conv("conv_stride2_pad1", 2, 3, 3, {.stride = 2, .padding = 1});
  conv("conv_dilation2_pad2_nobias", 2, 2, 3, {.padding = 2, .dilation = 2, .bias = false});
  conv("conv_groups2", 4, 6, 3, {.padding = 1, .groups = 2});
  conv("conv_k5_stride3_nonsquare", 3, 2, 5, {.stride = 3, .padding = 2});
  conv("conv_64x64_pad1", 64, 64, 3, {.padding = 1});
  layer("max_pool_k2", nn::max_pool2d<D, P>(2));
  layer("max_pool_k3_stride2_pad1", nn::max_pool2d<D, P>(3, {.stride = 2, .padding = 1}));
  layer("avg_pool_k3_stride2_pad1_include_pad",
        nn::avg_pool2d<D, P>(3, {.stride = 2, .padding = 1, .count_include_pad = true}));
  layer("avg_pool_k3_stride2_pad1_exclude_pad",
        nn::avg_pool2d<D, P>(3, {.stride = 2, .padding = 1, .count_include_pad = false}));
  layer("adaptive_avg_pool_3x2", nn::adaptive_avg_pool2d<D, P>(3, 2));
  layer("batch_norm_c4", nn::batch_norm2d<D, P>(4, {.eps = 1e-5, .momentum = 0.1}));
#endif
}
