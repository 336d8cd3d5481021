// expect: error: .*locus: IDX files hold u8, i8, i16, i32, f32 or f64 elements, and locus reads u8, i32, f32 and f64
// Rule: read_idx<T, R> reads the element types IDX defines (and locus supports); i64,
// bool, f16 and bf16 have no IDX type code.
#include <locus/data/idx.hpp>

#ifdef LOCUS_VIOLATION
using element = std::int64_t;
#else
using element = std::uint8_t;
#endif

locus::tensor<element, locus::cpu, 1> labels() {
  return locus::data::read_idx<element, 1>("train-labels-idx1-ubyte.gz");
}
