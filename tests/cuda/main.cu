// Runner of the CUDA suite. Listing works everywhere (test discovery runs at build
// time on machines without a GPU); running needs a usable CUDA device, and without
// one every case exits with 77, which CTest reports as skipped, with the reason.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

#include <locus/locus.hpp>

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    if (std::strstr(argv[i], "list-test") || std::strstr(argv[i], "-ltc") || std::strstr(argv[i], "-lts"))
      listing = true;
  if (!listing && !locus::cuda_available()) {
    std::printf("SKIPPED: no usable CUDA device (%s); this case runs on a GPU machine "
                "(bench/gpu-check)\n", locus::environment().cuda_status.c_str());
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
