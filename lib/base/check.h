// FD_CHECK: invariants that only a bug in fdtrain can break.
//
// On failure prints file, line, the condition and an optional fmt message to
// stderr, then aborts. Never use it for anything a user can cause: throw
// fd::Error (error.h) instead.
#pragma once

#include <fmt/format.h>

#include <string>

namespace fd::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& msg);
}  // namespace fd::detail

#define FD_CHECK(cond, ...)                                                                 \
  do {                                                                                      \
    if (!(cond)) [[unlikely]]                                                               \
      ::fd::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
  } while (0)
