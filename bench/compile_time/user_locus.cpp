// Compile-time benchmark, locus side: a small, realistic user file. It fills cpu
// tensors (counter-based uniform random numbers, a constant, a range), takes a slice
// and a reshape, copies (clone, into a strided window, to<cpu>), reads a few elements
// and prints them. bench/compile_time/user_thrust.cpp does the same work directly
// with Thrust's OpenMP system; bench/compile-time compares their compile times.
#include <locus/locus.hpp>

#include <cstdio>

int main() {
  constexpr std::uint64_t seed = 42;

  // 1024 x 1024 uniform values in [0, 1), a constant and a range.
  auto x = locus::rand<float, locus::cpu>({1024, 1024}, seed);
  auto bias = locus::full<float, locus::cpu>({1024}, 0.5f);
  auto idx = locus::arange<std::int64_t, locus::cpu>(4096);

  // Views: the first 32 rows (a batch), the range as 64 x 64.
  auto batch = x.slice(0, 32);
  auto grid = idx.reshape({64, 64});

  // Copies: a deep copy of the batch, rows 8..15 of the constant overwritten by
  // rows 0..7 of a rank-2 view of it, and a contiguous copy of the grid.
  auto batch_copy = locus::to<locus::cpu>(batch);
  auto b = bias.reshape({32, 32});
  auto window = b.slice(8, 16);
  locus::copy(b.slice(0, 8), window);
  auto x2 = x.clone();

  // Reads.
  double sum = 0;
  for (locus::index_t j = 0; j < 1024; ++j) sum += batch_copy(5, j);
  std::printf("x(0,0) = %.6f  x(1023,1023) = %.6f  clone equal: %d\n", x(0, 0), x(1023, 1023),
              x2(17, 99) == x(17, 99));
  std::printf("batch: %lld x %lld, row 5 sum %.4f\n", (long long)batch.extent(0),
              (long long)batch.extent(1), sum);
  std::printf("grid(3, 7) = %lld  bias(100) = %.2f  numel(x) = %lld\n", (long long)grid(3, 7),
              bias(100), (long long)x.numel());
  return 0;
}
