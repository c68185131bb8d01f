// Function-calling chat data, template variables and content parts: records with
// tool_calls, tool results and a "tools" list render byte for byte as @huggingface/jinja
// renders the real templates of Llama 3.2, Qwen 2.5, Qwen 3 and Mistral Nemo (the reference
// run live: tests/data/chat_hf_reference.mjs), enable_thinking among the variables; the
// labels cover exactly each assistant turn (its tool calls included) and its end of turn,
// never a tool's result; and every malformed record is refused with FILE:LINE and why.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/data/chat_template.h"
#include "lib/data/example_dataset.h"
#include "lib/text/hf_tokenizer.h"
#include "tests/data/data_test_util.h"

namespace fd::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test_util::expect_usage_error;
using test_util::write_bytes;

const fs::path kSource = FD_SOURCE_DIR;
const fs::path kModels = kSource / "tests/fixtures/npm/node_modules/@lenml";

// Llama 3.1's template with tools comes from @huggingface/ollama-utils, over Llama 3.2's
// tokenizer (make_llama3_1_fixture.mjs), in a directory of this process's own.
fs::path models_root(const std::string& name) {
  if (name != "llama3_1") return kModels;
  // Made once, removed when the process ends.
  struct Fixture {
    fs::path dir = fs::temp_directory_path() / fmt::format("fd_llama3_1_{}", ::getpid());
    Fixture() {
      const std::string cmd = fmt::format(
          "node {} {}", (kSource / "tests/data/make_llama3_1_fixture.mjs").string(), dir.string());
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    ~Fixture() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  };
  static const Fixture fixture;
  return fixture.dir;
}

std::string model_dir(const std::string& name) {
  return (models_root(name) / ("tokenizer-" + name) / "models").string();
}

std::shared_ptr<const text::Tokenizer> tokenizer(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const text::Tokenizer>> cache;
  auto [it, fresh] = cache.try_emplace(name);
  if (fresh) it->second = text::load_tokenizer(model_dir(name));
  return it->second;
}

bool npm_installed() {
  return fs::exists(kSource / "tests/fixtures/npm/node_modules/@huggingface/jinja/package.json");
}

// The reference's renderings: (template, line) -> {ok, text | error}.
std::map<std::pair<std::string, int>, json> reference(const std::string& templates,
                                                      const std::string& records,
                                                      const std::string& vars,
                                                      const std::string& parts = "",
                                                      const fs::path& models = kModels) {
  const fs::path out =
      fs::temp_directory_path() / fmt::format("fd_chat_tools_{}.jsonl", ::getpid());
  std::string cmd = fmt::format("node {} --models {} --templates {} --records {} --out {}",
                                (kSource / "tests/data/chat_hf_reference.mjs").string(),
                                models.string(), templates, records, out.string());
  if (!vars.empty()) cmd += " --vars '" + vars + "'";
  if (!parts.empty()) cmd += " --parts " + parts;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::map<std::pair<std::string, int>, json> ref;
  std::ifstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    json j = json::parse(line);
    ref[{j["template"].get<std::string>(), j["line"].get<int>()}] = j;
  }
  fs::remove(out);
  return ref;
}

int line_of(const Record& r) { return std::stoi(r.where.substr(r.where.rfind(':') + 1)); }

// Where an assistant turn's generation prompt ends, and its end of turn, per family.
struct Family {
  const char* name;
  std::vector<std::string> headers;  // the text right before a target ends with one of these
  const char* eot;
};
const Family kFamilies[] = {
    {"llama3_1", {"<|start_header_id|>assistant<|end_header_id|>\n\n"}, "<|eot_id|>"},
    {"llama3_2", {"<|start_header_id|>assistant<|end_header_id|>\n\n"}, "<|eot_id|>"},
    {"qwen2_5", {"<|im_start|>assistant\n"}, "<|im_end|>"},
    {"qwen3", {"<|im_start|>assistant\n"}, "<|im_end|>"},
    {"mistral_nemo", {"[/INST]", "[/TOOL_RESULTS]"}, "</s>"},
};

std::vector<const Family*> all_families() {
  std::vector<const Family*> all;
  for (const Family& f : kFamilies) all.push_back(&f);
  return all;
}

// Renders every record as the reference does, and checks the labels: one target per
// assistant message, starting right after the family's assistant header, ending with its
// end-of-turn token, holding the turn's calls (name and arguments) and no tool result.
void check_file(const std::string& file, const std::vector<const Family*>& families,
                const std::string& vars) {
  const std::string path = (kSource / "tests/data" / file).string();
  RecordOptions o;
  const std::vector<Record> records = read_records({path}, o, nullptr);
  std::map<std::pair<std::string, int>, json> ref;
  for (const Family* f : families)
    ref.merge(reference(f->name, path, vars, "", models_root(f->name)));
  int compared = 0;
  for (const Family* f : families) {
    ChatTemplate t = ChatTemplate::load("", model_dir(f->name));
    EXPECT_FALSE(t.iterates_parts()) << f->name;
    if (!vars.empty()) {
      // Only Llama 3.1 and 3.2 read date_string: the others name it as unread.
      const std::vector<std::string> unread =
          t.set_variables(nlohmann::ordered_json::parse(vars), "vars");
      const bool date = vars.find("date_string") != std::string::npos;
      EXPECT_EQ(unread, date && !std::string(f->name).starts_with("llama3_")
                            ? std::vector<std::string>{"date_string"}
                            : std::vector<std::string>{});
    }
    for (const Record& r : records) {
      SCOPED_TRACE(fmt::format("{} {} {}", f->name, r.where, vars));
      const json& want = ref.at({f->name, line_of(r)});
      ASSERT_TRUE(want["ok"].get<bool>()) << want.dump();
      const std::string text = t.render(r, false);
      ASSERT_EQ(text, want["text"].get<std::string>());
      const RenderedChat rc = t.render_targets(r, tokenizer(f->name)->special_tokens());
      ASSERT_EQ(rc.text, text);
      size_t a = 0;
      for (const Message& m : r.messages) {
        if (m.role != "assistant") continue;
        ASSERT_LT(a, rc.targets.size());
        const TextSpan s = rc.targets[a++];
        const std::string target = text.substr(size_t(s.begin), size_t(s.end - s.begin));
        const std::string before = text.substr(0, size_t(s.begin));
        EXPECT_TRUE(std::any_of(f->headers.begin(), f->headers.end(),
                                [&](const std::string& h) { return before.ends_with(h); }))
            << "target: " << target << "\nafter: " << before.substr(before.size() - 40);
        EXPECT_TRUE(target.ends_with(f->eot)) << target;
        EXPECT_EQ(target.find(f->eot), target.size() - std::string(f->eot).size()) << target;
        for (const ToolCall& c : m.tool_calls) {
          EXPECT_NE(target.find("\"" + c.name + "\""), std::string::npos) << target;
          const std::string first_key = json::parse(c.arguments).begin().key();
          EXPECT_NE(target.find("\"" + first_key + "\""), std::string::npos) << target;
        }
        if (m.tool_calls.empty()) {
          EXPECT_NE(target.find(m.content.substr(0, 8)), std::string::npos) << target;
        }
      }
      EXPECT_EQ(a, rc.targets.size());
      for (const Message& m : r.messages) {
        if (m.role != "tool") continue;
        for (const TextSpan& s : rc.targets) {
          const std::string target = text.substr(size_t(s.begin), size_t(s.end - s.begin));
          EXPECT_EQ(target.find(m.content.substr(0, 12)), std::string::npos)
              << "a tool result inside a target: " << target;
        }
      }
      ++compared;
    }
  }
  EXPECT_EQ(compared, int(records.size() * families.size()));
}

TEST(ChatTools, RecordsRenderAsHuggingFaceAndLabelEachTurnWithItsCalls) {
  if (!npm_installed()) GTEST_SKIP() << "tests/fixtures/npm is not installed";
  // Llama 3.2 dates its system prompt with strftime_now: both sides get the same date.
  check_file("chat_tools_records.jsonl", all_families(), R"({"date_string": "26 Jul 2024"})");
}

TEST(ChatTools, Qwen3WithoutThinkingRendersAsHuggingFace) {
  if (!npm_installed()) GTEST_SKIP() << "tests/fixtures/npm is not installed";
  // The last answer's generation prompt holds the empty think block.
  const Family qwen3 = {
      "qwen3",
      {"<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"},
      "<|im_end|>"};
  check_file("chat_tools_records.jsonl", {&qwen3}, R"({"enable_thinking": false})");
}

TEST(ChatTools, ParallelCallsRenderAsHuggingFace) {
  if (!npm_installed()) GTEST_SKIP() << "tests/fixtures/npm is not installed";
  check_file("chat_tools_parallel.jsonl", {&kFamilies[2], &kFamilies[3], &kFamilies[4]}, "");
  // Llama 3.1 and 3.2 allow one call per message: their raise_exception, with the record's
  // line.
  const std::string path = (kSource / "tests/data/chat_tools_parallel.jsonl").string();
  const std::vector<Record> records = read_records({path}, RecordOptions{}, nullptr);
  for (const char* name : {"llama3_1", "llama3_2"}) {
    ChatTemplate t = ChatTemplate::load("", model_dir(name));
    expect_usage_error([&] { t.render(records[0], false); },
                       {"chat_tools_parallel.jsonl:1", "only supports single tool-calls"});
  }
}

// Qwen 3's last answer: with thinking on (the default) the model writes its (empty) think
// block, so it is part of the target; with enable_thinking false the generation prompt holds
// it, so the target is the answer alone.
TEST(ChatTools, Qwen3ThinkBlockOfTheLastAnswerFollowsEnableThinking) {
  Record r;
  r.messages = {{"user", "Q1"}, {"assistant", "A1"}, {"user", "Q2"}, {"assistant", "A2"}};
  r.where = "test";
  auto last_target = [&](const std::string& vars) {
    ChatTemplate t = ChatTemplate::load("", model_dir("qwen3"));
    if (!vars.empty()) t.set_variables(nlohmann::ordered_json::parse(vars), "data.template_vars");
    const RenderedChat rc = t.render_targets(r, tokenizer("qwen3")->special_tokens());
    const TextSpan s = rc.targets.at(1);
    return rc.text.substr(size_t(s.begin), size_t(s.end - s.begin));
  };
  EXPECT_EQ(last_target(""), "<think>\n\n</think>\n\nA2<|im_end|>");
  EXPECT_EQ(last_target(R"({"enable_thinking": false})"), "A2<|im_end|>");
  EXPECT_EQ(last_target(R"({"enable_thinking": true})"), "<think>\n\n</think>\n\nA2<|im_end|>");
}

// Target tokens decode to exactly the target spans (encode_example cuts at their edges).
TEST(ChatTools, TargetTokensAreTheSpans) {
  const std::string path = (kSource / "tests/data/chat_tools_records.jsonl").string();
  const std::vector<Record> records = read_records({path}, RecordOptions{}, nullptr);
  for (const char* name : {"qwen2_5", "mistral_nemo"}) {
    ExampleOptions o;
    o.tokenizer = tokenizer(name);
    o.chat_template = std::make_shared<const ChatTemplate>(ChatTemplate::load("", model_dir(name)));
    for (const Record& r : records) {
      SCOPED_TRACE(fmt::format("{} {}", name, r.where));
      const EncodedExample e = encode_example(r, o);
      const RenderedChat rc = o.chat_template->render_targets(r, o.tokenizer->special_tokens());
      std::string want;
      for (const TextSpan& s : rc.targets)
        want += rc.text.substr(size_t(s.begin), size_t(s.end - s.begin));
      std::vector<int32_t> ids;
      for (size_t i = 0; i < e.tokens.size(); ++i)
        if (e.target[i]) ids.push_back(e.tokens[i]);
      EXPECT_EQ(o.tokenizer->decode(ids, false), want);
    }
  }
}

// Content given as text parts: joined for templates that print content as a string, the
// list itself for a template that iterates parts (Gemma 3), each as @huggingface/jinja.
TEST(ChatTools, ContentPartsAreJoinedOrPassedAsTheTemplateReadsThem) {
  if (!npm_installed()) GTEST_SKIP() << "tests/fixtures/npm is not installed";
  const std::string path = write_bytes(
      "parts.jsonl",
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "  Name two "}, {"type": "text", "text": "colours.  "}]}, {"role": "assistant", "content": [{"type": "text", "text": "Red"}, {"type": "text", "text": " and blue."}]}]})"
      "\n");
  const std::vector<Record> records = read_records({path}, RecordOptions{}, nullptr);
  ASSERT_EQ(records[0].messages[1].content, "Red and blue.");
  const auto ref = reference("gemma3,qwen2_5", path, "", "gemma3=pass,qwen2_5=join");
  for (const char* name : {"gemma3", "qwen2_5"}) {
    SCOPED_TRACE(name);
    const ChatTemplate t = ChatTemplate::load("", model_dir(name));
    EXPECT_EQ(t.iterates_parts(), std::string(name) == "gemma3");
    const json& want = ref.at({name, 1});
    ASSERT_TRUE(want["ok"].get<bool>()) << want.dump();
    EXPECT_EQ(t.render(records[0], false), want["text"].get<std::string>());
    const RenderedChat rc = t.render_targets(records[0], tokenizer(name)->special_tokens());
    ASSERT_EQ(rc.targets.size(), 1u);
    const TextSpan s = rc.targets[0];
    EXPECT_TRUE(rc.text.substr(size_t(s.begin)).starts_with("Red")) << rc.text;
  }
}

TEST(ChatTools, TemplateVariablesAreCheckedAndUnreadOnesNamed) {
  ChatTemplate t = ChatTemplate::load("", model_dir("qwen3"));
  const auto vars = [](const char* s) { return nlohmann::ordered_json::parse(s); };
  EXPECT_EQ(t.set_variables(vars(R"({"enable_thinking": false, "reasoning_effort": "high"})"),
                            "data.template_vars"),
            std::vector<std::string>{"reasoning_effort"});
  expect_usage_error(
      [&] { t.set_variables(vars(R"({"enable_thinking": "no"})"), "data.template_vars"); },
      {"data.template_vars.enable_thinking", "is a string", "want a boolean"});
  expect_usage_error([&] { t.set_variables(vars(R"({"date_string": 26})"), "data.template_vars"); },
                     {"data.template_vars.date_string", "is a number", "want a string"});
  for (const char* reserved :
       {"messages", "tools", "add_generation_prompt", "range", "bos_token"}) {
    expect_usage_error(
        [&] {
          t.set_variables(nlohmann::ordered_json{{reserved, 1}}, "data.template_vars");
        },
        {fmt::format("data.template_vars.{}", reserved), "cannot be a template variable"});
  }
  expect_usage_error([&] { t.set_variables(vars("[1, 2]"), "data.template_vars"); },
                     {"data.template_vars", "not a mapping"});
  // A date_string reaches Llama 3.2's system prompt.
  ChatTemplate llama = ChatTemplate::load("", model_dir("llama3_2"));
  llama.set_variables(vars(R"({"date_string": "01 Jan 2030"})"), "data.template_vars");
  Record r;
  r.messages = {{"user", "Hi"}, {"assistant", "Hello"}};
  EXPECT_NE(llama.render(r, false).find("Today Date: 01 Jan 2030"), std::string::npos);
}

// Each malformed record: FILE:LINE and the reason; with on_bad_record: skip, counted.
TEST(ChatTools, MalformedToolRecordsAreRefusedWithTheirLine) {
  const std::string ok_user = R"({"role": "user", "content": "Weather?"})";
  const std::string call =
      R"({"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "w", "arguments": ARGS}}]})";
  auto with_args = [&](const std::string& args) {
    std::string c = call;
    c.replace(c.find("ARGS"), 4, args);
    return c;
  };
  const struct {
    std::string messages;
    std::vector<std::string> fragments;
  } cases[] = {
      {ok_user + ", " + with_args(R"("{\"city\": ")"),
       {"tool_calls[0].function.arguments: the string is not valid JSON"}},
      {ok_user + ", " + with_args("[1, 2]"),
       {"tool_calls[0].function.arguments is an array, not an object"}},
      {ok_user + ", " + with_args(R"("[1]")"),
       {"arguments is a string holding an array, not an object"}},
      {ok_user + R"(, {"role": "tool", "content": "18 C"}, {"role": "assistant", "content": "x"})",
       {"messages[1]: a tool result with no tool call before it"}},
      {ok_user + ", " + with_args(R"({"c": 1})") +
           R"(, {"role": "tool", "content": "18", "tool_call_id": "b"})",
       {"messages[2]: tool_call_id \"b\" is not the id of a call"}},
      {R"({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, {"role": "assistant", "content": "x"})",
       {"messages[0]: content[0]: part type \"image_url\" is not supported"}},
      {R"({"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}, {"role": "assistant", "content": "x"})",
       {"messages[0]: \"tool_calls\" on a user message"}},
      {R"({"role": "user", "content": "x"}, {"role": "assistant", "content": null})",
       {"messages[1]: \"content\" is null"}},
      {ok_user + R"(, {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]})",
       {"tool_calls[0].function: missing \"name\""}},
      {ok_user + R"(, {"role": "assistant", "content": "x", "tool_call_id": "a"})",
       {"messages[1]: \"tool_call_id\" on an assistant message"}},
      // Numbers a double cannot hold would render changed.
      {ok_user + ", " + with_args(R"({"id": 9007199254740993})"),
       {"messages[1]: tool_calls[0].function.arguments.id: 9007199254740993: the number is "
        "beyond 2^53",
        "give it as a string"}},
      {ok_user + ", " + with_args(R"("{\"n\": [1, -9007199254740993]}")"),
       {"tool_calls[0].function.arguments.n[1]: -9007199254740993: the number is beyond 2^53"}},
      {ok_user + ", " + with_args(R"({"big": 123456789012345678901234567890})"),
       {"tool_calls[0].function.arguments.big: 1.2345678901234568e+29"}},
      {ok_user + R"(, {"role": "assistant", "content": "x", "reasoning_content": 7})",
       {"messages[1]: \"reasoning_content\" is a number, not a string"}},
      {ok_user + R"(, {"role": "assistant", "content": "x", "meta": {"n": 18446744073709551615}})",
       {"messages[1].meta.n: 18446744073709551615: the number is beyond 2^53"}},
  };
  std::string file_text;
  for (const auto& c : cases) file_text += "{\"messages\": [" + c.messages + "]}\n";
  file_text +=
      R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "tools": {"a": 1}})"
      "\n";
  const std::string path = write_bytes("bad.jsonl", file_text);
  for (size_t i = 0; i < std::size(cases); ++i) {
    // Each record after a good one, alone in its file: its line and its reason.
    const std::string one = write_bytes(
        fmt::format("bad{}.jsonl", i),
        R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})"
        "\n{\"messages\": [" +
            cases[i].messages + "]}\n");
    std::vector<std::string> want = cases[i].fragments;
    want.push_back(fmt::format("bad{}.jsonl:2:", i));
    expect_usage_error([&] { read_records({one}, RecordOptions{}, nullptr); }, want);
  }
  RecordOptions skip;
  skip.bad = BadRecords::kSkip;
  RecordStats stats;
  EXPECT_TRUE(read_records({path}, skip, &stats).empty());
  EXPECT_EQ(stats.skipped, int64_t(std::size(cases)) + 1);
  expect_usage_error(
      [&] {
        read_records(
            {write_bytes("tools_big.jsonl",
                         R"({"messages": [{"role": "user", "content": "x"}, )"
                         R"({"role": "assistant", "content": "y"}], "tools": [{"type": )"
                         R"("function", "function": {"name": "f", "max": 9007199254740993}}]})"
                         "\n")},
            RecordOptions{}, nullptr);
      },
      {"tools_big.jsonl:1:", "tools[0].function.max: 9007199254740993: the number is beyond 2^53"});
  // 2^53 itself, and a number with a fraction, are held exactly: kept.
  Record exact;
  EXPECT_EQ(parse_record(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", )"
                         R"("tool_calls": [{"function": {"name": "f", "arguments": )"
                         R"({"a": 9007199254740992, "b": -9007199254740992, "c": 0.25}}}]}]})",
                         RecordOptions{}, &exact),
            "");
  expect_usage_error(
      [&] {
        read_records({write_bytes("tools.jsonl",
                                  R"({"messages": [{"role": "user", "content": "x"}, )"
                                  R"({"role": "assistant", "content": "y"}], "tools": {"a": 1}})"
                                  "\n")},
                     RecordOptions{}, nullptr);
      },
      {"tools.jsonl:1:", "\"tools\" is an object, not a list"});
  // What exports write on every message is no call, name or tools: null and [].
  Record export_like;
  EXPECT_EQ(
      parse_record(
          R"({"messages": [{"role": "user", "content": "q", "tool_calls": [], "name": null}, )"
          R"({"role": "assistant", "content": "a", "tool_calls": null, "tool_call_id": null}], "tools": []})",
          RecordOptions{}, &export_like),
      "");
  EXPECT_TRUE(export_like.tools.empty());
  EXPECT_TRUE(export_like.messages[0].tool_calls.empty());
  // Preference pairs do not read tool calls.
  RecordOptions pref;
  pref.format = RecordFormat::kPreference;
  Record out;
  EXPECT_NE(parse_record(
                R"({"prompt": [{"role": "tool", "content": "x"}], "chosen": [], "rejected": []})",
                pref, &out)
                .find("tool results are read in data.format chat"),
            std::string::npos);
}

// A template that drops tool calls cannot label them: refused, naming the message.
TEST(ChatTools, ATemplateWithoutToolCallsIsRefused) {
  const std::string path = (kSource / "tests/data/chat_tools_records.jsonl").string();
  const std::vector<Record> records = read_records({path}, RecordOptions{}, nullptr);
  const ChatTemplate t = ChatTemplate::load("chatml", model_dir("qwen2_5"));
  expect_usage_error([&] { t.render_targets(records[0], tokenizer("qwen2_5")->special_tokens()); },
                     {"chat_tools_records.jsonl:1", "messages[1] (assistant)",
                      "does not write this message's "
                      "tool calls"});
}

// A message's other keys reach the template as Hugging Face passes them: Qwen 3 writes an
// assistant's reasoning_content in its think block (after the last user message only).
TEST(ChatTools, ReasoningAndOtherKeysRenderAsHuggingFace) {
  if (!npm_installed()) GTEST_SKIP() << "tests/fixtures/npm is not installed";
  check_file("chat_reasoning_records.jsonl", all_families(), R"({"date_string": "26 Jul 2024"})");
}

// The reasoning the template writes is the model's to write (in the target); what it drops
// is named, message by message, and counted by the dataset.
TEST(ChatTools, ReasoningIsTrainedWhereWrittenAndDroppedTextsAreNamed) {
  const std::string path = (kSource / "tests/data/chat_reasoning_records.jsonl").string();
  const std::vector<Record> records = read_records({path}, RecordOptions{}, nullptr);
  ASSERT_EQ(records.size(), 4u);
  auto key_list = [](const RenderedChat& rc) {
    std::vector<std::string> out;
    for (const NotWritten& n : rc.not_written)
      out.push_back(fmt::format("{} {}", n.message, n.key));
    return out;
  };
  const ChatTemplate qwen3 = ChatTemplate::load("", model_dir("qwen3"));
  const std::vector<std::string> special = tokenizer("qwen3")->special_tokens();
  RenderedChat rc = qwen3.render_targets(records[0], special);
  ASSERT_EQ(rc.targets.size(), 2u);
  auto span = [&](size_t i) {
    return rc.text.substr(size_t(rc.targets[i].begin),
                          size_t(rc.targets[i].end - rc.targets[i].begin));
  };
  EXPECT_EQ(span(0), "51.<|im_end|>");
  EXPECT_EQ(span(1), "<think>\n51 + 17 = 68.\n</think>\n\n68.<|im_end|>");
  EXPECT_EQ(key_list(rc), std::vector<std::string>{"1 reasoning_content"});
  // A call turn after the last user message keeps its reasoning, before its call.
  rc = qwen3.render_targets(records[1], special);
  ASSERT_EQ(rc.targets.size(), 2u);
  EXPECT_TRUE(
      span(0).starts_with("<think>\nThe user wants the weather; call get_weather.\n"
                          "</think>\n\n<tool_call>\n"))
      << span(0);
  EXPECT_EQ(span(1), "<think>\nThe tool says 3 C.\n</think>\n\nIt is 3 C in Oslo.<|im_end|>");
  EXPECT_TRUE(rc.not_written.empty());
  // A string key no template reads is named; a number or null is not looked for.
  rc = qwen3.render_targets(records[2], special);
  EXPECT_EQ(key_list(rc), std::vector<std::string>{"0 lang"});
  // Llama 3.2 writes no reasoning; its tool results go through tojson (no tags), and are
  // found as JSON writes them, short ones too.
  const ChatTemplate llama = ChatTemplate::load("", model_dir("llama3_2"));
  rc = llama.render_targets(records[0], tokenizer("llama3_2")->special_tokens());
  EXPECT_EQ(key_list(rc), (std::vector<std::string>{"1 reasoning_content", "3 reasoning_content"}));
  Record short_result;
  ASSERT_EQ(parse_record(R"({"messages": [{"role": "user", "content": "Weather?"}, )"
                         R"({"role": "assistant", "tool_calls": [{"id": "c1", "function": )"
                         R"({"name": "w", "arguments": {"city": "Oslo"}}}]}, )"
                         R"({"role": "tool", "tool_call_id": "c1", "content": "3 C"}, )"
                         R"({"role": "assistant", "content": "It is 3 C."}]})",
                         RecordOptions{}, &short_result),
            "");
  short_result.where = "short";
  rc = llama.render_targets(short_result, tokenizer("llama3_2")->special_tokens());
  EXPECT_TRUE(rc.not_written.empty()) << key_list(rc).front();

  // The dataset counts them by role and key, and says where the first is.
  ExampleOptions o;
  o.train_files = {path};
  o.val_fraction = 0;
  o.seq_len = 512;
  o.tokenizer = tokenizer("qwen3");
  o.vocab_size = o.tokenizer->vocab_size();
  o.chat_template =
      std::make_shared<const ChatTemplate>(ChatTemplate::load("", model_dir("qwen3")));
  ExampleDataset d(o);
  EXPECT_EQ(d.stats().not_written,
            (std::map<std::string, int64_t>{{"assistant reasoning_content", 1}, {"user lang", 1}}));
  const std::string warning = d.not_written_warning();
  EXPECT_NE(warning.find("1 assistant reasoning_content, 1 user lang"), std::string::npos)
      << warning;
  EXPECT_NE(warning.find("chat_reasoning_records.jsonl:1 messages[1]"), std::string::npos)
      << warning;
}

// A generation prompt that ends inside a special token: the target starts at the token, so
// that the model is trained to write all of it and the text is not tokenized apart.
TEST(ChatTools, ATargetNeverStartsInsideASpecialToken) {
  const ChatTemplate t = ChatTemplate::from_source(
      "{%- for m in messages -%}"
      "{%- if m.role == 'user' -%}<|user|>{{ m.content }}<|end|>"
      "{%- else -%}<|assistant|>{{ m.content }}<|end|>{%- endif -%}"
      "{%- endfor -%}"
      "{%- if add_generation_prompt -%}<|assistant|><|thi{%- endif -%}",
      "test template", "", "");
  Record r;
  r.messages = {{"user", "Q"}, {"assistant", "<|think|>R<|/think|>A"}};
  r.where = "test";
  const RenderedChat rc =
      t.render_targets(r, {"<|user|>", "<|assistant|>", "<|end|>", "<|think|>", "<|/think|>"});
  ASSERT_EQ(rc.targets.size(), 1u);
  EXPECT_EQ(rc.text.substr(size_t(rc.targets[0].begin)), "<|think|>R<|/think|>A<|end|>");
}

}  // namespace
}  // namespace fd::data

namespace fd::data {
namespace {

// Llama 3.1's built-in tools (brave_search, wolfram_alpha) end a call turn with <|eom_id|>,
// not the template's usual <|eot_id|>, and its templates write a tool's result through tojson
// (no provenance). A template written that way (3.1's is not among the npm fixtures): the
// target ends with the turn's own last special token and never reaches the result.
TEST(ChatTools, ACallTurnEndsAtItsOwnEndOfMessage) {
  const std::string source =
      "{%- for m in messages -%}"
      "{%- if m.role == 'tool' -%}{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' -}}"
      "{%- else -%}{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' -}}{%- endif -%}"
      "{%- if m.tool_calls is defined -%}"
      "{%- for c in m.tool_calls -%}{{- '<|python_tag|>' + c.function.name + '.call(query=' + "
      "c.function.arguments.query|tojson + ')' -}}{%- endfor -%}{{- '<|eom_id|>' -}}"
      "{%- elif m.role == 'tool' -%}{{- m.content|tojson + '<|eot_id|>' -}}"
      "{%- else -%}{{- m.content + '<|eot_id|>' -}}{%- endif -%}"
      "{%- endfor -%}"
      "{%- if add_generation_prompt -%}"
      "{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}";
  const ChatTemplate t = ChatTemplate::from_source(source, "builtin.jinja", "", "");
  Record r;
  if (std::string err = parse_record(
          R"({"messages": [{"role": "user", "content": "Who won?"}, )"
          R"({"role": "assistant", "tool_calls": [{"function": {"name": "brave_search", "arguments": {"query": "final"}}}]}, )"
          R"({"role": "tool", "content": "Team A won 2-1."}, {"role": "assistant", "content": "Team A won."}]})",
          RecordOptions{}, &r);
      !err.empty())
    FAIL() << err;
  r.where = "test";
  const RenderedChat rc = t.render_targets(r, tokenizer("llama3_2")->special_tokens());
  ASSERT_EQ(rc.targets.size(), 2u);
  auto span = [&](size_t i) {
    return rc.text.substr(size_t(rc.targets[i].begin),
                          size_t(rc.targets[i].end - rc.targets[i].begin));
  };
  EXPECT_EQ(span(0), "<|python_tag|>brave_search.call(query=\"final\")<|eom_id|>");
  EXPECT_EQ(span(1), "Team A won.<|eot_id|>");
}

// With on_bad_record: skip, a record its template refuses (Llama 3.2 allows one call per
// message) is left out and counted like a malformed one; with error it stops at its line.
TEST(ChatTools, RecordsTheTemplateRefusesAreSkippedAndCounted) {
  std::string text =
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]})"
      "\n";
  std::ifstream in(kSource / "tests/data/chat_tools_parallel.jsonl");
  for (std::string line; std::getline(in, line);) text += line + "\n";
  const std::string path = write_bytes("mixed.jsonl", text);
  ExampleOptions o;
  o.train_files = {path};
  o.val_fraction = 0;
  o.seq_len = 2048;
  o.tokenizer = tokenizer("llama3_2");
  o.vocab_size = o.tokenizer->vocab_size();
  o.chat_template =
      std::make_shared<const ChatTemplate>(ChatTemplate::load("", model_dir("llama3_2")));
  expect_usage_error([&] { ExampleDataset d(o); },
                     {"mixed.jsonl:2", "only supports single tool-calls"});
  o.records.bad = BadRecords::kSkip;
  ExampleDataset d(o);
  EXPECT_EQ(d.stats().train_examples, 1);
  EXPECT_EQ(d.stats().records.records, 1);
  EXPECT_EQ(d.stats().records.skipped, 2);
  ASSERT_EQ(d.stats().records.skip_reasons.size(), 2u);
  EXPECT_NE(d.stats().records.skip_reasons[0].find("mixed.jsonl:2: "), std::string::npos)
      << d.stats().records.skip_reasons[0];
  EXPECT_NE(d.stats().records.skip_reasons[0].find("only supports single tool-calls"),
            std::string::npos);
}

}  // namespace
}  // namespace fd::data
