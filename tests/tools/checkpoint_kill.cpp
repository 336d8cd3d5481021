// Checkpoints against kills and full disks (docs/reliability.md).
//
//   checkpoint_kill kill ROUNDS DIR [SEED]   a child trains and writes DIR/last.safetensors
//                                            after every step, resuming from it; it is
//                                            killed with SIGKILL at a random moment, ROUNDS
//                                            times; after each kill the newest checkpoint
//                                            must load, equal byte for byte the checkpoint
//                                            of a run that trained as many steps without
//                                            stopping, and train on
//   checkpoint_kill fulldisk DIR             DIR is a small file system (a 5 MiB tmpfs): the
//                                            second checkpoint does not fit; the save must
//                                            throw io_error, leave the first intact and no
//                                            temporary file behind
//   checkpoint_kill write DIR                the child's loop (never returns)
//
// Exit status 0 when every check held, 1 otherwise (the reason on stderr).
#include <locus/train.hpp>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

namespace nn = locus::nn;
namespace fs = std::filesystem;
using D = locus::cpu;
using P = locus::amp::fp32;

// 512 x 512 + 512 weights: with AdamW's two moments a checkpoint is about 3.2 MB, so a
// save takes long enough for kills to land inside it.
struct bundle {
  nn::sequential<nn::linear<D, P>> m{nn::linear<D, P>(512, 512)};
  locus::optim::adamw<D> opt{m.parameters(), {.lr = 1e-3}};
  std::unique_ptr<locus::train::trainer<decltype(m), locus::optim::adamw<D>, nn::mse>> t;
  bundle() {
    m.reset_parameters(11);
    t = std::make_unique<locus::train::trainer<decltype(m), locus::optim::adamw<D>, nn::mse>>(m, opt, nn::mse{});
  }
  /// Step n's batch: a function of n only, so any run reaches the same state after n steps.
  void step(std::int64_t n) {
    const auto x = locus::randn<float, D>({8, 512}, 1000 + static_cast<std::uint64_t>(n));
    const auto y = locus::randn<float, D>({8, 512}, 900000 + static_cast<std::uint64_t>(n));
    t->step(x, y);
  }
};

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

int fail(const std::string& why) {
  std::fprintf(stderr, "checkpoint_kill: FAILED: %s\n", why.c_str());
  return 1;
}

[[noreturn]] void write_loop(const fs::path& dir) {
  bundle b;
  const fs::path last = dir / "last.safetensors";
  std::int64_t n = fs::exists(last) ? locus::train::resume(last, *b.t) : 0;
  for (;;) {
    b.step(n);
    ++n;
    locus::train::save_checkpoint(last, *b.t, n);
  }
}

std::size_t temporaries(const fs::path& dir) {
  std::size_t k = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("last.safetensors.tmp.", 0) == 0) ++k;
  return k;
}

int kill_rounds(int rounds, const fs::path& dir, std::uint64_t seed) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> delay_us(0, 300000);
  bundle ref;  // advanced to each checkpoint's step count (which never falls)
  std::int64_t ref_steps = 0, last_steps = -1;
  int mid_write = 0, no_file = 0, checked = 0, stale_seen = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < rounds; ++r) {
    std::string self = fs::read_symlink("/proc/self/exe").string();
    std::string mode = "write", d = dir.string();
    char* argv[] = {self.data(), mode.data(), d.data(), nullptr};
    pid_t pid = 0;
    if (const int e = ::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, environ); e != 0)
      return fail(std::string("posix_spawn: ") + std::strerror(e));
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFSIGNALED(status)) return fail("round " + std::to_string(r) + ": the writer exited by itself (status " +
                                          std::to_string(status) + ") instead of being killed");
    const std::size_t stale = temporaries(dir);
    if (stale > 0) ++mid_write;  // killed inside a save: its temporary file is left
    if (stale > 1) ++stale_seen;  // an earlier kill's temporary was not cleaned up
    const fs::path last = dir / "last.safetensors";
    if (!fs::exists(last)) {
      ++no_file;
      if (last_steps >= 0) return fail("round " + std::to_string(r) + ": the checkpoint disappeared");
      continue;
    }
    // The newest checkpoint loads, and holds exactly the state after its step count.
    bundle c;
    std::int64_t n = 0;
    try {
      n = locus::train::resume(last, *c.t);
    } catch (const std::exception& e) {
      return fail("round " + std::to_string(r) + ": the newest checkpoint does not load: " + e.what());
    }
    if (n < last_steps) return fail("round " + std::to_string(r) + ": the checkpoint went back from step " +
                                    std::to_string(last_steps) + " to " + std::to_string(n));
    while (ref_steps < n) ref.step(ref_steps++);
    const fs::path ref_file = dir.parent_path() / (dir.filename().string() + "-reference.safetensors");
    locus::train::save_checkpoint(ref_file, *ref.t, n);
    if (bytes_of(last) != bytes_of(ref_file))
      return fail("round " + std::to_string(r) + ": the checkpoint of step " + std::to_string(n) +
                  " differs from an uninterrupted run's");
    c.step(n);  // and training goes on from it
    last_steps = n;
    ++checked;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (temporaries(dir) > 1) return fail("temporary files of killed writers accumulate");
  std::printf(
      "checkpoint_kill: %d kills in %.1f s: %d newest checkpoints loaded and matched an uninterrupted run (last at "
      "step %lld), %d kills before the first checkpoint, %d kills inside a save (a temporary file left, removed by "
      "the next save), %d rounds with an older temporary still present\n",
      rounds, s, checked, static_cast<long long>(last_steps), no_file, mid_write, stale_seen);
  if (stale_seen > 0) return fail("a killed writer's temporary file survived the next save");
  if (checked == 0) return fail("no kill came after a checkpoint: the delays are too short");
  return 0;
}

int full_disk(const fs::path& dir) {
  bundle b;
  const fs::path last = dir / "last.safetensors";
  b.step(0);
  try {
    locus::train::save_checkpoint(last, *b.t, 1);
  } catch (const std::exception& e) {
    return fail(std::string("the first checkpoint should fit: ") + e.what());
  }
  const std::string first = bytes_of(last);
  b.step(1);
  try {
    locus::train::save_checkpoint(last, *b.t, 2);
    return fail("a second checkpoint of " + std::to_string(first.size()) + " bytes fitted beside the first: the file "
                "system is too large for this test");
  } catch (const locus::io_error& e) {
    std::printf("checkpoint_kill: the full disk's save failed as expected: %s\n", e.what());
  }
  if (bytes_of(last) != first) return fail("the previous checkpoint changed");
  if (temporaries(dir) != 0) return fail("the failed save left its temporary file");
  bundle c;
  if (locus::train::resume(last, *c.t) != 1) return fail("the previous checkpoint does not resume at epoch 1");
  // with the space back (the old file removed), the save goes through
  fs::remove(last);
  locus::train::save_checkpoint(last, *b.t, 2);
  bundle d;
  if (locus::train::resume(last, *d.t) != 2) return fail("the save after freeing space did not land");
  std::printf("checkpoint_kill: full disk: io_error, previous checkpoint intact, no temporary left, resumable\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "write" && argc == 3) write_loop(argv[2]);
    if (mode == "kill" && (argc == 4 || argc == 5))
      return kill_rounds(std::atoi(argv[2]), argv[3], argc == 5 ? std::strtoull(argv[4], nullptr, 10) : 1);
    if (mode == "fulldisk" && argc == 3) return full_disk(argv[2]);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  std::fprintf(stderr, "usage: checkpoint_kill kill ROUNDS DIR [SEED] | fulldisk DIR | write DIR\n");
  return 2;
}
