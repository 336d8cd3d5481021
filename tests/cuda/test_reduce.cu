// CUDA suite: reductions (CUB), softmax and one_hot on cuda (more in test_reduce_more.cu).
#define LOCUS_TEST_DEVICES locus::cuda
#include "generic/reduce_cases.hpp"
