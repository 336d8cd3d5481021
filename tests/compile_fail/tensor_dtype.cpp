// expect: error: .*locus: tensor element type must be one of f32, f64, i32, i64, u8, bool, f16, bf16
// Rule: a tensor holds one of locus's dtypes; other element types have no kernels,
// no casts and no file formats.
#include <cstdint>

#include <locus/tensor/tensor.hpp>

#ifdef LOCUS_VIOLATION
using element = std::int16_t;
#else
using element = std::int32_t;
#endif
locus::tensor<element, locus::cpu, 1> t;
