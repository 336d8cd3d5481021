// DLPack on a GPU (locus/interop/dlpack.hpp): a cuda tensor leaves as kDLCUDA with the id
// of the GPU that holds it and comes back zero-copy; a foreign producer's cudaMalloc'd
// memory enters as a typed cuda view without a copy, its deleter called once; GPU memory
// offered to a host device, and a device id that does not exist, are refused with the
// expected and the found device. Part of the CUDA suite, so without a GPU every case is
// reported as skipped (tests/cuda/main.cu) instead of passing unrun. The host cases,
// kDLCUDAHost among them, are in tests/test_dlpack.cpp.
#include <doctest/doctest.h>

#if defined(LOCUS_TEST_HAS_DLPACK) && LOCUS_TEST_HAS_DLPACK

#include <locus/interop/dlpack.hpp>
#include "dlpack_counted.hpp"
#include <locus/locus.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

// to_dlpack's own deleter, wrapped to count its calls (dlpack_counted.hpp)
using locus_test::counted;
using locus_test::g_locus_deletes;

// A producer locus did not build: cudaMalloc'd floats, its own shape, a counting deleter.
struct gpu_producer {
  DLManagedTensor managed{};
  std::int64_t shape[2]{};
  float* data = nullptr;
};
// The deleter runs inside locus's noexcept release: it records, the cases check.
int g_foreign_deletes = 0;
int g_foreign_free_failures = 0;
void foreign_deleter(DLManagedTensor* self) noexcept {
  auto* p = static_cast<gpu_producer*>(self->manager_ctx);
  if (cudaFree(p->data) != cudaSuccess) ++g_foreign_free_failures;
  delete p;
  ++g_foreign_deletes;
}
/// rows x cols floats on the current GPU holding 0.5 * (flat index), as kDLCUDA with the
/// current GPU's id.
DLManagedTensor* foreign_gpu_floats(std::int64_t rows, std::int64_t cols) {
  int device_id = -1;
  REQUIRE(cudaGetDevice(&device_id) == cudaSuccess);
  auto* p = new gpu_producer;
  const auto n = static_cast<std::size_t>(rows * cols);
  REQUIRE(cudaMalloc(&p->data, n * sizeof(float)) == cudaSuccess);
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = 0.5f * static_cast<float>(i);
  REQUIRE(cudaMemcpy(p->data, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  p->shape[0] = rows;
  p->shape[1] = cols;
  DLTensor& t = p->managed.dl_tensor;
  t.data = p->data;
  t.device = {kDLCUDA, device_id};
  t.ndim = 2;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = p->shape;
  t.strides = nullptr;  // C-contiguous
  t.byte_offset = 0;
  p->managed.manager_ctx = p;
  p->managed.deleter = &foreign_deleter;
  return &p->managed;
}

template <class T, class D, std::size_t R>
std::string refused(DLManagedTensor* m) {
  try {
    (void)locus::from_dlpack<T, D, R>(m);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("dlpack cuda: a cuda tensor is kDLCUDA with its GPU's id and comes back zero-copy") {
  auto host = locus::arange<float, locus::cpu>(0, 10);
  auto t = locus::to<locus::cuda>(host);
  float* const original = t.data_handle();
  int current = -1;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  DLManagedTensor* m = counted(locus::to_dlpack(std::move(t)));
  CHECK(m->dl_tensor.device.device_type == kDLCUDA);
  CHECK(m->dl_tensor.device.device_id == current);
  CHECK(m->dl_tensor.data == static_cast<void*>(original));
  const int before = g_locus_deletes;
  {
    auto h = locus::from_dlpack<float, locus::cuda, 1>(m);
    CHECK(h.device_id() == current);
    CHECK(h.view().data_handle() == original);
    auto back = locus::to<locus::cpu>(h.view());
    for (int i = 0; i < 10; ++i) CHECK(back(i) == static_cast<float>(i));
  }
  CHECK(g_locus_deletes == before + 1);
}

TEST_CASE("dlpack cuda: a foreign producer's GPU memory is a cuda view without a copy, its deleter called once") {
  int current = -1;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  const int before = g_foreign_deletes;
  DLManagedTensor* m = foreign_gpu_floats(3, 4);
  const void* producer_data = m->dl_tensor.data;
  {
    auto h = locus::from_dlpack<float, locus::cuda, 2>(m);
    CHECK(h.device_id() == current);
    CHECK(h.view().data_handle() == producer_data);
    CHECK(h.view().shape()[0] == 3);
    CHECK(h.view().shape()[1] == 4);
    // computed on by locus's kernels where it lies: the sum of 0.5 * (0..11) = 33
    CHECK(locus::to<locus::cpu>(locus::sum(h.view())).item() == 33.0f);
    CHECK(g_foreign_deletes == before);
  }
  CHECK(g_foreign_deletes == before + 1);
  CHECK(g_foreign_free_failures == 0);
}

TEST_CASE("dlpack cuda: GPU memory for a host device, and a GPU that does not exist, are refused, the deleter run each time") {
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  const int before = g_foreign_deletes;
  CHECK(refused<float, locus::cpu, 2>(foreign_gpu_floats(2, 2)).find(
            "expected host memory (device type kDLCPU = 1, or kDLCUDAHost = 3), found device type 2 (kDLCUDA)") !=
        std::string::npos);
  CHECK(refused<float, locus::pinned, 2>(foreign_gpu_floats(2, 2)).find(
            "expected page-locked host memory (device type kDLCUDAHost = 3), found device type 2 (kDLCUDA)") !=
        std::string::npos);
  DLManagedTensor* m = foreign_gpu_floats(2, 2);
  m->dl_tensor.device.device_id = count;  // one past the last GPU
  const std::string msg = refused<float, locus::cuda, 2>(m);
  const std::string n = std::to_string(count);
  CHECK(msg.find("the tensor is on CUDA device " + n + ", but this process sees " + n + " CUDA device") !=
        std::string::npos);
  CHECK(g_foreign_deletes == before + 3);
  CHECK(g_foreign_free_failures == 0);
}

#endif  // LOCUS_TEST_HAS_DLPACK
