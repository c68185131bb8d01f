// Helpers for the checkpoint tests: temporary directories, a tiny GPT and a
// checkpoint of it written the way a ZeRO run at world size W writes one
// (each rank the W-th part of every segment's flat space).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "lib/base/error.h"
#include "lib/ckpt/manifest.h"
#include "lib/ckpt/shard.h"
#include "lib/nn/gpt.h"

namespace fd::ckpt::testing {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("fd_ckpt_test_" + std::to_string(rd()) + "_" + std::to_string(::getpid()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path(const std::string& rel = "") const { return (path_ / rel).string(); }

 private:
  fs::path path_;
};

inline nn::GptConfig tiny_config(int n_layer = 2, int d_model = 16) {
  nn::GptConfig c;
  c.n_layer = n_layer;
  c.n_head = 2;
  c.d_model = d_model;
  c.vocab_size = 64;
  c.max_seq_len = 16;
  return c;
}

// The model's layout rows, in canonical order.
inline std::vector<ParamLayout> layout_of(const nn::Gpt& model) {
  std::vector<ParamLayout> out;
  for (const auto& seg : model.segments())
    for (const nn::Parameter& p : seg->params()) {
      std::vector<int64_t> shape;
      for (int i = 0; i < p.value.shape().ndim(); ++i) shape.push_back(p.value.shape()[i]);
      out.push_back({p.name, seg->name(), p.offset, shape, p.decay});
    }
  return out;
}

inline ShardMeta test_meta(const nn::Gpt& model, int world, int rank, int64_t step,
                           const std::string& precision) {
  ShardMeta m;
  m.step = step;
  m.world_size = world;
  m.rank = rank;
  m.zero_stage = world > 1 ? 1 : 0;
  m.precision = precision;
  m.recipe_yaml = "model:\n  n_layer: 2\n# a test recipe\n";
  m.optimizer_step = step;
  m.seed = 1234;
  m.skipped_steps = 0;
  m.layout = layout_of(model);
  m.fdtrain_version = "fdtrain test";
  if (precision == "fp16") m.loss_scaler = LossScalerState{32768.0, step, 3, 2};
  return m;
}

// Deterministic optimizer state: exp_avg[i] = (offset + i) * 1e-3 + k.
inline Tensor ramp(int64_t offset, int64_t count, float k) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[size_t(i)] = float(offset + i) * 1e-3f + k;
  return Tensor::from_vector(v, Shape{count});
}

// Rank `rank`'s ranges of `model` (f32) split `world` ways; params in
// `params_dtype` (kF32: left undefined when `omit_f32_params`).
inline std::vector<SegmentRange> test_ranges(const nn::Gpt& model, int world, int rank,
                                             DType params_dtype, bool omit_f32_params = false) {
  std::vector<SegmentRange> out;
  for (const auto& seg : model.segments()) {
    int64_t n = seg->numel();
    EXPECT_EQ(n % world, 0);
    int64_t share = n / world, off = int64_t(rank) * share;
    SegmentRange r{seg->name(), n, off, share, {}, {}, {}, {}};
    r.master = seg->flat_params().flat_slice(off, share).to(DType::kF32);
    r.exp_avg = ramp(off, share, 1.0f);
    r.exp_avg_sq = ramp(off, share, 2.0f);
    if (params_dtype != DType::kF32 || !omit_f32_params) r.params = r.master.to(params_dtype);
    out.push_back(std::move(r));
  }
  return out;
}

// Writes a complete checkpoint of `model` at `world` ranks into `dir`
// (created), with its manifest. Returns the step directory.
inline std::string write_test_checkpoint(const std::string& dir, const nn::Gpt& model, int world,
                                         int64_t step, DType params_dtype = DType::kF32,
                                         const std::string& precision = "fp32") {
  fs::create_directories(dir);
  Manifest mf;
  mf.format_version = kFormatVersion;
  mf.step = step;
  mf.world_size = world;
  mf.zero_stage = world > 1 ? 1 : 0;
  mf.precision = precision;
  for (const auto& seg : model.segments()) mf.segments.push_back({seg->name(), seg->numel()});
  for (int r = 0; r < world; ++r) {
    write_shard((fs::path(dir) / shard_file_name(r)).string(),
                test_meta(model, world, r, step, precision),
                test_ranges(model, world, r, params_dtype));
    mf.files.push_back(shard_file_name(r));
  }
  write_manifest(dir, mf);
  return dir;
}

// A GPT initialised with GPT-2 init, its groups padded for `world` ranks.
inline std::unique_ptr<nn::Gpt> make_model(const nn::GptConfig& c, int world = 1, uint64_t seed = 7,
                                           DType dtype = DType::kF32) {
  nn::GroupLayout layout;
  layout.pad_multiple = world;
  auto m = std::make_unique<nn::Gpt>(c, dtype, layout);
  m->init_gpt2(seed);
  return m;
}

// Runs `cmd`; returns its stdout and sets *rc to its exit status.
inline std::string run_command(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) {
    *rc = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// The message of the fd::Error `f` throws ("" and a test failure if none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const fd::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an fd::Error";
  return "";
}

}  // namespace fd::ckpt::testing
