// Helpers for the data tests: write small token and text files.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "lib/base/error.h"
#include "tests/base/error_test_util.h"

namespace fd::data::test_util {

// A fresh path under the test temp dir, unique per test and name.
inline std::string temp_path(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir =
      std::string(::testing::TempDir()) + "fd_data_" + info->test_suite_name() + "_" + info->name();
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

inline std::string write_bytes(const std::string& name, const std::string& bytes) {
  std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

struct LlmcHeader {
  int32_t magic = 20240520;
  int32_t version = 1;
  std::optional<int64_t> count = std::nullopt;  // default: tokens.size()
};

// An llm.c token file: 256 x int32 header, then uint16 tokens; `drop` bytes
// are cut off the end.
inline std::string write_llmc(const std::string& name, const std::vector<uint16_t>& tokens,
                              LlmcHeader h = {}, size_t drop = 0) {
  std::vector<int32_t> header(256, 0);
  header[0] = h.magic;
  header[1] = h.version;
  header[2] = int32_t(h.count.value_or(int64_t(tokens.size())));
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), 2 * tokens.size());
  bytes.resize(bytes.size() - drop);
  return write_bytes(name, bytes);
}

using fd::test_util::expect_usage_error;

}  // namespace fd::data::test_util
