// tour: the environment report, then a typed computation on the best available
// device. The body is written once, for any device D; with_device instantiates it
// for cpu and cuda and runs the one this machine can use (LOCUS_DEVICE=cpu forces
// the cpu). Compiled by nvcc when CUDA is enabled, because the cuda instantiation
// launches kernels.
#include <locus/locus.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  const auto env = locus::environment();
  std::fputs(env.to_string().c_str(), stdout);

  const auto choice = argc > 1 ? locus::parse_device_choice(argv[1]) : locus::device_choice::automatic;
  const std::string summary = locus::with_device(choice, [](auto device) {
    using D = decltype(device);
    std::printf("\nrunning on %s\n", std::string(D::name).c_str());

    // Typed tensors: device, dtype and rank are part of the type.
    locus::tensor<float, D, 2> x = locus::randn<float, D>({256, 784}, /*seed=*/42);
    locus::tensor<float, D, 2> w = locus::rand<float, D>({784, 10}, /*seed=*/7, -0.05, 0.05);
    auto batch = x.slice(0, 32);  // a view of the first 32 rows, no copy

    // Lazy expressions fuse into one kernel; matmul, softmax and reductions run on D.
    locus::tensor<float, D, 2> xn = locus::tanh(batch * 0.5f) + 0.1f;  // one pass
    auto logits = locus::matmul(xn, w);                                  // [32, 10]
    auto probs = locus::softmax(logits, 1);
    auto predicted = locus::argmax(probs, 1);                            // i64 [32]
    auto total = locus::sum(probs);                                      // rank 0, on D

    // Results reach the host only through an explicit transfer.
    locus::tensor<float, locus::cpu, 2> ph = locus::to<locus::cpu>(probs);
    locus::tensor<std::int64_t, locus::cpu, 1> yh = locus::to<locus::cpu>(predicted);
    std::printf("x: %lld x %lld, batch %lld x %lld, logits %lld x %lld\n", (long long)x.extent(0),
                (long long)x.extent(1), (long long)batch.extent(0), (long long)batch.extent(1),
                (long long)logits.extent(0), (long long)logits.extent(1));
    std::printf("sample 0: class %lld with p = %.4f; probabilities sum to %.4f over %lld rows\n",
                (long long)yh(0), ph(0, yh(0)), locus::to<locus::cpu>(total).item(),
                (long long)ph.extent(0));

    // Memory statistics of the device the work ran on.
    const auto s = locus::memory_stats<D>();
    std::printf("%s memory: %s allocated, %s reserved, peak %s, %zu allocations, %zu cache hits\n",
                std::string(D::name).c_str(),
                locus::out_of_memory::format_bytes(s.allocated_bytes).c_str(),
                locus::out_of_memory::format_bytes(s.reserved_bytes).c_str(),
                locus::out_of_memory::format_bytes(s.peak_allocated_bytes).c_str(),
                s.allocations, s.cache_hits);
    // Mistakes the compiler catches (uncomment one to see its message):
    //   float v = x(0, 0);            // on cuda: element access needs host-accessible memory
    //   locus::tensor<float, locus::cpu, 2> h = x;   // on cuda: transfers are explicit
    //   auto y = x;                    // tensor is move-only: write x.clone()
    return std::string(D::name);
  });
  std::printf("\ntour finished on %s\n", summary.c_str());
  return 0;
}
