// The exception hierarchy. Every failure locus reports at run time is a
// `locus::error`, so a caller can catch one type; the derived types carry the
// numbers a user needs to act (both shapes, the bytes asked for and held, the
// failing CUDA call and where it was made).
#pragma once

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

  [[nodiscard]] const std::string& device() const noexcept { return device_; }
  [[nodiscard]] std::size_t requested_bytes() const noexcept { return requested_; }
  [[nodiscard]] std::size_t allocated_bytes() const noexcept { return allocated_; }
  [[nodiscard]] std::size_t reserved_bytes() const noexcept { return reserved_; }
  [[nodiscard]] std::size_t limit_bytes() const noexcept { return limit_; }

  static std::string format_bytes(std::size_t b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(b);
    int u = 0;
    while (v >= 1024.0 && u < 4) {
      v /= 1024.0;
      ++u;
    }
    char buf[64];
    if (u == 0)
      std::snprintf(buf, sizeof buf, "%zu B", b);
    else
      std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
    return buf;
  }

 private:
  static std::string make_message(std::string_view device, std::size_t requested,
                                  std::size_t allocated, std::size_t reserved,
                                  std::size_t limit, std::string_view cause) {
    std::string m = "locus: out of memory on ";
    m += device;
    m += ": tried to allocate " + format_bytes(requested) + "; " + format_bytes(allocated) +
         " allocated by tensors, " + format_bytes(reserved) + " reserved by the allocator";
    if (limit != static_cast<std::size_t>(-1)) m += ", limit " + format_bytes(limit);
    if (!cause.empty()) {
      m += " (";
      m += cause;
      m += ")";
    }
    m += ". Try a smaller batch size, gradient accumulation over several micro-batches, "
         "bf16/f16 compute, or free tensors you no longer need";
    m += cause == "memory limit" ? " (or raise the limit: locus::set_memory_limit<D>(bytes))." : ".";
    return m;
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

}  // namespace locus
