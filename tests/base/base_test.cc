#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "lib/base/error.h"
#include "lib/base/file_type.h"
#include "lib/base/rng.h"
#include "lib/base/sha256.h"
#include "lib/base/strings.h"

namespace fd {
namespace {

TEST(Sha256, KnownVectors) {
  Sha256 empty;
  EXPECT_EQ(empty.hex_digest(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 abc;
  abc.update("abc", 3);
  EXPECT_EQ(abc.hex_digest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // Two-block message, fed in uneven pieces.
  std::string m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  Sha256 split;
  split.update(m.data(), 5);
  split.update(m.data() + 5, m.size() - 5);
  EXPECT_EQ(split.hex_digest(), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Strings, NearestKey) {
  std::vector<std::string> keys = {"lr", "betas", "eps", "weight_decay", "grad_clip"};
  EXPECT_EQ(nearest("lrr", keys), "lr");
  EXPECT_EQ(nearest("weight_decy", keys), "weight_decay");
  EXPECT_EQ(nearest("zzzzzzzzzz", keys), "");
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

TEST(Rng, CounterBasedAndUniform) {
  EXPECT_EQ(hash_words(1, 2, 3), hash_words(1, 2, 3));
  EXPECT_NE(hash_words(1, 2, 3), hash_words(1, 3, 2));
  double sum = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    float u = uniform01(hash_words(7, i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  for (int i = 0; i < 1000; ++i) EXPECT_LT(uniform_below(hash_words(9, i), 17), 17u);
}

TEST(FileType, NamesWhatAPathIs) {
  const std::string dir = ::testing::TempDir() + "fd_base_file_type";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/file") << "x";
  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0600), 0);
  std::filesystem::create_symlink(dir + "/file", dir + "/link");
  EXPECT_EQ(describe_file_type(dir + "/file"), "a regular file");
  EXPECT_EQ(describe_file_type(dir + "/link"), "a regular file");  // links are followed
  EXPECT_EQ(describe_file_type(dir), "a directory");
  EXPECT_EQ(describe_file_type(dir + "/fifo"), "a FIFO");
  EXPECT_EQ(describe_file_type("/dev/null"), "a character device");
  EXPECT_EQ(describe_file_type(dir + "/missing"), "");
  std::filesystem::remove_all(dir);
}

TEST(Error, ExitCodes) {
  try {
    usage_error("bad {}", 1);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_STREQ(e.what(), "bad 1");
  }
  try {
    runtime_error("io");
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 1);
  }
}

}  // namespace
}  // namespace fd
