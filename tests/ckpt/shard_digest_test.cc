// Shard digests: the manifest records each shard's size and CRC-32, and
// open_checkpoint() checks them before HDF5 parses a shard. A damaged shard
// is refused with one fd::Error naming it, however it is damaged, including
// the files in tests/fuzz/hdf5/ that make HDF5 1.10 itself read out of
// bounds (found by tests/fuzz/shard_fuzz.cc; under make test-asan this test
// fails loudly if such bytes ever reach HDF5).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "lib/ckpt/export.h"
#include "lib/ckpt/manifest.h"
#include "tests/ckpt/ckpt_test_util.h"

namespace fd::ckpt {
namespace {

using testing::error_of;
using testing::TempDir;
namespace fs = std::filesystem;

class ShardDigest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::make_model(testing::tiny_config(), 2);
    dir_ = tmp_.path("step_00000003");
    testing::write_test_checkpoint(dir_, *model_, 2, 3);
    // As the trainer's save does: the digests of the shards as written.
    Manifest m = read_manifest(dir_);
    for (const std::string& f : m.files) m.digests.push_back(file_digest(dir_ + "/" + f));
    write_manifest(dir_, m);
    shard_ = dir_ + "/rank_00001.h5";
  }
  // open_checkpoint's and inspect_checkpoint's messages (both must fail).
  std::string open_error() {
    std::string a = error_of([&] { open_checkpoint(dir_); });
    std::string b = error_of([&] { inspect_checkpoint(dir_); });
    EXPECT_EQ(a, b);
    EXPECT_NE(a.find(shard_), std::string::npos) << a;
    EXPECT_NE(a.find("resume from an earlier checkpoint"), std::string::npos) << a;
    EXPECT_EQ(a.find('\n'), std::string::npos) << "one line: " << a;
    return a;
  }

  TempDir tmp_;
  std::unique_ptr<testing::TestModel> model_;
  std::string dir_, shard_;
};

TEST_F(ShardDigest, RecordedAndAccepted) {
  Manifest m = read_manifest(dir_);
  ASSERT_EQ(m.digests.size(), 2u);
  EXPECT_EQ(m.digests[1].bytes, fs::file_size(shard_));
  EXPECT_EQ(m.digests[1], file_digest(shard_));
  EXPECT_NO_THROW(inspect_checkpoint(dir_));
}

TEST_F(ShardDigest, AFlippedBitAnywhereIsRefused) {
  uintmax_t size = fs::file_size(shard_);
  for (double where : {0.0, 0.01, 0.5, 0.99}) {
    auto pos = std::streamoff(double(size - 1) * where);
    auto flip = [&] {
      std::fstream f(shard_, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(pos);
      char c = 0;
      f.read(&c, 1);
      f.seekp(pos);
      c = char(c ^ 0x04);
      f.write(&c, 1);
    };
    flip();
    std::string msg = open_error();
    EXPECT_NE(msg.find("is damaged: its CRC-32C is"), std::string::npos) << where << ": " << msg;
    flip();  // undo
  }
  EXPECT_NO_THROW(open_checkpoint(dir_));
}

TEST_F(ShardDigest, ATruncatedShardIsRefused) {
  fs::resize_file(shard_, fs::file_size(shard_) - 100);
  std::string msg = open_error();
  EXPECT_NE(msg.find("but the manifest says"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

// The shard_fuzz findings inside libhdf5: never handed to HDF5 through a checkpoint.
TEST_F(ShardDigest, FilesThatBreakHdf5AreRefusedBeforeHdf5) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(std::string(FD_SOURCE_DIR) + "/tests/fuzz/hdf5")) {
    fs::copy_file(e.path(), shard_, fs::copy_options::overwrite_existing);
    std::string msg = open_error();
    EXPECT_TRUE(msg.find("damaged") != std::string::npos ||
                msg.find("truncated") != std::string::npos)
        << e.path() << ": " << msg;
    ++n;
  }
  EXPECT_GE(n, 1);
}

TEST_F(ShardDigest, MalformedDigestFieldsAreRefused) {
  std::string path = dir_ + "/manifest.json";
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    std::ofstream(path, std::ios::trunc) << t;
    return error_of([&] { read_manifest(dir_); });
  };
  EXPECT_NE(with("\"file_crc32c\": [", "\"file_crc32c\": [\"zz\", ").find("file_crc32c"),
            std::string::npos);
  EXPECT_NE(with("\"file_bytes\": [", "\"file_bytes\": [1, ").find("one entry per file"),
            std::string::npos);
  EXPECT_NE(with("\"file_bytes\"", "\"file_bytes_\"").find("missing or malformed"),
            std::string::npos);
}

// Checkpoints written before digests were recorded still open.
TEST_F(ShardDigest, ManifestsWithoutDigestsStillOpen) {
  Manifest m = read_manifest(dir_);
  m.digests.clear();
  write_manifest(dir_, m);
  EXPECT_TRUE(read_manifest(dir_).digests.empty());
  EXPECT_NO_THROW(inspect_checkpoint(dir_));
}

}  // namespace
}  // namespace fd::ckpt
