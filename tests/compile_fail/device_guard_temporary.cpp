// expect: error: ignoring .*locus: a device_guard acts for its scope
// flags: -Werror=unused-result -Werror=unused-value
// Rule: a guard that is itself a temporary ends at the ';' and guards nothing (a
// [[nodiscard]] warning: an error under -Werror).
#include <locus/locus.hpp>

void f() {
#ifdef LOCUS_VIOLATION
  locus::device_guard{0};
#else
  locus::device_guard g{0};
#endif
}
