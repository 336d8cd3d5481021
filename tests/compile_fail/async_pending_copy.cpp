// expect: error: .*locus: pending is move-only .it owns an in-flight copy.; write std::move\(p\)
// Rule: one owner per in-flight copy: a pending does not copy.
#include <locus/transfer/async.hpp>

using pending_t = locus::pending<locus::tensor<float, locus::cuda, 1>>;

pending_t pass(pending_t& p) {
#ifdef LOCUS_VIOLATION
  pending_t q = p;
#else
  pending_t q = std::move(p);
#endif
  return q;
}
