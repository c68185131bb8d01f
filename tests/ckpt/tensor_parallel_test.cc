// Tensor-parallel checkpoints (DESIGN 17): the slice columns of /layout and the tensor_*
// attributes round trip, shards without them read as before (every row whole), a checkpoint
// of T tp ranks consolidates to the very tensors of the unsharded model (an uneven vocabulary
// split, a fused q|k|v split in 3 blocks), and an inconsistent one is refused with the file and
// what to do.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hdf5.h>

#include <functional>
#include <map>
#include <optional>

#include "lib/ckpt/export.h"
#include "lib/ckpt/h5.h"
#include "lib/ckpt/shard.h"
#include "lib/ckpt/slices.h"
#include "tests/ckpt/ckpt_test_util.h"

namespace fd::ckpt {
namespace {

using testing::error_of;
using testing::TempDir;
namespace fs = std::filesystem;

struct Split {
  int dim;
  int blocks;
};

// How the test's GPT-2 splits (Megatron's, as lib/nn's Decoder): the embedding's rows by
// vocabulary, c_attn and c_fc by output features (c_attn in 3 blocks, q | k | v), the
// projections by input features; everything else whole.
std::optional<Split> split_of(const std::string& name) {
  if (name == "wte.weight") return Split{0, 1};
  if (name.find("c_attn.weight") != std::string::npos) return Split{1, 3};
  if (name.find("c_attn.bias") != std::string::npos) return Split{0, 3};
  if (name.find("c_fc.weight") != std::string::npos) return Split{1, 1};
  if (name.find("c_fc.bias") != std::string::npos) return Split{0, 1};
  if (name.find("c_proj.weight") != std::string::npos) return Split{0, 1};
  return std::nullopt;
}

// [begin, end) of `global` for tp rank t of T: the first global % T ranks one more.
std::pair<int64_t, int64_t> share(int64_t global, int t, int T) {
  const int64_t base = global / T, extra = global % T;
  const int64_t begin = t * base + std::min<int64_t>(t, extra);
  return {begin, begin + base + (t < extra ? 1 : 0)};
}

// Rank t's slice of `whole` along dim (blocks parts, each split alike), by index arithmetic
// of its own (not slices.h's).
Tensor slice_values(const Tensor& whole, int dim, int blocks, int64_t begin, int64_t end) {
  std::vector<int64_t> gshape, lshape;
  for (int d = 0; d < whole.shape().ndim(); ++d) gshape.push_back(whole.shape()[d]);
  lshape = gshape;
  const int64_t global = gshape[size_t(dim)] / blocks, part = end - begin;
  lshape[size_t(dim)] = part * blocks;
  int64_t n = 1;
  for (int64_t d : lshape) n *= d;
  std::vector<float> out(static_cast<size_t>(n));
  const float* src = whole.f32();
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i, g = 0, stride = 1;
    std::vector<int64_t> coord(lshape.size());
    for (size_t d = lshape.size(); d-- > 0;) {
      coord[d] = rest % lshape[d];
      rest /= lshape[d];
    }
    for (size_t d = lshape.size(); d-- > 0;) {
      int64_t c = coord[d];
      if (int(d) == dim) c = (c / part) * global + begin + c % part;
      g += c * stride;
      stride *= gshape[d];
    }
    out[size_t(i)] = src[g];
  }
  return Tensor::from_vector(out, Shape(std::span<const int64_t>(lshape)));
}

// Writes a checkpoint of `model` at T tp ranks x 1 replica (world T) into `dir`, as a
// tensor-parallel run's ZeRO-0 ranks would. `edit` may change tp rank t's layout rows before
// they are written.
void write_tp_checkpoint(const std::string& dir, const testing::TestModel& model, int T,
                         int64_t step,
                         const std::function<void(int t, std::vector<ParamLayout>&)>& edit = {}) {
  fs::create_directories(dir);
  Manifest mf;
  mf.step = step;
  mf.world_size = T;
  mf.zero_stage = 0;
  mf.precision = "fp32";
  for (int t = 0; t < T; ++t) {
    ShardMeta meta = testing::test_meta(model, T, t, step, "fp32");
    meta.zero_stage = 0;
    meta.tensor = {T, t, 1};
    meta.layout.clear();
    std::vector<SegmentRange> ranges;
    for (const auto& seg : model.segments()) {
      std::vector<float> flat;
      for (const testing::TestParam& p : seg->params()) {
        ParamLayout row{p.name, seg->name(), int64_t(flat.size()), {}, p.decay};
        Tensor v = p.value;
        if (std::optional<Split> s = split_of(p.name)) {
          const int64_t global = p.value.shape()[s->dim] / s->blocks;
          auto [b, e] = share(global, t, T);
          v = slice_values(p.value, s->dim, s->blocks, b, e);
          row.slice_dim = s->dim;
          row.slice_offset = b;
          row.slice_global = global;
          row.slice_blocks = s->blocks;
        }
        for (int d = 0; d < v.shape().ndim(); ++d) row.shape.push_back(v.shape()[d]);
        const std::vector<float> values = v.to_vector();
        flat.insert(flat.end(), values.begin(), values.end());
        flat.resize((flat.size() + 15) / 16 * 16, 0.0f);
        meta.layout.push_back(std::move(row));
      }
      const int64_t n = int64_t(flat.size());
      SegmentRange r{seg->name(), n, 0, n, {}, {}, {}, {}, {}, {}};
      r.master = Tensor::from_vector(flat, Shape{n});
      r.exp_avg = testing::ramp(0, n, 1.0f);
      r.exp_avg_sq = testing::ramp(0, n, 2.0f);
      mf.segments.push_back({seg->name(), n, t});
      ranges.push_back(std::move(r));
    }
    if (edit) edit(t, meta.layout);
    write_shard((fs::path(dir) / shard_file_name(t)).string(), meta, ranges);
    mf.files.push_back(shard_file_name(t));
  }
  write_manifest(dir, mf);
}

std::unique_ptr<testing::TestModel> uneven_model() {
  testing::TinyConfig c = testing::tiny_config();
  c.vocab_size = 67;  // 67 % 2 = 1, 67 % 4 = 3: the first tp ranks hold one more row
  return testing::make_model(c, 1);
}

TEST(TensorParallelShard, SliceColumnsAndAttributesRoundTrip) {
  TempDir tmp;
  auto model = uneven_model();
  write_tp_checkpoint(tmp.path("step_00000005"), *model, 2, 5);
  const ShardReader r = ShardReader::open(tmp.path("step_00000005/rank_00001.h5"));
  EXPECT_EQ(r.meta().tensor, (ShardMeta::TensorLayout{2, 1, 1}));
  std::map<std::string, ParamLayout> rows;
  for (const ParamLayout& p : r.meta().layout) rows[p.name] = p;
  const ParamLayout& wte = rows.at("wte.weight");
  EXPECT_EQ(wte.slice_dim, 0);
  EXPECT_EQ(wte.slice_offset, 34);  // rank 0 holds rows [0, 34), rank 1 [34, 67)
  EXPECT_EQ(wte.slice_global, 67);
  EXPECT_EQ(wte.shape, (std::vector<int64_t>{33, 16}));
  const ParamLayout& qkv = rows.at("h.0.attn.c_attn.weight");
  EXPECT_EQ(qkv.slice_dim, 1);
  EXPECT_EQ(qkv.slice_blocks, 3);
  EXPECT_EQ(qkv.slice_offset, 8);
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{16, 24}));
  EXPECT_EQ(global_shape(qkv), (std::vector<int64_t>{16, 48}));
  EXPECT_TRUE(rows.at("ln_f.weight").whole());
}

// A shard without tensor parallelism has no slice columns and no tensor_* attributes: the
// files of earlier fdtrain versions, which read as every row whole.
TEST(TensorParallelShard, ShardsWithoutTensorParallelismAreAsBefore) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 2);
  const std::string dir = testing::write_test_checkpoint(tmp.path("step_00000003"), *model, 2, 3);
  const std::string shard = dir + "/rank_00000.h5";
  {
    h5::H5Id file(H5Fopen(shard.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    ASSERT_TRUE(file.valid());
    EXPECT_LE(H5Lexists(file.get(), "/layout/slice_dim", H5P_DEFAULT), 0);
    EXPECT_FALSE(h5::has_attr(file.get(), "tensor_size"));
  }
  const Checkpoint c = open_checkpoint(dir);
  EXPECT_EQ(c.tensor_size(), 1);
  EXPECT_EQ(c.meta().tensor, ShardMeta::TensorLayout{});
  for (const ParamLayout& p : c.meta().layout) EXPECT_TRUE(p.whole()) << p.name;
  ASSERT_EQ(c.whole_layout.size(), c.meta().layout.size());
  for (size_t i = 0; i < c.whole_layout.size(); ++i)
    EXPECT_EQ(c.whole_layout[i].shape, c.meta().layout[i].shape);
}

// T = 2 and T = 4 (uneven: 67 rows over 4 ranks) consolidate to the model's own tensors,
// bit for bit, in canonical order, as the unsharded checkpoint does.
TEST(TensorParallelCheckpoint, ConsolidatesToTheWholeTensors) {
  TempDir tmp;
  auto model = uneven_model();
  testing::write_test_checkpoint(tmp.path("t1/step_00000005"), *model, 1, 5);
  const auto reference =
      consolidate_ordered(open_checkpoint(tmp.path("t1/step_00000005")), DType::kF32);
  for (int T : {2, 4}) {
    const std::string dir = tmp.path("t" + std::to_string(T) + "/step_00000005");
    write_tp_checkpoint(dir, *model, T, 5);
    const Checkpoint c = open_checkpoint(dir);
    EXPECT_EQ(c.tensor_size(), T);
    const auto got = consolidate_ordered(c, DType::kF32);
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, reference[i].first);
      ASSERT_EQ(got[i].second.shape(), reference[i].second.shape()) << got[i].first;
      EXPECT_EQ(got[i].second.to_vector(), reference[i].second.to_vector())
          << "T=" << T << " " << got[i].first;
    }
    const std::string report = inspect_checkpoint(dir);
    EXPECT_NE(report.find(fmt::format("tensor parallel: {} ranks x 1 replicas", T)),
              std::string::npos)
        << report;
    EXPECT_NE(report.find("(tp rank 1, replica 0)"), std::string::npos) << report;
  }
}

// for_each_writer_piece over any range of a whole tensor finds its elements in the tp ranks'
// slices (checked against the whole tensor's values).
TEST(TensorParallelSlices, WriterPiecesReassembleAnyRange) {
  auto model = uneven_model();
  const int T = 3;
  for (const char* name : {"wte.weight", "h.1.attn.c_attn.weight", "h.0.attn.c_attn.bias",
                           "h.0.mlp.c_proj.weight", "ln_f.bias"}) {
    const Tensor& whole = model->find(name)->value;
    std::vector<ParamLayout> rows(T);
    std::vector<std::vector<float>> values(T);
    for (int t = 0; t < T; ++t) {
      ParamLayout& row = rows[size_t(t)];
      row.name = name;
      Tensor v = whole;
      if (std::optional<Split> s = split_of(name)) {
        const int64_t global = whole.shape()[s->dim] / s->blocks;
        auto [b, e] = share(global, t, T);
        v = slice_values(whole, s->dim, s->blocks, b, e);
        row.slice_dim = s->dim;
        row.slice_offset = b;
        row.slice_global = global;
        row.slice_blocks = s->blocks;
      }
      for (int d = 0; d < v.shape().ndim(); ++d) row.shape.push_back(v.shape()[d]);
      values[size_t(t)] = v.to_vector();
    }
    std::vector<const ParamLayout*> ptrs;
    for (const ParamLayout& r : rows) ptrs.push_back(&r);
    ASSERT_EQ(tiling_problem(ptrs), "") << name;
    const std::vector<float> want = whole.to_vector();
    const int64_t n = whole.numel();
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, n}, {1, n - 1}, {n / 3, n / 2}, {5, 6}}) {
      std::vector<float> got(size_t(e - b), -1.0f);
      int64_t next = b;
      for_each_writer_piece(ptrs, b, e - b, [&](int t, int64_t local, int64_t g, int64_t m) {
        EXPECT_EQ(g, next) << name;
        next = g + m;
        for (int64_t k = 0; k < m; ++k)
          got[size_t(g - b + k)] = values[size_t(t)][size_t(local + k)];
      });
      EXPECT_EQ(next, e) << name;
      EXPECT_EQ(got, std::vector<float>(want.begin() + b, want.begin() + e)) << name;
    }
  }
}

class BadTensorParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = uneven_model();
    dir_ = tmp_.path("step_00000005");
  }
  std::string refusal() {
    const std::string msg = error_of([&] { open_checkpoint(dir_); });
    EXPECT_NE(msg.find("resume from an earlier checkpoint"), std::string::npos) << msg;
    return msg;
  }
  TempDir tmp_;
  std::unique_ptr<testing::TestModel> model_;
  std::string dir_;
};

TEST_F(BadTensorParallel, TheGoodOneIsFine) {
  write_tp_checkpoint(dir_, *model_, 2, 5);
  EXPECT_NO_THROW(open_checkpoint(dir_));
}

TEST_F(BadTensorParallel, TensorRankThatIsNotTheRanksIsRefused) {
  write_tp_checkpoint(dir_, *model_, 2, 5);
  const std::string shard = dir_ + "/rank_00001.h5";
  {
    h5::H5Id file(H5Fopen(shard.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_TRUE(file.valid());
    ASSERT_GE(H5Adelete(file.get(), "tensor_rank"), 0);
    ASSERT_TRUE(h5::write_attr_i64(file.get(), "tensor_rank", 0));
    ASSERT_TRUE(file.close());
  }
  const std::string msg = refusal();
  EXPECT_NE(msg.find(shard), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor_rank 0 is not the tp rank of rank 1"), std::string::npos) << msg;
}

TEST_F(BadTensorParallel, SizeThatDoesNotFitTheWorldIsRefused) {
  write_tp_checkpoint(dir_, *model_, 2, 5);
  const std::string shard = dir_ + "/rank_00000.h5";
  {
    h5::H5Id file(H5Fopen(shard.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_TRUE(file.valid());
    ASSERT_GE(H5Adelete(file.get(), "tensor_replicas"), 0);
    ASSERT_TRUE(h5::write_attr_i64(file.get(), "tensor_replicas", 2));
    ASSERT_TRUE(file.close());
  }
  const std::string msg = refusal();
  EXPECT_NE(msg.find(shard), std::string::npos) << msg;
  EXPECT_NE(msg.find("do not fit world size 2"), std::string::npos) << msg;
}

TEST_F(BadTensorParallel, SlicesThatDoNotTileTheWholeTensorAreRefused) {
  write_tp_checkpoint(dir_, *model_, 2, 5, [](int t, std::vector<ParamLayout>& layout) {
    for (ParamLayout& p : layout)
      if (t == 1 && p.name == "wte.weight") p.slice_offset = 33;  // overlaps rank 0's row 33
  });
  const std::string msg = refusal();
  EXPECT_NE(msg.find("'wte.weight' is not split consistently"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tp rank 1's slice starts at 33"), std::string::npos) << msg;
}

TEST_F(BadTensorParallel, WholeParameterOfAnotherShapeIsRefused) {
  write_tp_checkpoint(dir_, *model_, 2, 5, [](int t, std::vector<ParamLayout>& layout) {
    for (ParamLayout& p : layout)
      if (t == 1 && p.name == "ln_f.bias") p.shape = {8};
  });
  const std::string msg = refusal();
  EXPECT_NE(msg.find("'ln_f.bias' is not split consistently"), std::string::npos) << msg;
}

TEST_F(BadTensorParallel, ManifestWithoutATpRanksSegmentsIsRefused) {
  write_tp_checkpoint(dir_, *model_, 2, 5);
  Manifest mf = read_manifest(dir_);
  std::erase_if(mf.segments, [](const ManifestSegment& s) { return s.tp == 1; });
  write_manifest(dir_, mf);
  const std::string msg = refusal();
  EXPECT_NE(msg.find("of tp rank 1 is not in the manifest"), std::string::npos) << msg;
}

TEST_F(BadTensorParallel, ManifestSegmentOfTpRankOneRoundTrips) {
  write_tp_checkpoint(dir_, *model_, 2, 5);
  const Manifest mf = read_manifest(dir_);
  const Checkpoint c = open_checkpoint(dir_);
  int64_t embed0 = 0, embed1 = 0;
  for (const ManifestSegment& s : mf.segments)
    if (s.name == "embed") (s.tp == 0 ? embed0 : embed1) = s.numel;
  // 34 and 33 rows of 16 plus the positions: the tp ranks' flat spaces differ.
  EXPECT_EQ(embed0, 34 * 16 + 16 * 16);
  EXPECT_EQ(embed1, 33 * 16 + 16 * 16);
}

}  // namespace
}  // namespace fd::ckpt
