// LoRA adapters in PEFT format: write -> read is exact (settings and
// tensors); an independent Python reader (json + struct only) finds PEFT's
// keys, shapes and config; merging matches a float64 reference; malformed
// adapters are refused with one message naming the file. (The checkpoint
// exports --lora-adapter and --merge-lora, which read the run's recipe, are
// tested in tests/engine/export_test.cc.)
#include "lib/ckpt/peft.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>

#include "lib/base/strings.h"
#include "lib/tensor/safetensors.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/ckpt/lora_test_util.h"

namespace fd::ckpt {
namespace {

using testing::error_of;
using testing::run_command;
using testing::TempDir;
namespace fs = std::filesystem;
using testing::gpt2_base;
using testing::kWidth;
using testing::Named;
using testing::random_lora;
using testing::random_tensor;
using testing::same_bytes;

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
  // A directory of the user's named like the staging directory is never touched, and the
  // fresh staging directory (a.tmp-XXXXXX) is gone once the adapter is in place.
  fs::create_directories(tmp.path("a.tmp"));
  write_text(tmp.path("a.tmp/mine.txt"), "mine");
  write_peft_adapter(tmp.path("a"), test_spec(), test_lora(), true);
  EXPECT_EQ(read_text(tmp.path("a.tmp/mine.txt")), "mine");
  for (const auto& e : fs::directory_iterator(tmp.path("")))
    EXPECT_EQ(e.path().filename().string().rfind("a.tmp-", 0), std::string::npos) << e.path();
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
      {"corrupt json", edit_config("{", "{{"), "adapter_config.json", "not valid JSON"},
      // Integers past int are refused, not narrowed (2^32 + 2 would read as 2).
      {"r past int", edit_config("\"r\": 2", "\"r\": 4294967298"), "adapter_config.json",
       "r must be an integer in [1, 65536], got 4294967298"},
      {"layer past int",
       edit_config("\"layers_to_transform\": [", "\"layers_to_transform\": [4294967296, "),
       "adapter_config.json", "layers_to_transform holds 4294967296"},
      {"config a directory",
       [](const std::string& d) {
         fs::remove(d + "/adapter_config.json");
         fs::create_directories(d + "/adapter_config.json");
       },
       "adapter_config.json", "is a directory, not a regular file"},
      {"NaN weight", rewrite_tensors([](Named& t) {
         t[0].second.f32()[1] = std::numeric_limits<float>::quiet_NaN();
       }),
       "adapter_model.safetensors", "holds NaN at element 1"},
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

}  // namespace
}  // namespace fd::ckpt

// ---------------------------------------------------------------------------
// The Llama family: Linear [out, in] layers under model.layers.N.

namespace fd::ckpt {
namespace {

using testing::error_of;
using testing::Named;

Tensor seeded(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  return testing::random_tensor(shape, rng);
}
using testing::TempDir;
namespace fs = std::filesystem;

// Adapters on q_proj (64 -> 64) and v_proj (64 -> 32) of blocks 0 and 1, r 4.
Named llama_lora() {
  Named out;
  uint32_t seed = 1;
  for (int l = 0; l < 2; ++l)
    for (auto [m, n_out] : {std::pair<const char*, int64_t>{"q_proj", 64}, {"v_proj", 32}}) {
      const std::string p = fmt::format("model.layers.{}.self_attn.{}.", l, m);
      out.emplace_back(p + "lora_A.weight", seeded(Shape{4, 64}, seed++));
      out.emplace_back(p + "lora_B.weight", seeded(Shape{n_out, 4}, seed++));
    }
  return out;
}

TEST(PeftLlama, WritesPeftNamesAndReadsBack) {
  TempDir tmp;
  LoraSpec spec;
  spec.r = 4;
  spec.alpha = 8;
  spec.targets = {"all-linear"};  // as the recipe may say: written as the modules' short names
  write_peft_adapter(tmp.path("a"), spec, llama_lora(), false);
  std::ifstream cfg(tmp.path("a") + "/adapter_config.json");
  const std::string text(std::istreambuf_iterator<char>(cfg), {});
  EXPECT_NE(text.find("\"fan_in_fan_out\": false"), std::string::npos) << text;
  EXPECT_NE(text.find("\"target_modules\": [\n    \"q_proj\",\n    \"v_proj\"\n  ]"),
            std::string::npos)
      << text;
  SafetensorsFile f = SafetensorsFile::open(tmp.path("a") + "/adapter_model.safetensors");
  const std::vector<std::string> names = f.names();
  EXPECT_NE(std::find(names.begin(), names.end(),
                      "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"),
            names.end());
  EXPECT_EQ(peft_key("model.layers.0.self_attn.q_proj.lora_A.weight"),
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");

  PeftAdapter a = read_peft_adapter(tmp.path("a"));
  EXPECT_EQ(a.spec.targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  const Named want = llama_lora();
  ASSERT_EQ(a.tensors.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(a.tensors[i].first, want[i].first);
    EXPECT_TRUE(a.tensors[i].second.to_vector() == want[i].second.to_vector()) << want[i].first;
  }

  // fan_in_fan_out true would transpose Linear weights: refused.
  std::string edited = text;
  edited.replace(edited.find("\"fan_in_fan_out\": false"), 23, "\"fan_in_fan_out\": true");
  std::ofstream(tmp.path("a") + "/adapter_config.json") << edited;
  const std::string msg = error_of([&] { read_peft_adapter(tmp.path("a")); });
  EXPECT_NE(msg.find("fan_in_fan_out is true, but the Llama family"), std::string::npos) << msg;
}

TEST(PeftLlama, MergeIsWPlusScaledBA) {
  const Named lora = llama_lora();
  Named base = {{"model.layers.0.self_attn.q_proj.weight", seeded(Shape{64, 64}, 90)},
                {"model.layers.0.self_attn.v_proj.weight", seeded(Shape{32, 64}, 91)},
                {"model.layers.1.self_attn.q_proj.weight", seeded(Shape{64, 64}, 92)},
                {"model.layers.1.self_attn.v_proj.weight", seeded(Shape{32, 64}, 93)}};
  const Named merged = merge_lora(base, lora, 2.0);
  double worst = 0;
  for (size_t k = 0; k < base.size(); ++k) {
    const std::vector<float> w = base[k].second.to_vector(), got = merged[k].second.to_vector();
    const std::vector<float> a = lora[2 * k].second.to_vector(),
                             b = lora[2 * k + 1].second.to_vector();
    const int64_t n_out = base[k].second.shape()[0], in = 64;
    for (int64_t o = 0; o < n_out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double d = 0;
        for (int64_t q = 0; q < 4; ++q) d += double(b[size_t(o * 4 + q)]) * a[size_t(q * in + i)];
        const double want = double(w[size_t(o * in + i)]) + 2.0 * d;
        worst = std::max(
            worst, std::fabs(got[size_t(o * in + i)] - want) / std::max(1e-6, std::fabs(want)));
      }
  }
  std::printf("Llama merge: largest relative difference %.3e\n", worst);
  EXPECT_LT(worst, 1e-6);
}

}  // namespace
}  // namespace fd::ckpt
