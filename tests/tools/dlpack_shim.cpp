// A shared library that lets Python (ctypes) reach locus's DLPack boundary, for
// tests/python/dlpack_numpy.py: NumPy consumes tensors locus produced (to_dlpack) and
// locus consumes arrays NumPy produced (from_dlpack), each deleter counted here.
#include <locus/interop/dlpack.hpp>
#include <locus/locus.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>

namespace {

int g_locus_deletes = 0;     // deleters of DLManagedTensors locus produced
int g_consumer_deletes = 0;  // deleters of foreign DLManagedTensors locus consumed
void (*g_locus_deleter)(DLManagedTensor*) = nullptr;
std::map<DLManagedTensor*, void (*)(DLManagedTensor*)> g_foreign;  // m -> the producer's deleter

void count_locus_delete(DLManagedTensor* m) {
  ++g_locus_deletes;
  g_locus_deleter(m);
}

void count_foreign_delete(DLManagedTensor* m) {
  ++g_consumer_deletes;
  auto it = g_foreign.find(m);
  void (*original)(DLManagedTensor*) = it->second;
  g_foreign.erase(it);
  if (original) original(m);
}

/// Wraps m's deleter in a counting one (m may be null: from_dlpack refuses it).
void watch(DLManagedTensor* m) {
  if (!m) return;
  g_foreign[m] = m->deleter;
  m->deleter = &count_foreign_delete;
}

void write_error(const std::exception& e, char* err, int cap) {
  if (err && cap > 0) std::snprintf(err, static_cast<std::size_t>(cap), "%s", e.what());
}

}  // namespace

extern "C" {

/// A rows x cols f32 cpu tensor with a(i, j) = i * cols + j + 0.5 (a tensor of rank 3 when
/// depth > 0: a(i, j, k) = (i * cols + j) * depth + k + 0.5, shape [rows, cols, depth]),
/// handed over as DLPack.
DLManagedTensor* locus_shim_make_f32(int rows, int cols, int depth) {
  DLManagedTensor* m = nullptr;
  if (depth > 0) {
    auto t = locus::empty<float, locus::cpu>({rows, cols, depth});
    float* p = t.data();
    for (int k = 0; k < rows * cols * depth; ++k) p[k] = static_cast<float>(k) + 0.5f;
    m = locus::to_dlpack(std::move(t));
  } else {
    auto t = locus::empty<float, locus::cpu>({rows, cols});
    float* p = t.data();
    for (int k = 0; k < rows * cols; ++k) p[k] = static_cast<float>(k) + 0.5f;
    m = locus::to_dlpack(std::move(t));
  }
  g_locus_deleter = m->deleter;
  m->deleter = &count_locus_delete;
  return m;
}

/// An i64 cpu tensor of n elements, a(k) = k * k - 7, as DLPack.
DLManagedTensor* locus_shim_make_i64(int n) {
  auto t = locus::empty<std::int64_t, locus::cpu>({n});
  for (int k = 0; k < n; ++k) t(k) = std::int64_t{k} * k - 7;
  DLManagedTensor* m = locus::to_dlpack(std::move(t));
  g_locus_deleter = m->deleter;
  m->deleter = &count_locus_delete;
  return m;
}

/// The data pointer of a DLManagedTensor (to compare with NumPy's, zero-copy).
std::uintptr_t locus_shim_data_pointer(const DLManagedTensor* m) {
  return reinterpret_cast<std::uintptr_t>(m->dl_tensor.data) + m->dl_tensor.byte_offset;
}

/// from_dlpack<float, cpu, 2>(m): 0 and out = {rows, cols, sum, sum of a(i, j) * (i * cols
/// + j + 1), data pointer} on success; 1 and the error text in err on a refusal.
int locus_shim_consume_f32_2d(DLManagedTensor* m, double* out, char* err, int cap) {
  watch(m);
  try {
    auto h = locus::from_dlpack<float, locus::cpu, 2>(m);
    const auto v = h.view();
    double sum = 0, weighted = 0;
    for (locus::index_t i = 0; i < v.extent(0); ++i)
      for (locus::index_t j = 0; j < v.extent(1); ++j) {
        sum += v(i, j);
        weighted += static_cast<double>(v(i, j)) * static_cast<double>(i * v.extent(1) + j + 1);
      }
    out[0] = static_cast<double>(v.extent(0));
    out[1] = static_cast<double>(v.extent(1));
    out[2] = sum;
    out[3] = weighted;
    out[4] = static_cast<double>(reinterpret_cast<std::uintptr_t>(v.data_handle()));
    return 0;
  } catch (const locus::error& e) {
    write_error(e, err, cap);
    return 1;
  }
}

/// from_dlpack<bool, cpu, 1>(m): 0 and *count = the number of true elements, or 1 and err.
int locus_shim_consume_bool_1d(DLManagedTensor* m, long long* count, char* err, int cap) {
  watch(m);
  try {
    auto h = locus::from_dlpack<bool, locus::cpu, 1>(m);
    *count = static_cast<long long>(locus::sum(h.view()).item());
    return 0;
  } catch (const locus::error& e) {
    write_error(e, err, cap);
    return 1;
  }
}

int locus_shim_locus_deletes() { return g_locus_deletes; }
int locus_shim_consumer_deletes() { return g_consumer_deletes; }
long long locus_shim_cpu_allocated_bytes() {
  return static_cast<long long>(locus::memory_stats<locus::cpu>().allocated_bytes);
}

}  // extern "C"
