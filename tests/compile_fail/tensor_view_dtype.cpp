// expect: error: .*locus: tensor_view element type must be one of f32, f64, i32, i64, u8, bool, f16, bf16
// Rule: a view holds one of locus's dtypes (optionally const).
#include <cstdint>

#include <locus/tensor/tensor.hpp>

#ifdef LOCUS_VIOLATION
using element = const std::uint16_t;
#else
using element = const std::uint8_t;
#endif
locus::tensor_view<element, locus::cpu, 1> v;
