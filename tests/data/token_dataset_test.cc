#include "lib/data/token_dataset.h"

#include <gtest/gtest.h>

#include <numeric>

#include "tests/data/data_test_util.h"

namespace fd::data {
namespace {

using test_util::expect_usage_error;
using test_util::write_bytes;
using test_util::write_llmc;

std::vector<uint16_t> iota_tokens(int n, uint16_t first) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<int32_t> all(const TokenStream& s) {
  std::vector<int32_t> out(size_t(s.size()));
  s.copy(0, s.size(), out.data());
  return out;
}

TEST(TokenDataset, ConcatenatesFilesAndHoldsOutTail) {
  DatasetOptions o;
  o.train_files = {write_llmc("a.bin", iota_tokens(60, 0)),
                   write_llmc("b.bin", iota_tokens(40, 1000))};
  o.val_fraction = 0.25;
  o.seq_len = 8;
  o.vocab_size = 2000;
  TokenDataset d(o);
  ASSERT_EQ(d.train().size(), 75);
  ASSERT_EQ(d.val().size(), 25);
  EXPECT_TRUE(d.has_val());
  std::vector<int32_t> train = all(d.train());
  std::vector<int32_t> val = all(d.val());
  // Train: file a (0..59) then the first 15 tokens of b; val: the last 25 of b.
  for (int i = 0; i < 60; ++i) EXPECT_EQ(train[i], i);
  for (int i = 60; i < 75; ++i) EXPECT_EQ(train[i], 1000 + (i - 60));
  for (int i = 0; i < 25; ++i) EXPECT_EQ(val[i], 1015 + i);
  // A copy that crosses the file boundary.
  int32_t buf[4];
  d.train().copy(58, 4, buf);
  EXPECT_EQ(std::vector<int32_t>(buf, buf + 4), (std::vector<int32_t>{58, 59, 1000, 1001}));
  EXPECT_NE(d.summary().find("train 75 tokens (2 files)"), std::string::npos) << d.summary();
  EXPECT_NE(d.summary().find("val 25 tokens (last 25% of train)"), std::string::npos)
      << d.summary();
}

TEST(TokenDataset, TextFilesAppendBytes) {
  DatasetOptions o;
  o.train_files = {write_bytes("a.txt", "hello "), write_bytes("b.txt", "world")};
  o.val_fraction = 0.0;
  o.seq_len = 4;
  o.vocab_size = 256;
  o.format = TokenFormat::kText;
  TokenDataset d(o);
  EXPECT_FALSE(d.has_val());
  std::vector<int32_t> t = all(d.train());
  EXPECT_EQ(std::string(t.begin(), t.end()), "hello world");
  EXPECT_NE(d.summary().find("no validation split"), std::string::npos);
}

TEST(TokenDataset, UsesValFilesWhenGiven) {
  DatasetOptions o;
  o.train_files = {write_llmc("train.bin", iota_tokens(50, 0))};
  o.val_files = {write_llmc("val.bin", iota_tokens(20, 500))};
  o.val_fraction = 0.5;  // ignored: val files given
  o.seq_len = 10;
  o.vocab_size = 1000;
  TokenDataset d(o);
  EXPECT_EQ(d.train().size(), 50);
  EXPECT_EQ(d.val().size(), 20);
  EXPECT_EQ(d.val()[0], 500);
  EXPECT_EQ(d.train()[49], 49);
}

TEST(TokenDataset, RejectsShortSplits) {
  DatasetOptions o;
  o.train_files = {write_llmc("a.bin", iota_tokens(400, 0))};
  o.val_fraction = 0.1;  // 40 tokens
  o.seq_len = 128;
  o.vocab_size = 1000;
  expect_usage_error([&] { TokenDataset{o}; },
                     {"data: the validation split holds 40 tokens, fewer than seq_len + 1 = 129",
                      "add data, lower data.val_fraction or data.seq_len"});
  o.seq_len = 400;
  expect_usage_error([&] { TokenDataset{o}; },
                     {"the training split holds 360 tokens, fewer than seq_len + 1 = 401"});
  o.seq_len = 10;
  o.val_files = {write_llmc("v.bin", iota_tokens(10, 0))};
  expect_usage_error(
      [&] { TokenDataset{o}; },
      {"validation split holds 10 tokens, fewer than seq_len + 1 = 11", "add validation data"});
}

TEST(TokenDataset, RejectsBadOptions) {
  DatasetOptions o;
  o.seq_len = 4;
  o.vocab_size = 256;
  expect_usage_error([&] { TokenDataset{o}; }, {"no training files", "set data.train"});
  o.train_files = {write_bytes("a.txt", "some text here")};
  o.val_fraction = 1.0;
  expect_usage_error([&] { TokenDataset{o}; }, {"val_fraction must be in [0, 1)"});
  o.val_fraction = 0.0;
  o.val_files = o.train_files;
  expect_usage_error([&] { TokenDataset{o}; }, {"both a training and a validation file"});
}

TEST(TokenDataset, PropagatesFileErrors) {
  DatasetOptions o;
  o.train_files = {write_llmc("good.bin", iota_tokens(50, 0)),
                   write_llmc("bad.bin", {1, 2, 70}, {}, 2)};
  o.seq_len = 4;
  o.vocab_size = 100;
  expect_usage_error([&] { TokenDataset{o}; }, {"bad.bin", "header says 3 tokens"});
}

}  // namespace
}  // namespace fd::data
