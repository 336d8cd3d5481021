// Loader throughput on Fashion-MNIST (train, 60000 images), batch 256, shuffled: the
// data::loader<cpu> (background thread, prefetch 2) against a plain loop that does the
// same work in the consumer thread: the same shuffled order, each image normalised
// (x / 255) into a [256, 784] float batch and its label into an i64 batch. Items are
// batches; the target is >= 0.8x the loop. Set LOCUS_FASHION_MNIST_DIR to another IDX
// directory to use other data.
//
// BM_loader_augment/workers:N: the CNN main job's training loader (the same images
// with its crop+flip augmentation, batch 128) at 1 and 2 workers
// (loader_options::workers), the consumer doing nothing: the case where the transforms
// dominate. Items are samples; the target is >= 1.5x at 2 workers against 1.
#include <algorithm>
#include <benchmark/benchmark.h>

#include <locus/data/loader.hpp>
#include <locus/data/transforms.hpp>
#include <locus/locus.hpp>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

const locus::data::idx_dataset& train() {
  static const locus::data::idx_dataset ds = [] {
    const char* dir = std::getenv("LOCUS_FASHION_MNIST_DIR");
    return locus::data::idx_dataset::from_directory(dir ? dir : "/usr/share/datasets/fashion-mnist", "train");
  }();
  return ds;
}

constexpr locus::index_t batch_size = 256;

void BM_loader_cpu(benchmark::State& st) {
  const auto& ds = train();
  locus::data::loader<locus::cpu> l(ds, {.batch_size = batch_size, .shuffle = true, .seed = 1});
  std::int64_t batches = 0, epoch = 0;
  for (auto _ : st) {
    l.set_epoch(epoch++);
    for (auto& [x, y] : l) {
      benchmark::DoNotOptimize(x.data_handle());
      benchmark::DoNotOptimize(y.data_handle());
      ++batches;
    }
  }
  st.SetItemsProcessed(batches);
}

void BM_plain_loop(benchmark::State& st) {
  const auto& ds = train();
  locus::data::loader<locus::cpu> order_source(ds, {.batch_size = batch_size, .shuffle = true, .seed = 1});
  const locus::index_t n = ds.size(), f = ds.features();
  std::int64_t batches = 0, epoch = 0;
  for (auto _ : st) {
    order_source.set_epoch(epoch++);
    const auto order = order_source.indices();  // the same order the loader uses
    for (locus::index_t b = 0; b < n; b += batch_size) {
      const locus::index_t count = std::min(batch_size, n - b);
      auto x = locus::empty<float, locus::cpu>({count, f});
      auto y = locus::empty<std::int64_t, locus::cpu>({count});
      for (locus::index_t i = 0; i < count; ++i)
        y(i) = ds.load(order[static_cast<std::size_t>(b + i)], x.span().subspan(static_cast<std::size_t>(i * f), static_cast<std::size_t>(f)));
      benchmark::DoNotOptimize(x.data_handle());
      benchmark::DoNotOptimize(y.data_handle());
      ++batches;
    }
  }
  st.SetItemsProcessed(batches);
}

void BM_loader_augment(benchmark::State& st) {
  const auto& ds = train();
  // As examples/fashion_mnist_job.hpp builds it for --model cnn --augment crop+flip.
  locus::data::loader<locus::cpu> l(
      ds, {.batch_size = 128,
           .shuffle = true,
           .seed = 1,
           .workers = static_cast<int>(st.range(0)),
           .transform = locus::data::compose(
               locus::data::random_crop{.channels = 1, .height = 28, .width = 28, .padding = 2},
               locus::data::horizontal_flip{.channels = 1, .height = 28, .width = 28})});
  std::int64_t samples = 0, epoch = 0;
  double waited = 0;
  for (auto _ : st) {
    l.set_epoch(epoch++);
    for (auto& [x, y] : l) {
      benchmark::DoNotOptimize(x.data_handle());
      benchmark::DoNotOptimize(y.data_handle());
      samples += x.shape()[0];
    }
    waited += l.wait_seconds();
  }
  st.SetItemsProcessed(samples);
  st.counters["loader_wait_s_per_epoch"] = waited / static_cast<double>(st.iterations());
}

}  // namespace

BENCHMARK(BM_loader_augment)->ArgName("workers")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_loader_cpu)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_plain_loop)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
