// Holes a hostile review found in the API's edges (issue 28): format widths that wrapped
// around size_t in <locus/fmt.hpp>, and collectives on rank-0 (scalar) tensors in
// <locus/dist/communicator.hpp>. The compile-time halves (guards of temporaries,
// data_parallel's arguments, save_checkpoint without nlohmann-json, a format spec in a
// literal) are in tests/compile_fail/; the 2-rank runs of the scalar collectives in
// tests/dist/test_dist.cpp.
//
// The host suite links no MPI, so <locus/dist/communicator.hpp> compiles here as a world
// of one (LOCUS_HAS_MPI unset): the same argument checks, shape rules and code paths up
// to the MPI call.
#include <doctest/doctest.h>

#include <locus/dist/communicator.hpp>
#include <locus/locus.hpp>

#include <cstdint>
#include <limits>
#include <string>

#if defined(LOCUS_TEST_HAS_FMT) && LOCUS_TEST_HAS_FMT
#include <locus/fmt.hpp>

#include <iterator>
#include <sstream>

namespace {

std::string text_of(const locus::tensor<float, locus::cpu, 1>& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

/// Formats into a buffer that starts empty; the format_error's message, or "" when it
/// formatted. The buffer must still be empty after a refusal: nothing half-written.
template <class... A>
std::string refusal(fmt::string_view spec, const A&... a) {
  fmt::memory_buffer buf;
  try {
    fmt::format_to(std::back_inserter(buf), fmt::runtime(spec), a...);
  } catch (const fmt::format_error& e) {
    CHECK(buf.size() == 0);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("hostile fmt: width digits past INT_MAX are refused as {fmt} refuses them, never wrapped") {
  auto t = locus::arange<float, locus::cpu>(0, 3);
  const std::string plain = text_of(t);
  // {fmt}'s own verdict on the same specs for a string, the reference for ours
  CHECK_THROWS_AS((void)fmt::format(fmt::runtime("{:>18446744073709551716}"), "s"), fmt::format_error);
  CHECK_THROWS_AS((void)fmt::format(fmt::runtime("{:>2147483648}"), "s"), fmt::format_error);

  // 2^64 + 100 used to become a width of 100; INT_MAX + 1 and 10^30 a width nobody can hold
  for (const char* spec : {"{:>18446744073709551716}", "{:18446744073709551716}", "{:*<2147483648}", "{:2147483648}",
                           "{:>1000000000000000000000000000000}", "{:^4294967396}"}) {
    CAPTURE(spec);
    const std::string why = refusal(spec, t);
    CHECK(why.find("locus: a tensor's format width is larger than 2147483647 (INT_MAX)") != std::string::npos);
    CHECK(why.find("{:>100}") != std::string::npos);  // the fix
    CHECK_THROWS_AS((void)fmt::format(fmt::runtime(spec), t.view()), fmt::format_error);  // views too
  }
  // a width that fits: the text padded to exactly that width
  const std::string w300 = fmt::format(fmt::runtime("{:>300}"), t);
  CHECK(w300.size() == 300);
  CHECK(w300 == std::string(300 - plain.size(), ' ') + plain);
  CHECK(fmt::format("{:*^301}", t.view()).size() == 301);
  // 0 as a fill is fine
  CHECK(fmt::format("{:0>{}}", t, plain.size() + 2) == "00" + plain);
  // a leading 0 is {fmt}'s zero flag, which it refuses for text; the fix is the fill
  CHECK(refusal("{:05}", t).find("give 0 as the fill instead: {:0>100}") != std::string::npos);
  CHECK(refusal("{:>0}", t).find("does not start with 0") != std::string::npos);
  // '{' as a fill is refused by {fmt} too; other single code points are fills
  CHECK(refusal("{:{<50}", t).find("'{' cannot be a fill character") != std::string::npos);
  CHECK(fmt::format(fmt::runtime("{:\u00b7>{}}"), t, plain.size() + 3) == "\u00b7\u00b7\u00b7" + plain);
}

TEST_CASE("hostile fmt: a width from an argument is checked as {fmt} checks it for a string") {
  auto t = locus::arange<float, locus::cpu>(0, 3);
  const std::string plain = text_of(t);
  // accepted: every integer type {fmt} passes, within [0, INT_MAX]
  CHECK(fmt::format("{:>{}}", t, 120) == std::string(120 - plain.size(), ' ') + plain);
  CHECK(fmt::format("{:>{}}", t, static_cast<unsigned char>(120)).size() == 120);
  CHECK(fmt::format("{:>{}}", t, std::int64_t{120}).size() == 120);
  CHECK(fmt::format("{:>{}}", t, std::uint64_t{120}).size() == 120);
  CHECK(fmt::format("{:>{}}", t, 0) == plain);
  CHECK(fmt::format("{0:>{1}}|{0}", t, 120).size() == 120 + 1 + plain.size());
  CHECK(fmt::format("{:>{w}}", t, fmt::arg("w", 120)).size() == 120);

  // {fmt}'s verdicts for a string, then ours for a tensor
  CHECK_THROWS_AS((void)fmt::format(fmt::runtime("{:>{}}"), "s", -1), fmt::format_error);
  CHECK_THROWS_AS((void)fmt::format(fmt::runtime("{:>{}}"), "s", std::uint64_t{1} << 31), fmt::format_error);
  CHECK(refusal("{:>{}}", t, -1).find("is negative") != std::string::npos);
  CHECK(refusal("{:>{}}", t, std::numeric_limits<std::int64_t>::min()).find("is negative") != std::string::npos);
  // 2^32 + 100 and 2^64 - 1 must not become 100 and -1 (or SIZE_MAX)
  for (const std::uint64_t w : {std::uint64_t{1} << 31, (std::uint64_t{1} << 32) + 100,
                                std::numeric_limits<std::uint64_t>::max()}) {
    CAPTURE(w);
    CHECK(refusal("{:>{}}", t, w).find("larger than 2147483647 (INT_MAX)") != std::string::npos);
  }
  CHECK(refusal("{:>{}}", t, std::int64_t{1} << 40).find("larger than 2147483647") != std::string::npos);
  CHECK(refusal("{:>{}}", t, 12.0).find("not an integer") != std::string::npos);
  CHECK(refusal("{:>{}}", t, "12").find("not an integer") != std::string::npos);
  CHECK(refusal("{:>{}}", t, true).find("not an integer") != std::string::npos);
  CHECK(refusal("{:>{}}", t, 'x').find("not an integer") != std::string::npos);
  // an argument that is not there: by position, by a huge index, by name
  CHECK(refusal("{:>{}}", t).find("not passed") != std::string::npos);
  CHECK(refusal("{0:>{5}}", t, 3).find("not passed") != std::string::npos);
  CHECK(refusal("{0:>{99999999999999999999}}", t, 3).find("not passed") != std::string::npos);  // read as INT_MAX
  CHECK(!refusal("{:>{1}}", t, 3).empty());  // {fmt}: automatic and manual indexing do not mix
  CHECK(refusal("{:>{w}}", t, fmt::arg("v", 3)).find("not passed") != std::string::npos);
  // malformed: unclosed, or more after the width
  CHECK(refusal("{:>{}", t, 3).find("no closing '}'") != std::string::npos);
  CHECK(refusal("{:>{", t, 3).find("{:{}}") != std::string::npos);
  CHECK(refusal("{:>12", t).find("no closing '}'") != std::string::npos);
  CHECK(refusal("{:>{-1}}", t, 3).find("{:{}}") != std::string::npos);
  CHECK(refusal("{:>{}x}", t, 3).find("[[fill]align][width]") != std::string::npos);
  CHECK(refusal("{:>{}.3}", t, 3).find("[[fill]align][width]") != std::string::npos);
}

#endif  // LOCUS_TEST_HAS_FMT

TEST_CASE("hostile dist: collectives on rank-0 (scalar) tensors work in a world of one") {
  locus::dist::environment env;
  locus::dist::communicator<locus::cpu> comm(env);
  REQUIRE(comm.world_size() == 1);
  auto s = locus::full<float, locus::cpu>(locus::extents<0>{}, 2.5f);
  comm.all_reduce(s);
  comm.all_reduce(s, locus::dist::reduce_op::average);
  comm.broadcast(s, 0);
  auto v = s.view();
  comm.all_reduce(v);
  comm.all_reduce_start(s);
  comm.all_reduce_start(v, locus::dist::reduce_op::average);
  comm.wait();
  CHECK(s.item() == 2.5f);

  // a scalar gathers into a 1-D tensor of world_size elements
  auto out = locus::zeros<float, locus::cpu>({1});
  comm.all_gather(s, out);
  CHECK(out(0) == 2.5f);
  comm.all_gather(std::as_const(s).view(), out.view());
  CHECK(out(0) == 2.5f);
  auto i = locus::full<std::int64_t, locus::cpu>(locus::extents<0>{}, std::int64_t{-7});
  auto iout = locus::zeros<std::int64_t, locus::cpu>({1});
  comm.all_gather(i, iout);
  CHECK(iout(0) == -7);

  // an output of the wrong size is a shape_error naming the scalar's shape; nothing written
  auto two = locus::full<float, locus::cpu>({2}, -1.0f);
  try {
    comm.all_gather(s, two);
    FAIL("all_gather of a scalar into [2] over one rank did not throw");
  } catch (const locus::shape_error& e) {
    CHECK(std::string(e.what()) == "locus: all_gather of [] over 1 ranks needs an output of [1], got [2]");
  }
  CHECK(two(0) == -1.0f);
  CHECK(two(1) == -1.0f);
}

TEST_CASE("hostile dist: all_reduce_start takes a tensor or view of any rank, and a strided one is a value_error") {
  locus::dist::environment env;
  locus::dist::communicator<locus::cpu> comm(env);
  auto m = locus::full<float, locus::cpu>({2, 3}, 1.5f);
  comm.all_reduce_start(m);
  comm.all_reduce_start(m.view());
  comm.wait();
  CHECK(m(1, 2) == 1.5f);
  // every other column: MPI could not reduce it in place; refused on any world size
  auto cols = locus::unsafe_view<locus::cpu>(m.data(), locus::extents<2>{2, 2}, locus::extents<2>{3, 2});
  CHECK_THROWS_AS(comm.all_reduce_start(cols), locus::value_error);
  auto empty = locus::zeros<float, locus::cpu>({0, 3});
  comm.all_reduce_start(empty);  // nothing to reduce, nothing refused
  comm.wait();
}
