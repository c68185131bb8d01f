// The recipe reference (reference.h) against the schema it documents: the
// documented defaults are the defaults a loaded recipe gets, every documented
// key is accepted and nothing else is, and a stored recipe is read without
// its files.
#include "lib/config/reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <optional>
#include <set>

#include "lib/base/strings.h"
#include "lib/config/schema.h"
#include "tests/config/test_util.h"

namespace fd::config {
namespace {

std::optional<double> as_number(const std::string& s) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// "section.key" (or "key") -> the value to_yaml() prints on that key's line.
std::map<std::string, std::string> printed_values(const Recipe& r) {
  std::map<std::string, std::string> out;
  std::string section, map;
  for (const std::string& line : split(to_yaml(r), '\n')) {
    if (line.empty() || line[0] == '#' || line.rfind("    - ", 0) == 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t depth = line.find_first_not_of(' ') / 2;  // 0 section, 1 key, 2 key of a map
    std::string key = line.substr(2 * depth, colon - 2 * depth);
    std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (depth == 0) section = key;
    if (depth == 1 && value.empty()) map = key;  // a map (or a block list) follows
    if (depth == 2) {
      out[section + "." + map + "." + key] = value;
    } else {
      out[depth == 1 ? section + "." + key : key] = value;
    }
  }
  return out;
}

// Each documented default is what a recipe that leaves the key out gets: the
// value to_yaml() prints for a default Recipe (with a default lora section,
// for the lora keys, a default model.quantize map, for its keys, and a default objective
// section, for its keys). Numbers
// compare as numbers ("3e-4" == "0.0003").
TEST(Reference, DefaultsAreTheRecipeDefaults) {
  Recipe r;
  r.lora = LoraOptions{};
  r.model.quantize = QuantizeOptions{};
  r.objective = ObjectiveOptions{};
  const std::map<std::string, std::string> printed = printed_values(r);
  // Defaults that are not a fixed value: lora.alpha defaults to lora.r, and the
  // Llama family's keys (printed only for those archs) have per-arch defaults.
  std::set<std::string> derived = {"lora.alpha"};
  for (const char* k :
       {"n_kv_head", "head_dim", "d_ff", "norm_eps", "rope_theta", "rope_scaling", "rope_factor",
        "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_seq_len",
        "tie_embeddings", "attention_bias", "mlp_bias", "qk_norm"})
    derived.insert(std::string("model.") + k);
  Recipe llama = r;
  llama.model.arch = Arch::kLlama;
  const std::map<std::string, std::string> printed_llama = printed_values(llama);
  for (const std::string& k : derived)
    if (k.rfind("model.", 0) == 0) {
      EXPECT_FALSE(printed.count(k)) << k << " is printed for a gpt2 model";
      EXPECT_TRUE(printed_llama.count(k)) << k << " is not printed for a llama model";
    }
  int compared = 0;
  for (const KeyDoc& k : key_reference()) {
    if (k.required() || derived.count(k.path)) continue;
    auto it = printed.find(k.path);
    ASSERT_NE(it, printed.end()) << k.path << " is documented but to_yaml() does not print it";
    std::optional<double> doc = as_number(k.default_value), got = as_number(it->second);
    if (doc && got)
      EXPECT_EQ(*doc, *got) << k.path << ": documented default " << k.default_value;
    else
      EXPECT_EQ(k.default_value, it->second) << k.path;
    ++compared;
  }
  EXPECT_GE(compared, 50);
  // And the other way: every key to_yaml() prints is documented.
  std::set<std::string> documented;
  std::set<std::string> maps;  // zero.offload_optimizer: a map of documented keys
  for (const KeyDoc& k : key_reference()) {
    documented.insert(k.path);
    if (std::count(k.path.begin(), k.path.end(), '.') == 2)
      maps.insert(k.path.substr(0, k.path.rfind('.')));
  }
  for (const auto& [path, value] : printed_llama) {
    if (!is_section(path) && !maps.count(path)) {
      EXPECT_TRUE(documented.count(path)) << path << " is not documented";
    }
  }
}

TEST(Reference, RequiredKeysAreTheRequiredOnes) {
  std::set<std::string> required;
  for (const KeyDoc& k : key_reference())
    if (k.required()) required.insert(k.path);
  // model.d_ff: required for the Llama family only (gpt2's MLP is 4 x d_model); lora.r and
  // objective.name when their section is there.
  EXPECT_EQ(required, (std::set<std::string>{"data.train", "steps", "lora.r", "model.d_ff",
                                             "objective.name"}));
}

// The loader accepts exactly the documented keys.
TEST(Reference, EveryDocumentedKeyIsAcceptedAndNothingElse) {
  std::set<std::string> seen;
  for (const KeyDoc& k : key_reference()) {
    EXPECT_TRUE(seen.insert(k.path).second) << k.path << " is documented twice";
    EXPECT_EQ(check_key_path(k.path), "") << k.path;
    EXPECT_FALSE(k.type.empty() || k.description.empty()) << k.path;
  }
  for (const SectionDoc& s : section_reference()) {
    EXPECT_TRUE(is_section(s.name)) << s.name;
    EXPECT_NE(check_key_path(s.name + ".no_such_key"), "") << s.name;
  }
  EXPECT_NE(check_key_path("no_such_section"), "");
  EXPECT_NE(check_key_path("model.nlayer").find("did you mean 'n_layer'"), std::string::npos);
}

TEST(Reference, FormatsNameEveryKey) {
  const std::string text = format_reference_text(), md = format_reference_markdown();
  for (const KeyDoc& k : key_reference()) {
    EXPECT_NE(text.find("  " + k.path + ": " + k.type), std::string::npos) << k.path;
    // A section's table names its keys without the section (offload_optimizer.device in zero's).
    const std::string in_section = k.path.substr(k.path.find('.') + 1);
    EXPECT_NE(md.find("| `" + in_section + "` | "), std::string::npos) << k.path;
  }
  for (const SectionDoc& s : section_reference())
    EXPECT_NE(md.find("## `" + s.name + "`"), std::string::npos) << s.name;
  EXPECT_NE(md.find("| `n_layer` | int | `4` | >= 1 | transformer blocks |"), std::string::npos);
  EXPECT_NE(md.find("| `steps` | int | **required** | >= 1 |"), std::string::npos);
}

// A checkpoint's stored recipe names files of another machine: they are kept
// as written, not looked for; the same text through try_parse_recipe() fails.
TEST_F(ConfigTest, StoredRecipeNeedNotFindItsFiles) {
  const std::string yaml =
      "model: {n_layer: 2, n_head: 3, d_model: 24, init_from: /nowhere/base.safetensors}\n"
      "data: {train: [/nowhere/a.txt, /nowhere/b*.txt], seq_len: 16}\n"
      "lora: {r: 4, adapter: /nowhere/adapter}\n"
      "device: cuda\n"
      "steps: 5\n";
  LoadResult stored = try_parse_stored_recipe(yaml, "stored");
  ASSERT_TRUE(stored.ok()) << ::testing::PrintToString(stored.errors);
  EXPECT_EQ(stored.recipe.model.n_head, 3);
  EXPECT_EQ(stored.recipe.data.train,
            (std::vector<std::string>{"/nowhere/a.txt", "/nowhere/b*.txt"}));
  EXPECT_EQ(stored.recipe.model.init_from, "/nowhere/base.safetensors");
  LoadResult fresh = try_parse_recipe(yaml, "fresh");
  EXPECT_EQ(fresh.errors.size(), 4u) << ::testing::PrintToString(fresh.errors);
  // Everything else is still checked.
  LoadResult bad = try_parse_stored_recipe("model: {n_head: 0}\ndata: {train: x}\nsteps: 1\n", "s");
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_NE(bad.errors[0].find("model.n_head: must be >= 1"), std::string::npos) << bad.errors[0];
}

}  // namespace
}  // namespace fd::config
