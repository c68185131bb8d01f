#include "lib/data/token_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include "tests/data/data_test_util.h"

namespace fd::data {
namespace {

using test_util::expect_usage_error;
using test_util::LlmcHeader;
using test_util::write_bytes;
using test_util::write_llmc;

// The way out of a wrong format names both settings: the file may have come
// from a recipe (data.format) or from fdtrain eval (--format).
constexpr const char* kAsText =
    "to read it as raw text, set data.format: text in a recipe or --format text for fdtrain eval";

TEST(TokenFile, ReadsBackLlmcFile) {
  std::vector<uint16_t> tokens = {0, 1, 50256, 65535, 7, 300};
  std::string path = write_llmc("a.bin", tokens);
  TokenFile f = TokenFile::open(path, TokenFormat::kLlmc, 65536);
  EXPECT_EQ(f.format(), TokenFormat::kLlmc);
  ASSERT_EQ(f.size(), 6);
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(f[int64_t(i)], int32_t(tokens[i]));
  int32_t out[3];
  f.copy(2, 3, out);
  EXPECT_EQ(out[0], 50256);
  EXPECT_EQ(out[1], 65535);
  EXPECT_EQ(out[2], 7);
}

TEST(TokenFile, ReadsTextAsBytes) {
  std::string path = write_bytes("t.txt", "ab\xFF\n");
  TokenFile f = TokenFile::open(path, TokenFormat::kText, 256);
  EXPECT_EQ(f.format(), TokenFormat::kText);
  ASSERT_EQ(f.size(), 4);
  EXPECT_EQ(f[0], 'a');
  EXPECT_EQ(f[2], 255);
  EXPECT_EQ(f[3], '\n');
}

TEST(TokenFile, AutoDetectsFormat) {
  EXPECT_EQ(TokenFile::open(write_llmc("tokens.dat", {1, 2}), TokenFormat::kAuto, 300).format(),
            TokenFormat::kLlmc);
  EXPECT_EQ(TokenFile::open(write_bytes("notes.txt", "hello"), TokenFormat::kAuto, 256).format(),
            TokenFormat::kText);
  // A .bin without the magic is taken as a token file and rejected clearly.
  expect_usage_error(
      [&] {
        TokenFile::open(write_bytes("x.bin", std::string(2000, 'a')), TokenFormat::kAuto, 256);
      },
      {"not an llm.c token file", kAsText});
}

TEST(TokenFile, FormatNames) {
  EXPECT_EQ(token_format_from_name("llmc"), TokenFormat::kLlmc);
  EXPECT_EQ(token_format_from_name("text"), TokenFormat::kText);
  EXPECT_EQ(token_format_from_name("auto"), TokenFormat::kAuto);
  EXPECT_EQ(token_format_from_name("bin"), std::nullopt);
  EXPECT_EQ(token_format_name(TokenFormat::kLlmc), "llmc");
}

TEST(TokenFile, RejectsBadMagic) {
  std::string path = write_llmc("x.bin", {1, 2, 3}, LlmcHeader{.magic = 12345});
  expect_usage_error([&] { TokenFile::open(path, TokenFormat::kLlmc, 50257); },
                     {path, "not an llm.c token file (magic 12345, expected 20240520)",
                      "llm.c's data scripts", kAsText});
}

// Version 2 and llm.c's LLaMA-3 files hold uint32 tokens.
std::string write_llmc32(const std::string& name, const std::vector<uint32_t>& tokens,
                         LlmcHeader h) {
  std::vector<int32_t> header(256, 0);
  header[0] = h.magic;
  header[1] = h.version;
  header[2] = int32_t(h.count.value_or(int64_t(tokens.size())));
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), 4 * tokens.size());
  return write_bytes(name, bytes);
}

TEST(TokenFile, ReadsUint32Versions) {
  const std::vector<uint32_t> ids = {0, 70000, 128255, 5};
  for (const LlmcHeader h : {LlmcHeader{.version = 2}, LlmcHeader{.magic = 20240801, .version = 7}}) {
    const std::string path = write_llmc32("x32.bin", ids, h);
    const TokenFile f = TokenFile::open(path, TokenFormat::kLlmc, 128256);
    ASSERT_EQ(f.size(), 4);
    std::vector<int32_t> out(4);
    f.copy(0, 4, out.data());
    EXPECT_EQ(out, (std::vector<int32_t>{0, 70000, 128255, 5}));
    EXPECT_EQ(f[1], 70000);
    expect_usage_error([&] { TokenFile::open(path, TokenFormat::kLlmc, 128000); },
                       {path, "token id 128255 at position 2", "model.vocab_size = 128000"});
  }
  // An id of 2^31 or more (negative as int32) is out of range, not a crash.
  const std::string big = write_llmc32("big.bin", {1, 0x80000001u}, LlmcHeader{.version = 2});
  expect_usage_error([&] { TokenFile::open(big, TokenFormat::kLlmc, 128256); },
                     {big, "at position 1"});
  // A uint32 file whose size matches uint16 tokens is caught by the size check.
  const std::string truncated = write_llmc("t.bin", {1, 2, 3, 4}, LlmcHeader{.version = 2});
  expect_usage_error([&] { TokenFile::open(truncated, TokenFormat::kLlmc, 128256); },
                     {truncated, "header says 4 tokens but the file holds 2"});
}

TEST(TokenFile, RejectsBadVersion) {
  std::string path = write_llmc("x.bin", {1, 2, 3}, LlmcHeader{.version = 3});
  expect_usage_error([&] { TokenFile::open(path, TokenFormat::kLlmc, 50257); },
                     {path, "version 3", "fdtrain tokenize"});
  std::string llama3 = write_llmc("y.bin", {1, 2}, LlmcHeader{.magic = 20240801, .version = 1});
  expect_usage_error([&] { TokenFile::open(llama3, TokenFormat::kLlmc, 50257); },
                     {llama3, "LLaMA-3 token file version 1, expected 7"});
}

TEST(TokenFile, RejectsTruncatedFile) {
  std::vector<uint16_t> tokens(1000, 5);
  std::string path = write_llmc("x.bin", tokens, {}, 4);  // 998 tokens left
  expect_usage_error([&] { TokenFile::open(path, TokenFormat::kLlmc, 50257); },
                     {path, "header says 1000 tokens but the file holds 998",
                      "file size 3020 bytes, expected 3024", "truncated"});
}

TEST(TokenFile, RejectsTrailingBytes) {
  std::string path = write_llmc("x.bin", {1, 2, 3}, LlmcHeader{.count = 2});
  expect_usage_error([&] { TokenFile::open(path, TokenFormat::kLlmc, 50257); },
                     {path, "header says 2 tokens but the file holds 3", "trailing bytes"});
}

TEST(TokenFile, RejectsZeroOrNegativeCount) {
  std::string zero = write_llmc("zero.bin", {}, LlmcHeader{.count = 0});
  expect_usage_error([&] { TokenFile::open(zero, TokenFormat::kLlmc, 50257); },
                     {zero, "header says 0 tokens"});
  std::string neg = write_llmc("neg.bin", {}, LlmcHeader{.count = -3});
  expect_usage_error([&] { TokenFile::open(neg, TokenFormat::kLlmc, 50257); },
                     {neg, "header says -3 tokens"});
}

TEST(TokenFile, RejectsFileShorterThanHeader) {
  std::string path = write_bytes("short.bin", std::string(100, '\0'));
  expect_usage_error([&] { TokenFile::open(path, TokenFormat::kLlmc, 50257); },
                     {path, "100 bytes, shorter than the 1024-byte", kAsText});
}

TEST(TokenFile, RejectsEmptyFile) {
  for (TokenFormat fmt : {TokenFormat::kLlmc, TokenFormat::kText, TokenFormat::kAuto}) {
    std::string path = write_bytes("empty.bin", "");
    expect_usage_error([&] { TokenFile::open(path, fmt, 50257); }, {path, "empty file"});
  }
}

TEST(TokenFile, RejectsMissingFileAndDirectory) {
  std::string path = test_util::temp_path("missing.bin");
  expect_usage_error([&] { TokenFile::open(path, TokenFormat::kAuto, 50257); },
                     {path, "no such file"});
  std::string dir = test_util::temp_path("adir");
  std::filesystem::create_directories(dir);
  expect_usage_error([&] { TokenFile::open(dir, TokenFormat::kAuto, 50257); },
                     {dir, "is a directory, not a regular file"});
}

TEST(TokenFile, RejectsDevicesAndFifosWithoutWaiting) {
  expect_usage_error([&] { TokenFile::open("/dev/zero", TokenFormat::kAuto, 50257); },
                     {"/dev/zero", "is a character device, not a regular file"});
  std::string fifo = test_util::temp_path("fifo");
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // Opening a FIFO for reading would wait for a writer: it must be refused at once.
  expect_usage_error([&] { TokenFile::open(fifo, TokenFormat::kText, 256); },
                     {fifo, "is a FIFO, not a regular file"});
}

TEST(TokenFile, RejectsTokenIdAtOrAboveVocabSize) {
  std::string path = write_llmc("x.bin", {1, 2, 99, 50257, 4, 60000});
  expect_usage_error([&] { TokenFile::open(path, TokenFormat::kLlmc, 50257); },
                     {path, "token id 50257 at position 3", "model.vocab_size = 50257"});
  EXPECT_NO_THROW(TokenFile::open(path, TokenFormat::kLlmc, 60001));
  // Text: bytes above a small vocabulary.
  std::string text = write_bytes("t.txt", "abc\xC3\xA9");
  expect_usage_error([&] { TokenFile::open(text, TokenFormat::kText, 128); },
                     {text, "token id 195 at position 3", "model.vocab_size = 128", "byte tokens"});
}

}  // namespace
}  // namespace fd::data
