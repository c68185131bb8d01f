// The tokenizer.json components on their own: Hugging Face's split behaviours
// (its documented "the-final--countdown" example), Digits, Metaspace's
// prepend schemes, and a refusal naming the JSON path and type for each
// malformed or unsupported component. Exactness on real files is
// hf_tokenizer_test.cc's.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/base/error.h"
#include "lib/text/hf_tokenizer.h"
#include "lib/text/pre_tokenizer.h"
#include "tests/base/error_test_util.h"

namespace fd::text {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test_util::expect_usage_error;

std::vector<std::string> words(const char* pre_tokenizer, std::string_view text,
                               PreTokenizer::Place place = PreTokenizer::kAtStart) {
  const PreTokenizer p = PreTokenizer::from_json(json::parse(pre_tokenizer), "test");
  PreTokenizer::Scratch scratch;
  std::vector<Span> spans;
  const std::string_view out = p.split(text, place, scratch, spans);
  std::vector<std::string> result;
  for (const Span& s : spans) result.emplace_back(out.substr(s.begin, s.end - s.begin));
  return result;
}

using W = std::vector<std::string>;

TEST(PreTokenizer, SplitBehavioursAsHuggingFaceDocumentsThem) {
  auto split = [](const char* behavior, bool invert = false) {
    return words(fmt::format(R"({{"type": "Split", "pattern": {{"String": "-"}},
                                  "behavior": "{}", "invert": {}}})",
                             behavior, invert)
                     .c_str(),
                 "the-final--countdown");
  };
  EXPECT_EQ(split("Removed"), (W{"the", "final", "countdown"}));
  EXPECT_EQ(split("Isolated"), (W{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithPrevious"), (W{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithNext"), (W{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split("Contiguous"), (W{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(split("Removed", true), (W{"-", "-", "-"}));
}

TEST(PreTokenizer, DigitsAndByteLevelRegex) {
  EXPECT_EQ(words(R"({"type": "Digits", "individual_digits": true})", "Call 123!"),
            (W{"Call ", "1", "2", "3", "!"}));
  EXPECT_EQ(words(R"({"type": "Digits", "individual_digits": false})", "Call 123!"),
            (W{"Call ", "123", "!"}));
  EXPECT_EQ(words(R"({"type": "ByteLevel", "add_prefix_space": true, "use_regex": true})",
                  "Hello  world's"),
            (W{" Hello", " ", " world", "'s"}));
}

TEST(PreTokenizer, MetaspacePrependSchemes) {
  const char* first =
      R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true})";
  EXPECT_EQ(words(first, "Hey friend"), (W{"\u2581Hey", "\u2581friend"}));
  EXPECT_EQ(words(first, "Hey friend", PreTokenizer::kInside), (W{"Hey", "\u2581friend"}));
  EXPECT_EQ(words(first, "Hey", PreTokenizer::kContinuing), (W{"Hey"}));
  const char* always =
      R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": false})";
  EXPECT_EQ(words(always, "Hey  you", PreTokenizer::kInside), (W{"\u2581Hey\u2581\u2581you"}));
  EXPECT_EQ(words(always, "Hey", PreTokenizer::kContinuing), (W{"Hey"}));
}

// A tiny byte-level tokenizer.json; `edit` changes it before loading.
std::string tiny(const std::function<void(json&)>& edit) {
  json j = json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [{"id": 4, "content": "<eos>", "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null,
              "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3},
              "merges": ["a b"]}
  })");
  edit(j);
  return j.dump();
}

void expect_refused(const std::function<void(json&)>& edit, const std::string& fragment) {
  try {
    HfTokenizer::from_strings(tiny(edit), "", "tok.json");
    ADD_FAILURE() << "accepted; expected: " << fragment;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(HfTokenizerLoad, TinyTokenizerEncodesAndDecodes) {
  const auto tok = HfTokenizer::from_strings(tiny([](json&) {}), "", "tok.json");
  EXPECT_EQ(tok->encode("ab ab<eos>"), (std::vector<int32_t>{2, 3, 2, 4}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{2, 3, 2, 4}), "ab ab<eos>");
  EXPECT_EQ(tok->decode(std::vector<int32_t>{2, 4}, /*skip_special=*/true), "ab");
  EXPECT_EQ(tok->vocab_size(), 5);
}

TEST(HfTokenizerLoad, RefusesWhatItDoesNotImplementByJsonPath) {
  expect_refused([](json& j) { j["model"]["type"] = "WordPiece"; },
                 "tok.json: model.type: the model type \"WordPiece\" is not supported");
  expect_refused([](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout");
  expect_refused([](json& j) { j["model"]["merges"].push_back("a zz"); },
                 "model.merges[1]: \"zz\" is not in the vocabulary");
  expect_refused([](json& j) { j["model"]["merges"].push_back("a b c"); },
                 "model.merges[1]: \"a b c\" is not two tokens");
  expect_refused([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; },
                 "normalizer: the normalizer type \"Lowercase\" is not supported");
  expect_refused(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers", {{{"type", "Digits"}}, {{"type", "Whitespace"}}}}};
      },
      "pre_tokenizer.pretokenizers[1]: the pre-tokenizer type \"Whitespace\" is not supported");
  expect_refused(
      [](json& j) {
        j["pre_tokenizer"] = {
            {"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "ByteLevel"}},
              {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Isolated"}}}}};
      },
      "pre_tokenizer.pretokenizers[1]: a pre-tokenizer after ByteLevel is not supported");
  expect_refused(
      [](json& j) {
        j["pre_tokenizer"] = {
            {"type", "Split"}, {"pattern", {{"Regex", "\\bx"}}}, {"behavior", "Isolated"}};
      },
      "word boundary");
  expect_refused(
      [](json& j) {
        j["pre_tokenizer"] = {
            {"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}};
      },
      "pre_tokenizer.pattern.Regex: the pattern \"(a\" does not compile");
  expect_refused(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Odd"}};
      },
      "\"behavior\" must be one of");
  expect_refused([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; },
                 "decoder: the decoder type \"WordPiece\" is not supported");
  expect_refused([](json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; },
                 "post_processor: the post-processor type \"RobertaProcessing\"");
  expect_refused([](json& j) { j["truncation"] = {{"max_length", 8}}; }, "truncation");
  expect_refused([](json& j) { j.erase("model"); }, "\"model\" is missing");
  expect_refused([](json& j) { j["added_tokens"][0].erase("id"); }, "added_tokens[0]");
}

TEST(HfTokenizerLoad, ConfigTokensMustExist) {
  EXPECT_EQ(*HfTokenizer::from_strings(tiny([](json&) {}), R"({"eos_token": "<eos>"})", "d/t.json")
                 ->eos_id(),
            4);
  try {
    HfTokenizer::from_strings(tiny([](json&) {}), R"({"bos_token": "<s>"})", "d/t.json");
    ADD_FAILURE() << "accepted a bos_token outside the vocabulary";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("d/tokenizer_config.json: bos_token \"<s>\" is not a token"),
              std::string::npos)
        << e.what();
  }
}

TEST(HfTokenizerLoad, JsonSyntaxErrorsNameLineAndColumn) {
  try {
    HfTokenizer::from_strings("{\n  \"model\": {\n    \"vocab\": [1,,2]\n}", "", "x/tokenizer.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x/tokenizer.json: line 3, column 17: not valid JSON"),
              std::string::npos)
        << e.what();
  }
}

// Hostile files (issue 35). Nesting: a normalizer Sequence 50,000 deep, refused before any
// code recurses over it (it used to overflow the stack); the same in tokenizer_config.json.
TEST(HfTokenizerLoad, DeepNestingIsRefusedNotACrash) {
  std::string deep;
  for (int i = 0; i < 50000; ++i) deep += R"({"type": "Sequence", "normalizers": [)";
  deep += R"({"type": "NFC"})";
  for (int i = 0; i < 50000; ++i) deep += "]}";
  std::string text = tiny([](json& j) { j["normalizer"] = "@deep@"; });
  text.replace(text.find("\"@deep@\""), 8, deep);
  expect_usage_error([&] { HfTokenizer::from_strings(text, "", "d/tokenizer.json"); },
                     {"d/tokenizer.json: ", "nested deeper than 128 levels"});
  expect_usage_error(
      [&] {
        HfTokenizer::from_strings(tiny([](json&) {}), R"({"bos_token": )" + deep + "}",
                                  "d/tokenizer.json");
      },
      {"d/tokenizer_config.json: ", "nested deeper than 128 levels"});
}

// Ids: every id read is checked as an id (an int32 below kMaxTokenIds), never wrapped or
// truncated (2^40 used to become 0; 2^31 - 1 ended in an internal error writing tokens).
TEST(HfTokenizerLoad, IdsOutsideTheRangeOfAnIdAreRefused) {
  for (const int64_t id : {int64_t{2147483647}, int64_t{1} << 40, int64_t{-1}, int64_t{1} << 24}) {
    expect_usage_error(
        [&] {
          HfTokenizer::from_strings(tiny([&](json& j) { j["added_tokens"][0]["id"] = id; }), "",
                                    "tok.json");
        },
        {"tok.json: added_tokens[0]: the added token \"<eos>\" has the id " + std::to_string(id),
         "outside the ids a tokenizer may use ([0, 16777216))"});
    expect_usage_error(
        [&] {
          HfTokenizer::from_strings(tiny([&](json& j) { j["model"]["vocab"]["ab"] = id; }), "",
                                    "tok.json");
        },
        {"tok.json: model.vocab[\"ab\"]: the id " + std::to_string(id), "outside the ids"});
  }
  expect_usage_error(
      [&] {
        HfTokenizer::from_strings(
            tiny([](json& j) { j["added_tokens"][0]["id"] = uint64_t{18446744073709551615u}; }), "",
            "tok.json");
      },
      {"added_tokens[0]: the added token \"<eos>\" has the id 18446744073709551615"});
  // The largest id allowed is allowed.
  EXPECT_EQ(HfTokenizer::from_strings(
                tiny([](json& j) { j["added_tokens"][0]["id"] = (int64_t{1} << 24) - 1; }), "",
                "tok.json")
                ->vocab_size(),
            int64_t{1} << 24);
  // The post-processor's ids.
  expect_usage_error(
      [&] {
        HfTokenizer::from_strings(tiny([](json& j) {
                                    j["post_processor"] = json::parse(R"({
              "type": "TemplateProcessing",
              "single": [{"SpecialToken": {"id": "<eos>", "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}}],
              "special_tokens": {"<eos>": {"id": "<eos>", "ids": [4294967300], "tokens": ["<eos>"]}}
            })");
                                  }),
                                  "", "tok.json");
      },
      {"post_processor.single[0]: \"<eos>\" has the id 4294967300, outside the tokenizer's 5 ids"});
}

// eos_token_id in the model's generation_config.json / config.json: 2^32 + 4 is not 4.
TEST(HfTokenizerLoad, EosIdsOfTheModelAreRangeChecked) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("fd_tok_eos_{}", ::getpid());
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << tiny([](json&) {});
  std::ofstream(dir / "config.json") << R"({"eos_token_id": [4, 4294967300]})";
  expect_usage_error(
      [&] { HfTokenizer::load((dir / "tokenizer.json").string()); },
      {(dir / "config.json").string(), "eos_token_id 4294967300 is outside the tokenizer's 5 ids"});
  std::ofstream(dir / "config.json") << R"({"eos_token_id": 4})";
  EXPECT_EQ(HfTokenizer::load((dir / "tokenizer.json").string())->stop_ids(),
            (std::vector<int32_t>{4}));
  // Not a regular file: refused by name, not read (a FIFO would block).
  fs::remove(dir / "config.json");
  fs::create_directory(dir / "config.json");
  expect_usage_error([&] { HfTokenizer::load((dir / "tokenizer.json").string()); },
                     {(dir / "config.json").string(), "is a directory, not a regular file"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fd::text
