// libmodel: locus inside a shared library with hidden visibility, behind a C API.
#include "model.h"

#include <locus/train.hpp>

#include <omp.h>

#include <exception>
#include <memory>
#include <string>
#include <utility>

namespace {
using C = locus::cpu;
std::unique_ptr<locus::tensor<float, C, 1>> held;
std::string last_error;
}  // namespace

extern "C" {

double model_train(int steps) try {
  using P = locus::amp::fp32;
  namespace nn = locus::nn;
  // y = x0 + x1 + x2 + x3 on 512 random points: an MLP fits it quickly.
  auto x = locus::rand<float, C>({512, 4}, /*seed=*/1, -1.0, 1.0);
  locus::tensor<float, C, 2> y = locus::sum(x, 1, locus::keepdim);
  nn::sequential model(nn::linear<C, P>(4, 16), nn::tanh<C, P>(), nn::linear<C, P>(16, 1));
  model.reset_parameters(/*seed=*/7);
  locus::optim::adamw<C> opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  nn::mse::state<C, P> loss(nn::mse{});
  double last = -1;
  for (int s = 0; s < steps; ++s) {
    auto out = model.forward(std::as_const(x).view());
    auto l = loss.forward(out, y);
    model.backward(loss.grad());
    opt.step();
    model.parameters().zero_grad();
    last = l.item();
  }
  return last;
} catch (const std::exception& e) {
  last_error = e.what();
  return -1;
}

int model_hold(long n) try {
  held = std::make_unique<locus::tensor<float, C, 1>>(locus::zeros<float, C>({n}));
  return 0;
} catch (const locus::out_of_memory& e) {
  last_error = e.what();
  return 1;
}

void model_release(void) { held.reset(); }
const char* model_last_error(void) { return last_error.c_str(); }

const void* model_cpu_allocator_identity(void) { return &locus::detail::allocator_for<C>(); }
size_t model_cpu_allocated_bytes(void) { return locus::memory_stats<C>().allocated_bytes; }
size_t model_cpu_limit_bytes(void) { return locus::memory_stats<C>().limit_bytes; }
int model_fault_fired(void) { return locus::fault::fired() ? 1 : 0; }
int model_host_gemm(void) { return static_cast<int>(locus::current_host_gemm()); }
int model_matmul_precision_high(void) {
  return locus::float32_matmul_precision() == locus::matmul_precision::high ? 1 : 0;
}
int model_omp_max_threads(void) { return omp_get_max_threads(); }

}  // extern "C"
