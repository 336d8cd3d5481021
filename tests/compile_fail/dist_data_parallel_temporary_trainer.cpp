// expect: error: .*locus: data_parallel's trainer is a temporary, .*name it first: locus::train::trainer t\(model, opt, loss\); locus::dist::data_parallel dp\(comm, t\)
// Rule: data_parallel keeps its trainer by address (and installs its gradient sync into it):
// a temporary trainer would dangle.
#include <locus/dist.hpp>

using P = locus::amp::fp32;

void f(locus::dist::communicator<locus::cpu>& comm, locus::dist::communicator<locus::cuda>& nccl,
       locus::dist::communicator<locus::pinned>& pinned) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters(), {.lr = 0.1});
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
  (void)comm, (void)nccl, (void)pinned;
#ifdef LOCUS_VIOLATION
  locus::dist::data_parallel dp(comm, locus::train::trainer(model, opt, locus::nn::cross_entropy{}));
#else
  locus::dist::data_parallel dp(comm, t);
#endif
}
