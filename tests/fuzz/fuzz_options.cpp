// libFuzzer target: the main job's command-line parser (examples/fashion_mnist_options.hpp,
// the same code the job runs). The input is split at NUL bytes into arguments (at most
// 64). Every command line must end in one of three ways: a configuration within the
// documented ranges, a usage_error (the job prints it and exits 2) or a help_request.
// Any other exception, a crash, a sanitizer report, or a configuration out of range is a
// finding.
#include "../../examples/fashion_mnist_options.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_options: %s\n", what);
  std::abort();
}

void check(const fashion_mnist::config& c) {
  if (c.epochs < 1 || c.epochs > 1000000) finding("--epochs out of range accepted");
  if (c.accumulate < 1 || c.accumulate > 65536) finding("--accumulate out of range accepted");
  if (!(c.lr > 0 && c.lr <= 10)) finding("--lr out of range accepted");
  for (const double b : {c.clip_grad_norm, c.clip_grad_value})
    if (!(b == 0 || (b >= 1.2e-38 && b <= 1e30))) finding("a clip bound out of range accepted");
  if (c.clip_grad_norm > 0 && c.clip_grad_value > 0) finding("both clippings accepted");
  if (c.hidden.size() != 2 || c.hidden[0] < 1 || c.hidden[1] < 1 || c.hidden[0] > (1 << 20) || c.hidden[1] > (1 << 20))
    finding("--hidden out of range accepted");
  if (c.batch_size != "auto") {
    std::size_t used = 0;
    long long n = 0;
    try {
      n = std::stoll(c.batch_size, &used);
    } catch (...) {
      finding("a --batch-size that is not a number accepted");
    }
    if (used != c.batch_size.size() || n < 1 || n > (1LL << 31)) finding("--batch-size out of range accepted");
  }
  if (c.model != "mlp" && c.model != "cnn") finding("an unknown --model accepted");
  if (c.device != "auto" && c.device != "cpu" && c.device != "cuda") finding("an unknown --device accepted");
  if (!c.plot.empty() && c.log.empty()) finding("--plot without --log accepted");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args{"fashion_mnist"};
  std::string cur;
  for (std::size_t i = 0; i < size && args.size() < 64; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (!cur.empty() && args.size() < 64) args.push_back(cur);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    check(fashion_mnist::parse_options(static_cast<int>(argv.size()), argv.data()));
  } catch (const fashion_mnist::usage_error&) {
  } catch (const fashion_mnist::help_request&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_options: unexpected exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}
