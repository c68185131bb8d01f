// Shards: what write_shard() writes, ShardReader reads back bit for bit,
// including ranges read across the middle of a stored range and params
// converted between dtypes; the manifest and the `latest` pointer.
#include "lib/ckpt/shard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "lib/ckpt/h5.h"
#include "lib/ckpt/manifest.h"
#include "tests/ckpt/ckpt_test_util.h"

namespace fd::ckpt {
namespace {

using testing::TempDir;

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(StepNames, AreZeroPadded) {
  EXPECT_EQ(step_dir_name(100), "step_00000100");
  EXPECT_EQ(step_dir_name(0), "step_00000000");
  EXPECT_EQ(shard_file_name(3), "rank_00003.h5");
}

void round_trip(DType params_dtype, const std::string& precision) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 2);
  ShardMeta meta = testing::test_meta(*model, 2, 1, 42, precision);
  std::vector<SegmentRange> ranges = testing::test_ranges(*model, 2, 1, params_dtype);
  std::string path = tmp.path("rank_00001.h5");
  write_shard(path, meta, ranges);

  ShardReader r = ShardReader::open(path);
  const ShardMeta& m = r.meta();
  EXPECT_EQ(m.format_version, kFormatVersion);
  EXPECT_EQ(m.step, 42);
  EXPECT_EQ(m.world_size, 2);
  EXPECT_EQ(m.rank, 1);
  EXPECT_EQ(m.zero_stage, 1);
  EXPECT_EQ(m.precision, precision);
  EXPECT_EQ(m.recipe_yaml, meta.recipe_yaml);
  EXPECT_EQ(m.optimizer_step, 42);
  EXPECT_EQ(m.seed, 1234);
  EXPECT_EQ(m.fdtrain_version, "fdtrain test");
  ASSERT_EQ(m.loss_scaler.has_value(), precision == "fp16");
  if (m.loss_scaler) {
    EXPECT_EQ(m.loss_scaler->scale, 32768.0);
    EXPECT_EQ(m.loss_scaler->iter, 42);
    EXPECT_EQ(m.loss_scaler->last_overflow_iter, 3);
    EXPECT_EQ(m.loss_scaler->hysteresis_left, 2);
  }
  ASSERT_EQ(m.layout.size(), meta.layout.size());
  for (size_t i = 0; i < m.layout.size(); ++i) {
    EXPECT_EQ(m.layout[i].name, meta.layout[i].name);
    EXPECT_EQ(m.layout[i].segment, meta.layout[i].segment);
    EXPECT_EQ(m.layout[i].offset, meta.layout[i].offset);
    EXPECT_EQ(m.layout[i].shape, meta.layout[i].shape);
    EXPECT_EQ(m.layout[i].decay, meta.layout[i].decay);
  }

  ASSERT_EQ(r.ranges().size(), ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    const SegmentRange& w = ranges[i];
    const ShardReader::RangeInfo& info = r.ranges()[i];
    EXPECT_EQ(info.segment, w.segment);  // written order, not name order
    EXPECT_EQ(info.segment_numel, w.segment_numel);
    EXPECT_EQ(info.offset, w.offset);
    EXPECT_EQ(info.count, w.count);
    EXPECT_EQ(info.params_dtype, params_dtype);
    for (auto [field, want] : {std::pair{"master", w.master},
                               {"exp_avg", w.exp_avg},
                               {"exp_avg_sq", w.exp_avg_sq},
                               {"params", w.params}}) {
      Tensor got = Tensor::empty(Shape{w.count}, want.dtype());
      r.read(w.segment, field, w.offset, w.count, got);
      EXPECT_TRUE(same_bytes(got, want)) << w.segment << "/" << field;
    }
  }
}

TEST(Shard, RoundTripFp32) { round_trip(DType::kF32, "fp32"); }
TEST(Shard, RoundTripBf16Params) { round_trip(DType::kBF16, "bf16"); }
TEST(Shard, RoundTripFp16ParamsAndLossScaler) { round_trip(DType::kF16, "fp16"); }

// A pipeline run's shard records the layout that wrote it; a shard without
// a pipeline has none (no attributes: stages 1).
TEST(Shard, PipelineLayoutRoundTrips) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 4);
  for (bool piped : {true, false}) {
    ShardMeta meta = testing::test_meta(*model, 4, 3, 7, "bf16");
    if (piped)
      meta.pipeline = {.stages = 2,
                       .replicas = 2,
                       .stage = 1,
                       .replica = 1,
                       .blocks = {1, 3},
                       .schedule = "gpipe"};
    const std::string path = tmp.path(piped ? "piped.h5" : "plain.h5");
    write_shard(path, meta, testing::test_ranges(*model, 4, 3, DType::kBF16));
    const ShardReader reader = ShardReader::open(path);
    const ShardMeta::Pipeline& got = reader.meta().pipeline;
    EXPECT_EQ(got, meta.pipeline);
    EXPECT_EQ(got.stages, piped ? 2 : 1);
  }
}

TEST(Shard, PartialReadsAcrossTheMiddleOfARange) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 2);
  std::vector<SegmentRange> ranges = testing::test_ranges(*model, 2, 0, DType::kBF16);
  write_shard(tmp.path("s.h5"), testing::test_meta(*model, 2, 0, 1, "bf16"), ranges);
  ShardReader r = ShardReader::open(tmp.path("s.h5"));
  const SegmentRange& w = ranges[1];  // h.0
  ASSERT_GT(w.count, 40);
  int64_t begin = w.offset + 7, count = w.count / 2;
  Tensor got = Tensor::empty(Shape{count}, DType::kF32);
  r.read(w.segment, "exp_avg", begin, count, got);
  EXPECT_TRUE(same_bytes(got, w.exp_avg.flat_slice(7, count).to(DType::kF32)));
  // params stored as bf16, read as bf16 (bitwise) and as f32 (exact widening).
  Tensor p16 = Tensor::empty(Shape{count}, DType::kBF16);
  r.read(w.segment, "params", begin, count, p16);
  EXPECT_TRUE(same_bytes(p16, w.params.flat_slice(7, count).to(DType::kBF16)));
  Tensor p32 = Tensor::empty(Shape{count}, DType::kF32);
  r.read(w.segment, "params", begin, count, p32);
  EXPECT_TRUE(same_bytes(p32, w.params.flat_slice(7, count).to(DType::kF32)));
  // The last element only.
  Tensor last = Tensor::empty(Shape{1}, DType::kF32);
  r.read(w.segment, "master", w.offset + w.count - 1, 1, last);
  EXPECT_EQ(last.f32()[0], w.master.f32()[w.count - 1]);

  // Outside the file's range: a clear error naming the file and the range.
  Tensor too_many = Tensor::empty(Shape{w.count + 1}, DType::kF32);
  std::string msg =
      testing::error_of([&] { r.read(w.segment, "master", w.offset, w.count + 1, too_many); });
  EXPECT_NE(msg.find(tmp.path("s.h5")), std::string::npos) << msg;
  EXPECT_NE(msg.find("not in this file's range"), std::string::npos) << msg;
  msg = testing::error_of([&] { r.read("h.9", "master", 0, 1, last); });
  EXPECT_NE(msg.find("no range of segment 'h.9'"), std::string::npos) << msg;
}

// Format version 2: the state's datasets carry a CRC-32C per chunk (<= 1 Mi elements). A read
// across chunk boundaries returns the written bits; damage in one chunk fails exactly the
// reads that touch that chunk.
TEST(Shard, ChunkChecksumsVerifyPartialReadsAcrossChunks) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 1);
  std::vector<SegmentRange> ranges = testing::test_ranges(*model, 1, 0, DType::kBF16);
  SegmentRange& big = ranges[1];  // h.0, grown to 2.5 chunks
  const int64_t n = (int64_t(5) << 20) / 2 + 3;
  big.segment_numel = n;
  big.offset = 0;
  big.count = n;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(i % 9973) * 0.5f - 7.0f;
  big.master = Tensor::from_vector(v, Shape{n});
  big.exp_avg = Tensor::from_vector(v, Shape{n});
  big.exp_avg_sq = Tensor::from_vector(v, Shape{n});
  big.params = big.master.to(DType::kBF16);
  const std::string path = tmp.path("s.h5");
  const FileDigest digest = write_shard(path, testing::test_meta(*model, 1, 0, 1, "bf16"), ranges);
  // The digest write_shard returns (the state's CRCs from memory, combined with the rest read
  // back) is the whole file's.
  EXPECT_EQ(digest, file_digest(path));
  const int64_t chunk = h5::chunk_elements_1d(n);  // 3 equal chunks of at most 1 Mi
  ASSERT_EQ(chunk, (n + 2) / 3);
  {
    ShardReader r = ShardReader::open(path);
    EXPECT_EQ(r.meta().format_version, 2);
    const int64_t begin = chunk - 5, count = chunk + 10;  // chunks 0, 1 and 2
    Tensor got = Tensor::empty(Shape{count}, DType::kF32);
    r.read("h.0", "exp_avg_sq", begin, count, got);
    EXPECT_TRUE(same_bytes(got, big.exp_avg_sq.flat_slice(begin, count)));
    Tensor p = Tensor::empty(Shape{count}, DType::kBF16);
    r.read("h.0", "params", begin, count, p);
    EXPECT_TRUE(same_bytes(p, big.params.flat_slice(begin, count)));
  }
  // Damage the middle of chunk 1 of exp_avg: reads of chunk 0 or 2 alone still succeed. The
  // dataset is contiguous (written past HDF5) and 4 KiB aligned; its chunks are logical.
  haddr_t addr = 0;
  const hsize_t bytes = hsize_t(chunk) * 4;
  {
    h5::H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    h5::H5Id ds(H5Dopen2(file.get(), "/segments/h.0/exp_avg", H5P_DEFAULT));
    h5::H5Id dcpl(H5Dget_create_plist(ds.get()));
    EXPECT_EQ(H5Pget_layout(dcpl.get()), H5D_CONTIGUOUS);
    const haddr_t start = H5Dget_offset(ds.get());
    ASSERT_NE(start, HADDR_UNDEF);
    EXPECT_EQ(start % 4096, 0u);
    addr = start + bytes;
  }
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(addr + bytes / 2));
    f.write("\x5a\x5a", 2);
  }
  ShardReader r = ShardReader::open(path);
  Tensor one = Tensor::empty(Shape{100}, DType::kF32);
  r.read("h.0", "exp_avg", chunk - 100, 100, one);
  r.read("h.0", "exp_avg", 2 * chunk, 100, one);
  const std::string msg =
      testing::error_of([&] { r.read("h.0", "exp_avg", chunk - 50, 100, one); });
  EXPECT_NE(msg.find("checksum mismatch in segment 'h.0', dataset /segments/h.0/exp_avg"),
            std::string::npos)
      << msg;
}

// Shards of format version 1 (HDF5's Fletcher32 on the state) are still read and verified.
TEST(Shard, FormatVersion1ShardsStillRead) {
  const std::string path =
      std::string(FD_SOURCE_DIR) + "/tests/fuzz/corpus/shard_hdf5/bf16_world1.h5";
  ShardReader r = ShardReader::open(path);
  EXPECT_EQ(r.meta().format_version, 1);
  int64_t read = 0;
  for (const ShardReader::RangeInfo& info : r.ranges())
    for (const char* field : {"master", "exp_avg", "exp_avg_sq", "params"}) {
      Tensor t = Tensor::empty(Shape{info.count}, DType::kF32);
      r.read(info.segment, field, info.offset, info.count, t);
      read += info.count;
    }
  EXPECT_GT(read, 0);
}

TEST(Shard, Fp32ParamsMayBeOmittedAndReadFromMaster) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 1);
  std::vector<SegmentRange> ranges =
      testing::test_ranges(*model, 1, 0, DType::kF32, /*omit_f32_params=*/true);
  ASSERT_FALSE(ranges[0].params.defined());
  write_shard(tmp.path("s.h5"), testing::test_meta(*model, 1, 0, 1, "fp32"), ranges);
  ShardReader r = ShardReader::open(tmp.path("s.h5"));
  Tensor got = Tensor::empty(Shape{ranges[0].count}, DType::kBF16);
  r.read("embed", "params", 0, ranges[0].count, got);
  EXPECT_TRUE(same_bytes(got, ranges[0].master.to(DType::kBF16)));
}

TEST(Shard, WriteIntoAMissingDirectoryIsARuntimeError) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(1), 1);
  std::string path = tmp.path("no/such/dir/rank_00000.h5");
  try {
    write_shard(path, testing::test_meta(*model, 1, 0, 1, "fp32"),
                testing::test_ranges(*model, 1, 0, DType::kF32));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(Manifest, RoundTripAndLatest) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 2);
  std::string dir = tmp.path("checkpoints/" + step_dir_name(5));
  testing::write_test_checkpoint(dir, *model, 2, 5);
  Manifest m = read_manifest(dir);
  EXPECT_EQ(m.format_version, kFormatVersion);
  EXPECT_EQ(m.step, 5);
  EXPECT_EQ(m.world_size, 2);
  EXPECT_EQ(m.zero_stage, 1);
  EXPECT_EQ(m.precision, "fp32");
  EXPECT_EQ(m.files, (std::vector<std::string>{"rank_00000.h5", "rank_00001.h5"}));
  ASSERT_EQ(m.segments.size(), 4u);
  EXPECT_EQ(m.segments[0].name, "embed");
  EXPECT_EQ(m.segments[3].name, "final");
  EXPECT_EQ(m.segments[1].numel, model->segments()[1]->numel());

  EXPECT_FALSE(read_latest(tmp.path("checkpoints")).has_value());
  write_latest(tmp.path("checkpoints"), 5);
  EXPECT_EQ(read_latest(tmp.path("checkpoints")), dir);
  EXPECT_FALSE(testing::fs::exists(tmp.path("checkpoints/latest.tmp")));
  // A step dir, a checkpoints dir and a run dir all resolve to the step dir.
  EXPECT_EQ(resolve_step_dir(dir), dir);
  EXPECT_EQ(resolve_step_dir(tmp.path("checkpoints")), dir);
  EXPECT_EQ(resolve_step_dir(tmp.path()), dir);
}

}  // namespace
}  // namespace fd::ckpt
