// bench_attention: ag::scaled_dot_product_attention, forward + backward, causal, f32 on
// the host, at sequence lengths --lengths (default 128, 512, 2048) with --batch B, --heads
// H and head dimension --dim E (default 4 x 4 x 32, a small GPT's). Prints one JSON line
// per length: the median ms of one forward + backward over --rounds rounds of --steps
// calls (after one warm-up call). The locus side of bench/pytorch/attention.py, which
// times torch.nn.functional.scaled_dot_product_attention with is_causal=True on the same
// shapes and threads; run both in one session and quote the ratios (bench/attention-run).
//
//   bench_attention [--lengths 128,512,2048] [--batch 4] [--heads 4] [--dim 32]
//                   [--steps 5] [--rounds 5] [--threads N]
#include <locus/ag/attention.hpp>
#include <locus/locus.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using D = locus::cpu;
using locus::index_t;
namespace ag = locus::ag;

std::vector<index_t> parse_list(const char* s) {
  std::vector<index_t> out;
  while (*s) {
    char* end = nullptr;
    const long long v = std::strtoll(s, &end, 10);
    if (end == s || v < 1) {
      std::fprintf(stderr, "bench_attention: --lengths takes positive integers separated by commas\n");
      std::exit(2);
    }
    out.push_back(static_cast<index_t>(v));
    s = *end == ',' ? end + 1 : end;
  }
  return out;
}

locus::tensor<float, D, 4> random4(locus::extents<4> s, unsigned seed) {
  locus::tensor<float, D, 4> t(s);
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (index_t i = 0; i < t.numel(); ++i) t.data_handle()[i] = n(g);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<index_t> lengths{128, 512, 2048};
  index_t b = 4, h = 4, e = 32;
  int steps = 5, rounds = 5, threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_attention: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--lengths") lengths = parse_list(next());
    else if (a == "--batch") b = std::atoll(next());
    else if (a == "--heads") h = std::atoll(next());
    else if (a == "--dim") e = std::atoll(next());
    else if (a == "--steps") steps = std::atoi(next());
    else if (a == "--rounds") rounds = std::atoi(next());
    else if (a == "--threads") threads = std::atoi(next());
    else {
      std::fprintf(stderr, "bench_attention: unknown option %s\n", a.c_str());
      return 2;
    }
  }
#if defined(_OPENMP)
  if (threads > 0) omp_set_num_threads(threads);
  threads = omp_get_max_threads();
#endif
  for (const index_t t : lengths) {
    const auto q = random4({b, h, t, e}, 1), k = random4({b, h, t, e}, 2), v = random4({b, h, t, e}, 3);
    ag::tape<float, D> tape;
    double check = 0;
    const auto call = [&] {
      tape.reset();
      const auto lq = tape.leaf(q), lk = tape.leaf(k), lv = tape.leaf(v);
      const auto o = ag::scaled_dot_product_attention(lq, lk, lv, {.causal = true});
      tape.backward(ag::sum(o));
      check += static_cast<double>(tape.grad(lq).data_handle()[q.numel() - 1]);
    };
    call();
    std::vector<double> ms;
    for (int r = 0; r < rounds; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) call();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("{\"impl\": \"locus\", \"batch\": %lld, \"heads\": %lld, \"length\": %lld, \"dim\": %lld, "
                "\"threads\": %d, \"ms_fwd_bwd\": %.3f, \"check\": %.6g}\n",
                static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(t),
                static_cast<long long>(e), threads, ms[ms.size() / 2], check);
    std::fflush(stdout);
  }
}
