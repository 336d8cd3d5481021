// CUDA suite: the device-generic training bodies on cuda (gradients against finite
// differences, accumulation, the grad scaler, optimizers, initialisation), compiled by
// nvcc; skipped with the reason where there is no GPU.
#define LOCUS_TEST_DEVICES locus::cuda
#include "generic/train_cases.hpp"
