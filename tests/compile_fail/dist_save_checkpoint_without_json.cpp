// expect: error: .*locus: data_parallel::save_checkpoint writes a safetensors checkpoint, which needs nlohmann-json, but LOCUS_HAS_JSON is not 1: install nlohmann-json3-dev \(Debian\)
// Rule: without nlohmann-json (LOCUS_HAS_JSON unset, as this harness compiles) <locus/dist.hpp>
// compiles and trains (the control twin); only a program that saves needs the library.
#if defined(LOCUS_HAS_JSON)
#error "this test is about builds without nlohmann-json: LOCUS_HAS_JSON must be unset"
#endif
#include <locus/dist.hpp>
#if defined(NLOHMANN_JSON_VERSION_MAJOR)  // so it compiles where the json header is absent
#error "<locus/dist.hpp> included nlohmann-json although LOCUS_HAS_JSON is unset"
#endif

using P = locus::amp::fp32;

void f(locus::dist::communicator<locus::cpu>& comm, locus::dist::communicator<locus::cuda>& nccl,
       locus::dist::communicator<locus::pinned>& pinned) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters(), {.lr = 0.1});
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
  (void)comm, (void)nccl, (void)pinned;
#ifdef LOCUS_VIOLATION
  locus::dist::data_parallel dp(comm, t); dp.save_checkpoint("ckpt.safetensors", 0);
#else
  locus::dist::data_parallel dp(comm, t); (void)dp.syncs();
#endif
}
