// The exception hierarchy. Every failure locus reports at run time is a
// `locus::error`, so a caller can catch one type; the derived types carry the
// numbers a user needs to act (both shapes, the bytes asked for and held, the
// failing CUDA call and where it was made).
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

namespace locus {

/// Base of every exception thrown by locus.
class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
};

/// Extents that do not fit together: bad factory shapes, copies between tensors of
/// different shapes, reshapes that change the element count. Prevents the silent
/// broadcasting or truncation a raw buffer copy would do.
class shape_error : public error {
 public:
  using error::error;
};

/// An element index outside its extent (only checked with LOCUS_CHECK_BOUNDS).
class index_error : public error {
 public:
  using error::error;
};

/// A file that cannot be read or written as expected (missing, truncated, corrupt).
class io_error : public error {
 public:
  using error::error;
};

/// A value the operation cannot represent or define: an integer scalar outside its
/// tensor's dtype, integer division by zero, an integer to a negative scalar power,
/// an integer arange or fill that is not a whole number in range. (PyTorch raises a
/// RuntimeError for each; locus raises this, a locus::error.)
class value_error : public error {
 public:
  using error::error;
};

/// Operands on two GPUs, or on another GPU than the one the work would launch on, or a
/// GPU index that does not exist. Raised before anything is launched or changed.
/// first_gpu() and second_gpu() are the two GPUs found (-1 where there is no second).
class device_error : public error {
 public:
  device_error(const std::string& what, int first, int second) : error(what), first_(first), second_(second) {}
  explicit device_error(const std::string& what) : error(what) {}
  [[nodiscard]] int first_gpu() const noexcept { return first_; }
  [[nodiscard]] int second_gpu() const noexcept { return second_; }

 private:
  int first_ = -1;
  int second_ = -1;
};

/// A failed allocation, with the numbers behind it. Replaces an untyped
/// "CUDA out of memory" string: the caller can read how much was asked for and how
/// much the allocator held, and decide (smaller batch, accumulate gradients).
class out_of_memory : public error {
 public:
  out_of_memory(std::string_view device, std::size_t requested, std::size_t allocated,
                std::size_t reserved, std::size_t limit, std::string_view cause)
      : error(make_message(device, requested, allocated, reserved, limit, cause)),
        device_(device),
        requested_(requested),
        allocated_(allocated),
        reserved_(reserved),
        limit_(limit) {}

  [[nodiscard]] const std::string& device() const& noexcept { return device_; }
  [[nodiscard]] std::string device() const&& { return device_; }  // of a temporary: a copy
  [[nodiscard]] std::size_t requested_bytes() const noexcept { return requested_; }
  [[nodiscard]] std::size_t allocated_bytes() const noexcept { return allocated_; }
  [[nodiscard]] std::size_t reserved_bytes() const noexcept { return reserved_; }
  [[nodiscard]] std::size_t limit_bytes() const noexcept { return limit_; }

  static std::string format_bytes(std::size_t b) {
    char buf[32];
    bytes_text(buf, b);
    return buf;
  }

 private:
  static void bytes_text(char (&out)[32], std::size_t b) noexcept {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(b);
    int u = 0;
    while (v >= 1024.0 && u < 4) {
      v /= 1024.0;
      ++u;
    }
    if (u == 0)
      std::snprintf(out, sizeof out, "%zu B", b);
    else
      std::snprintf(out, sizeof out, "%.2f %s", v, units[u]);
  }
  // One snprintf, not operator+ chains: this is compiled in every file that allocates.
  [[gnu::cold, gnu::noinline]] static std::string make_message(std::string_view device, std::size_t requested,
                                                              std::size_t allocated, std::size_t reserved,
                                                              std::size_t limit, std::string_view cause) {
    char req[32], alloc[32], res[32], lim[32] = "";
    bytes_text(req, requested);
    bytes_text(alloc, allocated);
    bytes_text(res, reserved);
    if (limit != static_cast<std::size_t>(-1)) bytes_text(lim, limit);
    // An injected fault is no shortage: advice on memory would send the reader the wrong way.
    const bool injected = cause == "injected fault";
    char buf[640];
    std::snprintf(buf, sizeof buf,
                  "locus: out of memory on %.*s: tried to allocate %s; %s allocated by tensors, %s reserved by "
                  "the allocator%s%s%s%.*s%s. %s%s",
                  static_cast<int>(device.size()), device.data(), req, alloc, res, lim[0] ? ", limit " : "", lim,
                  cause.empty() ? "" : " (", static_cast<int>(cause.size()), cause.data(), cause.empty() ? "" : ")",
                  injected ? "This failure was injected by locus::fault::fail_allocation, a test hook; memory was "
                             "not short"
                           : "Try a smaller batch size, gradient accumulation over several micro-batches, bf16/f16 "
                             "compute, or free tensors you no longer need",
                  cause == "memory limit" ? " (or raise the limit: locus::set_memory_limit<D>(bytes))." : ".");
    return buf;
  }

  std::string device_;
  std::size_t requested_, allocated_, reserved_, limit_;
};

/// A failed CUDA runtime (or cuBLAS, NCCL) call: the call as written, where it was
/// made, the numeric code and the library's own text.
class cuda_error : public error {
 public:
  cuda_error(std::string_view call, std::string_view file, int line, int code,
             std::string_view text)
      : error(make_message(call, file, line, code, text)), code_(code) {}
  /// A failure found before any call (locus::preflight): the whole message, and the
  /// code the CUDA call that would have failed returns (cudaErrorNoKernelImageForDevice,
  /// cudaErrorInsufficientDriver, cudaErrorNotSupported).
  cuda_error(const std::string& what, int code) : error(what), code_(code) {}
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  static std::string make_message(std::string_view call, std::string_view file, int line,
                                  int code, std::string_view text) {
    std::string m = "locus: CUDA call failed: ";
    m += call;
    m += " at ";
    m += file;
    // snprintf rather than operator+ chains: g++ 12 reports a false -Wrestrict on those.
    char nums[64];
    std::snprintf(nums, sizeof nums, ":%d: error %d: ", line, code);
    m += nums;
    m += text;
    return m;
  }
  int code_;
};

namespace detail {

/// printf-style message text. locus builds its messages with one vsnprintf rather
/// than chains of std::string operator+: those chains are compiled again, inline, in
/// every file that includes locus (see bench/compile-time), and this is one function.
[[gnu::format(printf, 1, 0)]] inline std::string vformat(const char* fmt, std::va_list ap) {
  char buf[512];
  std::va_list again;
  va_copy(again, ap);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  std::string out;
  if (n < 0) {
    out = fmt;
  } else if (static_cast<std::size_t>(n) < sizeof buf) {
    out.assign(buf, static_cast<std::size_t>(n));
  } else {
    out.resize(static_cast<std::size_t>(n));
    std::vsnprintf(out.data(), out.size() + 1, fmt, again);
  }
  va_end(again);
  return out;
}

[[gnu::format(printf, 1, 2)]] inline std::string format(const char* fmt, ...) {
  std::va_list ap;
  va_start(ap, fmt);
  std::string out = vformat(fmt, ap);
  va_end(ap);
  return out;
}

/// Throw E with a printf-style message: one cold call at the failing site.
#define LOCUS_DEFINE_THROWER(name, E)                                                       \
  [[noreturn, gnu::cold, gnu::noinline, gnu::format(printf, 1, 2)]] inline void name(const char* fmt, ...) { \
    std::va_list ap;                                                                        \
    va_start(ap, fmt);                                                                      \
    std::string m = vformat(fmt, ap);                                                       \
    va_end(ap);                                                                             \
    throw E(m);                                                                             \
  }
LOCUS_DEFINE_THROWER(throw_shape_error, shape_error)
LOCUS_DEFINE_THROWER(throw_index_error, index_error)
LOCUS_DEFINE_THROWER(throw_value_error, value_error)
LOCUS_DEFINE_THROWER(throw_io_error, io_error)
LOCUS_DEFINE_THROWER(throw_device_error, device_error)
#undef LOCUS_DEFINE_THROWER

}  // namespace detail

}  // namespace locus
