// tour: the environment report, then a typed computation on the best available
// device. The body is written once, for any device D; with_device instantiates it
// for cpu and cuda and runs the one this machine can use (LOCUS_DEVICE=cpu forces
// the cpu). Compiled by nvcc when CUDA is enabled, because the cuda instantiation
// launches kernels.
#include <locus/locus.hpp>

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

    // Results reach the host only through an explicit transfer.
    locus::tensor<float, locus::cpu, 2> xb = locus::to<locus::cpu>(batch);
    locus::tensor<float, locus::cpu, 2> wh = locus::to<locus::cpu>(w);
    double logit00 = 0, sq = 0;
    for (locus::index_t k = 0; k < 784; ++k) logit00 += double(xb(0, k)) * wh(k, 0);
    for (float v : xb.span()) sq += double(v) * v;
    std::printf("x: %lld x %lld, batch %lld x %lld, mean square %.4f (randn: about 1)\n",
                (long long)x.extent(0), (long long)x.extent(1), (long long)xb.extent(0),
                (long long)xb.extent(1), sq / double(xb.numel()));
    std::printf("logit[0][0] = %.6f\n", logit00);

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
