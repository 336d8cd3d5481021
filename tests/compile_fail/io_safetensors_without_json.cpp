// expect: error: .*locus: locus/io/safetensors.hpp needs nlohmann-json, but LOCUS_HAS_JSON is not 1
// Rule: checkpoints need nlohmann-json; without it the header says so (and how to get
// it) instead of failing inside a missing include.
#ifdef LOCUS_VIOLATION
#undef LOCUS_HAS_JSON
#else
#define LOCUS_HAS_JSON 1
#endif
#include <locus/io/safetensors.hpp>
