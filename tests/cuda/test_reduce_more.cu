// CUDA suite: reductions along every path (infinities, arg ties, exact i64 sums, long
// axes, every op along every axis) on cuda; apart from test_reduce.cu so that the two
// halves compile in parallel (test_reduce.cu alone was the slowest file of the build).
#define LOCUS_TEST_DEVICES locus::cuda
#include "generic/reduce_more_cases.hpp"
