// expect: error: .*locus: pending is move-only .it owns an in-flight copy.; write std::move\(p\)
// Rule: one owner per in-flight copy: a pending does not copy-assign either.
#include <locus/transfer/async.hpp>

using pending_t = locus::pending<locus::tensor<float, locus::cuda, 1>>;

void replace(pending_t& q, pending_t& p) {
#ifdef LOCUS_VIOLATION
  q = p;
#else
  q = std::move(p);
#endif
}
