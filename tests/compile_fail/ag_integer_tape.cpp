// expect: error: .*locus: a tape differentiates f32, f64, bf16 or f16 values
// Rule: integer and bool values have no gradient.
#include <locus/ag/tape.hpp>

#ifdef LOCUS_VIOLATION
locus::ag::tape<int, locus::cpu> t;
#else
locus::ag::tape<float, locus::cpu> t;
#endif
