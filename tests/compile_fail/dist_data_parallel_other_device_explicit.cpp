// expect: error: .*locus: data_parallel got a communicator<pinned> for a trainer on cpu; .*make a locus::dist::communicator<locus::cpu> comm\(env\) and pass it
// Rule: the same rule when the trainer type is spelled out (no deduction).
#include <locus/dist.hpp>

using P = locus::amp::fp32;

void f(locus::dist::communicator<locus::cpu>& comm, locus::dist::communicator<locus::cuda>& nccl,
       locus::dist::communicator<locus::pinned>& pinned) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters(), {.lr = 0.1});
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
  (void)comm, (void)nccl, (void)pinned;
#ifdef LOCUS_VIOLATION
  locus::dist::data_parallel<decltype(t)> dp(pinned, t);
#else
  locus::dist::data_parallel<decltype(t)> dp(comm, t);
#endif
}
