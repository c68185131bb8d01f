// Fine-tuning records: the chat (messages and ShareGPT), instruct and text shapes, JSONL and
// JSON arrays, and every malformed record reported with FILE:LINE and what is wrong, or
// skipped and counted.
#include "lib/data/sft_records.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "tests/data/data_test_util.h"

namespace fd::data {
namespace {

using test_util::expect_usage_error;
using test_util::write_bytes;

RecordOptions options(RecordFormat f, BadRecords bad = BadRecords::kError) {
  RecordOptions o;
  o.format = f;
  o.bad = bad;
  return o;
}
RecordOptions chat() { return options(RecordFormat::kChat); }

TEST(SftRecords, ChatMessagesAndShareGpt) {
  const std::string f = write_bytes(
      "chat.jsonl",
      "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
      "\"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello\"}]}\n"
      "\n"
      "{\"conversations\": [{\"from\": \"human\", \"value\": \"2+2?\"}, {\"from\": \"gpt\", "
      "\"value\": \"4\"}]}\n");
  RecordStats stats;
  std::vector<Record> r = read_records({f}, chat(), &stats);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(stats.records, 2);
  ASSERT_EQ(r[0].messages.size(), 3u);
  EXPECT_EQ(r[0].messages[0].role, "system");
  EXPECT_EQ(r[0].messages[2].content, "Hello");
  EXPECT_EQ(r[0].where, f + ":1");
  EXPECT_EQ(r[1].where, f + ":3");
  ASSERT_EQ(r[1].messages.size(), 2u);
  EXPECT_EQ(r[1].messages[0].role, "user");
  EXPECT_EQ(r[1].messages[1].role, "assistant");
  EXPECT_EQ(r[1].messages[1].content, "4");
}

TEST(SftRecords, InstructBecomesAnExchangeAndKeepsItsFields) {
  const std::string f =
      write_bytes("alpaca.json",
                  "[{\"instruction\": \"Add\", \"input\": \"2 and 2\", \"output\": \"4\"},"
                  " {\"q\": \"Name a colour\", \"a\": \"Red\"}]");
  RecordOptions o = options(RecordFormat::kInstruct);
  expect_usage_error([&] { read_records({f}, o, nullptr); },
                     {f + ": element 1", "missing \"instruction\""});
  o.bad = BadRecords::kSkip;
  RecordStats stats;
  std::vector<Record> r = read_records({f}, o, &stats);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(stats.skipped, 1);
  ASSERT_EQ(stats.skip_reasons.size(), 1u);
  EXPECT_NE(stats.skip_reasons[0].find("element 1"), std::string::npos);
  EXPECT_EQ(r[0].messages[0].content, "Add\n\n2 and 2");
  EXPECT_EQ(r[0].messages[1].content, "4");
  EXPECT_EQ(r[0].instruction, "Add");
  EXPECT_EQ(r[0].input, "2 and 2");
  // Configurable field names.
  o.fields.instruction = "q";
  o.fields.output = "a";
  r = read_records({f}, o, nullptr);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].messages[0].content, "Name a colour");
}

TEST(SftRecords, EveryBadRecordNamesItsLine) {
  const struct {
    const char* line;
    const char* what;
  } cases[] = {
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}", "not valid JSON"},
      {"[1, 2]", "not a JSON object"},
      {"{\"msgs\": []}", "missing \"messages\""},
      {"{\"messages\": {}}", "not an array"},
      {"{\"messages\": []}", "is empty"},
      {"{\"messages\": [{\"role\": \"user\"}]}", "messages[0]: missing \"content\""},
      {"{\"messages\": [{\"content\": \"x\"}]}", "messages[0]: missing \"role\""},
      {"{\"messages\": [{\"role\": \"user\", \"content\": 3}]}", "\"content\" is a number"},
      {"{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", "role \"robot\""},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "no assistant message"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"system\", "
       "\"content\": \"y\"}, {\"role\": \"assistant\", \"content\": \"z\"}]}",
       "may only come first"},
      {"{\"conversations\": [{\"from\": \"alien\", \"value\": \"x\"}]}", "\"from\": \"alien\""},
  };
  for (const auto& c : cases) {
    const std::string f = write_bytes("bad.jsonl", std::string("\n") + c.line + "\n");
    expect_usage_error([&] { read_records({f}, chat(), nullptr); },
                       {f + ":2: ", c.what, "on_bad_record"});
  }
}

TEST(SftRecords, SkipCountsAndKeepsTheGoodOnes) {
  std::string text;
  for (int i = 0; i < 15; ++i) text += "{\"text\": 1}\n{\"text\": \"ok\"}\n";
  const std::string f = write_bytes("t.jsonl", text);
  RecordOptions o = options(RecordFormat::kText, BadRecords::kSkip);
  RecordStats stats;
  std::vector<Record> r = read_records({f}, o, &stats);
  EXPECT_EQ(r.size(), 15u);
  EXPECT_EQ(stats.skipped, 15);
  EXPECT_EQ(stats.skip_reasons.size(), RecordStats::kMaxReasons);
  EXPECT_EQ(r[0].text, "ok");
}

TEST(SftRecords, RefusesFilesThatAreNotDatasets) {
  const std::string txt = write_bytes("a.txt", "hello");
  expect_usage_error([&] { read_records({txt}, chat(), nullptr); }, {txt, ".jsonl"});
  expect_usage_error([&] { read_records({"/nonexistent/x.jsonl"}, chat(), nullptr); },
                     {"/nonexistent/x.jsonl", "cannot open"});
  const std::string obj = write_bytes("o.json", "{\"messages\": []}");
  expect_usage_error([&] { read_records({obj}, chat(), nullptr); }, {obj, "one array"});
  const std::string broken = write_bytes("b.json", "[{\"a\": 1},");
  expect_usage_error([&] { read_records({broken}, chat(), nullptr); }, {broken, "not valid JSON"});
}

// Hostile files (issue 35): deep nesting, endless lines, files that are not files.
TEST(SftRecords, NestingLineLengthAndFileKindAreBounded) {
  const std::string good = "{\"text\": \"ok\"}\n";
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string d = write_bytes("deep.jsonl", good + deep + "\n" + good);
  expect_usage_error([&] { read_records({d}, options(RecordFormat::kText), nullptr); },
                     {d + ":2: arrays and objects nested deeper than 128 levels"});
  RecordStats stats;
  EXPECT_EQ(read_records({d}, options(RecordFormat::kText, BadRecords::kSkip), &stats).size(), 2u);
  EXPECT_EQ(stats.skipped, 1);
  // A line longer than kMaxJsonLineBytes (64 MiB) is a bad record, and is not read into memory
  // whole.
  const std::string long_line = write_bytes(
      "long.jsonl", good + "{\"text\": \"" + std::string(size_t{64} << 20, 'x') + "\"}\n" + good);
  stats = {};
  EXPECT_EQ(
      read_records({long_line}, options(RecordFormat::kText, BadRecords::kSkip), &stats).size(),
      2u);
  ASSERT_EQ(stats.skip_reasons.size(), 1u);
  EXPECT_NE(stats.skip_reasons[0].find("long.jsonl:2: the line is longer than 67108864 bytes"),
            std::string::npos)
      << stats.skip_reasons[0];
  // Where a line is not JSON: its column.
  const std::string bad = write_bytes("bad.jsonl", good + "{\"text\": tru}\n");
  expect_usage_error([&] { read_records({bad}, options(RecordFormat::kText), nullptr); },
                     {bad + ":2: not valid JSON at column 13: ", "(a .jsonl file holds one JSON"});
  // A .json dataset nested too deeply; a directory and a FIFO named .jsonl (a FIFO would block).
  const std::string dj = write_bytes("deep.json", "[" + deep + "]");
  expect_usage_error([&] { read_records({dj}, options(RecordFormat::kText), nullptr); },
                     {dj, "nested deeper than 128 levels"});
  const std::string dir = test_util::temp_path("dir.jsonl");
  std::filesystem::create_directories(dir);
  expect_usage_error([&] { read_records({dir}, chat(), nullptr); },
                     {dir, "is a directory, not a regular file"});
  const std::string fifo = test_util::temp_path("fifo.jsonl");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_usage_error([&] { read_records({fifo}, chat(), nullptr); }, {fifo, "not a regular file"});
  const std::string fifo_json = test_util::temp_path("fifo.json");
  std::filesystem::remove(fifo_json);
  ASSERT_EQ(::mkfifo(fifo_json.c_str(), 0600), 0);
  expect_usage_error([&] { read_records({fifo_json}, chat(), nullptr); },
                     {fifo_json, "not a regular file"});
}

}  // namespace
}  // namespace fd::data
