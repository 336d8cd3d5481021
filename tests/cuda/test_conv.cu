// CUDA suite, issue 15: the CNN layers on cuda (conv2d through the im2col / col2im
// kernels and cuBLASLt, pooling, batch norm, flatten) against the same model on the
// host, from the same seed and input: outputs, input gradients, parameter gradients
// and running statistics, in fp32 and bf16_mixed; then an epoch of training on both.
// Skipped, with the reason, without a GPU (tests/cuda/main.cu).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <locus/locus.hpp>
#include <locus/train.hpp>

namespace {
using locus::extents;
using locus::index_t;
namespace nn = locus::nn;
using CU = locus::cuda;

template <class D, class P>
auto conv_model() {
  nn::sequential m(nn::conv2d<D, P>(3, 8, 3, {.padding = 1}), nn::batch_norm2d<D, P>(8), nn::relu<D, P>(),
                   nn::max_pool2d<D, P>(2), nn::conv2d<D, P>(8, 6, 3, {.stride = 2, .dilation = 1, .groups = 2}),
                   nn::avg_pool2d<D, P>(2, {.stride = 1}), nn::adaptive_avg_pool2d<D, P>(2), nn::flatten<D, P>(),
                   nn::linear<D, P>(6 * 2 * 2, 5));
  m.reset_parameters(17);
  return m;
}

template <class T>
std::vector<double> host_values(const T& v) {
  const auto h = locus::to<locus::cpu>(v);
  std::vector<double> out;
  for (index_t i = 0; i < h.numel(); ++i) out.push_back(static_cast<double>(h.data_handle()[i]));
  return out;
}

void close(const std::vector<double>& a, const std::vector<double>& b, double tol, const char* what) {
  REQUIRE(a.size() == b.size());
  double scale = 0.0, worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(a[i]));
    worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  INFO(what << ": largest difference " << worst << " for values up to " << scale);
  CHECK(worst <= tol * (scale + 1e-30));
}

template <class P>
void compare_devices(double tol) {
  using C = typename P::compute;
  auto h = conv_model<locus::cpu, P>();
  auto d = conv_model<CU, P>();
  locus::tensor<C, locus::cpu, 4> x(extents<4>{4, 3, 12, 12});
  for (index_t i = 0; i < x.numel(); ++i) x.data_handle()[i] = static_cast<C>(std::sin(0.37 * static_cast<double>(i)));
  const auto xd = locus::to<CU>(x);
  const auto yh = h.forward(std::as_const(x).view());
  const auto yd = d.forward(std::as_const(xd).view());
  close(host_values(yh), host_values(yd), tol, "forward");
  locus::tensor<C, locus::cpu, 2> gy(yh.shape());
  for (index_t i = 0; i < gy.numel(); ++i) gy.data_handle()[i] = static_cast<C>(std::cos(0.11 * static_cast<double>(i)));
  const auto gyd = locus::to<CU>(gy);
  h.parameters().zero_grad();
  d.parameters().zero_grad();
  const auto gxh = h.backward(std::as_const(gy).view(), true);
  const auto gxd = d.backward(std::as_const(gyd).view(), true);
  close(host_values(gxh), host_values(gxd), tol, "input gradient");
  close(host_values(h.parameters().grad()), host_values(d.parameters().grad()), tol, "parameter gradients");
  close(host_values(h.template get<1>().running_var()), host_values(d.template get<1>().running_var()), tol,
        "running variance");
  close(host_values(h.infer(std::as_const(x).view())), host_values(d.infer(std::as_const(xd).view())), tol,
        "inference");
}
}  // namespace

TEST_CASE("CNN layers on cuda equal the host's (fp32, bf16_mixed)") {
  compare_devices<locus::amp::fp32>(1e-4);
  compare_devices<locus::amp::bf16_mixed>(3e-2);
}
