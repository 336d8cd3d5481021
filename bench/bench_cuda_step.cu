// The training step's launch and host cost (issue 13), for the main job's MLP
// (784-512-256-10, batch 128, bf16_mixed, AdamW), ordinary and in graph mode. Prints
// one line per figure, "name value unit", that bench/gpu-check's table parses:
//   step_launches_ordinary   kernel launches per ordinary step (locus's launch helpers
//                            and cuBLASLt GEMMs, counted: this file is built with
//                            LOCUS_COUNT_LAUNCHES)
//   step_graph_nodes         nodes of the captured update-branch graph (kernel, memset,
//                            memcpy), and step_graph_kernels its kernel nodes
//   step_launches_graph      launches per graph-mode step (the graph, the batch copies
//                            and the step-values kernel)
//   step_host_us_ordinary / step_host_us_graph   host time to enqueue one step (us)
//   step_us_ordinary / step_us_graph             GPU time per step (us, events over 200)
//   step_gemms_us            the step's GEMMs alone (the same shapes, cuBLASLt through
//                            locus::matmul_into, 8 per step), us
//   step_graph_over_gemms    step_us_graph / step_gemms_us (target <= 1.5)
// Without a GPU it prints "no CUDA device" and exits 0.
#define LOCUS_COUNT_LAUNCHES 1  // before any locus header: the launch helpers count
#include <chrono>
#include <cstdio>
#include <vector>

#include <locus/locus.hpp>
#include <locus/train.hpp>

namespace {
namespace nn = locus::nn;
using P = locus::amp::bf16_mixed;
using locus::index_t;
constexpr index_t B = 128;
constexpr int steps = 200;

auto make_model() {
  nn::sequential m(nn::linear<locus::cuda, P>(784, 512), nn::relu<locus::cuda, P>(), nn::linear<locus::cuda, P>(512, 256),
                   nn::relu<locus::cuda, P>(), nn::linear<locus::cuda, P>(256, 10));
  m.reset_parameters(1);
  return m;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct figures {
  double host_us, gpu_us;
};

template <class T, class X, class Y>
figures time_steps(T& t, const X& x, const Y& y) {
  for (int i = 0; i < 5; ++i) t.step(x, y);  // warm-up, capture
  LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  LOCUS_CUDA_CHECK(cudaEventCreate(&a));
  LOCUS_CUDA_CHECK(cudaEventCreate(&b));
  LOCUS_CUDA_CHECK(cudaEventRecord(a, locus::detail::current_stream()));
  const double h0 = now_us();
  for (int i = 0; i < steps; ++i) t.step(x, y);
  const double h1 = now_us();
  LOCUS_CUDA_CHECK(cudaEventRecord(b, locus::detail::current_stream()));
  LOCUS_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  LOCUS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  return {(h1 - h0) / steps, 1000.0 * ms / steps};
}
}  // namespace

int main() {
  if (!locus::cuda_available()) {
    std::printf("no CUDA device (%s): bench_cuda_step skipped\n", locus::environment().cuda_status.c_str());
    return 0;
  }
  auto x = locus::to<locus::cuda>(locus::randn<float, locus::cpu>({B, 784}, 3));
  auto yh = locus::zeros<std::int64_t, locus::cpu>({B});
  for (index_t i = 0; i < B; ++i) yh(i) = i % 10;
  auto y = locus::to<locus::cuda>(yh);

  // ordinary
  auto m1 = make_model();
  locus::optim::adamw<locus::cuda> o1(m1.parameters());
  locus::train::trainer t1(m1, o1, nn::cross_entropy{});
  t1.step(x, y);
  LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
  const auto l0 = locus::detail::launch_count(), g0 = locus::detail::gemm_count();
  t1.step(x, y);
  const auto launches = (locus::detail::launch_count() - l0) + (locus::detail::gemm_count() - g0);
  const auto gemms = locus::detail::gemm_count() - g0;
  const figures f1 = time_steps(t1, x, y);

  // graph mode
  auto m2 = make_model();
  locus::optim::adamw<locus::cuda> o2(m2.parameters());
  locus::train::trainer t2(m2, o2, nn::cross_entropy{}, {.cuda_graph = true});
  const figures f2 = time_steps(t2, x, y);
  const auto l1 = locus::detail::launch_count();
  t2.step(x, y);
  const auto graph_launches = locus::detail::launch_count() - l1 + 1;  // + the graph launch itself
  size_t nodes = 0;
  int kernels = 0;
  if (cudaGraph_t g = t2.captured_graph(1)) {
    LOCUS_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    std::vector<cudaGraphNode_t> all(nodes);
    LOCUS_CUDA_CHECK(cudaGraphGetNodes(g, all.data(), &nodes));
    for (auto n : all) {
      cudaGraphNodeType k{};
      LOCUS_CUDA_CHECK(cudaGraphNodeGetType(n, &k));
      kernels += k == cudaGraphNodeTypeKernel;
    }
  }

  // the step's GEMMs alone: forward 3, backward 5 (dW of every layer, dX of layers 2
  // and 3; the first layer's dX is never needed)
  auto bf = [](index_t r, index_t c) { return locus::to<locus::cuda>(locus::eval(locus::cast<locus::bf16>(locus::randn<float, locus::cpu>({r, c}, 5)))); };
  auto X = bf(B, 784), W1 = bf(784, 512), H1 = bf(B, 512), W2 = bf(512, 256), H2 = bf(B, 256), W3 = bf(256, 10),
       G3 = bf(B, 10), G2 = bf(B, 256), G1 = bf(B, 512);
  auto o_h1 = bf(B, 512), o_h2 = bf(B, 256), o_3 = bf(B, 10), dw3 = bf(256, 10), dw2 = bf(512, 256),
       dw1 = bf(784, 512), dx3 = bf(B, 256), dx2 = bf(B, 512);
  auto gemm_pass = [&] {
    locus::matmul_into(o_h1, X, W1);
    locus::matmul_into(o_h2, H1, W2);
    locus::matmul_into(o_3, H2, W3);
    locus::matmul_into(dw3, locus::transpose(H2), G3);
    locus::matmul_into(dx3, G3, locus::transpose(W3));
    locus::matmul_into(dw2, locus::transpose(H1), G2);
    locus::matmul_into(dx2, G2, locus::transpose(W2));
    locus::matmul_into(dw1, locus::transpose(X), G1);
  };
  for (int i = 0; i < 5; ++i) gemm_pass();
  cudaEvent_t a, b;
  LOCUS_CUDA_CHECK(cudaEventCreate(&a));
  LOCUS_CUDA_CHECK(cudaEventCreate(&b));
  LOCUS_CUDA_CHECK(cudaEventRecord(a, locus::detail::current_stream()));
  for (int i = 0; i < steps; ++i) gemm_pass();
  LOCUS_CUDA_CHECK(cudaEventRecord(b, locus::detail::current_stream()));
  LOCUS_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  LOCUS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  const double gemm_us = 1000.0 * ms / steps;

  std::printf("step_launches_ordinary %llu launches\n", static_cast<unsigned long long>(launches));
  std::printf("step_gemms_ordinary %llu gemms\n", static_cast<unsigned long long>(gemms));
  std::printf("step_graph_nodes %zu nodes\n", nodes);
  std::printf("step_graph_kernels %d kernels\n", kernels);
  std::printf("step_launches_graph %llu launches\n", static_cast<unsigned long long>(graph_launches));
  std::printf("step_host_us_ordinary %.2f us\n", f1.host_us);
  std::printf("step_host_us_graph %.2f us\n", f2.host_us);
  std::printf("step_us_ordinary %.2f us\n", f1.gpu_us);
  std::printf("step_us_graph %.2f us\n", f2.gpu_us);
  std::printf("step_gemms_us %.2f us\n", gemm_us);
  std::printf("step_graph_over_gemms %.3f x (target <= 1.5)\n", gemm_us > 0 ? f2.gpu_us / gemm_us : 0.0);
  return 0;
}
