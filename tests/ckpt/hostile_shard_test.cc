// Shards that are well-formed HDF5 but hold hostile numbers (found by
// tests/fuzz/shard_fuzz.cc; inputs in tests/fuzz/regressions/shard/): each is
// refused with one fd::Error naming the file, without integer overflow
// (UBSan) or a giant allocation.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>

#include "lib/ckpt/export.h"
#include "lib/ckpt/h5.h"
#include "lib/ckpt/shard.h"
#include "tests/ckpt/ckpt_test_util.h"

namespace fd::ckpt {
namespace {

using testing::error_of;
using testing::TempDir;

class HostileShard : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::make_model(testing::tiny_config(), 1);
    dir_ = tmp_.path("step_00000001");
    testing::write_test_checkpoint(dir_, *model_, 1, 1);
    shard_ = dir_ + "/rank_00000.h5";
  }
  // Replaces integer attribute `name` of object `obj` ("/" or a group) with `value`.
  void set_attr(const char* obj, const char* name, int64_t value) {
    h5::H5Id file(H5Fopen(shard_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_TRUE(file.valid());
    h5::H5Id o(H5Oopen(file.get(), obj, H5P_DEFAULT));
    ASSERT_TRUE(o.valid());
    ASSERT_GE(H5Adelete(o.get(), name), 0);
    ASSERT_TRUE(h5::write_attr_i64(o.get(), name, value));
  }
  std::string open_error() {
    std::string msg = error_of([&] { ShardReader::open(shard_); });
    EXPECT_NE(msg.find(shard_), std::string::npos) << msg;
    return msg;
  }

  TempDir tmp_;
  std::unique_ptr<testing::TestModel> model_;
  std::string dir_, shard_;
};

TEST_F(HostileShard, RangeWhoseEndOverflows) {
  set_attr("/segments/embed", "offset", int64_t(1) << 62);
  set_attr("/segments/embed", "count", int64_t(1) << 62);
  set_attr("/segments/embed", "segment_numel", int64_t(1) << 62);
  std::string msg = open_error();
  EXPECT_NE(msg.find("does not lie within segment_numel"), std::string::npos) << msg;
}

// Pipeline attributes that do not fit the shard's world: refused by name.
TEST_F(HostileShard, PipelineLayoutThatDoesNotFitTheWorld) {
  auto add = [&](int64_t stages, int64_t stage, const char* blocks) {
    h5::H5Id file(H5Fopen(shard_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_TRUE(file.valid());
    for (const char* a : {"pipeline_stages", "pipeline_replicas", "pipeline_stage",
                          "pipeline_replica", "pipeline_blocks", "pipeline_schedule"})
      if (h5::has_attr(file.get(), a)) {
        ASSERT_GE(H5Adelete(file.get(), a), 0);
      }
    ASSERT_TRUE(h5::write_attr_i64(file.get(), "pipeline_stages", stages));
    ASSERT_TRUE(h5::write_attr_i64(file.get(), "pipeline_replicas", 1));
    ASSERT_TRUE(h5::write_attr_i64(file.get(), "pipeline_stage", stage));
    ASSERT_TRUE(h5::write_attr_i64(file.get(), "pipeline_replica", 0));
    ASSERT_TRUE(h5::write_attr_str(file.get(), "pipeline_blocks", blocks));
    ASSERT_TRUE(h5::write_attr_str(file.get(), "pipeline_schedule", "1f1b"));
  };
  add(2, 0, "1,1");  // 2 stages x 1 replica in a world of 1
  EXPECT_NE(open_error().find("do not fit world size 1"), std::string::npos);
  add(2, 0, "1,x");
  EXPECT_NE(open_error().find("'pipeline_blocks' = '1,x' is not a list of block counts"),
            std::string::npos);
}

TEST_F(HostileShard, WorldSizeBeyondInt) {
  set_attr("/", "world_size", (int64_t(1) << 32) + 1);  // would truncate to 1
  std::string msg = open_error();
  EXPECT_NE(msg.find("'world_size' = 4294967297 is out of range"), std::string::npos) << msg;
}

TEST_F(HostileShard, LayoutShapeWhoseElementCountOverflows) {
  {
    h5::H5Id file(H5Fopen(shard_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    h5::H5Id ds(H5Dopen2(file.get(), "/layout/shape", H5P_DEFAULT));
    ASSERT_TRUE(ds.valid());
    auto dims = h5::dataset_dims(ds.get());
    ASSERT_TRUE(dims && dims->size() == 2 && (*dims)[1] >= 2);
    std::vector<int64_t> shapes((*dims)[0] * (*dims)[1]);
    ASSERT_GE(H5Dread(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, shapes.data()), 0);
    shapes[0] = shapes[1] = int64_t(1) << 40;  // (2^40, 2^40): 2^80 elements
    ASSERT_GE(H5Dwrite(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, shapes.data()), 0);
  }
  std::string msg = open_error();
  EXPECT_NE(msg.find("more than 2^63 elements"), std::string::npos) << msg;
}

// A parameter in a segment the manifest lists but no shard holds, past the
// segment's end: it used to be consolidated as silent zeros.
TEST_F(HostileShard, ParameterBeyondItsSegmentInTheManifest) {
  Manifest m = read_manifest(dir_);
  m.segments.push_back({"extra", 16});
  write_manifest(dir_, m);
  {
    // Move the last parameter into segment "extra" at offset 64 (> 16).
    h5::H5Id file(H5Fopen(shard_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    h5::H5Id g(H5Gopen2(file.get(), "/layout", H5P_DEFAULT));
    auto segments = h5::read_string_dataset(g.get(), "segment");
    ASSERT_TRUE(segments.has_value());
    segments->back() = "extra";
    ASSERT_GE(H5Ldelete(g.get(), "segment", H5P_DEFAULT), 0);
    ASSERT_TRUE(h5::write_string_dataset(g.get(), "segment", *segments));
    h5::H5Id off(H5Dopen2(g.get(), "offset", H5P_DEFAULT));
    std::vector<int64_t> offsets(segments->size());
    ASSERT_GE(H5Dread(off.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()), 0);
    offsets.back() = 64;
    ASSERT_GE(H5Dwrite(off.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()), 0);
  }
  std::string msg = error_of([&] { open_checkpoint(dir_); });
  EXPECT_NE(msg.find("lies beyond segment 'extra' of 16 elements"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fd::ckpt
