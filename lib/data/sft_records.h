// Fine-tuning records: the chat, instruct and text examples of a supervised
// fine-tuning dataset, read from JSON Lines (.jsonl: one JSON object per
// line) or JSON (.json: one array of objects) files and validated one by one.
//
// Shapes (data.format):
//   chat      {"messages": [{"role": R, "content": C}, ...], "tools": [...] (optional)}, R
//             one of system, user, assistant, tool; or ShareGPT's {"conversations":
//             [{"from": F, "value": C}, ...]} with F mapped by sharegpt_role() (human ->
//             user, gpt -> assistant, system -> system, ...). Function calling as OpenAI and
//             Hugging Face write it:
//               an assistant message may carry "tool_calls": [{"id": ... (optional),
//               "type": "function" (optional), "function": {"name": N, "arguments": A}}],
//               A a JSON object or a string holding one (OpenAI's spelling: it is parsed,
//               so every template sees an object, as transformers asks); its content may
//               then be null or absent ("");
//               a "tool" message holds a call's result: "content", and optionally
//               "tool_call_id" and "name"; it must follow an assistant message with
//               tool_calls (and the results of that message's other calls), and a
//               tool_call_id must be one of those calls' ids;
//               the record's "tools" (a list of JSON schemas) is the template's `tools`.
//             A message's other keys reach the template as given (Qwen 3 reads an
//             assistant's "reasoning_content"; "reasoning_content", "reasoning" and
//             "thinking" must be strings or null). Numbers in tool arguments, tools and
//             other keys must be exact as doubles (jinja::Value::inexact_number(): an
//             integer beyond 2^53 is refused; give it as a string).
//             C is a string or OpenAI's list of parts [{"type": "text", "text": T}, ...]
//             (only text parts; the texts are the content, concatenated).
//   instruct  Alpaca: {"instruction": I, "input": X (optional), "output": O},
//             field names configurable; becomes [user: I (+ "\n\n" + X), assistant: O]
//             and keeps I and X apart for templates that want them (alpaca).
//   text      {"text": T}: a document, trained on whole.
//   preference  TRL's preference pairs, field names fixed: standard
//             {"prompt": P, "chosen": C, "rejected": R}, all strings; or conversational,
//             all message lists: the prompt's turns (system first if any, ending with a
//             user turn), then "chosen" and "rejected" each the assistant's message(s).
// A record of another format's shape (a preference record read as chat, a chat record
// read as preference) is an error whatever on_bad_record says, naming data.format to use.
// A record that breaks a rule is reported as "FILE:LINE: what is wrong" (JSON
// files: "FILE: element N"); with BadRecords::kSkip it is counted and left out
// instead, and the first few reasons are kept for the run's summary. A line
// that is not JSON, nests deeper than kMaxJsonDepth (lib/base/input_file.h) or
// is longer than kMaxJsonLineBytes is such a bad record; a file that is not a
// regular file, or a .json file over kMaxJsonDatasetBytes, is an error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fd::data {

enum class RecordFormat { kChat, kInstruct, kText, kPreference };

// The largest .json dataset read whole (a larger one belongs in .jsonl, read a
// line at a time; each line at most kMaxJsonLineBytes, line_reader.h).
inline constexpr int64_t kMaxJsonDatasetBytes = int64_t{1} << 30;  // 1 GiB

struct RecordFields {
  std::string messages = "messages";        // chat: the message list (or "conversations", ShareGPT)
  std::string instruction = "instruction";  // instruct
  std::string input = "input";              // instruct, optional in each record
  std::string output = "output";            // instruct
  std::string text = "text";                // text
};

enum class BadRecords { kError, kSkip };

struct ToolCall {
  std::string id;         // "" when the record gives none
  std::string name;       // the function's
  std::string arguments;  // a JSON object as text, keys in the record's order
};

struct Message {
  std::string role;     // system, user, assistant or tool
  std::string content;  // given as text parts: their concatenation
  // content given as a list of text parts: each part's text (chat_template.h decides whether
  // the template sees the list or the concatenation).
  std::vector<std::string> parts{};
  bool has_parts = false;
  std::vector<ToolCall> tool_calls{};  // assistant
  std::string tool_call_id{}, name{};  // tool: which call this is the result of ("" if not given)
  // The message's other keys (reasoning_content, thinking, anything else), as a JSON
  // object's text in the record's order ("" for none): the template sees them as Hugging
  // Face's apply_chat_template passes them (chat_template.h says which it did not write).
  std::string extra{};
};

struct Record {
  std::vector<Message> messages;  // chat and instruct; conversational preference: the prompt
  std::string text;               // text; standard preference: the prompt
  std::string tools;              // chat: the record's "tools" list as JSON text ("" for none)
  // instruct only: the instruction and input as given (the alpaca template's fields).
  std::string instruction, input;
  // preference only: the shape, and the two answers (messages when conversational, else text).
  bool conversational = false;
  std::vector<Message> chosen, rejected;
  std::string chosen_text, rejected_text;
  std::string where;  // "FILE:LINE" (or "FILE: element N"), for messages
};

struct RecordStats {
  int64_t records = 0;  // read and kept
  int64_t skipped = 0;  // bad records left out (BadRecords::kSkip)
  // The first reasons for skipping ("FILE:LINE: what"), at most kMaxReasons.
  std::vector<std::string> skip_reasons;
  static constexpr size_t kMaxReasons = 10;
};

struct RecordOptions {
  RecordFormat format = RecordFormat::kChat;
  RecordFields fields;
  BadRecords bad = BadRecords::kError;
  // chat: a record needs an assistant message (something to train on); false for
  // conversations to render (fdtrain template).
  bool require_assistant = true;
};

// The role a ShareGPT "from" value stands for, or "" for one it does not know:
// human, user -> user; gpt, assistant, chatgpt, bard, bing, model -> assistant;
// system -> system.
std::string sharegpt_role(const std::string& from);

// Reads every record of `files` in order. Throws fd::Error (kUsage) for an
// unreadable file, a file that is not .jsonl or .json, and (BadRecords::kError)
// the first bad record. `stats` (may be null) receives the counts.
std::vector<Record> read_records(const std::vector<std::string>& files, const RecordOptions& o,
                                 RecordStats* stats);

// The records of a run: `train` files, and `val` files or else the last val_fraction of the
// training records (at least one, never all; none with fewer than two records).
struct RecordSplits {
  std::vector<Record> train, val;
};
RecordSplits read_splits(const std::vector<std::string>& train, const std::vector<std::string>& val,
                         double val_fraction, const RecordOptions& o, RecordStats* stats);

// A record found bad after reading (its encoding, say): "WHERE: reason" thrown as fd::Error
// (kUsage) with BadRecords::kError, else moved from `stats`' records to its skipped.
void reject_record(const std::string& where, const std::string& reason, const RecordOptions& o,
                   RecordStats* stats);

// A JSON Lines line's try_parse_json() error (lib/base/input_file.h) as a
// reason after "FILE:LINE: ": "not valid JSON at column C: ... (a .jsonl file
// holds one JSON object per line)".
std::string jsonl_error(const std::string& reason);

// One record from a JSON value (the same rules, for tests and previews):
// returns "" and fills `out`, or returns what is wrong.
std::string parse_record(const std::string& json_text, const RecordOptions& o, Record* out);

}  // namespace fd::data
