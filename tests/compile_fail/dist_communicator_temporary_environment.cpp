// expect: error: .*locus: communicator got a temporary environment, .*name it first: locus::dist::environment env\(argc, argv\); locus::dist::communicator<D> comm\(env\);
// Rule: a communicator keeps its environment (MPI's lifetime, the watchdog) by address.
#include <locus/dist/communicator.hpp>

void f() {
#ifdef LOCUS_VIOLATION
  locus::dist::communicator<locus::cpu> comm(locus::dist::environment{});
#else
  locus::dist::environment env;
  locus::dist::communicator<locus::cpu> comm(env);
#endif
}
