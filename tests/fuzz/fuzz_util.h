// Shared by the fuzz targets (tests/fuzz/*_fuzz.cc).
//
// Each target is one LLVMFuzzerTestOneInput. The contract it checks: every
// input ends either in success or in one fd::Error, the error type a user
// sees as one message. Anything else (another exception, FD_CHECK, a crash,
// a sanitizer report, a hang, a leak) is a finding. The targets are built
// twice: with clang -fsanitize=fuzzer,address,undefined for `make fuzz`, and
// with the project's compiler and replay_main.cc for the ctest entries
// fuzz_regressions.<name>, which feed them the committed corpus and every
// input that once failed (tests/fuzz/regressions/<name>/).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "lib/base/error.h"

namespace fd::fuzz {

// A private scratch directory for the process, removed at exit. Readers
// that take a path get the input written to a file in it.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/fdfuzz.XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("fdfuzz: mkdtemp");
      std::abort();
    }
    static struct Cleanup {
      std::string d;
      ~Cleanup() {
        std::error_code ec;
        std::filesystem::remove_all(d, ec);
      }
    } cleanup{tmpl};
    return tmpl;
  }();
  return dir;
}

// Writes `bytes` to `path` (created or truncated); aborts if it cannot, since
// the target would then test nothing.
inline void write_file(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() ||
      std::fclose(f) != 0) {
    std::perror(("fdfuzz: writing " + path).c_str());
    std::abort();
  }
}

inline std::string_view as_view(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `f`; an fd::Error is the clean outcome for bad input and is swallowed
// (printed when FDFUZZ_VERBOSE is set, to see what a seed runs into). Every
// other exception escapes, and the fuzzer reports it.
template <typename F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const fd::Error& e) {
    static const bool verbose = std::getenv("FDFUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "fd::Error: %s\n", e.what());
  }
}

}  // namespace fd::fuzz
