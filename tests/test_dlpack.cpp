// DLPack at a typed boundary (locus/interop/dlpack.hpp): to_dlpack hands a tensor over
// without a copy and its deleter frees it once; from_dlpack checks a producer's tensor
// (device, dtype, rank, shape, strides, offset, alignment) and calls the producer's
// deleter exactly once, on success and on every refusal. The producer here is written in
// this file (its own buffer, shape and strides, a counting deleter); NumPy is the foreign
// producer and consumer in tests/python/dlpack_numpy.py.
#include <doctest/doctest.h>

#if defined(LOCUS_TEST_HAS_DLPACK) && LOCUS_TEST_HAS_DLPACK

#include <locus/interop/dlpack.hpp>
#include "dlpack_counted.hpp"
#include <locus/locus.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

// ---- a producer locus did not build: raw bytes, its own shape/strides, counted deleter --
int g_producer_deletes = 0;

struct producer {
  alignas(64) unsigned char bytes[4096] = {};
  std::vector<std::int64_t> shape, strides;
  DLManagedTensor m{};
};

void producer_deleter(DLManagedTensor* self) {
  ++g_producer_deletes;
  delete static_cast<producer*>(self->manager_ctx);
}

/// A DLManagedTensor over a fresh buffer: code/bits, shape, strides (empty: null).
DLManagedTensor* make(std::uint8_t code, std::uint8_t bits, std::vector<std::int64_t> shape,
                      std::vector<std::int64_t> strides = {}, DLDeviceType dev = kDLCPU) {
  auto* p = new producer;
  p->shape = std::move(shape);
  p->strides = std::move(strides);
  DLTensor& t = p->m.dl_tensor;
  t.data = p->bytes;
  t.device = {dev, 0};
  t.ndim = static_cast<int>(p->shape.size());
  t.dtype = {code, bits, 1};
  t.shape = p->shape.empty() ? nullptr : p->shape.data();
  t.strides = p->strides.empty() ? nullptr : p->strides.data();
  t.byte_offset = 0;
  p->m.manager_ctx = p;
  p->m.deleter = &producer_deleter;
  return &p->m;
}

float* floats(DLManagedTensor* m) { return reinterpret_cast<float*>(static_cast<producer*>(m->manager_ctx)->bytes); }

/// Runs f, which must throw E; returns its message (empty, and a failed check, if not).
template <class E, class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("wrong exception type: " << e.what());
    return {};
  }
  FAIL_CHECK("no exception");
  return {};
}

/// The refusal of m as from_dlpack<T, D, R>, checking the producer's deleter ran once.
template <class T, class D, std::size_t R, class E = locus::value_error>
std::string refused(DLManagedTensor* m) {
  const int before = g_producer_deletes;
  std::string msg = refusal<E>([&] { (void)locus::from_dlpack<T, D, R>(m); });
  CHECK(g_producer_deletes == before + 1);
  return msg;
}

// to_dlpack's own deleter, wrapped to count its calls (dlpack_counted.hpp)
using locus_test::counted;
using locus_test::g_locus_deletes;

/// A value for flat index k of dtype T that differs between neighbours.
template <class T>
T value_at(std::int64_t k) {
  if constexpr (std::is_same_v<T, bool>) return (k * 7 + 3) % 3 == 0;
  else if constexpr (std::is_same_v<T, locus::f16> || std::is_same_v<T, locus::bf16>)
    return T(static_cast<float>(k % 64) * 0.5f - 8.0f);
  else if constexpr (std::is_same_v<T, std::uint8_t>) return static_cast<T>((k * 37 + 5) % 256);
  else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(k) * T(0.25) - T(3);
  else return static_cast<T>(k * 1000003 - 77);
}
template <class T>
bool same_value(T a, T b) {
  if constexpr (std::is_same_v<T, locus::f16> || std::is_same_v<T, locus::bf16>)
    return static_cast<float>(a) == static_cast<float>(b);
  else return a == b;
}

template <class T>
constexpr std::uint8_t want_code() {
  if constexpr (std::is_same_v<T, locus::bf16>) return kDLBfloat;
  else if constexpr (std::is_same_v<T, locus::f16> || std::is_floating_point_v<T>) return kDLFloat;
  else if constexpr (std::is_same_v<T, bool> || std::is_unsigned_v<T>) return kDLUInt;
  else return kDLInt;
}

template <class T, class D, std::size_t R>
void round_trip(const locus::extents<R>& shape) {
  CAPTURE(locus::dtype_name<T>);
  CAPTURE(R);
  locus::tensor<T, D, R> t(shape);
  const std::int64_t n = t.numel();
  {
    T* p = t.data();
    for (std::int64_t k = 0; k < n; ++k) p[k] = value_at<T>(k);
  }
  T* const original = t.data_handle();
  DLManagedTensor* m = counted(locus::to_dlpack(std::move(t)));
  CHECK(t.data_handle() == nullptr);  // moved in
  const DLTensor& dl = m->dl_tensor;
  CHECK(dl.data == static_cast<void*>(original));  // zero-copy
  CHECK(dl.device.device_type == (std::is_same_v<D, locus::cpu> ? kDLCPU : kDLCUDAHost));
  CHECK(dl.device.device_id == 0);
  CHECK(dl.ndim == static_cast<int>(R));
  CHECK(dl.dtype.code == want_code<T>());
  CHECK(dl.dtype.bits == 8 * sizeof(T));
  CHECK(dl.dtype.lanes == 1);
  CHECK(dl.byte_offset == 0);
  std::int64_t expect_stride = 1;
  for (std::size_t a = R; a-- > 0;) {
    CHECK(dl.shape[a] == shape[a]);
    CHECK(dl.strides[a] == expect_stride);
    expect_stride *= shape[a];
  }
  const int before = g_locus_deletes;
  {
    auto h = locus::from_dlpack<T, D, R>(m);
    auto moved = std::move(h);  // moving the handle does not release
    CHECK(g_locus_deletes == before);
    auto v = moved.view();
    CHECK(v.data_handle() == original);
    CHECK(v.shape() == shape);
    CHECK(v.is_contiguous());
    const T* q = v.data_handle();
    bool all = true;
    for (std::int64_t k = 0; k < n; ++k) all = all && same_value(q[k], value_at<T>(k));
    CHECK(all);
  }
  CHECK(g_locus_deletes == before + 1);
}

template <class T, class D>
void round_trips() {
  round_trip<T, D, 0>({});
  round_trip<T, D, 1>({7});
  round_trip<T, D, 2>({3, 5});
  round_trip<T, D, 3>({2, 3, 4});
  round_trip<T, D, 4>({2, 1, 3, 2});
  round_trip<T, D, 2>({0, 4});  // empty
}

}  // namespace

TEST_CASE("dlpack: every dtype and rank 0..4 round-trips through to_dlpack and from_dlpack, zero-copy") {
  const auto base = locus::memory_stats<locus::cpu>().allocated_bytes;
  round_trips<float, locus::cpu>();
  round_trips<double, locus::cpu>();
  round_trips<locus::f16, locus::cpu>();
  round_trips<locus::bf16, locus::cpu>();
  round_trips<std::int32_t, locus::cpu>();
  round_trips<std::int64_t, locus::cpu>();
  round_trips<std::uint8_t, locus::cpu>();
  round_trips<bool, locus::cpu>();
  CHECK(locus::memory_stats<locus::cpu>().allocated_bytes == base);  // every tensor freed
#if LOCUS_HAS_CUDA
  round_trips<float, locus::pinned>();  // kDLCUDAHost (ordinary host memory without a driver)
  round_trips<std::int64_t, locus::pinned>();
#endif
}

TEST_CASE("dlpack: a DLManagedTensor from to_dlpack that no one consumes is freed once by its deleter") {
  const auto base = locus::memory_stats<locus::cpu>().allocated_bytes;
  auto t = locus::arange<float, locus::cpu>(0, 1000);
  CHECK(locus::memory_stats<locus::cpu>().allocated_bytes > base);
  DLManagedTensor* m = counted(locus::to_dlpack(std::move(t)));
  const int before = g_locus_deletes;
  m->deleter(m);
  CHECK(g_locus_deletes == before + 1);
  CHECK(locus::memory_stats<locus::cpu>().allocated_bytes == base);
}

TEST_CASE("dlpack: from_dlpack views a foreign producer's memory, honouring strides and byte_offset") {
  SUBCASE("contiguous: the same pointer, the deleter once at the handle's end") {
    DLManagedTensor* m = make(kDLFloat, 32, {2, 3});
    for (int k = 0; k < 6; ++k) floats(m)[k] = static_cast<float>(k * k);
    const int before = g_producer_deletes;
    {
      auto h = locus::from_dlpack<float, locus::cpu, 2>(m);
      auto v = h.view();
      CHECK(v.data_handle() == floats(m));
      CHECK(v(1, 2) == 25.0f);
      v(0, 1) = -4.0f;  // writable, the producer's memory
      CHECK(floats(m)[1] == -4.0f);
      const auto& ch = h;
      static_assert(std::is_same_v<decltype(ch.view()), locus::tensor_view<const float, locus::cpu, 2>>);
      CHECK(locus::sum(ch.view()).item() == doctest::Approx(0 + -4 + 4 + 9 + 16 + 25));
      locus::dlpack_tensor<float, locus::cpu, 2> other;
      other = std::move(h);
      CHECK(g_producer_deletes == before);
      CHECK(other.view()(1, 0) == 9.0f);
    }
    CHECK(g_producer_deletes == before + 1);
  }
  SUBCASE("a slice-like strided tensor: every other column of a 4x6 array, from row 1") {
    // NumPy's a[1:, ::2] of a 4x6 f32 array: shape [3, 3], strides [6, 2], offset 6 floats.
    DLManagedTensor* m = make(kDLFloat, 32, {3, 3}, {6, 2});
    for (int k = 0; k < 24; ++k) floats(m)[k] = static_cast<float>(10 * (k / 6) + k % 6);  // a[i][j] = 10 i + j
    m->dl_tensor.byte_offset = 6 * sizeof(float);
    const int before = g_producer_deletes;
    {
      auto h = locus::from_dlpack<float, locus::cpu, 2>(m);
      auto v = h.view();
      CHECK(v.data_handle() == floats(m) + 6);
      CHECK(v.strides() == locus::extents<2>{6, 2});
      CHECK(!v.is_contiguous());
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) CHECK(v(i, j) == static_cast<float>(10 * (i + 1) + 2 * j));
      // a contiguous copy through locus's strided copy path
      auto c = v.clone();
      CHECK(c(2, 2) == 34.0f);
      CHECK(locus::sum(v).item() == doctest::Approx(10 + 12 + 14 + 20 + 22 + 24 + 30 + 32 + 34));
    }
    CHECK(g_producer_deletes == before + 1);
  }
  SUBCASE("a transposed (column-major) tensor, and strides of size-1 axes are free") {
    DLManagedTensor* m = make(kDLInt, 64, {3, 1, 2}, {1, 999, 3});
    auto* q = reinterpret_cast<std::int64_t*>(floats(m));
    for (int k = 0; k < 6; ++k) q[k] = 100 + k;
    auto h = locus::from_dlpack<std::int64_t, locus::cpu, 3>(m);
    auto v = h.view();
    CHECK(v(2, 0, 0) == 102);
    CHECK(v(0, 0, 1) == 103);
    CHECK(v(2, 0, 1) == 105);
  }
  SUBCASE("overlapping strides (a broadcast row) are read through a const view") {
    DLManagedTensor* m = make(kDLFloat, 32, {4, 3}, {0, 1});
    for (int k = 0; k < 3; ++k) floats(m)[k] = static_cast<float>(k + 1);
    auto h = locus::from_dlpack<const float, locus::cpu, 2>(m);
    static_assert(std::is_same_v<decltype(h.view()), locus::tensor_view<const float, locus::cpu, 2>>);
    CHECK(locus::sum(h.view()).item() == doctest::Approx(24.0));
  }
  SUBCASE("an empty tensor may have a null data pointer; a null deleter is not called") {
    DLManagedTensor* m = make(kDLFloat, 32, {0, 5});
    auto* owner = static_cast<producer*>(m->manager_ctx);
    m->dl_tensor.data = nullptr;
    m->deleter = nullptr;
    const int before = g_producer_deletes;
    {
      auto h = locus::from_dlpack<float, locus::cpu, 2>(m);
      CHECK(h.numel() == 0);
      CHECK(h.view().data_handle() == nullptr);
    }
    CHECK(g_producer_deletes == before);
    delete owner;
  }
  SUBCASE("kDLCUDAHost memory is host memory: cpu and pinned take it") {
    DLManagedTensor* m = make(kDLFloat, 32, {2}, {}, kDLCUDAHost);
    floats(m)[1] = 7.0f;
    {
      auto h = locus::from_dlpack<float, locus::cpu, 1>(m);
      CHECK(h.view()(1) == 7.0f);
    }
#if LOCUS_HAS_CUDA
    m = make(kDLFloat, 32, {2}, {}, kDLCUDAHost);
    floats(m)[0] = 3.0f;
    auto h = locus::from_dlpack<float, locus::pinned, 1>(m);
    CHECK(h.view()(0) == 3.0f);
#endif
  }
  SUBCASE("bool takes kDLUInt 8 (DLPack 0.6) and kDLBool 8 (code 6, NumPy 2)") {
    for (std::uint8_t code : {std::uint8_t{kDLUInt}, std::uint8_t{6}}) {
      DLManagedTensor* m = make(code, 8, {3});
      auto* b = static_cast<producer*>(m->manager_ctx)->bytes;
      b[0] = 1;
      b[1] = 0;
      b[2] = 1;
      auto h = locus::from_dlpack<bool, locus::cpu, 1>(m);
      CHECK(locus::sum(h.view()).item() == 2);
    }
  }
}

TEST_CASE("dlpack: every refusal of from_dlpack names what was expected and found, and the deleter runs once") {
  SUBCASE("null") {
    CHECK(refusal<locus::value_error>([] { (void)locus::from_dlpack<float, locus::cpu, 2>(nullptr); }) ==
          "locus: from_dlpack<f32, cpu, 2>: expected a DLManagedTensor, found a null pointer");
  }
  SUBCASE("device type") {
    CHECK(refused<float, locus::cpu, 2>(make(kDLFloat, 32, {2, 2}, {}, kDLCUDA)) ==
          "locus: from_dlpack<f32, cpu, 2>: expected host memory (device type kDLCPU = 1, or kDLCUDAHost = 3), "
          "found device type 2 (kDLCUDA), device id 0");
    CHECK(refused<float, locus::cpu, 2>(make(kDLFloat, 32, {2, 2}, {}, kDLROCM)) ==
          "locus: from_dlpack<f32, cpu, 2>: expected host memory (device type kDLCPU = 1, or kDLCUDAHost = 3), "
          "found device type 10 (kDLROCM), device id 0");
#if LOCUS_HAS_CUDA
    CHECK(refused<float, locus::pinned, 2>(make(kDLFloat, 32, {2, 2}, {}, kDLCPU)) ==
          "locus: from_dlpack<f32, pinned, 2>: expected page-locked host memory (device type kDLCUDAHost = 3), "
          "found device type 1 (kDLCPU), device id 0; pageable memory is locus::cpu: from_dlpack<T, locus::cpu, R>");
    CHECK(refused<float, locus::cuda, 2>(make(kDLFloat, 32, {2, 2}, {}, kDLCUDAHost)) ==
          "locus: from_dlpack<f32, cuda, 2>: expected GPU memory (device type kDLCUDA = 2), found device type 3 "
          "(kDLCUDAHost), device id 0");
    // A cuda device id that does not exist (the message says how many do).
    int count = 0;
    const bool runtime = cudaGetDeviceCount(&count) == cudaSuccess;
    (void)cudaGetLastError();
    DLManagedTensor* m = make(kDLFloat, 32, {2, 2}, {}, kDLCUDA);
    m->dl_tensor.device.device_id = 7;
    const std::string msg = refused<float, locus::cuda, 2>(m);
    if (runtime) {
      CHECK(msg == "locus: from_dlpack<f32, cuda, 2>: the tensor is on CUDA device 7, but this process sees " +
                       std::to_string(count) + (count == 1 ? " CUDA device" : " CUDA devices") + " (ids 0 to " +
                       std::to_string(count - 1) + ")");
    } else {
      CHECK(msg.rfind("locus: from_dlpack<f32, cuda, 2>: the tensor is on CUDA device 7, but this process sees no "
                      "CUDA device (",
                      0) == 0);
    }
#endif
  }
  SUBCASE("dtype code, bits and lanes") {
    CHECK(refused<float, locus::cpu, 2>(make(kDLInt, 32, {2, 2})) ==
          "locus: from_dlpack<f32, cpu, 2>: expected dtype f32 (code 2 kDLFloat, 32 bits, 1 lane), found code 0 "
          "(kDLInt), 32 bits, 1 lane");
    CHECK(refused<float, locus::cpu, 2>(make(kDLFloat, 64, {2, 2})) ==
          "locus: from_dlpack<f32, cpu, 2>: expected dtype f32 (code 2 kDLFloat, 32 bits, 1 lane), found code 2 "
          "(kDLFloat), 64 bits, 1 lane");
    CHECK(refused<locus::bf16, locus::cpu, 1>(make(kDLFloat, 16, {2})) ==
          "locus: from_dlpack<bf16, cpu, 1>: expected dtype bf16 (code 4 kDLBfloat, 16 bits, 1 lane), found code 2 "
          "(kDLFloat), 16 bits, 1 lane");
    CHECK(refused<std::uint8_t, locus::cpu, 1>(make(6, 8, {2})) ==
          "locus: from_dlpack<u8, cpu, 1>: expected dtype u8 (code 1 kDLUInt, 8 bits, 1 lane), found code 6 "
          "(kDLBool), 8 bits, 1 lane");
    CHECK(refused<bool, locus::cpu, 1>(make(kDLInt, 8, {2})) ==
          "locus: from_dlpack<bool, cpu, 1>: expected dtype bool (code 1 kDLUInt or 6 kDLBool, 8 bits, 1 lane), "
          "found code 0 (kDLInt), 8 bits, 1 lane");
    DLManagedTensor* m = make(kDLFloat, 32, {2, 2});
    m->dl_tensor.dtype.lanes = 4;
    CHECK(refused<float, locus::cpu, 2>(m) ==
          "locus: from_dlpack<f32, cpu, 2>: expected dtype f32 (code 2 kDLFloat, 32 bits, 1 lane), found code 2 "
          "(kDLFloat), 32 bits, 4 lanes");
    CHECK(refused<double, locus::cpu, 1>(make(kDLComplex, 64, {2})) ==
          "locus: from_dlpack<f64, cpu, 1>: expected dtype f64 (code 2 kDLFloat, 64 bits, 1 lane), found code 5 "
          "(kDLComplex), 64 bits, 1 lane");
  }
  SUBCASE("ndim and shape") {
    CHECK(refused<float, locus::cpu, 2, locus::shape_error>(make(kDLFloat, 32, {2, 2, 2})) ==
          "locus: from_dlpack<f32, cpu, 2>: expected ndim 2, found ndim 3");
    CHECK(refused<float, locus::cpu, 0, locus::shape_error>(make(kDLFloat, 32, {1})) ==
          "locus: from_dlpack<f32, cpu, 0>: expected ndim 0, found ndim 1");
    DLManagedTensor* m = make(kDLFloat, 32, {2, 2});
    m->dl_tensor.shape = nullptr;
    CHECK(refused<float, locus::cpu, 2, locus::shape_error>(m) ==
          "locus: from_dlpack<f32, cpu, 2>: the DLTensor's shape is a null pointer (ndim 2)");
    CHECK(refused<float, locus::cpu, 2, locus::shape_error>(make(kDLFloat, 32, {2, -3})) ==
          "locus: from_dlpack<f32, cpu, 2>: expected extents >= 0, found -3 on axis 1 of shape [2, -3]");
    constexpr std::int64_t big = std::int64_t{1} << 32;
    CHECK(refused<float, locus::cpu, 2, locus::shape_error>(make(kDLFloat, 32, {big, big})) ==
          "locus: from_dlpack<f32, cpu, 2>: shape [4294967296, 4294967296] has more elements than fit in 4-byte "
          "elements addressed by 64 bits");
  }
  SUBCASE("strides") {
    CHECK(refused<float, locus::cpu, 2, locus::shape_error>(make(kDLFloat, 32, {2, 3}, {3, -1})) ==
          "locus: from_dlpack<f32, cpu, 2>: expected strides >= 0, found -1 on axis 1 (shape [2, 3], strides [3, -1]); "
          "locus views do not step backwards: copy the array first (numpy.ascontiguousarray)");
    CHECK(refused<float, locus::cpu, 2, locus::shape_error>(make(kDLFloat, 32, {3, 2}, {std::int64_t{1} << 62, 1})) ==
          "locus: from_dlpack<f32, cpu, 2>: shape [3, 2] with strides [4611686018427387904, 1]: the last element's byte "
          "offset overflows 64 bits");
    CHECK(refused<float, locus::cpu, 2, locus::shape_error>(make(kDLFloat, 32, {4, 3}, {0, 1})) ==
          "locus: from_dlpack<f32, cpu, 2>: shape [4, 3] with strides [0, 1] maps two elements to one address; a "
          "writable view must not overlap itself: take from_dlpack<const f32, cpu, 2> to read it");
    CHECK(refused<float, locus::cpu, 2, locus::shape_error>(make(kDLFloat, 32, {3, 3}, {2, 1})) ==
          "locus: from_dlpack<f32, cpu, 2>: shape [3, 3] with strides [2, 1] maps two elements to one address; a "
          "writable view must not overlap itself: take from_dlpack<const f32, cpu, 2> to read it");
  }
  SUBCASE("data pointer, byte_offset and alignment") {
    DLManagedTensor* m = make(kDLFloat, 32, {2, 2});
    m->dl_tensor.data = nullptr;
    CHECK(refused<float, locus::cpu, 2>(m) ==
          "locus: from_dlpack<f32, cpu, 2>: the DLTensor's data is a null pointer, but its shape [2, 2] holds 4 elements");
    m = make(kDLFloat, 32, {2, 2});
    m->dl_tensor.byte_offset = 2;
    const auto addr = reinterpret_cast<std::uintptr_t>(m->dl_tensor.data) + 2;
    char expect[256];
    std::snprintf(expect, sizeof expect,
                  "locus: from_dlpack<f32, cpu, 2>: expected a pointer aligned to 4 bytes for f32, found data %p + "
                  "byte_offset 2 = 0x%llx (2 bytes past a multiple of 4)",
                  m->dl_tensor.data, static_cast<unsigned long long>(addr));
    CHECK(refused<float, locus::cpu, 2>(m) == expect);
    m = make(kDLInt, 64, {1});
    m->dl_tensor.byte_offset = 12;  // 4 bytes past a multiple of 8
    CHECK(refused<std::int64_t, locus::cpu, 1>(m).find("expected a pointer aligned to 8 bytes for i64") !=
          std::string::npos);
    m = make(kDLFloat, 32, {1});
    m->dl_tensor.byte_offset = std::numeric_limits<std::uint64_t>::max() - 1;
    CHECK(refused<float, locus::cpu, 1>(m).find("wraps around the address space") != std::string::npos);
  }
  SUBCASE("bool bytes other than 0 and 1") {
    DLManagedTensor* m = make(kDLUInt, 8, {2, 2});
    static_cast<producer*>(m->manager_ctx)->bytes[3] = 2;
    CHECK(refused<bool, locus::cpu, 2>(m) ==
          "locus: from_dlpack<bool, cpu, 2>: a bool element holds the byte 2 (element 3, index [1, 1]); bools are 0 or "
          "1: take from_dlpack<u8, cpu, 2> for bytes");
  }
}

// The cuda cases (kDLCUDA both ways) are in tests/cuda/test_dlpack.cu, part of the CUDA suite.
#endif  // LOCUS_TEST_HAS_DLPACK
