// fashion_mnist: trains an MLP classifier on Fashion-MNIST (or any IDX directory, such as
// MNIST) with locus's typed training loop. The README's first command runs it.
//
//   fashion_mnist [--data DIR] [--device auto|cpu|cuda] [--precision fp32|bf16|fp16]
//                 [--epochs N] [--batch-size N|auto] [--lr X] [--accumulate N] [--seed N]
//                 [--clip-grad-norm X | --clip-grad-value X] [--plot FILE.png]
//                 [--hidden A,B] [--checkpoint-dir DIR] [--resume [FILE]] [--log FILE.csv]
//                 [--memory-limit BYTES[K|M|G]] [--workers N]
//
// The command line is parsed strictly by CLI11 before anything else happens: a malformed
// or out-of-range value names its option and exits 2; --help lists the options on
// stdout and exits 0.
//
// --batch-size auto tries batches from 64 up (doubling, then bisecting) and keeps the
// largest whose forward and backward fit the device's memory, counting the batches the
// loader holds ahead; it searches up to min(training set, 4096) samples, since beyond
// that an epoch has too few optimizer steps to train well. --memory-limit caps the
// device's allocator (locus::set_memory_limit), so auto can be tried on a CPU.
//
// The body (fashion_mnist_job.hpp) is written once for any device D and precision policy
// P; the options pick the instantiation. This file, main and the cpu job, is built by the
// host compiler; the cuda job is fashion_mnist_cuda.cu, built by nvcc when CUDA is enabled
// (FASHION_MNIST_HAS_CUDA=1): an nvcc translation unit would give the cpu job scalar host
// loops (docs/guide.md, "One program, both devices").
//
// Data-parallel: built with MPI (CMake found it: locus::dist), the same binary runs as N
// ranks under a launcher, `scripts/run-main --ranks N ...` or `mpirun -np N fashion_mnist
// ...`: each rank trains on its shard of the training set (the loader's rank and
// world_size, drop_last), the gradients are averaged every optimizer step
// (locus::dist::data_parallel), the test set is sharded and its figures combined; rank 0
// alone prints, writes --log and the checkpoints, and every rank resumes from them. A
// rank's error ends the whole job with that rank's message. Without a launcher it is the
// single process it always was, MPI not even initialised.
#include "fashion_mnist_job.hpp"

#ifndef FASHION_MNIST_HAS_CUDA
#define FASHION_MNIST_HAS_CUDA 0
#endif

namespace {

using namespace fashion_mnist::job;

/// The job on this process (one rank of it, or all of it).
int job(const config& c) {
  const auto env = locus::environment();
  std::fputs(env.to_string().c_str(), stdout);
  bool use_cuda = false;
  if (c.device == "cuda") {
#if FASHION_MNIST_HAS_CUDA
    if (!locus::cuda_available()) {
      std::fprintf(stderr, "fashion_mnist: --device cuda, but no usable GPU: %s\n", env.cuda_status.c_str());
      return 1;
    }
    use_cuda = true;
#else
    std::fprintf(stderr, "fashion_mnist: --device cuda, but this build has no CUDA (configure with nvcc on PATH)\n");
    return 1;
#endif
  } else if (c.device == "auto") {
#if FASHION_MNIST_HAS_CUDA
    use_cuda = locus::cuda_available();
#endif
  }
  // On cuda the default is bf16, or fp16 with a grad scaler on a card without bf16
  // (compute capability below 8.0: locus::mixed_precision_for).
  std::string precision = !c.precision.empty() ? c.precision : (use_cuda ? "bf16" : "fp32");
#if FASHION_MNIST_HAS_CUDA
  if (use_cuda && c.precision.empty()) {
    const int gpu = locus::detail::current_device_or_zero();
    for (const auto& d : env.devices)
      if (d.index == gpu && locus::mixed_precision_for(d) == locus::gpu_precision::fp16) {
        precision = "fp16";
        std::printf("GPU %d (%s) has compute capability %d.%d, without bf16: training in fp16 with a grad scaler\n",
                    gpu, d.name.c_str(), d.compute_major, d.compute_minor);
      }
  }
#endif
  std::printf("\ntraining on %s in %s\n", use_cuda ? "cuda" : "cpu", precision.c_str());
#if FASHION_MNIST_HAS_CUDA
  if (use_cuda) {
#if LOCUS_HAS_MPI
    // several ranks on a node: one GPU each (before any cuda work of this rank)
    int gpus = 0;
    if (g_env && g_env->local_size() > 1 && cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 1)
      LOCUS_CUDA_CHECK(cudaSetDevice(g_env->local_rank() % gpus));
#endif
    return run_cuda(c, precision);  // fashion_mnist_cuda.cu
  }
#endif
  return run_device<locus::cpu>(c, precision);
}

}  // namespace

int main(int argc, char** argv) {
  const config c = parse(argc, argv);
#if LOCUS_HAS_MPI
  // Under a launcher: one rank of the job (rank 0 prints; an error on any rank ends the
  // job with that rank's message). Without one: a world of one, no MPI_Init.
  return locus::dist::run(argc, argv, [&](locus::dist::environment& env) -> int {
    g_env = &env;
    if (env.rank() != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;
    try {
      return job(c);
    } catch (const std::exception& e) {
      if (env.world_size() > 1) throw std::runtime_error(std::string("fashion_mnist: ") + e.what());
      std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
      return 1;
    }
  });
#else
  try {
    return job(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
#endif
}
