// expect: error: .*locus: data_parallel's trainer is const, and data_parallel installs its gradient sync into it and trains it; pass a mutable trainer
// Rule: data_parallel changes its trainer (the gradient sync, every step): not through const.
#include <locus/dist.hpp>

using P = locus::amp::fp32;

void f(locus::dist::communicator<locus::cpu>& comm, locus::dist::communicator<locus::cuda>& nccl,
       locus::dist::communicator<locus::pinned>& pinned) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters(), {.lr = 0.1});
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
  (void)comm, (void)nccl, (void)pinned;
#ifdef LOCUS_VIOLATION
  locus::dist::data_parallel dp(comm, std::as_const(t));
#else
  locus::dist::data_parallel dp(comm, t);
#endif
}
