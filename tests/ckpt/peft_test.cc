// LoRA adapters in PEFT format: write -> read is exact (settings and
// tensors); an independent Python reader (json + struct only) finds PEFT's
// keys, shapes and config; merging matches a float64 reference; malformed
// adapters are refused with one message naming the file; and the checkpoint
// exports (--lora-adapter, --merge-lora) work from a LoRA run's checkpoint,
// in-process and through the fdtrain binary.
#include "lib/ckpt/peft.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "lib/base/strings.h"
#include "lib/ckpt/export.h"
#include "lib/ckpt/lora_base.h"
#include "lib/tensor/safetensors.h"
#include "tests/ckpt/ckpt_test_util.h"

namespace fd::ckpt {
namespace {

using testing::error_of;
using testing::run_command;
using testing::TempDir;
namespace fs = std::filesystem;
using Named = std::vector<std::pair<std::string, Tensor>>;

constexpr int kWidth = 16;  // C of the tiny model (testing::tiny_config())

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Tensor random_tensor(const Shape& shape, std::mt19937& rng, double scale = 1.0,
                     DType dt = DType::kF32) {
  std::normal_distribution<float> dist(0.0f, float(scale));
  std::vector<float> v(size_t(shape.numel()));
  for (float& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape, dt, MemCategory::kOther);
}

// (in, out) of a block module of a width-C GPT-2.
std::pair<int64_t, int64_t> module_dims(const std::string& module, int64_t c) {
  if (module == "attn.c_attn") return {c, 3 * c};
  if (module == "attn.c_proj") return {c, c};
  if (module == "mlp.c_fc") return {c, 4 * c};
  return {4 * c, c};  // mlp.c_proj
}

// Random LoRA pairs (A (r, in), B (out, r)) for `modules` of blocks `layers`,
// in canonical order.
Named random_lora(int r, const std::vector<int>& layers, const std::vector<std::string>& modules,
                  uint64_t seed, DType dt = DType::kF32, int64_t c = kWidth) {
  std::mt19937 rng{uint32_t(seed)};
  Named out;
  for (int layer : layers)
    for (const std::string& m : modules) {
      auto [in, o] = module_dims(m, c);
      std::string base = fmt::format("h.{}.{}.", layer, m);
      out.emplace_back(base + "lora_A.weight", random_tensor(Shape{r, in}, rng, 0.5, dt));
      out.emplace_back(base + "lora_B.weight", random_tensor(Shape{o, r}, rng, 0.5, dt));
    }
  return out;
}

// A GPT-2 base in Hugging Face names and layouts (Conv1D (in, out)).
Named gpt2_base(int n_layer, int64_t c, int64_t vocab, int64_t seq, uint64_t seed,
                DType dt = DType::kF32) {
  std::mt19937 rng{uint32_t(seed)};
  Named out;
  out.emplace_back("wte.weight", random_tensor(Shape{vocab, c}, rng, 0.02, dt));
  out.emplace_back("wpe.weight", random_tensor(Shape{seq, c}, rng, 0.02, dt));
  for (int i = 0; i < n_layer; ++i) {
    std::string h = fmt::format("h.{}.", i);
    out.emplace_back(h + "ln_1.weight", random_tensor(Shape{c}, rng, 1.0, dt));
    out.emplace_back(h + "ln_1.bias", random_tensor(Shape{c}, rng, 0.1, dt));
    for (const char* m : {"attn.c_attn", "attn.c_proj"}) {
      auto [in, o] = module_dims(m, c);
      out.emplace_back(h + m + ".weight", random_tensor(Shape{in, o}, rng, 0.02, dt));
      out.emplace_back(h + m + ".bias", random_tensor(Shape{o}, rng, 0.02, dt));
    }
    out.emplace_back(h + "ln_2.weight", random_tensor(Shape{c}, rng, 1.0, dt));
    out.emplace_back(h + "ln_2.bias", random_tensor(Shape{c}, rng, 0.1, dt));
    for (const char* m : {"mlp.c_fc", "mlp.c_proj"}) {
      auto [in, o] = module_dims(m, c);
      out.emplace_back(h + m + ".weight", random_tensor(Shape{in, o}, rng, 0.02, dt));
      out.emplace_back(h + m + ".bias", random_tensor(Shape{o}, rng, 0.02, dt));
    }
  }
  out.emplace_back("ln_f.weight", random_tensor(Shape{c}, rng, 1.0, dt));
  out.emplace_back("ln_f.bias", random_tensor(Shape{c}, rng, 0.1, dt));
  return out;
}

LoraSpec test_spec() {
  LoraSpec s;
  s.r = 2;
  s.alpha = 3.5;
  s.dropout = 0.05;
  s.targets = {"c_attn", "c_proj"};
  s.layers = {0, 2};
  s.base = "models/base.safetensors";
  return s;
}

Named test_lora(DType dt = DType::kF32) {
  return random_lora(2, {0, 2}, {"attn.c_attn", "attn.c_proj", "mlp.c_proj"}, 5, dt);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// ---------------------------------------------------------------------------

TEST(PeftAdapter, RoundTripIsExact) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    TempDir tmp;
    const LoraSpec spec = test_spec();
    Named lora = test_lora(dt);
    // Any input order; the adapter comes back in canonical order.
    Named shuffled(lora.rbegin(), lora.rend());
    write_peft_adapter(tmp.path("adapter"), spec, shuffled, false);
    EXPECT_FALSE(fs::exists(tmp.path("adapter.tmp")));
    PeftAdapter a = read_peft_adapter(tmp.path("adapter"));
    EXPECT_EQ(a.spec, spec);
    ASSERT_EQ(a.tensors.size(), lora.size());
    for (size_t i = 0; i < lora.size(); ++i) {
      EXPECT_EQ(a.tensors[i].first, lora[i].first);
      EXPECT_TRUE(same_bytes(a.tensors[i].second, lora[i].second)) << lora[i].first;
    }
  }
}

TEST(PeftAdapter, AllLayersIsNullAndIntegerAlphaIsAnInteger) {
  TempDir tmp;
  LoraSpec spec = test_spec();
  spec.layers = {};
  spec.alpha = 16;
  spec.targets = {"c_fc"};
  write_peft_adapter(tmp.path("a"), spec, random_lora(2, {0, 1, 2}, {"mlp.c_fc"}, 1), false);
  std::string cfg = read_text(tmp.path("a/adapter_config.json"));
  EXPECT_NE(cfg.find("\"layers_to_transform\": null"), std::string::npos) << cfg;
  EXPECT_NE(cfg.find("\"lora_alpha\": 16,"), std::string::npos) << cfg;
  EXPECT_EQ(read_peft_adapter(tmp.path("a")).spec, spec);
}

TEST(PeftAdapter, RefusesAnExistingDirectoryUnlessOverwrite) {
  TempDir tmp;
  write_peft_adapter(tmp.path("a"), test_spec(), test_lora(), false);
  std::string msg =
      error_of([&] { write_peft_adapter(tmp.path("a"), test_spec(), test_lora(), false); });
  EXPECT_NE(msg.find("already exists"), std::string::npos) << msg;
  LoraSpec other = test_spec();
  other.r = 4;
  Named lora4 = random_lora(4, {0, 2}, {"attn.c_attn", "attn.c_proj", "mlp.c_proj"}, 9);
  write_peft_adapter(tmp.path("a"), other, lora4, true);
  EXPECT_EQ(read_peft_adapter(tmp.path("a")).spec.r, 4);
  EXPECT_FALSE(fs::exists(tmp.path("a.tmp")));
  EXPECT_FALSE(fs::exists(tmp.path("a.old")));
}

TEST(PeftAdapter, WriteRefusesInconsistentInput) {
  TempDir tmp;
  auto refuse = [&](const LoraSpec& spec, const Named& lora, const std::string& want) {
    std::string msg = error_of([&] { write_peft_adapter(tmp.path("x"), spec, lora, false); });
    EXPECT_NE(msg.find(want), std::string::npos) << "want '" << want << "' in: " << msg;
    EXPECT_FALSE(fs::exists(tmp.path("x")));
  };
  LoraSpec s = test_spec();
  Named lora = test_lora();
  Named unpaired(lora.begin() + 1, lora.end());
  refuse(s, unpaired, "has no matching");
  LoraSpec r3 = s;
  r3.r = 3;
  refuse(r3, lora, "with r = 3");
  LoraSpec only_attn = s;
  only_attn.targets = {"c_attn"};
  refuse(only_attn, lora, "do not name it");
  LoraSpec layer0 = s;
  layer0.layers = {0};
  refuse(layer0, lora, "do not list it");
  Named renamed = lora;
  renamed[0].first = "h.0.attn.q_proj.lora_A.weight";
  refuse(s, renamed, "is not a LoRA weight");
  Named missing_module(lora.begin() + 2, lora.end());  // h.0.attn.c_attn gone
  refuse(s, missing_module, "name h.0.attn.c_attn, but there are no LoRA weights");
  LoraSpec bad_target = s;
  bad_target.targets = {"q_proj"};
  refuse(bad_target, lora, "c_attn, c_proj, attn.c_proj, c_fc, mlp.c_proj");
  // B of c_attn with out = C instead of 3C.
  Named wrong_out = lora;
  std::mt19937 rng(1);
  wrong_out[1].second = random_tensor(Shape{kWidth, 2}, rng);
  refuse(s, wrong_out, "do not fit attn.c_attn");
}

// The adapter as an independent reader sees it: PEFT's key names, shapes and
// config fields, and the same values.
TEST(PeftAdapter, PythonReaderSeesPeftKeysAndShapes) {
  int rc = 0;
  run_command("command -v python3", &rc);
  if (rc != 0) GTEST_SKIP() << "no python3";
  TempDir tmp;
  const LoraSpec spec = test_spec();
  const Named lora = test_lora();
  write_peft_adapter(tmp.path("adapter"), spec, lora, false);
  std::string text = run_command("python3 '" + std::string(FD_SOURCE_DIR) +
                                     "/tests/ckpt/read_peft.py' '" + tmp.path("adapter") + "'",
                                 &rc);
  ASSERT_EQ(rc, 0) << text;
  std::map<std::string, std::string> cfg;
  std::vector<std::vector<std::string>> tensors;
  for (const std::string& line : split(text, '\n')) {
    std::vector<std::string> f = split(line, '\t');
    if (f.size() == 3 && f[0] == "config") cfg[f[1]] = f[2];
    if (f.size() == 5 && f[0] == "tensor") tensors.push_back(f);
  }
  EXPECT_EQ(cfg["peft_type"], "\"LORA\"");
  EXPECT_EQ(cfg["task_type"], "\"CAUSAL_LM\"");
  EXPECT_EQ(cfg["r"], "2");
  EXPECT_EQ(cfg["lora_alpha"], "3.5");
  EXPECT_EQ(cfg["lora_dropout"], "0.05");
  EXPECT_EQ(cfg["target_modules"], "[\"c_attn\", \"c_proj\"]");
  EXPECT_EQ(cfg["bias"], "\"none\"");
  EXPECT_EQ(cfg["fan_in_fan_out"], "true");
  EXPECT_EQ(cfg["inference_mode"], "true");
  EXPECT_EQ(cfg["layers_to_transform"], "[0, 2]");
  EXPECT_EQ(cfg["base_model_name_or_path"], "\"models/base.safetensors\"");
  ASSERT_EQ(tensors.size(), lora.size()) << text;
  for (size_t i = 0; i < lora.size(); ++i) {
    const Tensor& t = lora[i].second;
    EXPECT_EQ(tensors[i][1], "base_model.model.transformer." + lora[i].first);
    EXPECT_EQ(tensors[i][2], "F32");
    EXPECT_EQ(tensors[i][3], fmt::format("{},{}", t.shape()[0], t.shape()[1]));
    double sum = 0;
    for (float v : t.to_vector()) sum += double(v);
    EXPECT_EQ(std::strtod(tensors[i][4].c_str(), nullptr), sum) << lora[i].first;
  }
  // PEFT's shapes for GPT-2 (C = 16, r = 2): c_attn A (2, 16), B (48, 2).
  EXPECT_EQ(tensors[0][1], "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
  EXPECT_EQ(tensors[0][3], "2,16");
  EXPECT_EQ(tensors[1][1], "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight");
  EXPECT_EQ(tensors[1][3], "48,2");
  EXPECT_EQ(tensors[4][1], "base_model.model.transformer.h.0.mlp.c_proj.lora_A.weight");
  EXPECT_EQ(tensors[4][3], "2,64");
}

// An adapter in the form PEFT itself writes (written here by hand, not by
// write_peft_adapter): its extra config keys are accepted, attn.c_attn is
// read as c_attn, and layers_to_transform may be a single index.
TEST(PeftAdapter, ReadsAnAdapterWrittenByPeft) {
  TempDir tmp;
  fs::create_directories(tmp.path("p"));
  write_text(tmp.path("p/adapter_config.json"), R"({
  "alpha_pattern": {}, "auto_mapping": null, "base_model_name_or_path": "gpt2",
  "bias": "none", "fan_in_fan_out": true, "inference_mode": true, "init_lora_weights": true,
  "layers_pattern": null, "layers_to_transform": 1, "loftq_config": {}, "lora_alpha": 32,
  "lora_dropout": 0.1, "megatron_config": null, "megatron_core": "megatron.core",
  "modules_to_save": null, "peft_type": "LORA", "r": 2, "rank_pattern": {}, "revision": null,
  "target_modules": ["attn.c_attn"], "task_type": "CAUSAL_LM", "use_dora": false,
  "use_rslora": false
})");
  Named lora = random_lora(2, {1}, {"attn.c_attn"}, 3);
  Named keyed;
  for (const auto& [n, t] : lora) keyed.emplace_back("base_model.model.transformer." + n, t);
  write_safetensors(tmp.path("p/adapter_model.safetensors"), keyed, {{"format", "pt"}});
  PeftAdapter a = read_peft_adapter(tmp.path("p"));
  EXPECT_EQ(a.spec.r, 2);
  EXPECT_EQ(a.spec.alpha, 32);
  EXPECT_EQ(a.spec.targets, std::vector<std::string>{"c_attn"});
  EXPECT_EQ(a.spec.layers, std::vector<int>{1});
  EXPECT_EQ(a.spec.base, "gpt2");
  ASSERT_EQ(a.tensors.size(), 2u);
  EXPECT_EQ(a.tensors[0].first, "h.1.attn.c_attn.lora_A.weight");
}

TEST(PeftAdapter, MalformedAdaptersAreRefused) {
  struct Case {
    const char* what;
    std::function<void(const std::string& dir)> damage;
    const char* file;  // the file the message must name
    const char* want;
  };
  auto edit_config = [](const std::string& from, const std::string& to) {
    return [from, to](const std::string& dir) {
      std::string p = dir + "/adapter_config.json";
      std::string t = read_text(p);
      size_t at = t.find(from);
      ASSERT_NE(at, std::string::npos) << from;
      t.replace(at, from.size(), to);
      write_text(p, t);
    };
  };
  auto rewrite_tensors = [](std::function<void(Named&)> f) {
    return [f](const std::string& dir) {
      std::string p = dir + "/adapter_model.safetensors";
      SafetensorsFile st = SafetensorsFile::open(p);
      Named t;
      for (const std::string& n : st.names()) t.emplace_back(n, st.load(n));
      f(t);
      write_safetensors(p, t);
    };
  };
  const std::vector<Case> cases = {
      {"other peft type", edit_config("\"LORA\"", "\"PREFIX_TUNING\""), "adapter_config.json",
       "peft_type is \"PREFIX_TUNING\""},
      {"fan_in_fan_out false", edit_config("\"fan_in_fan_out\": true", "\"fan_in_fan_out\": false"),
       "adapter_config.json", "fan_in_fan_out is false"},
      {"r disagrees with shapes", edit_config("\"r\": 2", "\"r\": 4"), "adapter_model.safetensors",
       "with r = 4"},
      {"r not an integer", edit_config("\"r\": 2", "\"r\": \"two\""), "adapter_config.json",
       "r must be an integer"},
      {"unknown target", edit_config("\"c_proj\"", "\"q_proj\""), "adapter_config.json",
       "target module 'q_proj' is not one fdtrain adapts; the valid names are c_attn"},
      {"targets miss a module", edit_config("\"c_proj\"", "\"attn.c_proj\""),
       "adapter_model.safetensors", "h.0.mlp.c_proj, but the targets"},
      {"rslora", edit_config("\"use_rslora\": false", "\"use_rslora\": true"),
       "adapter_config.json", "use_rslora is true"},
      {"corrupt json", edit_config("{", "{{"), "adapter_config.json", "not a JSON object"},
      {"missing model file",
       [](const std::string& d) { fs::remove(d + "/adapter_model.safetensors"); },
       "adapter_model.safetensors", "does not exist"},
      {"unpaired A", rewrite_tensors([](Named& t) { t.erase(t.begin()); }),
       "adapter_model.safetensors", "has no matching"},
      {"foreign key", rewrite_tensors([](Named& t) {
         std::mt19937 rng(2);
         t.emplace_back("base_model.model.lm_head.lora_A.weight", random_tensor(Shape{2, 16}, rng));
       }),
       "adapter_model.safetensors", "key 'base_model.model.lm_head.lora_A.weight'"},
      {"unprefixed key", rewrite_tensors([](Named& t) {
         t[0].first = t[0].first.substr(std::string("base_model.model.transformer.").size());
       }),
       "adapter_model.safetensors", "is not a LoRA weight of a GPT-2 block"},
      {"truncated safetensors",
       [](const std::string& d) { fs::resize_file(d + "/adapter_model.safetensors", 20); },
       "adapter_model.safetensors", ""},
  };
  for (const Case& c : cases) {
    TempDir tmp;
    write_peft_adapter(tmp.path("a"), test_spec(), test_lora(), false);
    c.damage(tmp.path("a"));
    std::string msg = error_of([&] { read_peft_adapter(tmp.path("a")); });
    std::printf("  %-24s %s\n", c.what, msg.c_str());
    EXPECT_NE(msg.find(c.file), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.want), std::string::npos) << c.what << ": " << msg;
  }
  TempDir tmp;
  std::string msg = error_of([&] { read_peft_adapter(tmp.path("none")); });
  EXPECT_NE(msg.find("is not a directory"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------

// W' = W + (B A)^T * scaling against a float64 reference; untouched tensors
// are passed through; a bf16 base stays bf16.
TEST(MergeLora, MatchesFloat64Reference) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Named base = gpt2_base(3, kWidth, 64, 16, 11, dt);
    const Named lora = test_lora();
    const double scaling = 3.5 / 2;
    const Named merged = merge_lora(base, lora, scaling);
    ASSERT_EQ(merged.size(), base.size());
    std::map<std::string, std::pair<Tensor, Tensor>> pairs;  // module weight -> (A, B)
    for (size_t i = 0; i < lora.size(); i += 2) {
      std::string n = lora[i].first;
      pairs[n.substr(0, n.find(".lora_A.")) + ".weight"] = {lora[i].second, lora[i + 1].second};
    }
    double worst = 0;
    for (size_t i = 0; i < base.size(); ++i) {
      const auto& [name, w] = base[i];
      ASSERT_EQ(merged[i].first, name);
      EXPECT_EQ(merged[i].second.dtype(), dt) << name;
      auto it = pairs.find(name);
      if (it == pairs.end()) {
        EXPECT_TRUE(same_bytes(merged[i].second, w)) << name << " has no adapter";
        continue;
      }
      std::vector<float> a = it->second.first.to_vector(), b = it->second.second.to_vector(),
                         wv = w.to_vector(), got = merged[i].second.to_vector();
      const int64_t r = 2, in = w.shape()[0], out = w.shape()[1];
      double diff2 = 0, ref2 = 0;
      for (int64_t k = 0; k < in; ++k)
        for (int64_t j = 0; j < out; ++j) {
          double d = 0;
          for (int64_t q = 0; q < r; ++q) d += double(b[size_t(j * r + q)]) * a[size_t(q * in + k)];
          const double ref = double(wv[size_t(k * out + j)]) + d * scaling;
          diff2 += std::pow(got[size_t(k * out + j)] - ref, 2);
          ref2 += ref * ref;
        }
      worst = std::max(worst, std::sqrt(diff2 / ref2));
    }
    const double tol = dt == DType::kF32 ? 1e-7 : 4e-3;  // one rounding to the base dtype
    std::printf("  merge %s: worst rel err %.3e (tol %.0e)\n", dt == DType::kF32 ? "f32" : "bf16",
                worst, tol);
    EXPECT_LE(worst, tol);
  }
}

TEST(MergeLora, AcceptsTransformerPrefixAndRefusesAMismatchedBase) {
  Named base = gpt2_base(3, kWidth, 64, 16, 11);
  for (auto& [n, t] : base) n = "transformer." + n;
  Named merged = merge_lora(base, test_lora(), 1.0);
  EXPECT_EQ(merged[4].first, "transformer.h.0.attn.c_attn.weight");
  EXPECT_FALSE(same_bytes(merged[4].second, base[4].second));

  Named two_blocks = gpt2_base(2, kWidth, 64, 16, 11);  // the adapter has block 2
  std::string msg = error_of([&] { merge_lora(two_blocks, test_lora(), 1.0); });
  EXPECT_NE(msg.find("no 'h.2.attn.c_attn.weight'"), std::string::npos) << msg;
  Named wide = gpt2_base(3, 2 * kWidth, 64, 16, 11);
  msg = error_of([&] { merge_lora(wide, test_lora(), 1.0); });
  EXPECT_NE(msg.find("has shape (32, 96) in the base"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------
// Exports from a LoRA run's checkpoint.

// An llm.c token file of `n` tokens.
void write_tokens(const std::string& path, int n) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = n;
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) tokens[size_t(i)] = uint16_t(i % 64);
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), 1024);
  f.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(2 * n));
}

// A checkpoint as a LoRA run of the tiny model (2 blocks, C = 16) writes one
// at world size `world`: the layout holds only the adapters, one segment per
// block, the recipe names the base and the lora section, and the shards record
// the base file's SHA-256. `base_layers` other than 2 writes a base that does
// not fit the recipe (an inconsistent checkpoint that records its digest).
struct LoraRun {
  std::string base;    // the base model file (HF names, "transformer." prefix, mask buffers)
  Named base_tensors;  // as HF names without the prefix
  Named lora;
  std::string ckpt;
};

LoraRun write_lora_run(const TempDir& tmp, int world, bool with_lora_section = true,
                       int base_layers = 2) {
  LoraRun run;
  run.base = tmp.path("base.safetensors");
  run.base_tensors = gpt2_base(base_layers, kWidth, 64, 16, 21);
  Named file;
  for (const auto& [n, t] : run.base_tensors) file.emplace_back("transformer." + n, t);
  file.emplace_back("transformer.h.0.attn.bias", Tensor::zeros(Shape{1, 1, 16, 16}));
  file.emplace_back("lm_head.weight", run.base_tensors[0].second);
  write_safetensors(run.base, file);
  write_tokens(tmp.path("train.bin"), 4096);
  std::string recipe = fmt::format(
      "model:\n  n_layer: 2\n  n_head: 2\n  d_model: 16\n  vocab_size: 64\n  max_seq_len: 16\n"
      "  init_from: {}\ndata:\n  format: tokens\n  seq_len: 8\n  train: {}\nsteps: 5\n",
      run.base, tmp.path("train.bin"));
  if (with_lora_section)
    recipe +=
        "lora:\n  r: 2\n  alpha: 3\n  dropout: 0.1\n  targets: [c_attn, c_proj]\n  layers: [1]\n";
  run.lora = random_lora(2, {1}, {"attn.c_attn", "attn.c_proj", "mlp.c_proj"}, 33);

  // One segment "h.1" with the six tensors back to back, padded for `world`.
  std::vector<ParamLayout> layout;
  std::vector<float> flat;
  for (const auto& [n, t] : run.lora) {
    std::vector<int64_t> shape = {t.shape()[0], t.shape()[1]};
    layout.push_back({n, "h.1", int64_t(flat.size()), shape, false});
    std::vector<float> v = t.to_vector();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  while (flat.size() % size_t(world)) flat.push_back(0.0f);
  const int64_t numel = int64_t(flat.size()), share = numel / world;
  Tensor all = Tensor::from_vector(flat, Shape{numel});
  run.ckpt = tmp.path("run/checkpoints/step_00000006");
  fs::create_directories(run.ckpt);
  Manifest mf;
  mf.format_version = kFormatVersion;
  mf.step = 6;
  mf.world_size = world;
  mf.zero_stage = 2;
  mf.precision = "fp32";
  mf.segments.push_back({"h.1", numel});
  for (int r = 0; r < world; ++r) {
    ShardMeta m;
    m.step = 6;
    m.world_size = world;
    m.rank = r;
    m.zero_stage = 2;
    m.precision = "fp32";
    m.recipe_yaml = recipe;
    m.optimizer_step = 6;
    m.seed = 1;
    m.layout = layout;
    m.fdtrain_version = "fdtrain test";
    m.base_sha256 = file_sha256(run.base);
    SegmentRange range{"h.1", numel, r * share, share, {}, {}, {}, {}};
    range.master = all.flat_slice(r * share, share).to(DType::kF32);
    range.exp_avg = Tensor::zeros(Shape{share});
    range.exp_avg_sq = Tensor::zeros(Shape{share});
    write_shard((fs::path(run.ckpt) / shard_file_name(r)).string(), m, {range});
    mf.files.push_back(shard_file_name(r));
  }
  write_manifest(run.ckpt, mf);
  write_latest(tmp.path("run/checkpoints"), 6);
  return run;
}

TEST(LoraExport, AdapterFromACheckpoint) {
  TempDir tmp;
  LoraRun run = write_lora_run(tmp, 2);
  std::string summary =
      export_lora_adapter(tmp.path("run"), tmp.path("adapter"), DType::kF32, false);
  EXPECT_NE(summary.find("6 tensors"), std::string::npos) << summary;
  PeftAdapter a = read_peft_adapter(tmp.path("adapter"));
  EXPECT_EQ(a.spec, (LoraSpec{2, 3.0, 0.1, {"c_attn", "c_proj"}, {1}, run.base}));
  ASSERT_EQ(a.tensors.size(), run.lora.size());
  for (size_t i = 0; i < run.lora.size(); ++i) {
    EXPECT_EQ(a.tensors[i].first, run.lora[i].first);
    EXPECT_TRUE(same_bytes(a.tensors[i].second, run.lora[i].second)) << run.lora[i].first;
  }
  export_lora_adapter(tmp.path("run"), tmp.path("adapter_bf16"), DType::kBF16, false);
  PeftAdapter b = read_peft_adapter(tmp.path("adapter_bf16"));
  for (size_t i = 0; i < run.lora.size(); ++i)
    EXPECT_TRUE(same_bytes(b.tensors[i].second, run.lora[i].second.to(DType::kBF16)));

  std::string msg = error_of(
      [&] { export_lora_adapter(tmp.path("run"), tmp.path("adapter"), DType::kF32, false); });
  EXPECT_NE(msg.find("already exists"), std::string::npos) << msg;
  msg = error_of(
      [&] { export_checkpoint(tmp.path("run"), tmp.path("m.safetensors"), DType::kF32, false); });
  EXPECT_NE(msg.find("--lora-adapter DIR"), std::string::npos) << msg;
}

TEST(LoraExport, MergedModelIsTheBasePlusTheDeltas) {
  for (const char* ext : {".safetensors", ".h5"}) {
    TempDir tmp;
    LoraRun run = write_lora_run(tmp, 3);
    std::string out = tmp.path(std::string("merged") + ext);
    std::string summary = export_merged_lora(tmp.path("run"), out, DType::kF32, false);
    EXPECT_NE(summary.find("merged with the LoRA adapter"), std::string::npos) << summary;
    Named want = merge_lora(run.base_tensors, run.lora, 3.0 / 2.0);

    // Loads into a plain model of the recipe's size, and holds exactly the merge.
    auto model = testing::make_model(testing::tiny_config());
    load_weights(out, *model, "");
    std::map<std::string, Tensor> by_name(want.begin(), want.end());
    ASSERT_EQ(model->parameters().size(), want.size());
    for (const nn::Parameter* p : model->parameters()) {
      ASSERT_TRUE(by_name.count(p->name)) << p->name;
      EXPECT_TRUE(same_bytes(p->value, by_name[p->name])) << p->name;
    }
    if (std::string(ext) == ".safetensors") {
      SafetensorsFile f = SafetensorsFile::open(out);
      EXPECT_EQ(f.names().size(), want.size());  // no mask buffers, no lm_head
      EXPECT_EQ(f.metadata().at("base"), run.base);
      EXPECT_EQ(f.metadata().at("lora"), "r=2 alpha=3 targets=c_attn,c_proj layers=1");
      EXPECT_EQ(f.metadata().at("n_head"), "2");
      EXPECT_FALSE(same_bytes(f.load("h.1.attn.c_attn.weight"), run.base_tensors[16].second));
    }
  }
}

TEST(LoraExport, MergeRefusesABaseThatDoesNotFitTheRecipe) {
  TempDir tmp;
  LoraRun run = write_lora_run(tmp, 1, true, /*base_layers=*/3);  // 3 blocks; the recipe has 2
  std::string msg = error_of(
      [&] { export_merged_lora(tmp.path("run"), tmp.path("m.safetensors"), DType::kF32, false); });
  EXPECT_NE(msg.find("set model.n_layer to 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find(run.base), std::string::npos) << msg;
}

// The adapters are deltas to one file: another one at the base's path is
// refused by its SHA-256, whether its shapes differ or one value does.
TEST(LoraExport, MergeRefusesAnotherBaseFile) {
  TempDir tmp;
  LoraRun run = write_lora_run(tmp, 1);
  const std::string trained = file_sha256(run.base);
  std::string bytes;
  {
    std::ifstream in(run.base, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (int other = 0; other < 2; ++other) {
    if (other == 0) {
      write_safetensors(run.base, gpt2_base(3, kWidth, 64, 16, 21));  // 3 blocks
    } else {
      bytes[bytes.size() - 3] ^= 1;  // one bit of the last tensor's data
      std::ofstream(run.base, std::ios::binary | std::ios::trunc) << bytes;
    }
    std::string msg = error_of([&] {
      export_merged_lora(tmp.path("run"), tmp.path("m.safetensors"), DType::kF32, false);
    });
    EXPECT_NE(msg.find("trained on a base with SHA-256 " + trained + ", but model.init_from (" +
                       run.base + ") has " + file_sha256(run.base)),
              std::string::npos)
        << msg;
    EXPECT_FALSE(fs::exists(tmp.path("m.safetensors")));
  }
}

TEST(LoraExport, RefusesACheckpointWithoutALoraSection) {
  TempDir tmp;
  write_lora_run(tmp, 1, /*with_lora_section=*/false);
  std::string msg =
      error_of([&] { export_lora_adapter(tmp.path("run"), tmp.path("a"), DType::kF32, false); });
  EXPECT_NE(msg.find("not from a LoRA run"), std::string::npos) << msg;
}

TEST(LoraExport, FdtrainCkptExportCommands) {
  std::string bin = std::string(FD_BINARY_DIR) + "/bin/fdtrain";
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " not built";
  TempDir tmp;
  write_lora_run(tmp, 2);
  int rc = 0;
  std::string out = run_command(bin + " ckpt export '" + tmp.path("run") + "' --lora-adapter '" +
                                    tmp.path("adapter") + "' --merge-lora --out '" +
                                    tmp.path("merged.safetensors") + "'",
                                &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::exists(tmp.path("adapter/adapter_config.json"))) << out;
  EXPECT_TRUE(fs::exists(tmp.path("adapter/adapter_model.safetensors"))) << out;
  EXPECT_TRUE(fs::exists(tmp.path("merged.safetensors"))) << out;
  out = run_command(bin + " ckpt export '" + tmp.path("run") + "' --merge-lora", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--merge-lora needs --out"), std::string::npos) << out;
  out = run_command(bin + " ckpt export '" + tmp.path("run") + "' --out '" + tmp.path("x.h5") + "'",
                    &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("from a LoRA run"), std::string::npos) << out;
  out = run_command(
      bin + " ckpt export '" + tmp.path("run") + "' --lora-adapter '" + tmp.path("adapter") + "'",
      &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("already exists"), std::string::npos) << out;
}

}  // namespace
}  // namespace fd::ckpt
