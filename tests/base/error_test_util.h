// Shared by the tests of every module whose readers refuse bad input with a usage error.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/base/error.h"

namespace fd::test_util {

// Runs f, expecting an fd::Error of kind kUsage whose message contains every
// fragment.
template <typename F>
void expect_usage_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no fd::Error thrown; expected: " << fragments.front();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    for (const std::string& frag : fragments)
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos)
          << "message: " << e.what() << "\nmissing: " << frag;
  }
}

}  // namespace fd::test_util
