// libFuzzer target for the IDX reader (include/locus/data/idx.hpp).
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -DLOCUS_ENABLE_CUDA=0 \
//           -Iinclude tests/fuzz/fuzz_idx.cpp -lz -o fuzz_idx
//   ./fuzz_idx -max_total_time=60 -rss_limit_mb=2048 corpus/
//
// Each input is parsed from memory (read_idx_from_memory, the parser read_idx uses)
// as the element type and rank its header names, and as one that does not match; and
// through a file (an in-memory memfd, so zlib's gzip and plain paths and the file
// size bound run too; gzip inputs as u8 rank 3 and rank 1, the MNIST kinds). The only acceptable failure is locus::io_error; anything else
// escaping (another exception, a crash, a sanitizer report) is a finding. On success
// the tensor must have exactly the shape of the header and, from memory, exactly the
// bytes after it.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include <locus/data/idx.hpp>

namespace {

std::uint32_t be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

template <class T, std::size_t R>
void check_memory(const std::uint8_t* data, std::size_t size) {
  try {
    auto t = locus::data::read_idx_from_memory<T, R>(std::as_bytes(std::span(data, size)), "fuzz");
    // Success: the header matched and the data filled the buffer exactly.
    if (size < 4 + 4 * R) std::abort();
    for (std::size_t a = 0; a < R; ++a)
      if (static_cast<std::uint64_t>(t.shape()[a]) != be32(data + 4 + 4 * a)) std::abort();
    if (t.size_bytes() != size - 4 - 4 * R) std::abort();
    if constexpr (sizeof(T) == 1)
      if (t.size_bytes() && std::memcmp(t.data_handle(), data + 4 + 4 * R, t.size_bytes()) != 0) std::abort();
  } catch (const locus::io_error&) {
  }
}

template <class T, std::size_t R>
void check_file(const std::string& path) {
  try {
    auto t = locus::data::read_idx<T, R>(path);
    (void)t;
  } catch (const locus::io_error&) {
  }
}

/// Calls f.template operator()<T, R>() for the element type and rank in the header
/// (rank 1 to 4), or for u8 rank 1 when the header names neither.
template <class F>
void dispatch(const std::uint8_t* data, std::size_t size, F&& f) {
  const unsigned code = size > 2 ? data[2] : 0, rank = size > 3 ? data[3] : 0;
  auto by_rank = [&]<class T>() {
    switch (rank) {
      case 2: f.template operator()<T, 2>(); break;
      case 3: f.template operator()<T, 3>(); break;
      case 4: f.template operator()<T, 4>(); break;
      default: f.template operator()<T, 1>(); break;
    }
  };
  switch (code) {
    case 0x0C: by_rank.template operator()<std::int32_t>(); break;
    case 0x0D: by_rank.template operator()<float>(); break;
    case 0x0E: by_rank.template operator()<double>(); break;
    default: by_rank.template operator()<std::uint8_t>(); break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // From memory: the header's own type and rank, then a mismatching pair.
  dispatch(data, size, [&]<class T, std::size_t R>() { check_memory<T, R>(data, size); });
  check_memory<double, 3>(data, size);
  check_memory<std::uint8_t, 0>(data, size);

  // Through zlib and a file descriptor (gzip or plain).
  static const int fd = memfd_create("fuzz_idx", 0);
  if (fd < 0) return 0;
  if (ftruncate(fd, 0) != 0) return 0;
  if (size && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
    // gzip: the header is compressed; try the MNIST kinds (images, labels).
    check_file<std::uint8_t, 3>(path);
    check_file<std::uint8_t, 1>(path);
  } else {
    dispatch(data, size, [&]<class T, std::size_t R>() { check_file<T, R>(path); });
  }
  return 0;
}
