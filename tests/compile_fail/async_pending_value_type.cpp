// expect: error: .*locus: pending<V, S> holds the tensor an asynchronous copy writes, but V is not a locus::tensor
// Rule: a pending copy's value is the tensor it owns (to_async's new one, or the
// destination moved into copy_async); a view owns nothing.
#include <locus/transfer/async.hpp>

#ifdef LOCUS_VIOLATION
using value = locus::tensor_view<float, locus::cuda, 1>;
#else
using value = locus::tensor<float, locus::cuda, 1>;
#endif

std::size_t size() { return sizeof(locus::pending<value>); }
