// The reference log-probs cache (lib/engine/reference_logps.h): a round trip, and every way a
// file can fail to hold the values asked for (another key, other counts, a truncated or
// extended file, a flipped byte, not a cache at all) is a miss that says why, never an error.
#include "lib/engine/reference_logps.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace fd::engine {
namespace {

namespace fs = std::filesystem;

class ReferenceLogpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fd_reflogps_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    key_ = reference_key({{"data", "abc"}, {"weights", "seed 1"}});
    path_ = reference_cache_path(dir_, key_);
    values_.train = {-1.5, -2.25, -0.125, -7.0};
    values_.val = {-3.0, -4.5};
    ASSERT_EQ(write_reference_cache(path_, key_, values_), "");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string bytes() {
    std::ifstream in(path_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void put(const std::string& b) { std::ofstream(path_, std::ios::binary) << b; }
  std::string why_missing(const std::string& key, int64_t nt, int64_t nv) {
    std::string why;
    EXPECT_FALSE(read_reference_cache(path_, key, nt, nv, &why).has_value());
    return why;
  }
  fs::path dir_, path_;
  std::string key_;
  ReferenceLogps values_;
};

TEST_F(ReferenceLogpsTest, RoundTripIsExact) {
  EXPECT_EQ(path_.parent_path().filename(), "cache");
  EXPECT_EQ(path_.filename(), "reference_logps-" + key_.substr(0, 16) + ".bin");
  const auto got = read_reference_cache(path_, key_, 2, 1);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->train, values_.train);
  EXPECT_EQ(got->val, values_.val);
}

TEST_F(ReferenceLogpsTest, KeyDependsOnEveryField) {
  EXPECT_NE(reference_key({{"data", "abd"}, {"weights", "seed 1"}}), key_);
  EXPECT_NE(reference_key({{"data", "abc"}, {"weights", "seed 2"}}), key_);
  EXPECT_EQ(reference_key({{"data", "abc"}, {"weights", "seed 1"}}), key_);
}

TEST_F(ReferenceLogpsTest, MissesSayWhy) {
  EXPECT_NE(why_missing(reference_key({{"data", "other"}}), 2, 1).find("other data"),
            std::string::npos);
  EXPECT_NE(why_missing(key_, 3, 1).find("counts"), std::string::npos);
  const std::string good = bytes();
  put(good.substr(0, good.size() - 3));
  EXPECT_NE(why_missing(key_, 2, 1).find("truncated"), std::string::npos);
  put(good + "x");
  EXPECT_NE(why_missing(key_, 2, 1).find("too long"), std::string::npos);
  std::string flipped = good;
  flipped[flipped.size() - 2] ^= 0x10;
  put(flipped);
  EXPECT_NE(why_missing(key_, 2, 1).find("checksum"), std::string::npos);
  put("not json\n");
  EXPECT_NE(why_missing(key_, 2, 1).find("not a cache"), std::string::npos);
  fs::remove(path_);
  EXPECT_NE(why_missing(key_, 2, 1).find("no cached"), std::string::npos);
}

TEST_F(ReferenceLogpsTest, WritingReplacesOtherKeysOnly) {
  const std::string other = reference_key({{"data", "new"}});
  const fs::path other_path = reference_cache_path(dir_, other);
  std::ofstream(dir_ / "cache" / "users_file.bin") << "keep";
  ASSERT_EQ(write_reference_cache(other_path, other, values_), "");
  EXPECT_FALSE(fs::exists(path_));
  EXPECT_TRUE(fs::exists(other_path));
  EXPECT_TRUE(fs::exists(dir_ / "cache" / "users_file.bin"));
}

}  // namespace
}  // namespace fd::engine
