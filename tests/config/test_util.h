// Shared by the config tests: run from the repository root, so that fixture
// paths and the messages that name them are the short relative ones.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "lib/config/load.h"

namespace fd::config {

using Lines = std::vector<std::string>;

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { std::filesystem::current_path(FD_SOURCE_DIR); }

  static std::string fixture(const std::string& name) { return "tests/config/data/" + name; }

  // The errors of loading fixture `name` with `overrides`.
  static std::vector<std::string> errors_of(const std::string& name,
                                            const std::vector<std::string>& overrides = {}) {
    return try_load_recipe(fixture(name), overrides).errors;
  }
};

}  // namespace fd::config
