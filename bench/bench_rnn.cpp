// bench_rnn: one LSTM layer (ag::lstm) and one GRU layer (ag::gru), forward + backward (of
// the output's sum; gradients of x and of every weight), f32 on the host, over x
// [--steps-t T, --batch B, --input I] with hidden size --hidden H (default 64 x 32 x 128 x
// 256). Prints one JSON line per kind: the median ms of one forward + backward over
// --rounds rounds of --calls calls (after one warm-up call). The locus side of
// bench/pytorch/rnn.py (torch.nn.LSTM / torch.nn.GRU on the same shapes and threads).
//
//   bench_rnn [--seq 64] [--batch 32] [--input 128] [--hidden 256] [--calls 5] [--rounds 5] [--threads N]
#include <locus/ag/recurrent.hpp>
#include <locus/locus.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {
using D = locus::cpu;
using locus::index_t;
namespace ag = locus::ag;
}  // namespace

int main(int argc, char** argv) {
  index_t seq = 64, batch = 32, in = 128, hidden = 256;
  int calls = 5, rounds = 5, threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_rnn: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seq") seq = std::atoll(next());
    else if (a == "--batch") batch = std::atoll(next());
    else if (a == "--input") in = std::atoll(next());
    else if (a == "--hidden") hidden = std::atoll(next());
    else if (a == "--calls") calls = std::atoi(next());
    else if (a == "--rounds") rounds = std::atoi(next());
    else if (a == "--threads") threads = std::atoi(next());
    else {
      std::fprintf(stderr, "bench_rnn: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (seq < 1 || batch < 1 || in < 1 || hidden < 1 || calls < 1 || rounds < 1) {
    std::fprintf(stderr, "bench_rnn: sizes, --calls and --rounds must be positive\n");
    return 2;
  }
#if defined(_OPENMP)
  if (threads > 0) omp_set_num_threads(threads);
  threads = omp_get_max_threads();
#endif
  for (const int gates : {4, 3}) {
    const auto x = locus::randn<float, D>({seq, batch, in}, 1);
    const auto wih = locus::rand<float, D>({gates * hidden, in}, 2, -0.06, 0.06);
    const auto whh = locus::rand<float, D>({gates * hidden, hidden}, 3, -0.06, 0.06);
    const auto bih = locus::rand<float, D>({gates * hidden}, 4, -0.06, 0.06);
    const auto bhh = locus::rand<float, D>({gates * hidden}, 5, -0.06, 0.06);
    ag::tape<float, D> tape;
    double check = 0;
    const auto call = [&] {
      tape.reset();
      const auto lx = tape.leaf(x);
      const auto a = tape.leaf(wih), b = tape.leaf(whh);
      const auto c = tape.leaf(bih), d = tape.leaf(bhh);
      const auto y = gates == 4 ? ag::lstm(lx, a, b, c, d).y : ag::gru(lx, a, b, c, d).y;
      tape.backward(ag::sum(y));
      check += static_cast<double>(tape.grad(b).data_handle()[0]);
    };
    call();
    std::vector<double> ms;
    for (int r = 0; r < rounds; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < calls; ++s) call();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / calls);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("{\"impl\": \"locus\", \"kind\": \"%s\", \"seq\": %lld, \"batch\": %lld, \"input\": %lld, "
                "\"hidden\": %lld, \"threads\": %d, \"ms_fwd_bwd\": %.3f, \"check\": %.6g}\n",
                gates == 4 ? "lstm" : "gru", static_cast<long long>(seq), static_cast<long long>(batch),
                static_cast<long long>(in), static_cast<long long>(hidden), threads, ms[ms.size() / 2], check);
    std::fflush(stdout);
  }
}
