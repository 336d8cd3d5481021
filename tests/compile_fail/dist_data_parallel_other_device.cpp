// expect: error: .*locus: data_parallel got a communicator<cuda> \(NCCL\) for a trainer on cpu; .*make a locus::dist::communicator<locus::cpu> comm\(env\) and pass it
// Rule: data_parallel reduces the trainer's gradients with its communicator, so both are of one
// device; with class template argument deduction (the usual spelling) a mismatch used to be
// "class template argument deduction failed".
#include <locus/dist.hpp>

using P = locus::amp::fp32;

void f(locus::dist::communicator<locus::cpu>& comm, locus::dist::communicator<locus::cuda>& nccl,
       locus::dist::communicator<locus::pinned>& pinned) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters(), {.lr = 0.1});
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
  (void)comm, (void)nccl, (void)pinned;
#ifdef LOCUS_VIOLATION
  locus::dist::data_parallel dp(nccl, t);
#else
  locus::dist::data_parallel dp(comm, t);
#endif
}
