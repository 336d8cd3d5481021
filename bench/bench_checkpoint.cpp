// What checkpoint integrity costs (issue 28): a 100 MB checkpoint (25 f32 tensors of
// 4 MiB) saved and loaded with io::writer / io::load<cpu>, loaded with verification (the
// file as written, every tensor's CRC32C checked) and without (the same file with its
// checksum keys removed: io::load then verifies nothing), interleaved, and the CRC32C
// pass over the same 100 MB alone (the part of a save that the checksums add). The file
// lives in $TMPDIR (default /tmp): page-cache speed, the cheapest I/O a checksum could
// be compared with. Prints one line per figure: the median of N rounds, in ms, and the
// ratios. Usage: bench_checkpoint [rounds=7] [dir=$TMPDIR]
#include <locus/io/crc32c.hpp>
#include <locus/io/safetensors.hpp>
#include <locus/tensor/factories.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path dir = argc > 2 ? argv[2] : (tmp ? tmp : "/tmp");
  const auto with = dir / "locus-bench-ckpt-crc.safetensors";
  const auto without = dir / "locus-bench-ckpt-nocrc.safetensors";

  std::vector<locus::tensor<float, locus::cpu, 1>> ts;
  for (int i = 0; i < 25; ++i) ts.push_back(locus::randn<float, locus::cpu>({1 << 20}, static_cast<std::uint64_t>(i)));
  locus::io::writer w;
  for (int i = 0; i < 25; ++i) w.add("t" + std::to_string(i), ts[static_cast<std::size_t>(i)]);
  w.save(with);
  {  // the same file without its checksum keys
    std::ifstream f(with, std::ios::binary);
    const std::string raw{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= std::uint64_t{static_cast<unsigned char>(raw[static_cast<std::size_t>(i)])} << (8 * i);
    auto h = nlohmann::ordered_json::parse(raw.substr(8, n));
    h.erase("__metadata__");
    std::string text = h.dump();
    while ((8 + text.size()) % 8 != 0) text.push_back(' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
    std::ofstream o(without, std::ios::binary | std::ios::trunc);
    o << out << text << raw.substr(8 + n);
  }
  const double mb = 25.0 * 4.0;  // MiB
  std::vector<double> save_ms, load_ms, load_nocrc_ms, crc_ms;
  std::vector<unsigned char> bytes(std::size_t{25} << 22);
  for (int i = 0; i < 25; ++i)
    std::memcpy(bytes.data() + (std::size_t(i) << 22), ts[static_cast<std::size_t>(i)].data_handle(), std::size_t{1} << 22);
  std::uint32_t sink = 0;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    w.save(with);
    save_ms.push_back(ms_since(t0));
    t0 = std::chrono::steady_clock::now();
    { const auto a = locus::io::load<locus::cpu>(with); sink += static_cast<std::uint32_t>(a.verified_tensors()); }
    load_ms.push_back(ms_since(t0));
    t0 = std::chrono::steady_clock::now();
    { const auto a = locus::io::load<locus::cpu>(without); sink += static_cast<std::uint32_t>(a.verified_tensors()); }
    load_nocrc_ms.push_back(ms_since(t0));
    t0 = std::chrono::steady_clock::now();
    sink ^= locus::io::crc32c(bytes.data(), bytes.size());
    crc_ms.push_back(ms_since(t0));
  }
  const double s = median(save_ms), l = median(load_ms), ln = median(load_nocrc_ms), c = median(crc_ms);
  std::printf("checkpoint of %.0f MiB (25 f32 tensors), %d rounds, medians; crc32 instruction: %s\n", mb, rounds,
              locus::io::crc32c_uses_hardware() ? "yes" : "no");
  std::printf("  save (checksums included, fsync)      %8.1f ms\n", s);
  std::printf("  CRC32C of the 100 MiB alone           %8.1f ms  (%.1f GB/s; %.1f%% of the save)\n", c,
              mb * 1.048576 / c, 100.0 * c / s);
  std::printf("  load, verified                        %8.1f ms\n", l);
  std::printf("  load, no checksums (unverified)       %8.1f ms\n", ln);
  std::printf("  verification's cost on a load         %+7.1f%%  (verified / unverified = %.3f)\n", 100.0 * (l - ln) / ln,
              l / ln);
  std::printf("(accumulated results, so that nothing is optimised away: %08x)\n", static_cast<unsigned>(sink));
  std::filesystem::remove(with);
  std::filesystem::remove(without);
  return 0;
}
