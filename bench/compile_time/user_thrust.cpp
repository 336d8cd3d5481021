// Compile-time benchmark, Thrust side: the work of user_locus.cpp written directly
// against Thrust's OpenMP system, with std::vector buffers, the same counter-based
// (Philox4x32-10) uniform fill, the same constant and range fills, the same views
// (a row slice, a reshape as index arithmetic), the same copies and reads. It
// includes only the Thrust headers it uses, plus the standard headers.
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/system/omp/execution_policy.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

using index_t = std::int64_t;

struct philox_out {
  std::uint32_t v[4];
};

inline std::uint32_t mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  return static_cast<std::uint32_t>(p);
}

// Philox4x32-10, key = seed, counter = (index, stream).
inline philox_out philox4x32(std::uint64_t seed, std::uint64_t counter, std::uint64_t stream = 0) {
  std::uint32_t c0 = static_cast<std::uint32_t>(counter), c1 = static_cast<std::uint32_t>(counter >> 32);
  std::uint32_t c2 = static_cast<std::uint32_t>(stream), c3 = static_cast<std::uint32_t>(stream >> 32);
  std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    std::uint32_t hi0, hi1;
    const std::uint32_t lo0 = mulhilo(0xD2511F53u, c0, hi0);
    const std::uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, hi1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

struct uniform_fill {
  float* dst;
  std::uint64_t seed;
  double lo, hi;
  void operator()(index_t i) const {
    const philox_out r = philox4x32(seed, static_cast<std::uint64_t>(i));
    const float u = static_cast<float>(r.v[0] >> 8) * (1.0f / 16777216.0f);
    dst[i] = ::fmaf(static_cast<float>(hi - lo), u, static_cast<float>(lo));
  }
};

struct fill_value {
  float* dst;
  float value;
  void operator()(index_t i) const { dst[i] = value; }
};

struct arange_fill {
  std::int64_t* dst;
  index_t start, step;
  void operator()(index_t i) const { dst[i] = start + i * step; }
};

template <class F>
void launch_n(index_t n, F f) {
  thrust::for_each_n(thrust::omp::par, thrust::counting_iterator<index_t>(0), n, f);
}

}  // namespace

int main() {
  constexpr std::uint64_t seed = 42;
  constexpr index_t rows = 1024, cols = 1024;

  // 1024 x 1024 uniform values in [0, 1), a constant and a range.
  std::vector<float> x(rows * cols);
  launch_n(rows * cols, uniform_fill{x.data(), seed, 0.0, 1.0});
  std::vector<float> bias(1024);
  launch_n(1024, fill_value{bias.data(), 0.5f});
  std::vector<std::int64_t> idx(4096);
  launch_n(4096, arange_fill{idx.data(), 0, 1});

  // Views: the first 32 rows (a batch), the range as 64 x 64.
  const float* batch = x.data();
  const index_t batch_rows = 32;
  const std::int64_t* grid = idx.data();
  const index_t grid_cols = 64;

  // Copies: a deep copy of the batch, rows 8..15 of the constant (seen as 32 x 32)
  // overwritten by rows 0..7, and a deep copy of x.
  std::vector<float> batch_copy(batch, batch + batch_rows * cols);
  float* b = bias.data();
  for (index_t r = 0; r < 8; ++r)
    std::memcpy(b + (8 + r) * 32, b + r * 32, 32 * sizeof(float));
  std::vector<float> x2(x.size());
  std::memcpy(x2.data(), x.data(), x.size() * sizeof(float));

  // Reads.
  double sum = 0;
  for (index_t j = 0; j < cols; ++j) sum += batch_copy[5 * cols + j];
  std::printf("x(0,0) = %.6f  x(1023,1023) = %.6f  clone equal: %d\n", x[0],
              x[1023 * cols + 1023], x2[17 * cols + 99] == x[17 * cols + 99]);
  std::printf("batch: %lld x %lld, row 5 sum %.4f\n", (long long)batch_rows, (long long)cols, sum);
  std::printf("grid(3, 7) = %lld  bias(100) = %.2f  numel(x) = %lld\n",
              (long long)grid[3 * grid_cols + 7], bias[100], (long long)x.size());
  return 0;
}
