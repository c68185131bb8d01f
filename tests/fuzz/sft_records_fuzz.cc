// Fuzz target: fine-tuning records (lib/data/sft_records.h: read_records,
// parse_record) in every shape: chat ({"messages": ...} and ShareGPT's
// {"conversations": ...}), instruct (Alpaca) and text.
//
// Input: a dataset file (any bytes). It is read as a .jsonl file (one record
// a line) and as a .json file (one array of records), in each format, with
// bad records skipped (and, for chat, with bad records an error); and parsed
// whole as one record in each format. Checked: each either succeeds or throws fd::Error
// (parse_record: returns "" or a reason), and the records keep their
// promises: counts add up, at most kMaxReasons reasons; a chat record has
// messages with roles system, user or assistant, a system message only
// first, and an assistant message when one is required; an instruct record is
// [user, assistant] with the user's text built from instruction and input;
// every record names where it came from.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "lib/data/sft_records.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using fd::data::BadRecords;
using fd::data::Record;
using fd::data::RecordFormat;
using fd::data::RecordOptions;

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "sft_records_fuzz: %s\n", what.c_str());
  std::abort();
}

void check_record(const Record& r, const RecordOptions& o, bool need_where) {
  if (need_where && r.where.empty()) broken("a record without its place");
  switch (o.format) {
    case RecordFormat::kText:
      if (!r.messages.empty()) broken("a text record with messages");
      return;
    case RecordFormat::kInstruct: {
      if (r.messages.size() != 2 || r.messages[0].role != "user" ||
          r.messages[1].role != "assistant")
        broken("an instruct record that is not [user, assistant]");
      const std::string user = r.input.empty() ? r.instruction : r.instruction + "\n\n" + r.input;
      if (r.messages[0].content != user) broken("an instruct record's user text is not I + X");
      return;
    }
    case RecordFormat::kChat: {
      if (r.messages.empty()) broken("a chat record without messages");
      bool assistant = false;
      for (size_t i = 0; i < r.messages.size(); ++i) {
        const std::string& role = r.messages[i].role;
        if (role != "system" && role != "user" && role != "assistant")
          broken("a chat message with the role \"" + role + "\"");
        if (role == "system" && i != 0) broken("a system message after the first");
        assistant = assistant || role == "assistant";
      }
      if (o.require_assistant && !assistant) broken("a chat record without an assistant message");
      return;
    }
    case RecordFormat::kPreference:
      if (r.conversational) {
        if (r.messages.empty() || r.chosen.empty() || r.rejected.empty())
          broken("a conversational pair without its prompt or answers");
        for (const auto* answers : {&r.chosen, &r.rejected})
          for (const auto& m : *answers)
            if (m.role != "assistant") broken("a preference answer that is not the assistant's");
      } else if (!r.messages.empty() || !r.chosen.empty() || !r.rejected.empty()) {
        broken("a standard pair with messages");
      }
      return;
  }
}

void read_file(const std::string& path, const RecordOptions& o) {
  fd::data::RecordStats stats;
  const std::vector<Record> records = fd::data::read_records({path}, o, &stats);
  if (stats.records != static_cast<int64_t>(records.size()))
    broken("stats.records differs from the records returned");
  if (o.bad == BadRecords::kError && stats.skipped != 0) broken("records skipped under kError");
  if (stats.skip_reasons.size() > fd::data::RecordStats::kMaxReasons ||
      static_cast<int64_t>(stats.skip_reasons.size()) > stats.skipped)
    broken("more skip reasons than allowed or than skipped records");
  for (const Record& r : records) check_record(r, o, true);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string jsonl = fd::fuzz::scratch_dir() + "/records.jsonl";
  static const std::string json = fd::fuzz::scratch_dir() + "/records.json";
  const std::string_view in = fd::fuzz::as_view(data, size);
  fd::fuzz::write_file(jsonl, in);
  fd::fuzz::write_file(json, in);
  const std::string text(in);
  for (const RecordFormat format : {RecordFormat::kChat, RecordFormat::kInstruct,
                                    RecordFormat::kText, RecordFormat::kPreference}) {
    RecordOptions o;
    o.format = format;
    // Bad records skipped in each format; an error at the first one (chat only: the
    // same reading up to that record).
    for (const BadRecords bad : {BadRecords::kSkip, BadRecords::kError}) {
      if (bad == BadRecords::kError && format != RecordFormat::kChat) continue;
      o.bad = bad;
      fd::fuzz::expect_clean([&] { read_file(jsonl, o); });
      fd::fuzz::expect_clean([&] { read_file(json, o); });
    }
    for (const bool require : {true, false}) {
      o.require_assistant = require;
      Record r;
      fd::fuzz::expect_clean([&] {
        if (fd::data::parse_record(text, o, &r).empty()) check_record(r, o, false);
      });
    }
  }
  return 0;
}
