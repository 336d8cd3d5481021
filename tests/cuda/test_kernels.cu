// CUDA suite: the kernels shaped for the GPU (issue 13), checked against the host. The
// tiled reductions (bias gradients, sums along a leading axis) must equal, bit for bit,
// the host's run of the device schedule (run_tiled_host: same partial sums, same order;
// sums have no products to contract); softmax and cross-entropy (a warp or a block per
// row) must match the host within rounding; the f16/bf16 conversion instructions must
// give the portable path's bits for every one of the 2^32 floats.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <locus/locus.hpp>
#include <locus/nn/kernels.hpp>
#include <locus/nn/loss.hpp>

namespace {

namespace ld = locus::detail;
using locus::index_t;
using CU = locus::cuda;

template <class T>
std::vector<T> to_host_vec(const T* dev, std::size_t n) {
  std::vector<T> h(n);
  if (n) LOCUS_CUDA_CHECK(cudaMemcpy(h.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}
template <class T>
T* to_dev(const std::vector<T>& h) {
  T* p = nullptr;
  LOCUS_CUDA_CHECK(cudaMalloc(&p, h.size() * sizeof(T) + 1));
  if (!h.empty()) LOCUS_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

// ---- f16 / bf16: the instructions against the portable code, every input ----------------

struct mismatch {
  unsigned long long count;
  unsigned int first_input;
  unsigned int first_got;
  unsigned int first_want;
};

__device__ void note(mismatch* m, unsigned int in, unsigned int got, unsigned int want) {
  if (atomicAdd(&m->count, 1ull) == 0ull) {
    m->first_input = in;
    m->first_got = got;
    m->first_want = want;
  }
}

__global__ void narrow_all(std::uint64_t base, mismatch* f16m, mismatch* bf16m) {
  const std::uint64_t i = base + blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (i > 0xffffffffull) return;
  const auto x = static_cast<std::uint32_t>(i);
  const std::uint16_t h = ld::f32_bits_to_f16_bits(x), hp = ld::f32_bits_to_f16_bits_portable(x);
  if (h != hp) note(f16m, x, h, hp);
  const std::uint16_t b = ld::f32_bits_to_bf16_bits(x), bp = ld::f32_bits_to_bf16_bits_portable(x);
  if (b != bp) note(bf16m, x, b, bp);
}

__global__ void widen_all(mismatch* m) {
  const unsigned int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h > 0xffffu) return;
  const std::uint32_t w = ld::f16_bits_to_f32_bits(static_cast<std::uint16_t>(h));
  const std::uint32_t wp = ld::f16_bits_to_f32_bits_portable(static_cast<std::uint16_t>(h));
  if (w != wp) note(m, h, w, wp);
}

}  // namespace

TEST_CASE("cuda kernels: f16 and bf16 conversion instructions give the portable bits for all 2^32 floats") {
  mismatch* m = nullptr;
  LOCUS_CUDA_CHECK(cudaMalloc(&m, 3 * sizeof(mismatch)));
  LOCUS_CUDA_CHECK(cudaMemset(m, 0, 3 * sizeof(mismatch)));
  constexpr unsigned threads = 256;
  constexpr std::uint64_t per_launch = std::uint64_t(1) << 30;
  for (std::uint64_t base = 0; base < (std::uint64_t(1) << 32); base += per_launch)
    narrow_all<<<static_cast<unsigned>(per_launch / threads), threads>>>(base, m, m + 1);
  widen_all<<<65536 / threads, threads>>>(m + 2);
  LOCUS_CUDA_CHECK(cudaGetLastError());
  const auto h = to_host_vec(m, 3);
  LOCUS_CUDA_CHECK(cudaFree(m));
  const char* names[] = {"f32 -> f16", "f32 -> bf16", "f16 -> f32"};
  for (int k = 0; k < 3; ++k) {
    INFO(names[k] << ": first input 0x" << std::hex << h[k].first_input << " gave 0x" << h[k].first_got
                  << ", portable 0x" << h[k].first_want);
    CHECK(h[k].count == 0);
  }
  // and device code's portable results are the host's (a sample through a tensor cast)
  std::vector<float> xs;
  std::mt19937 rng(3);
  for (int i = 0; i < 1 << 16; ++i) {
    const std::uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    xs.push_back(f);
  }
  auto x = locus::from_host<CU>(xs, {index_t(xs.size())});
  auto hb = locus::to<locus::cpu>(locus::eval(locus::cast<locus::f16>(x)));
  auto bb = locus::to<locus::cpu>(locus::eval(locus::cast<locus::bf16>(x)));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < xs.size(); ++i)
    bad += hb.data_handle()[i].bits != locus::f16(xs[i]).bits || bb.data_handle()[i].bits != locus::bf16(xs[i]).bits;
  CHECK(bad == 0);
}

// ---- bias gradients: the tiled kernel equals the host's run of its schedule ----------------

TEST_CASE("cuda kernels: the tiled bias gradient equals the host run of its schedule bit for bit and is deterministic") {
  const std::pair<index_t, index_t> shapes[] = {{1, 1},   {128, 512}, {128, 256}, {128, 10}, {3, 33},
                                                {17, 31}, {4096, 3},  {5000, 65}, {100000, 2}, {0, 4}};
  std::uint64_t seed = 1;
  for (const auto& [rows, cols] : shapes) {
    for (ld::act_kind kind : {ld::act_kind::none, ld::act_kind::relu, ld::act_kind::gelu}) {
      INFO(rows << " x " << cols << " act " << static_cast<int>(kind));
      const auto n = static_cast<std::size_t>(rows * cols);
      std::mt19937_64 rng(seed++);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> gy(n), z(n), y(n), db0(static_cast<std::size_t>(cols));
      for (std::size_t i = 0; i < n; ++i) {
        gy[i] = nd(rng);
        z[i] = nd(rng);
        y[i] = z[i] > 0 ? z[i] : 0.0f;
      }
      for (std::size_t j = 0; j < db0.size(); ++j) db0[j] = 0.125f * static_cast<float>(j % 5);
      const bool uses_z = kind == ld::act_kind::gelu;
      // host: the device's schedule
      std::vector<float> hdz(n, 0.0f), hdb = db0;
      ld::bias_act_grad_kernel<float, float> hk{gy.data(), uses_z ? z.data() : nullptr, uses_z ? nullptr : y.data(),
                                                 kind == ld::act_kind::none ? nullptr : hdz.data(), hdb.data(), rows,
                                                 cols, kind};
      hk.plan = ld::plan_column_tiles(rows, cols);
      std::vector<float> partial(static_cast<std::size_t>(hk.plan.splits * cols));
      hk.partial = partial.data();
      if (rows > 0) hk.run_tiled_host();
      // device, twice
      float *dgy = to_dev(gy), *dz_ = to_dev(z), *dy = to_dev(y);
      std::vector<float> first;
      for (int run = 0; run < 2; ++run) {
        float *ddz = to_dev(std::vector<float>(n, 0.0f)), *ddb = to_dev(db0);
        ld::run_bias_act_grad<CU>(ld::bias_act_grad_kernel<float, float>{
            dgy, uses_z ? dz_ : nullptr, uses_z ? nullptr : dy, kind == ld::act_kind::none ? nullptr : ddz, ddb, rows,
            cols, kind});
        LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
        const auto gdb = to_host_vec(ddb, db0.size()), gdz = to_host_vec(ddz, n);
        for (std::size_t j = 0; j < gdb.size(); ++j) {
          if (kind == ld::act_kind::gelu) {  // erfc and exp differ by ulps between host and device
            CHECK(std::abs(gdb[j] - hdb[j]) <= 1e-5f * (1.0f + std::abs(hdb[j])) * std::sqrt(float(rows) + 1.0f));
          } else if (std::memcmp(&gdb[j], &hdb[j], 4) != 0) {
            FAIL_CHECK("db[" << j << "] = " << gdb[j] << ", the host's run of the schedule " << hdb[j]);
            break;
          }
        }
        if (kind == ld::act_kind::relu) CHECK(std::memcmp(gdz.data(), hdz.data(), n * 4) == 0);
        if (run == 0) first = gdb;
        else CHECK(std::memcmp(first.data(), gdb.data(), first.size() * 4) == 0);
        LOCUS_CUDA_CHECK(cudaFree(ddz));
        LOCUS_CUDA_CHECK(cudaFree(ddb));
      }
      LOCUS_CUDA_CHECK(cudaFree(dgy));
      LOCUS_CUDA_CHECK(cudaFree(dz_));
      LOCUS_CUDA_CHECK(cudaFree(dy));
    }
  }
}

// ---- reductions along a leading axis: the tiled kernel equals the host run ---------------

TEST_CASE("cuda kernels: leading-axis sums, maxima and argmaxima equal the host run of the tiled schedule bit for bit") {
  using K = ld::reduce_kind;
  for (const auto& s : std::vector<std::array<index_t, 2>>{{1, 1}, {7, 33}, {129, 65}, {100000, 3}, {20000, 257}}) {
    INFO(s[0] << " x " << s[1]);
    auto h = locus::randn<float, locus::cpu>({s[0], s[1]}, std::uint64_t(s[0] + s[1]), 0.5, 3.0);
    auto d = locus::to<CU>(h);
    auto same = [](const auto& dev, const auto& host) {
      auto a = locus::to<locus::cpu>(dev);
      return std::memcmp(a.data_handle(), host.data_handle(), host.size_bytes()) == 0;
    };
    CHECK(same(locus::sum(d, 0), ld::reduce_axis_tiled<K::sum>(h, 0)));
    CHECK(same(locus::mean(d, 0), ld::reduce_axis_tiled<K::mean>(h, 0)));
    CHECK(same(locus::max(d, 0), ld::reduce_axis_tiled<K::max>(h, 0)));
    CHECK(same(locus::argmin(d, 0), ld::reduce_axis_tiled<K::argmin>(h, 0)));
    // a strided operand (the transpose) along its leading axis: the multi-index reader
    auto dt = locus::transpose(d);
    auto ht = locus::transpose(h);
    CHECK(same(locus::sum(dt, 0), ld::reduce_axis_tiled<K::sum>(ht, 0)));
    CHECK(same(locus::argmax(dt, 0), ld::reduce_axis_tiled<K::argmax>(ht, 0)));
    auto v = locus::to<locus::cpu>(locus::var(d, 0));
    auto vh = ld::reduce_axis_tiled<K::var>(h, 0);
    for (index_t c = 0; c < s[1]; ++c)
      CHECK(std::abs(v.data_handle()[c] - vh.data_handle()[c]) <= 1e-6f * std::abs(vh.data_handle()[c]));
  }
}

// ---- softmax and cross-entropy: warps and blocks per row against the host ----------------

TEST_CASE("cuda kernels: softmax and cross-entropy of 10 and 50257 classes match the host") {
  for (index_t k : {index_t(1), index_t(10), index_t(1000), index_t(1025), index_t(50257)}) {
    const index_t n = k > 1000 ? 64 : 128;
    INFO(n << " x " << k);
    auto h = locus::randn<float, locus::cpu>({n, k}, std::uint64_t(k), 0.0, 5.0);
    h.data_handle()[3 * k] = -std::numeric_limits<float>::infinity();  // a masked class
    auto d = locus::to<CU>(h);
    for (bool lg : {false, true}) {
      auto gd = locus::to<locus::cpu>(lg ? locus::log_softmax(d, 1) : locus::softmax(d, 1));
      auto gh = lg ? locus::log_softmax(h, 1) : locus::softmax(h, 1);
      double worst = 0;
      for (index_t i = 0; i < n * k; ++i) {
        const double a = gd.data_handle()[i], b = gh.data_handle()[i];
        if (std::isinf(b)) CHECK(a == b);
        else worst = std::max(worst, std::abs(a - b) / std::max(lg ? 1.0 : 1e-30, std::abs(b)));
      }
      CHECK(worst <= (lg ? 2e-6 : 2e-5));
    }
    std::vector<std::int64_t> labels(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = (i * 7919) % k;
    auto yh = locus::from_host<locus::cpu>(labels, {n});
    auto yd = locus::to<CU>(yh);
    for (float eps : {0.0f, 0.1f}) {
      locus::nn::cross_entropy_state<locus::cpu, locus::amp::fp32> ch(locus::nn::cross_entropy{.label_smoothing = eps});
      locus::nn::cross_entropy_state<CU, locus::amp::fp32> cd(locus::nn::cross_entropy{.label_smoothing = eps});
      const float lh = locus::to<locus::cpu>(ch.forward(std::as_const(h).view(), std::as_const(yh).view())).item();
      const float ldv = locus::to<locus::cpu>(cd.forward(std::as_const(d).view(), std::as_const(yd).view())).item();
      CHECK(std::abs(lh - ldv) <= 1e-5f * std::max(1.0f, std::abs(lh)));
      auto gh = locus::eval(ch.grad());
      auto gd = locus::to<locus::cpu>(locus::eval(cd.grad()));
      double worst = 0;
      for (index_t i = 0; i < n * k; ++i)
        worst = std::max(worst, double(std::abs(gd.data_handle()[i] - gh.data_handle()[i])) /
                                    std::max(1e-3 / double(n * k), double(std::abs(gh.data_handle()[i]))));
      CHECK(worst <= 2e-5);
      auto [sh, ah] = ch.evaluate(std::as_const(h).view(), std::as_const(yh).view());
      auto [sd, ad] = cd.evaluate(std::as_const(d).view(), std::as_const(yd).view());
      CHECK(locus::to<locus::cpu>(ad).item() == locus::to<locus::cpu>(ah).item());  // same argmax per row
    }
    // a bad label is reported at the next check, naming its sample
    labels[5] = k;
    auto bad = locus::from_host<CU>(labels, {n});
    locus::nn::cross_entropy_state<CU, locus::amp::fp32> cd(locus::nn::cross_entropy{});
    (void)cd.forward(std::as_const(d).view(), std::as_const(bad).view());
    CHECK_THROWS_AS(cd.check_labels(), locus::index_error);
  }
}
