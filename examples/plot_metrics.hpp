// Both main jobs' --plot: runs scripts/plot-metrics LOG PNG, which renders the --log CSV
// (per epoch for the Fashion-MNIST job, per evaluation step for the GPT job) with
// matplotlib, outside the library. LOCUS_PLOT_SCRIPT in the environment overrides the
// path CMake compiles in (examples/CMakeLists.txt); without either, plot-metrics on PATH.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace locus_examples {

/// Runs the plot script on `log`, writing `png`; false, with a message that starts with
/// `program` (the job's name), when it cannot be run or fails.
inline bool plot_metrics(const char* program, const std::string& log, const std::string& png) {
  const char* env = std::getenv("LOCUS_PLOT_SCRIPT");
#ifdef LOCUS_PLOT_SCRIPT
  const std::string script = env ? env : LOCUS_PLOT_SCRIPT;
#else
  const std::string script = env ? env : "plot-metrics";
#endif
  std::vector<std::string> args{script, log, png};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int status = 0;
  if (const int e = ::posix_spawnp(&pid, script.c_str(), nullptr, nullptr, argv.data(), environ); e != 0) {
    std::fprintf(stderr, "%s: --plot: cannot run %s: %s\n", program, script.c_str(), std::strerror(e));
    return false;
  }
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      std::fprintf(stderr, "%s: --plot: waiting for %s: %s\n", program, script.c_str(), std::strerror(errno));
      return false;
    }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "%s: --plot: %s %s %s failed (status %d)\n", program, script.c_str(), log.c_str(),
                 png.c_str(), WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return false;
  }
  return true;
}

}  // namespace locus_examples
