// Helpers for the checkpoint tests: temporary directories, the tensors of a
// tiny GPT-2 (TestModel: names, shapes and flat segments as lib/nn's Decoder lays
// them out, without lib/nn, which lib/ckpt does not depend on) and a
// checkpoint of it written the way a ZeRO run at world size W writes one
// (each rank the W-th part of every segment's flat space).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/base/error.h"
#include "lib/ckpt/manifest.h"
#include "lib/ckpt/shard.h"
#include "lib/tensor/tensor.h"

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

// A GPT-2's dimensions (those of lib/nn's GptConfig).
struct TinyConfig {
  int n_layer = 2;
  int n_head = 2;
  int d_model = 16;
  int vocab_size = 64;
  int max_seq_len = 16;
};

inline TinyConfig tiny_config(int n_layer = 2, int d_model = 16) {
  TinyConfig c;
  c.n_layer = n_layer;
  c.n_head = 2;
  c.d_model = d_model;
  c.vocab_size = 64;
  c.max_seq_len = 16;
  return c;
}

// One parameter: its Hugging Face GPT-2 name, fp32 values, offset in its
// segment's flat space and whether weight decay applies (2-D weights).
struct TestParam {
  std::string name;
  Tensor value;
  int64_t offset = 0;
  bool decay = false;
};

// A segment (embed, h.N, final): its parameters back to back, each aligned to
// 16 elements, the total padded to a multiple of 16 * world (as lib/nn's
// FlatParamGroup), padding zero.
class TestSegment {
 public:
  TestSegment(std::string name, std::vector<TestParam> params, Tensor flat)
      : name_(std::move(name)), params_(std::move(params)), flat_(std::move(flat)) {}
  const std::string& name() const { return name_; }
  int64_t numel() const { return flat_.numel(); }
  const std::vector<TestParam>& params() const { return params_; }
  const Tensor& flat() const { return flat_; }

 private:
  std::string name_;
  std::vector<TestParam> params_;
  Tensor flat_;  // fp32, numel() elements
};

// The tensors of a GPT-2 (tied head) in canonical order, with deterministic
// values.
class TestModel {
 public:
  TestModel(const TinyConfig& c, std::vector<std::unique_ptr<TestSegment>> segments)
      : config_(c), segments_(std::move(segments)) {}
  const TinyConfig& config() const { return config_; }
  const std::vector<std::unique_ptr<TestSegment>>& segments() const { return segments_; }
  std::vector<const TestParam*> parameters() const {
    std::vector<const TestParam*> out;
    for (const auto& seg : segments_)
      for (const TestParam& p : seg->params()) out.push_back(&p);
    return out;
  }
  const TestParam* find(const std::string& name) const {
    for (const TestParam* p : parameters())
      if (p->name == name) return p;
    return nullptr;
  }

 private:
  TinyConfig config_;
  std::vector<std::unique_ptr<TestSegment>> segments_;
};

// The model's layout rows, in canonical order.
inline std::vector<ParamLayout> layout_of(const TestModel& model) {
  std::vector<ParamLayout> out;
  for (const auto& seg : model.segments())
    for (const TestParam& p : seg->params()) {
      std::vector<int64_t> shape;
      for (int i = 0; i < p.value.shape().ndim(); ++i) shape.push_back(p.value.shape()[i]);
      out.push_back({p.name, seg->name(), p.offset, shape, p.decay});
    }
  return out;
}

inline ShardMeta test_meta(const TestModel& model, int world, int rank, int64_t step,
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
inline std::vector<SegmentRange> test_ranges(const TestModel& model, int world, int rank,
                                             DType params_dtype, bool omit_f32_params = false) {
  std::vector<SegmentRange> out;
  for (const auto& seg : model.segments()) {
    int64_t n = seg->numel();
    EXPECT_EQ(n % world, 0);
    int64_t share = n / world, off = int64_t(rank) * share;
    SegmentRange r{seg->name(), n, off, share, {}, {}, {}, {}, {}, {}};
    r.master = seg->flat().flat_slice(off, share).to(DType::kF32);
    r.exp_avg = ramp(off, share, 1.0f);
    r.exp_avg_sq = ramp(off, share, 2.0f);
    if (params_dtype != DType::kF32 || !omit_f32_params) r.params = r.master.to(params_dtype);
    out.push_back(std::move(r));
  }
  return out;
}

// Writes a complete checkpoint of `model` at `world` ranks into `dir`
// (created), with its manifest. Returns the step directory.
inline std::string write_test_checkpoint(const std::string& dir, const TestModel& model, int world,
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

// A GPT-2 of `c` with values drawn from `seed` (weights in [-0.1, 0.1],
// biases and norms near 0 and 1), its segments padded for `world` ranks.
inline std::unique_ptr<TestModel> make_model(const TinyConfig& c, int world = 1,
                                             uint64_t seed = 7) {
  struct Spec {
    std::string name;
    std::vector<int64_t> shape;
    bool decay;
  };
  const int64_t C = c.d_model, V = c.vocab_size, T = c.max_seq_len;
  std::vector<std::pair<std::string, std::vector<Spec>>> specs;
  specs.push_back({"embed", {{"wte.weight", {V, C}, true}, {"wpe.weight", {T, C}, true}}});
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    specs.push_back({"h." + std::to_string(l),
                     {{h + "ln_1.weight", {C}, false},
                      {h + "ln_1.bias", {C}, false},
                      {h + "attn.c_attn.weight", {C, 3 * C}, true},
                      {h + "attn.c_attn.bias", {3 * C}, false},
                      {h + "attn.c_proj.weight", {C, C}, true},
                      {h + "attn.c_proj.bias", {C}, false},
                      {h + "ln_2.weight", {C}, false},
                      {h + "ln_2.bias", {C}, false},
                      {h + "mlp.c_fc.weight", {C, 4 * C}, true},
                      {h + "mlp.c_fc.bias", {4 * C}, false},
                      {h + "mlp.c_proj.weight", {4 * C, C}, true},
                      {h + "mlp.c_proj.bias", {C}, false}}});
  }
  specs.push_back({"final", {{"ln_f.weight", {C}, false}, {"ln_f.bias", {C}, false}}});

  constexpr int64_t kAlign = 16;
  auto aligned = [](int64_t n, int64_t unit) { return (n + unit - 1) / unit * unit; };
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  std::vector<std::unique_ptr<TestSegment>> segments;
  for (const auto& [seg_name, params] : specs) {
    std::vector<float> flat;
    std::vector<TestParam> out;
    for (const Spec& p : params) {
      int64_t n = 1;
      for (int64_t d : p.shape) n *= d;
      const bool norm_weight =
          p.name.find("ln_") != std::string::npos && p.name.find(".weight") != std::string::npos;
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = (norm_weight ? 1.0f : 0.0f) + u(rng);
      const int64_t offset = int64_t(flat.size());
      flat.insert(flat.end(), v.begin(), v.end());
      flat.resize(size_t(aligned(int64_t(flat.size()), kAlign)), 0.0f);
      out.push_back({p.name, Tensor::from_vector(v, Shape(std::span<const int64_t>(p.shape))),
                     offset, p.decay});
    }
    flat.resize(size_t(aligned(int64_t(flat.size()), kAlign * world)), 0.0f);
    const int64_t numel = int64_t(flat.size());
    segments.push_back(std::make_unique<TestSegment>(seg_name, std::move(out),
                                                     Tensor::from_vector(flat, Shape{numel})));
  }
  return std::make_unique<TestModel>(c, std::move(segments));
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
