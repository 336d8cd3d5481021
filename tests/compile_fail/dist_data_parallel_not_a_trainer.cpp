// expect: error: .*locus: data_parallel wraps a locus::train::trainer, and its second argument is not one \(a model or an optimizer\?\); make the trainer first
// Rule: data_parallel's second argument is a trainer, not the model it trains.
#include <locus/dist.hpp>

using P = locus::amp::fp32;

void f(locus::dist::communicator<locus::cpu>& comm, locus::dist::communicator<locus::cuda>& nccl,
       locus::dist::communicator<locus::pinned>& pinned) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters(), {.lr = 0.1});
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
  (void)comm, (void)nccl, (void)pinned;
#ifdef LOCUS_VIOLATION
  locus::dist::data_parallel dp(comm, model);
#else
  locus::dist::data_parallel dp(comm, t);
#endif
}
