// CUDA suite: streams, events, stream_guard, asynchronous copies (to_async,
// copy_async, pending) and the cuda loader (pinned staging, side-stream copies).
// Every case needs a GPU; without one the runner reports the whole suite skipped.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/spin.cuh"
#include <locus/locus.hpp>
#include <locus/data/loader.hpp>
#include <locus/transfer/async.hpp>
#include <locus/transfer/stream.hpp>

namespace {

using dev2 = locus::tensor<float, locus::cuda, 2>;

// ---- compile-time properties (checked by the build, GPU or not) -------------------------
static_assert(!std::is_copy_constructible_v<locus::stream>);
static_assert(!std::is_copy_assignable_v<locus::event>);
static_assert(std::is_nothrow_move_constructible_v<locus::stream>);
static_assert(std::is_nothrow_move_constructible_v<locus::event>);
static_assert(std::is_nothrow_move_constructible_v<locus::pending<dev2>>);
static_assert(!std::is_copy_constructible_v<locus::stream_guard> && !std::is_move_constructible_v<locus::stream_guard>);
// get() on an rvalue hands the tensor over by value; on an lvalue it lends it.
static_assert(std::is_same_v<decltype(std::declval<locus::pending<dev2>>().get()), dev2>);
static_assert(std::is_same_v<decltype(std::declval<locus::pending<dev2>&>().get()), dev2&>);
// The pending owns the destination, and a source that was moved in.
using pin2 = locus::tensor<float, locus::pinned, 2>;
static_assert(std::is_same_v<decltype(locus::to_async<locus::cuda>(std::declval<pin2>())), locus::pending<dev2, pin2>>);
static_assert(std::is_same_v<decltype(locus::to_async<locus::pinned>(std::declval<const dev2&>())),
                             locus::pending<pin2>>);
static_assert(std::is_same_v<decltype(locus::copy_async(std::declval<dev2&>(), std::declval<dev2>())),
                             locus::pending<dev2>>);
static_assert(std::is_same_v<decltype(locus::copy_async(std::declval<pin2>(), std::declval<dev2>())),
                             locus::pending<dev2, pin2>>);
static_assert(std::is_same_v<decltype(std::declval<locus::pending<dev2, pin2>>().get_with_source()),
                             locus::value_and_source<dev2, pin2>>);
static_assert(std::is_nothrow_move_constructible_v<locus::pending<dev2, pin2>>);
static_assert(std::is_nothrow_move_assignable_v<locus::pending<dev2, pin2>>);

using locus_test::spin;  // tests/cuda/spin.cuh

/// Puts a freed block of n elements of T in the cuda cache for the current stream, so
/// that an allocation made after spin() reuses it instead of calling cudaMalloc (which
/// may wait for the device: then "not done yet" checks would race).
template <class T>
void warm_cuda_cache(locus::index_t n) {
  auto w = locus::empty<T, locus::cuda>({n});
}

template <class T>
locus::tensor<T, locus::pinned, 1> pinned_pattern(locus::index_t n, unsigned salt) {
  auto t = locus::empty<T, locus::pinned>({n});
  auto* bytes = reinterpret_cast<unsigned char*>(t.data_handle());
  for (std::size_t i = 0; i < t.size_bytes(); ++i) bytes[i] = static_cast<unsigned char>((i * 2654435761u + salt) >> 7);
  return t;
}

template <class T, class D, std::size_t R>
bool same_bytes(const locus::tensor<T, locus::pinned, R>& a, const locus::tensor<T, D, R>& b) {
  static_assert(D::host_accessible);
  return a.shape() == b.shape() && std::memcmp(a.data_handle(), b.data_handle(), a.size_bytes()) == 0;
}

}  // namespace

// ---- asynchronous copies ------------------------------------------------------------------

TEST_CASE("to_async round trip pinned to cuda to pinned is exact") {
  CHECK_FALSE(locus::memory_stats<locus::pinned>().fallback);  // page-locked for real
  auto f = pinned_pattern<float>(1 << 20, 1);  // every bit pattern kind, NaNs included
  auto b = pinned_pattern<locus::bf16>(12345, 2);
  auto i = pinned_pattern<std::int64_t>(777, 3);
  const auto f_ref = f.clone();
  const auto b_ref = b.clone();
  const auto i_ref = i.clone();
  const void* f_memory = f.data_handle();

  auto to_gpu_f = locus::to_async<locus::cuda>(std::move(f));
  auto to_gpu_b = locus::to_async<locus::cuda>(std::move(b));
  auto to_gpu_i = locus::to_async<locus::cuda>(std::move(i));
  auto back_f = locus::to_async<locus::pinned>(to_gpu_f.get());  // a cuda lvalue source
  auto back_b = locus::to_async<locus::pinned>(to_gpu_b.get());
  auto back_i = locus::to_async<locus::pinned>(to_gpu_i.get());
  CHECK(same_bytes(f_ref, std::move(back_f).get()));
  CHECK(same_bytes(b_ref, std::move(back_b).get()));
  CHECK(same_bytes(i_ref, std::move(back_i).get()));
  // The source comes back, the same memory, untouched.
  auto [gpu_f, f_again] = std::move(to_gpu_f).get_with_source();
  CHECK(f_again.data_handle() == f_memory);
  CHECK(same_bytes(f_ref, f_again));
  CHECK(gpu_f.shape() == f_ref.shape());

  // Rank 3, through the blocking path for comparison.
  auto h = locus::to<locus::pinned>(locus::randn<float, locus::cpu>({4, 5, 6}, 9));
  const auto h_ref = h.clone();
  auto d = std::move(locus::to_async<locus::cuda>(std::move(h))).get();
  CHECK(same_bytes(h_ref, locus::to<locus::pinned>(d)));
}

TEST_CASE("copy_async takes over its destination and gives it back") {
  auto src = pinned_pattern<float>(4096, 4);
  const auto ref = src.clone();
  auto d1 = std::move(locus::to_async<locus::cuda>(std::move(src))).get();
  auto d2 = locus::empty<float, locus::cuda>({4096});
  auto out = locus::empty<float, locus::pinned>({4096});
  const float* d2_memory = d2.data_handle();
  {
    auto p = locus::copy_async(d1, std::move(d2));  // cuda -> cuda, a cuda lvalue source
    static_assert(std::is_same_v<decltype(p.get()), locus::tensor<float, locus::cuda, 1>&>);
    CHECK(p.get().data_handle() == d2_memory);
    d2 = std::move(p).get();  // the buffer is reused
  }
  CHECK(d2.data_handle() == d2_memory);
  out = std::move(locus::copy_async(d2, std::move(out))).get();  // cuda -> pinned
  CHECK(same_bytes(ref, out));

  // Rows of a matrix (a contiguous cuda view source) into a tensor of their shape.
  auto rows = locus::copy_async(d1.reshape({8, 512}).slice(2, 5), locus::empty<float, locus::cuda>({3, 512}));
  auto hm = locus::to<locus::cpu>(std::move(rows).get());
  CHECK(std::memcmp(hm.data_handle(), ref.data_handle() + 2 * 512, 3 * 512 * sizeof(float)) == 0);

  // Mismatched shapes: shape_error, nothing enqueued, nothing moved; strided views: shape_error.
  auto small = locus::empty<float, locus::cuda>({10});
  const float* small_memory = small.data_handle();
  CHECK_THROWS_AS((void)locus::copy_async(d1, std::move(small)), locus::shape_error);
  CHECK(small.data_handle() == small_memory);
  auto h = locus::to<locus::pinned>(ref);
  const float* h_memory = h.data_handle();
  CHECK_THROWS_AS((void)locus::copy_async(std::move(h), std::move(small)), locus::shape_error);
  CHECK(h.data_handle() == h_memory);
  CHECK(small.data_handle() == small_memory);
  auto wide = locus::zeros<float, locus::cuda>({4, 6});
  auto strided = locus::transpose(wide);  // [6, 4], strides (1, 6)
  CHECK_THROWS_AS((void)locus::copy_async(strided, locus::empty<float, locus::cuda>({6, 4})), locus::shape_error);
  CHECK_THROWS_AS((void)locus::to_async<locus::pinned>(strided), locus::shape_error);
}

TEST_CASE("copy_async and to_async: empty tensors, the same tensor on both sides, overlap") {
  // Zero-size copies: a pending like any other.
  auto e = locus::to_async<locus::cuda>(locus::empty<float, locus::pinned>({0, 3}));
  CHECK(e.get().shape() == locus::extents<2>{0, 3});
  auto [ev, es] = std::move(e).get_with_source();
  CHECK(ev.numel() == 0);
  CHECK(es.shape() == locus::extents<2>{0, 3});
  auto z = locus::copy_async(locus::tensor<float, locus::cuda, 1>(), locus::tensor<float, locus::cuda, 1>());
  CHECK(std::move(z).get().numel() == 0);

  // The same tensor as source and destination: nothing copied, the values stay, the
  // destination is the tensor, and there is no second owner of it.
  auto h = pinned_pattern<float>(1000, 12);
  const auto ref = h.clone();
  auto t = locus::to<locus::cuda>(h);
  const float* memory = t.data_handle();
  auto self = locus::copy_async(std::move(t), std::move(t));
  auto [value, source] = std::move(self).get_with_source();
  CHECK(value.data_handle() == memory);
  CHECK(source.numel() == 0);
  CHECK(same_bytes(ref, locus::to<locus::pinned>(value)));
  // A cuda lvalue view of the destination's own memory (same layout): in place.
  auto v = value.view();
  auto again = std::move(locus::copy_async(v, std::move(value))).get();
  CHECK(same_bytes(ref, locus::to<locus::pinned>(again)));
}

TEST_CASE("copy on cuda with overlapping sides gives the result of a separate source") {
  auto h = pinned_pattern<float>(8000, 13);
  auto t = locus::to<locus::cuda>(h);
  locus::copy(t.slice(0, 6000), t.slice(2000, 8000));  // overlapping, shifted forward
  auto got = locus::to<locus::pinned>(t);
  CHECK(std::memcmp(got.data_handle() + 2000, h.data_handle(), 6000 * sizeof(float)) == 0);
  CHECK(std::memcmp(got.data_handle(), h.data_handle(), 2000 * sizeof(float)) == 0);
  auto u = locus::to<locus::cuda>(h);
  locus::copy(u.slice(1000, 8000), u.slice(0, 7000));  // shifted back
  got = locus::to<locus::pinned>(u);
  CHECK(std::memcmp(got.data_handle(), h.data_handle() + 1000, 7000 * sizeof(float)) == 0);
  locus::copy(u, u);  // same mapping: nothing to do
  CHECK(same_bytes(got, locus::to<locus::pinned>(u)));
}

TEST_CASE("the fixes the messages name compile and work: to<D>(eval(e)), to_async<D>(eval(e))") {
  auto g = locus::ones<float, locus::cuda>({4});
  auto h = locus::to<locus::cpu>(locus::eval(g * 2.0f));  // for to<cpu>(g * 2.0f)
  CHECK(h(3) == 2.0f);
  auto p = locus::to_async<locus::pinned>(locus::eval(g * 3.0f));  // an owned cuda rvalue
  auto [value, source] = std::move(p).get_with_source();
  CHECK(value(0) == 3.0f);
  CHECK(source.numel() == 4);
}

TEST_CASE("pending get waits and ready polls") {
  locus::stream s;
  locus::stream_guard g(s);
  auto src = pinned_pattern<float>(1 << 16, 5);
  const auto ref = src.clone();
  warm_cuda_cache<float>(1 << 16);
  spin(s.native_handle(), 300);
  auto p = locus::to_async<locus::cuda>(std::move(src));
  CHECK_FALSE(p.ready());  // behind 300 ms of spinning
  const auto t0 = std::chrono::steady_clock::now();
  auto& lent = p.get();
  CHECK(std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(100));
  CHECK(p.ready());
  CHECK(s.query());
  CHECK(lent.numel() == (1 << 16));
  CHECK(&p.get() == &lent);  // get() twice on an lvalue: the same tensor
  auto owned = std::move(p).get();
  CHECK(same_bytes(ref, locus::to<locus::pinned>(owned)));
  CHECK_THROWS_AS((void)p.get(), locus::error);  // the value has left
  CHECK_THROWS_AS((void)p.ready(), locus::error);
  CHECK_THROWS_AS((void)std::move(p).get(), locus::error);
  CHECK_THROWS_AS((void)std::move(p).get_with_source(), locus::error);
  auto moved = std::move(p);  // moving an empty pending: still empty
  CHECK_THROWS_AS((void)moved.get(), locus::error);
}

TEST_CASE("a pending destroyed without get waits for its copy") {
  locus::stream s;
  locus::stream_guard g(s);
  auto src = pinned_pattern<float>(1 << 16, 6);
  warm_cuda_cache<float>(1 << 16);
  spin(s.native_handle(), 300);
  {
    auto p = locus::to_async<locus::cuda>(src.clone());
    CHECK_FALSE(s.query());
  }  // ~pending: waits, so its destination is not freed under the copy
  CHECK(s.query());

  // Moved, then the moved-to one destroyed: waits once, the moved-from one is empty.
  warm_cuda_cache<float>(1 << 16);
  spin(s.native_handle(), 300);
  {
    auto p = locus::to_async<locus::cuda>(src.clone());
    { auto q = std::move(p); }
    CHECK(s.query());
    CHECK_THROWS_AS((void)p.ready(), locus::error);
  }

  // Assigning over an in-flight pending waits for it too. b's copy goes to another
  // stream, so that after the assignment s holds nothing but a's (finished) copy.
  locus::stream t;
  auto tiny = pinned_pattern<float>(16, 7);
  {
    locus::stream_guard on_t(t);
    warm_cuda_cache<float>(16);
  }
  warm_cuda_cache<float>(1 << 16);
  spin(s.native_handle(), 300);
  auto a = locus::to_async<locus::cuda>(src.clone());
  auto b = [&] {
    locus::stream_guard on_t(t);
    return locus::to_async<locus::cuda>(std::move(tiny));
  }();
  CHECK_FALSE(s.query());
  a = std::move(b);
  CHECK(s.query());
  CHECK(std::move(a).get().numel() == 16);
}

TEST_CASE("to_async owns a moved-in source until the value leaves") {
  locus::stream s;
  locus::stream_guard g(s);
  locus::empty_cache<locus::pinned>();
  const auto before = locus::memory_stats<locus::pinned>().allocated_bytes;
  const std::size_t bytes = locus::detail::size_class((1 << 18) * sizeof(float));
  spin(s.native_handle(), 200);
  auto p = locus::to_async<locus::cuda>(pinned_pattern<float>(1 << 18, 8));  // a temporary source
  CHECK(locus::memory_stats<locus::pinned>().allocated_bytes == before + bytes);  // kept alive
  (void)p.get();
  CHECK(locus::memory_stats<locus::pinned>().allocated_bytes == before + bytes);  // still owned
  auto d = std::move(p).get();
  CHECK(locus::memory_stats<locus::pinned>().allocated_bytes == before);  // released with the value
}

// ---- streams, events, guards --------------------------------------------------------------

TEST_CASE("stream_guard makes work go to a stream and restores the previous one") {
  const cudaStream_t before = locus::detail::current_stream();
  locus::stream s, t;
  {
    locus::stream_guard g(s);
    CHECK(locus::detail::current_stream() == s.native_handle());
    warm_cuda_cache<float>(1 << 20);
    spin(locus::detail::current_stream(), 200);
    auto z = locus::zeros<float, locus::cuda>({1 << 20});  // a memset on the current stream
    CHECK_FALSE(s.query());
    CHECK(t.query());
    // Created streams are non-blocking: the legacy default stream is not held up.
    CHECK(cudaStreamQuery(nullptr) == cudaSuccess);
    {
      locus::stream_guard inner(t);
      CHECK(locus::detail::current_stream() == t.native_handle());
    }
    CHECK(locus::detail::current_stream() == s.native_handle());
    s.synchronize();
    CHECK(s.query());
    CHECK(locus::to<locus::cpu>(z)(12345) == 0.0f);
  }
  CHECK(locus::detail::current_stream() == before);
}

TEST_CASE("events order streams: record wait synchronize query") {
  locus::stream a, b;
  locus::event e;
  CHECK(e.query());  // nothing recorded yet
  {
    locus::stream_guard g(b);
    warm_cuda_cache<float>(1024);
  }
  spin(a.native_handle(), 200);
  e.record(a);
  CHECK_FALSE(e.query());
  b.wait(e);
  auto z = [&] {
    locus::stream_guard g(b);
    return locus::zeros<float, locus::cuda>({1024});
  }();
  CHECK_FALSE(b.query());  // b waits for a's spin
  e.synchronize();
  CHECK(e.query());
  b.synchronize();
  CHECK(b.query());
}

TEST_CASE("streams and events are move-only handles and a moved-from one is an error") {
  locus::stream s;
  const cudaStream_t h = s.native_handle();
  locus::stream s2 = std::move(s);
  CHECK(s2.native_handle() == h);
  CHECK(s.native_handle() == nullptr);
  CHECK_THROWS_AS(s.synchronize(), locus::error);
  CHECK_THROWS_AS((void)locus::stream_guard{s}, locus::error);
  locus::event e;
  locus::event e2 = std::move(e);
  CHECK_THROWS_AS((void)e.query(), locus::error);
  CHECK_THROWS_AS(e.record(s2), locus::error);
  CHECK_THROWS_AS(s2.wait(e), locus::error);
  e2.record(s2);
  e2.synchronize();
}

// ---- the cuda loader ----------------------------------------------------------------------

namespace {
struct counting_source {
  locus::index_t n = 0;
  locus::index_t f = 3;
  locus::index_t throw_at = -1;
  locus::index_t size() const { return n; }
  locus::index_t features() const { return f; }
  std::int64_t load(locus::index_t i, std::span<float> x) const {
    if (i == throw_at) throw std::runtime_error("sample " + std::to_string(i) + " is unreadable");
    for (std::size_t k = 0; k < x.size(); ++k) x[k] = static_cast<float>(i) + 0.001f * static_cast<float>(k);
    return i;
  }
};
}  // namespace

TEST_CASE("loader on cuda yields the batches of the cpu loader") {
  counting_source src{.n = 1000, .f = 784};
  const locus::data::loader_options opt{.batch_size = 64, .shuffle = true, .seed = 11, .prefetch = 3};
  locus::data::loader<locus::cpu, counting_source> host(src, opt);
  locus::data::loader<locus::cuda, counting_source> gpu(src, opt);
  host.set_epoch(2);
  gpu.set_epoch(2);
  locus::stream compute;  // the consumer works on its own stream
  locus::stream_guard g(compute);
  auto h = host.begin();
  int n = 0;
  for (auto& [x, y] : gpu) {
    REQUIRE(!(h == host.end()));
    auto& [hx, hy] = *h;
    auto gx = locus::to<locus::cpu>(x);
    auto gy = locus::to<locus::cpu>(y);
    CHECK(gx.shape() == hx.shape());
    CHECK(std::memcmp(gx.data_handle(), hx.data_handle(), hx.size_bytes()) == 0);
    CHECK(std::memcmp(gy.data_handle(), hy.data_handle(), hy.size_bytes()) == 0);
    spin(compute.native_handle(), 2);  // "compute" that overlaps the next copies
    ++h;
    ++n;
  }
  CHECK(n == gpu.size());
  CHECK(h == host.end());
}

TEST_CASE("loader on cuda bounds its pinned staging by the prefetch depth") {
  counting_source src{.n = 256, .f = 1000};
  const int depth = 2;
  const std::size_t staging = locus::detail::size_class(8 * 1000 * sizeof(float)) +
                              locus::detail::size_class(8 * sizeof(std::int64_t));
  locus::empty_cache<locus::pinned>();
  const auto base = locus::memory_stats<locus::pinned>().allocated_bytes;
  locus::reset_peak_memory_stats<locus::pinned>();
  {
    locus::data::loader<locus::cuda, counting_source> l(src, {.batch_size = 8, .prefetch = depth});
    int batches = 0;
    for (auto& [x, y] : l) {
      (void)x;
      (void)y;
      ++batches;
    }
    CHECK(batches == 32);
  }
  const auto s = locus::memory_stats<locus::pinned>();
  CHECK(s.peak_allocated_bytes - base <= (depth + 1) * staging);
  CHECK(s.allocated_bytes == base);
}

TEST_CASE("loader on cuda rethrows an exception of the background thread") {
  counting_source src{.n = 100, .f = 8, .throw_at = 50};
  locus::data::loader<locus::cuda, counting_source> l(src, {.batch_size = 10});
  int batches = 0;
  try {
    for (auto& [x, y] : l) {
      (void)x;
      (void)y;
      ++batches;
    }
    FAIL("expected the dataset's exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "sample 50 is unreadable");
  }
  CHECK(batches == 5);
}
