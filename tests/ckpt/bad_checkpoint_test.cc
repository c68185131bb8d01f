// Bad checkpoints: each way a checkpoint can be broken gives one fd::Error
// (kUsage) that names the file and says what is wrong, never a crash or a
// stack of HDF5 messages: a missing file or shard, a file that is not HDF5,
// a truncated file, flipped bytes in a dataset's data, a wrong format
// version, a missing attribute, a missing manifest.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <fstream>

#include "lib/ckpt/export.h"
#include "lib/ckpt/h5.h"
#include "lib/ckpt/shard.h"
#include "tests/ckpt/ckpt_test_util.h"

namespace fd::ckpt {
namespace {

using testing::error_of;
using testing::TempDir;
namespace fs = std::filesystem;

class BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::make_model(testing::tiny_config(), 2);
    dir_ = tmp_.path("step_00000003");
    testing::write_test_checkpoint(dir_, *model_, 2, 3);
    shard_ = (fs::path(dir_) / "rank_00001.h5").string();
  }
  // ShardReader::open's and open_checkpoint's error messages (both must fail).
  std::string open_error() {
    std::string a = error_of([&] { ShardReader::open(shard_); });
    std::string b = error_of([&] { inspect_checkpoint(dir_); });
    EXPECT_NE(a.find(shard_), std::string::npos) << a;
    EXPECT_NE(b.find(shard_), std::string::npos) << b;
    return a;
  }
  // Modifies the shard through the HDF5 API.
  template <typename F>
  void edit(F&& f) {
    h5::H5Id file(H5Fopen(shard_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_TRUE(file.valid());
    f(file.get());
    ASSERT_TRUE(file.close());
  }

  TempDir tmp_;
  std::unique_ptr<testing::TestModel> model_;
  std::string dir_, shard_;
};

TEST_F(BadCheckpoint, TheGoodOneIsFine) {
  EXPECT_NO_THROW(ShardReader::open(shard_));
  EXPECT_NO_THROW(inspect_checkpoint(dir_));
}

TEST_F(BadCheckpoint, MissingShardFile) {
  fs::remove(shard_);
  std::string msg = error_of([&] { ShardReader::open(shard_); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  msg = error_of([&] { open_checkpoint(dir_); });
  EXPECT_NE(msg.find(shard_ + " is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lists 2 shards"), std::string::npos) << msg;
}

TEST_F(BadCheckpoint, MissingManifest) {
  fs::remove(fs::path(dir_) / "manifest.json");
  std::string msg = error_of([&] { open_checkpoint(dir_); });
  EXPECT_NE(msg.find("is not a checkpoint"), std::string::npos) << msg;
  msg = error_of([&] { read_manifest(dir_); });
  EXPECT_NE(msg.find("manifest.json is missing"), std::string::npos) << msg;
}

TEST_F(BadCheckpoint, NotAnHdf5File) {
  std::ofstream(shard_, std::ios::trunc) << "this is not a checkpoint\n";
  std::string msg = open_error();
  EXPECT_NE(msg.find("not an HDF5 file"), std::string::npos) << msg;
}

TEST_F(BadCheckpoint, TruncatedFile) {
  uintmax_t size = fs::file_size(shard_);
  fs::resize_file(shard_, size / 2);
  std::string msg = open_error();
  EXPECT_NE(msg.find("truncated or corrupt"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}

TEST_F(BadCheckpoint, FlippedBytesInADatasetAreACorruptionError) {
  // Find the file address of the first chunk of /segments/h.0/exp_avg and
  // flip bytes in the middle of it.
  haddr_t addr = 0;
  hsize_t chunk_bytes = 0;
  {
    h5::H5Id file(H5Fopen(shard_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    h5::H5Id ds(H5Dopen2(file.get(), "/segments/h.0/exp_avg", H5P_DEFAULT));
    ASSERT_TRUE(ds.valid());
    hsize_t first[1] = {0};
    unsigned mask = 0;
    ASSERT_GE(H5Dget_chunk_info_by_coord(ds.get(), first, &mask, &addr, &chunk_bytes), 0);
  }
  ASSERT_GT(chunk_bytes, 16u);
  {
    std::fstream f(shard_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(addr + chunk_bytes / 2));
    const char junk[4] = {'\x5a', '\x5a', '\x5a', '\x5a'};
    f.write(junk, 4);
  }
  // The header still opens; reading the dataset fails its checksum.
  ShardReader r = ShardReader::open(shard_);
  const ShardReader::RangeInfo* info = r.find_range("h.0");
  ASSERT_NE(info, nullptr);
  Tensor out = Tensor::empty(Shape{info->count}, DType::kF32);
  std::string msg = error_of([&] { r.read("h.0", "exp_avg", info->offset, info->count, out); });
  EXPECT_NE(msg.find(shard_), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/segments/h.0/exp_avg"), std::string::npos) << msg;
  EXPECT_NE(msg.find("resume from an earlier checkpoint"), std::string::npos) << msg;
  // inspect reads everything and so finds it too.
  msg = error_of([&] { inspect_checkpoint(dir_); });
  EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << msg;
}

// Format version 2's per-chunk checksums: a chunk length other than the writer's (here one
// that would overflow a buffer's size) is damage, refused before anything is allocated for it.
TEST_F(BadCheckpoint, AHostileChunkLengthIsRefused) {
  edit([](hid_t f) {
    h5::H5Id ds(H5Dopen2(f, "/segments/h.0/exp_avg_crc32c", H5P_DEFAULT));
    ASSERT_TRUE(ds.valid());
    ASSERT_GE(H5Adelete(ds.get(), "chunk"), 0);
    ASSERT_TRUE(h5::write_attr_i64(ds.get(), "chunk", (int64_t(1) << 62) + 1));
  });
  ShardReader r = ShardReader::open(shard_);
  const ShardReader::RangeInfo* info = r.find_range("h.0");
  ASSERT_NE(info, nullptr);
  Tensor out = Tensor::empty(Shape{info->count}, DType::kF32);
  std::string msg = error_of([&] { r.read("h.0", "exp_avg", info->offset, info->count, out); });
  EXPECT_NE(msg.find("checksum mismatch in segment 'h.0'"), std::string::npos) << msg;
}

TEST_F(BadCheckpoint, FlippedBytesAnywhereInALargeShardAreDetected) {
  // A shard whose data is nearly all of the file: flipping bytes in the
  // middle lands in a dataset and must be caught by inspect.
  auto big = testing::make_model(testing::tiny_config(1, 256), 1);
  std::string dir = tmp_.path("big");
  testing::write_test_checkpoint(dir, *big, 1, 1);
  std::string shard = (fs::path(dir) / "rank_00000.h5").string();
  uintmax_t size = fs::file_size(shard);
  ASSERT_GT(size, 1u << 20);
  for (double where : {0.3, 0.5, 0.8}) {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(double(size) * where));
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0x10);
    f.seekp(std::streamoff(double(size) * where));
    f.write(&c, 1);
    f.close();
    std::string msg = error_of([&] { inspect_checkpoint(dir); });
    EXPECT_NE(msg.find(shard), std::string::npos) << msg;
    EXPECT_NE(msg.find("corrupt"), std::string::npos) << msg;
    // Undo, so that the next position is tested alone.
    std::fstream g(shard, std::ios::in | std::ios::out | std::ios::binary);
    g.seekp(std::streamoff(double(size) * where));
    c = char(c ^ 0x10);
    g.write(&c, 1);
  }
  EXPECT_NO_THROW(inspect_checkpoint(dir));
}

TEST_F(BadCheckpoint, WrongFormatVersionNamesBothVersions) {
  edit([](hid_t f) {
    ASSERT_GE(H5Adelete(f, "format_version"), 0);
    ASSERT_TRUE(h5::write_attr_i64(f, "format_version", 99));
  });
  std::string msg = open_error();
  EXPECT_NE(msg.find("format version 99"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reads format versions 1 to 2"), std::string::npos) << msg;
}

TEST_F(BadCheckpoint, MissingAttribute) {
  edit([](hid_t f) { ASSERT_GE(H5Adelete(f, "world_size"), 0); });
  std::string msg = open_error();
  EXPECT_NE(msg.find("'world_size'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST_F(BadCheckpoint, MissingDataset) {
  edit([](hid_t f) { ASSERT_GE(H5Ldelete(f, "/segments/final/exp_avg_sq", H5P_DEFAULT), 0); });
  std::string msg = open_error();
  EXPECT_NE(msg.find("/segments/final/exp_avg_sq"), std::string::npos) << msg;
}

TEST_F(BadCheckpoint, RangeBeyondSegmentNumel) {
  edit([](hid_t f) {
    h5::H5Id g(H5Gopen2(f, "/segments/embed", H5P_DEFAULT));
    ASSERT_GE(H5Adelete(g.get(), "segment_numel"), 0);
    ASSERT_TRUE(h5::write_attr_i64(g.get(), "segment_numel", 8));
  });
  std::string msg = open_error();
  EXPECT_NE(msg.find("does not lie within segment_numel 8"), std::string::npos) << msg;
}

TEST_F(BadCheckpoint, ShardFromAnotherStep) {
  // rank 1 replaced by the rank-1 shard of another checkpoint (step 9).
  std::string other = tmp_.path("other");
  testing::write_test_checkpoint(other, *model_, 2, 9);
  fs::copy_file(fs::path(other) / "rank_00001.h5", shard_, fs::copy_options::overwrite_existing);
  std::string msg = error_of([&] { open_checkpoint(dir_); });
  EXPECT_NE(msg.find(shard_ + ": step is 9 but the manifest"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fd::ckpt
