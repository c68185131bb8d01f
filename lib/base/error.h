// fd::Error: the one exception type for failures a user can cause or meet.
//
// A user-facing failure (bad recipe, missing file, corrupt data) throws an
// fd::Error carrying a kind and a complete message: what went wrong, where
// (file:line:column or key path when known) and what to do. The CLI catches
// it, prints the message once and exits with exit_code(kind). Broken internal
// invariants are not Errors: they use FD_CHECK (check.h) and abort.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace fd {

enum class ErrorKind {
  kUsage,    // bad command line, recipe or other user input: exit 2
  kRuntime,  // the job could not complete (I/O failure, divergence): exit 1
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message)
      : std::runtime_error(std::move(message)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return kind_ == ErrorKind::kUsage ? 2 : 1; }

 private:
  ErrorKind kind_;
};

// Throws a usage error (exit code 2) with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void usage_error(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(ErrorKind::kUsage, fmt::format(f, std::forward<Args>(args)...));
}

// Throws a runtime error (exit code 1) with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void runtime_error(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(ErrorKind::kRuntime, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace fd
