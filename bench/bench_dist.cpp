// bench_dist: one data-parallel MLP training epoch on Fashion-MNIST through
// locus::dist::data_parallel (cpu, MPI): the bench model 784-256-128-10, AdamW, a global
// batch of --global-batch samples split over the ranks (each rank a contiguous part of
// the same shuffled order per step), data preloaded, rows gathered by memcpy as in
// bench_train. Run it as one rank with 2 threads and as 2 ranks with 1 thread each
// (bench/dist-run does both, alternately): the same samples, steps and global batch,
// so the ratio of their samples/s is the scaling efficiency. Prints one JSON line from
// rank 0 with the whole job's samples/s, the seconds each rank spent in the gradient
// all-reduce (max over ranks) and that time's share of the epoch.
//
//   mpirun -np 2 bench_dist [--global-batch 256] [--epochs 1] [--data DIR] [--bucket-kb K]
// --bucket-kb K: the gradients reduced in buckets of K KiB during backward (0: one
// all-reduce after backward, the default).
#include <locus/dist.hpp>
#include <locus/data/idx.hpp>
#include <locus/data/loader.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  return locus::dist::run(argc, argv, [&](locus::dist::environment& env) -> int {
    using locus::cpu;
    using locus::index_t;
    namespace nn = locus::nn;
    index_t global = 256;
    int epochs = 1;
    long long bucket_kb = 0;  // 0: one all-reduce after backward
    std::string data = "/usr/share/datasets/fashion-mnist";
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--global-batch") global = std::atoll(v.c_str());
      else if (k == "--epochs") epochs = std::atoi(v.c_str());
      else if (k == "--data") data = v;
      else if (k == "--bucket-kb") bucket_kb = std::atoll(v.c_str());
      else throw locus::value_error("bench_dist: unknown option " + k);
    }
    locus::dist::communicator<cpu> comm(env);
    const int world = comm.world_size(), rank = comm.rank();
    if (global % world != 0) throw locus::value_error("bench_dist: --global-batch must divide by the ranks");
    const index_t batch = global / world;

    auto set = locus::data::idx_dataset::from_directory(data, "train");
    const index_t n = set.size(), features = set.rows() * set.cols();
    const auto xh = set.images_normalized();
    const auto x_all = locus::to<cpu>(xh.reshape({n, features}));
    const auto y_all = set.labels();

    using P = locus::amp::fp32;
    nn::sequential model(nn::linear<cpu, P>(features, 256), nn::relu<cpu, P>(), nn::linear<cpu, P>(256, 128),
                         nn::relu<cpu, P>(), nn::linear<cpu, P>(128, 10));
    model.reset_parameters(static_cast<std::uint64_t>(rank));  // data_parallel makes them rank 0's
    locus::optim::adamw<cpu> opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.01});
    locus::train::trainer t(model, opt, nn::cross_entropy{});
    locus::dist::data_parallel dp(comm, t, {.bucket_bytes = static_cast<std::size_t>(bucket_kb) * 1024});

    locus::tensor<float, cpu, 2> xb(locus::extents<2>{batch, features});
    locus::tensor<std::int64_t, cpu, 1> yb(locus::extents<1>{batch});
    const index_t steps = n / global;
    auto epoch = [&](std::uint64_t e, index_t limit) {
      const auto order = locus::data::detail::epoch_order(n, true, 0, e);
      for (index_t s = 0; s < limit; ++s) {
        const index_t first = s * global + rank * batch;
        for (index_t b = 0; b < batch; ++b) {
          const index_t row = order[static_cast<std::size_t>(first + b)];
          std::memcpy(xb.data() + b * features, x_all.data_handle() + row * features, sizeof(float) * features);
          yb(b) = y_all(row);
        }
        t.step(xb, yb);
      }
    };
    epoch(1000, 20);  // warm-up: allocator, GEMM plans, MPI connections
    t.report();
    comm.barrier();
    const double sync0 = dp.sync_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    double loss = 0;
    for (int e = 0; e < epochs; ++e) {
      epoch(static_cast<std::uint64_t>(e), steps);
      loss = t.report().loss;
    }
    comm.barrier();
    const double dt = comm.max(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    const double sync = comm.max(dp.sync_seconds() - sync0);
    loss = comm.sum(loss) / world;
    const double sps = static_cast<double>(steps * global * epochs) / dt;
    int threads = 1;
#if defined(_OPENMP)
    threads = omp_get_max_threads();
#endif
    if (comm.is_root())
      std::printf("{\"name\": \"dist_mlp_train\", \"ranks\": %d, \"threads_per_rank\": %d, \"global_batch\": %lld, "
                  "\"bucket_kb\": %lld, \"samples_per_s\": %.1f, \"seconds\": %.4f, \"allreduce_seconds\": %.4f, \"allreduce_share\": %.4f, "
                  "\"final_loss\": %.6f}\n",
                  world, threads, static_cast<long long>(global), bucket_kb, sps, dt, sync, dt > 0 ? sync / dt : 0.0, loss);
    return 0;
  });
}
