// expect: error: .*locus: pending<V> holds a tensor or a tensor_view, but V is another type
// Rule: a pending copy's value is a tensor (to_async) or a view of the destination
// (copy_async).
#include <locus/transfer/async.hpp>

#ifdef LOCUS_VIOLATION
using value = float;
#else
using value = locus::tensor<float, locus::cuda, 1>;
#endif

std::size_t size() { return sizeof(locus::pending<value>); }
