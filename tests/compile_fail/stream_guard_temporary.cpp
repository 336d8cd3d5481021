// expect: error: ignoring .*locus: a stream_guard acts for its scope
// flags: -Werror=unused-result -Werror=unused-value
// Rule: a guard that is itself a temporary ends at the ';' and makes nothing current
// for the lines after it (a [[nodiscard]] warning: an error under -Werror).
#include <locus/locus.hpp>

void f(const locus::stream& s) {
#ifdef LOCUS_VIOLATION
  locus::stream_guard{s};
#else
  locus::stream_guard g{s};
#endif
}
