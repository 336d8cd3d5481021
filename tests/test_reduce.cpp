// Host suite: reductions, softmax and one_hot on cpu and pinned.
#include "host_devices.hpp"
#include "generic/reduce_cases.hpp"
#include "generic/reduce_more_cases.hpp"
