// Host suite: reductions, softmax and one_hot on cpu and pinned.
#define LOCUS_TEST_DEVICES locus::cpu, locus::pinned
#include "generic/reduce_cases.hpp"
