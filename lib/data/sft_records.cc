#include "lib/data/sft_records.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/data/line_reader.h"
#include "lib/jinja/jinja.h"

namespace fd::data {
namespace {

using json = nlohmann::ordered_json;

// A JSON value's type in words, for messages.
std::string type_of(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return "a number";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "not a value";
  }
}

// A string member of an object: "" and the value, or what is wrong.
std::string string_member(const json& obj, const std::string& key, const std::string& what,
                          bool optional, std::string* out) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (optional) return "";
    return fmt::format("missing \"{}\" ({})", key, what);
  }
  if (it->is_null() && optional) return "";
  if (!it->is_string())
    return fmt::format("\"{}\" is {}, not a string ({})", key, type_of(*it), what);
  *out = it->get<std::string>();
  return "";
}

// A message's content: a string, or OpenAI's list of text parts; null or absent only where
// `optional` (an assistant message with tool calls).
std::string parse_content(const json& m, const char* key, bool parts_allowed, bool optional,
                          Message* msg) {
  auto it = m.find(key);
  if (it == m.end() || it->is_null()) {
    if (optional) return "";
    if (it == m.end()) return fmt::format("missing \"{}\" (each message needs a {})", key, key);
    return fmt::format(
        "\"{}\" is null (only an assistant message with tool_calls may have no "
        "content)",
        key);
  }
  if (it->is_string()) {
    msg->content = it->get<std::string>();
    return "";
  }
  if (!it->is_array() || !parts_allowed) {
    return fmt::format(
        "\"{}\" is {}, not a string{}", key, type_of(*it),
        parts_allowed ? " or a list of {\"type\": \"text\", \"text\": ...} parts" : "");
  }
  msg->has_parts = true;
  for (size_t p = 0; p < it->size(); ++p) {
    const json& part = (*it)[p];
    if (!part.is_object())
      return fmt::format("{}[{}] is {}, not a {{\"type\", ...}} part", key, p, type_of(part));
    auto type = part.find("type");
    if (type == part.end() || !type->is_string())
      return fmt::format("{}[{}] has no \"type\" string", key, p);
    if (*type != "text") {
      return fmt::format(
          "{}[{}]: part type \"{}\" is not supported (fdtrain trains on text: only "
          "{{\"type\": \"text\", \"text\": ...}} parts)",
          key, p, type->get<std::string>());
    }
    std::string text;
    if (std::string err = string_member(part, "text", "a text part needs a text", false, &text);
        !err.empty())
      return fmt::format("{}[{}]: {}", key, p, err);
    msg->content += text;
    msg->parts.push_back(std::move(text));
  }
  return "";
}

// A number jinja::Value::inexact_number() found at "PATH: VALUE".
std::string inexact_error(const std::string& at) {
  return fmt::format(
      "{}: the number is beyond 2^53 (or 2^64 written as a float), which the template's numbers "
      "(doubles, as in @huggingface/jinja) cannot hold exactly, so it would render changed; "
      "give it as a string",
      at);
}

// Keys of a message (OpenAI's spelling) that parse_messages reads itself.
bool message_key(const std::string& key) {
  return key == "role" || key == "content" || key == "tool_calls" || key == "tool_call_id" ||
         key == "name";
}

// A message's other keys, passed to the template (Message::extra), or what is wrong.
std::string parse_extra(const json& m, const std::string& at, Message* msg) {
  json extra = json::object();
  for (const auto& [key, value] : m.items()) {
    if (message_key(key)) continue;
    if ((key == "reasoning_content" || key == "reasoning" || key == "thinking") &&
        !value.is_string() && !value.is_null()) {
      return fmt::format("{}: \"{}\" is {}, not a string (the model's reasoning, as text)", at, key,
                         type_of(value));
    }
    if (std::string at_number = jinja::Value::inexact_number(value); !at_number.empty())
      return inexact_error(at + "." + key + at_number);
    extra[key] = value;
  }
  if (!extra.empty()) msg->extra = extra.dump();
  return "";
}

// An assistant message's "tool_calls" (OpenAI's and Hugging Face's spelling).
std::string parse_tool_calls(const json& list, Message* msg) {
  if (!list.is_array() || list.empty())
    return fmt::format("\"tool_calls\" is {}, not a list of calls",
                       list.is_array() ? "empty" : type_of(list));
  for (size_t c = 0; c < list.size(); ++c) {
    const json& call = list[c];
    const std::string at = fmt::format("tool_calls[{}]", c);
    if (!call.is_object()) return fmt::format("{} is {}, not an object", at, type_of(call));
    ToolCall tc;
    if (std::string err = string_member(call, "id", "a call's id", true, &tc.id); !err.empty())
      return fmt::format("{}: {}", at, err);
    if (auto type = call.find("type"); type != call.end() && *type != "function")
      return fmt::format("{}: \"type\" is {}, not \"function\"", at, type->dump());
    auto fn = call.find("function");
    if (fn == call.end() || !fn->is_object()) {
      return fmt::format(
          "{}: missing \"function\": {{\"name\": ..., \"arguments\": ...}} (a call is "
          "{{\"id\": ..., \"type\": \"function\", \"function\": {{...}}}})",
          at);
    }
    if (std::string err = string_member(*fn, "name", "the function's name", false, &tc.name);
        !err.empty())
      return fmt::format("{}.function: {}", at, err);
    if (tc.name.empty()) return fmt::format("{}.function: \"name\" is empty", at);
    auto args = fn->find("arguments");
    if (args == fn->end())
      return fmt::format("{}.function: missing \"arguments\" (an object, or a string holding one)",
                         at);
    json parsed;
    if (args->is_string()) {
      if (std::string err = try_parse_json(args->get<std::string>(), parsed); !err.empty())
        return fmt::format("{}.function.arguments: the string is not valid JSON: {}", at, err);
    } else {
      parsed = *args;
    }
    if (!parsed.is_object()) {
      return fmt::format("{}.function.arguments is {}{}, not an object of the function's arguments",
                         at, args->is_string() ? "a string holding " : "", type_of(parsed));
    }
    if (std::string at_number = jinja::Value::inexact_number(parsed); !at_number.empty())
      return inexact_error(at + ".function.arguments" + at_number);
    tc.arguments = parsed.dump();
    msg->tool_calls.push_back(std::move(tc));
  }
  return "";
}

// A list of messages (a record's "messages", ShareGPT's "conversations", a preference
// record's prompt or answer): appended to `out`, or what is wrong. `tools`: function calls
// and tool results are allowed (chat records).
std::string parse_messages(const json& list, const std::string& list_key, bool sharegpt, bool tools,
                           std::vector<Message>* out) {
  const char* role_key = sharegpt ? "from" : "role";
  const char* content_key = sharegpt ? "value" : "content";
  const size_t first = out->size();
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    const std::string at = fmt::format("{}[{}]", list_key, i);
    if (!m.is_object()) return fmt::format("{} is {}, not an object", at, type_of(m));
    Message msg;
    std::string role;
    if (std::string err = string_member(
            m, role_key, fmt::format("each message needs a {}", role_key), false, &role);
        !err.empty())
      return fmt::format("{}: {}", at, err);
    if (sharegpt) {
      msg.role = sharegpt_role(role);
      if (msg.role.empty()) {
        return fmt::format(
            "{}: \"from\": \"{}\" is not a ShareGPT role fdtrain knows (human, user, gpt, "
            "assistant, chatgpt, bard, bing, model, system)",
            at, role);
      }
    } else {
      const bool known =
          role == "system" || role == "user" || role == "assistant" || (role == "tool" && tools);
      if (!known) {
        return fmt::format("{}: role \"{}\" is not one of system, user, assistant{}", at, role,
                           tools            ? ", tool"
                           : role == "tool" ? " (tool results are read in data.format chat)"
                                            : "");
      }
      msg.role = role;
    }
    auto calls = sharegpt ? m.end() : m.find("tool_calls");
    // null and [] are no calls (exports write them on every message).
    const bool has_calls =
        calls != m.end() && !calls->is_null() && !(calls->is_array() && calls->empty());
    if (has_calls && (!tools || msg.role != "assistant")) {
      return fmt::format("{}: \"tool_calls\" on a{} message{}", at,
                         msg.role == "assistant" ? "n assistant" : " " + msg.role,
                         tools ? " (only an assistant calls tools)"
                               : " (tool calls are read in data.format chat)");
    }
    if (std::string err = parse_content(m, content_key, !sharegpt, has_calls, &msg); !err.empty())
      return fmt::format("{}: {}", at, err);
    if (has_calls) {
      if (std::string err = parse_tool_calls(*calls, &msg); !err.empty())
        return fmt::format("{}: {}", at, err);
    }
    for (auto [key, field] :
         {std::pair{"tool_call_id", &msg.tool_call_id}, std::pair{"name", &msg.name}}) {
      if (sharegpt || !m.contains(key) || m[key].is_null()) continue;
      if (msg.role != "tool") {
        return fmt::format("{}: \"{}\" on a{} message (it names a tool result: role \"tool\")", at,
                           key, msg.role == "assistant" ? "n assistant" : " " + msg.role);
      }
      if (std::string err = string_member(m, key, "a tool result's", true, field); !err.empty())
        return fmt::format("{}: {}", at, err);
    }
    if (msg.role == "tool") {
      // The result of a call of the nearest assistant message before it, with only other
      // results in between.
      const Message* caller = nullptr;
      for (size_t k = out->size(); k > first; --k) {
        const Message& prev = (*out)[k - 1];
        if (prev.role == "tool") continue;
        if (prev.role == "assistant" && !prev.tool_calls.empty()) caller = &prev;
        break;
      }
      if (!caller) {
        return fmt::format(
            "{}: a tool result with no tool call before it (a \"tool\" message follows an "
            "assistant message with \"tool_calls\", or that message's other results)",
            at);
      }
      if (!msg.tool_call_id.empty()) {
        const bool found = std::any_of(caller->tool_calls.begin(), caller->tool_calls.end(),
                                       [&](const ToolCall& c) { return c.id == msg.tool_call_id; });
        if (!found) {
          return fmt::format(
              "{}: tool_call_id \"{}\" is not the id of a call of the assistant message before "
              "it",
              at, msg.tool_call_id);
        }
      }
    }
    if (!sharegpt) {
      if (std::string err = parse_extra(m, at, &msg); !err.empty()) return err;
    }
    if (msg.role == "system" && i != 0)
      return fmt::format("{}: a system message may only come first", at);
    out->push_back(std::move(msg));
  }
  return "";
}

std::string parse_chat(const json& j, const RecordOptions& o, Record* out, bool* wrong_format) {
  const RecordFields& f = o.fields;
  const bool sharegpt = !j.contains(f.messages) && j.contains("conversations");
  const std::string list_key = sharegpt ? "conversations" : f.messages;
  auto it = j.find(list_key);
  if (it == j.end() && j.contains("chosen") && j.contains("rejected")) {
    *wrong_format = true;
    return "the record looks like preference data (\"prompt\", \"chosen\", \"rejected\"), "
           "not a chat record: set data.format: preference";
  }
  if (it == j.end()) {
    return fmt::format(
        "missing \"{}\" (a chat record is {{\"{}\": [{{\"role\": ..., \"content\": ...}}, ...]}} "
        "or ShareGPT's {{\"conversations\": [{{\"from\": ..., \"value\": ...}}, ...]}})",
        f.messages, f.messages);
  }
  if (!it->is_array()) return fmt::format("\"{}\" is {}, not an array", list_key, type_of(*it));
  if (it->empty()) return fmt::format("\"{}\" is empty", list_key);
  if (std::string err = parse_messages(*it, list_key, sharegpt, true, &out->messages); !err.empty())
    return err;
  if (auto tools = j.find("tools"); tools != j.end() && !tools->is_null()) {
    if (!tools->is_array()) {
      return fmt::format("\"tools\" is {}, not a list of tools (JSON schemas)", type_of(*tools));
    }
    for (size_t t = 0; t < tools->size(); ++t) {
      if (!(*tools)[t].is_object())
        return fmt::format("tools[{}] is {}, not a tool (a JSON schema object)", t,
                           type_of((*tools)[t]));
    }
    if (std::string at_number = jinja::Value::inexact_number(*tools); !at_number.empty())
      return inexact_error("tools" + at_number);
    if (!tools->empty()) out->tools = tools->dump();  // [] is no tools, as null
  }
  const bool any_assistant = std::any_of(out->messages.begin(), out->messages.end(),
                                         [](const Message& m) { return m.role == "assistant"; });
  if (!any_assistant && o.require_assistant) {
    return fmt::format("\"{}\" has no assistant message: nothing to train on", list_key);
  }
  return "";
}

std::string parse_instruct(const json& j, const RecordFields& f, Record* out) {
  const std::string shape =
      fmt::format("an instruct record is {{\"{}\": ..., \"{}\": ... (optional), \"{}\": ...}}",
                  f.instruction, f.input, f.output);
  std::string output;
  std::string err = string_member(j, f.instruction, shape, false, &out->instruction);
  if (err.empty()) err = string_member(j, f.input, shape, true, &out->input);
  if (err.empty()) err = string_member(j, f.output, shape, false, &output);
  if (!err.empty()) return err;
  std::string user = out->instruction;
  if (!out->input.empty()) user += "\n\n" + out->input;
  out->messages = {{"user", std::move(user)}, {"assistant", std::move(output)}};
  return "";
}

constexpr const char* kPreferenceShape =
    "a preference record is {\"prompt\": ..., \"chosen\": ..., \"rejected\": ...}, all "
    "strings (standard) or all lists of {\"role\", \"content\"} messages (conversational)";

std::string parse_preference(const json& j, Record* out, bool* wrong_format) {
  const bool has_answers = j.contains("chosen") || j.contains("rejected");
  if (!has_answers && (j.contains("messages") || j.contains("conversations"))) {
    *wrong_format = true;
    return "the record looks like chat data (\"messages\" or \"conversations\"), not a "
           "preference pair: set data.format: chat";
  }
  const char* keys[] = {"prompt", "chosen", "rejected"};
  for (const char* key : keys) {
    if (!j.contains(key)) {
      return fmt::format(
          "missing \"{}\" ({}; a prompt taken from the answers, TRL's implicit "
          "prompt, is not read)",
          key, kPreferenceShape);
    }
    const json& v = j[key];
    if (!v.is_string() && !v.is_array())
      return fmt::format("\"{}\" is {}, not a string or a list of messages", key, type_of(v));
  }
  const bool conversational = j["prompt"].is_array();
  for (const char* key : {"chosen", "rejected"}) {
    if (j[key].is_array() != conversational) {
      return fmt::format("\"prompt\" is {} but \"{}\" is {}: {}", type_of(j["prompt"]), key,
                         type_of(j[key]), kPreferenceShape);
    }
  }
  out->conversational = conversational;
  if (!conversational) {
    out->text = j["prompt"].get<std::string>();
    out->chosen_text = j["chosen"].get<std::string>();
    out->rejected_text = j["rejected"].get<std::string>();
    return "";
  }
  if (j["prompt"].empty()) return "\"prompt\" is empty (it needs a user message)";
  if (std::string err = parse_messages(j["prompt"], "prompt", false, false, &out->messages);
      !err.empty())
    return err;
  if (out->messages.back().role != "user") {
    return fmt::format(
        "\"prompt\" must end with the user's turn the answers reply to (its last message's "
        "role is \"{}\")",
        out->messages.back().role);
  }
  for (auto [key, answer] :
       {std::pair{"chosen", &out->chosen}, std::pair{"rejected", &out->rejected}}) {
    if (j[key].empty())
      return fmt::format("\"{}\" is empty (it needs the assistant's answer)", key);
    if (std::string err = parse_messages(j[key], key, false, false, answer); !err.empty())
      return err;
    for (size_t i = 0; i < answer->size(); ++i) {
      if ((*answer)[i].role != "assistant") {
        return fmt::format("{}[{}]: role \"{}\": \"{}\" holds the assistant's answer only", key, i,
                           (*answer)[i].role, key);
      }
    }
  }
  return "";
}

std::string parse_value(const json& j, const RecordOptions& o, Record* out, bool* wrong_format) {
  if (!j.is_object()) return fmt::format("the record is {}, not a JSON object", type_of(j));
  switch (o.format) {
    case RecordFormat::kChat:
      return parse_chat(j, o, out, wrong_format);
    case RecordFormat::kInstruct:
      return parse_instruct(j, o.fields, out);
    case RecordFormat::kText:
      return string_member(j, o.fields.text, "a text record is {\"text\": ...}", false, &out->text);
    case RecordFormat::kPreference:
      return parse_preference(j, out, wrong_format);
  }
  return "unknown record format";
}

// Throws the reason, or counts the record as skipped, as the options say.
void reject(const std::string& where, const std::string& err, const RecordOptions& o,
            RecordStats* stats) {
  const std::string reason = fmt::format("{}: {}", where, err);
  if (o.bad == BadRecords::kError) {
    usage_error("{} (data.on_bad_record: skip leaves bad records out and counts them)", reason);
  }
  if (stats) {
    ++stats->skipped;
    if (stats->skip_reasons.size() < RecordStats::kMaxReasons)
      stats->skip_reasons.push_back(reason);
  }
}

// Keeps a record, or counts it as skipped, or throws, as the options say.
class Collector {
 public:
  Collector(const RecordOptions& o, RecordStats* stats) : o_(o), stats_(stats) {}

  void add(const std::string& where, const std::string& err, Record&& r,
           bool wrong_format = false) {
    if (!err.empty()) {
      if (wrong_format) usage_error("{}: {}", where, err);
      reject(where, err, o_, stats_);
      return;
    }
    r.where = where;
    records_.push_back(std::move(r));
    if (stats_) ++stats_->records;
  }

  std::vector<Record> take() { return std::move(records_); }

 private:
  const RecordOptions& o_;
  RecordStats* stats_;
  std::vector<Record> records_;
};

}  // namespace

std::string jsonl_error(const std::string& reason) {
  // try_parse_json's "line 1, column C: not valid JSON: D" of a one-line text: the line is the
  // file's (FILE:LINE is said before), the column this line's.
  static constexpr std::string_view kAt = "line 1, column ", kInvalid = ": not valid JSON: ";
  std::string out = reason;
  if (reason.starts_with(kAt)) {
    const size_t colon = reason.find(kInvalid);
    if (colon != std::string::npos) {
      out = fmt::format("not valid JSON at column {}: {}",
                        reason.substr(kAt.size(), colon - kAt.size()),
                        reason.substr(colon + kInvalid.size()));
    }
  }
  return out + " (a .jsonl file holds one JSON object per line)";
}

namespace {

void read_jsonl(const std::string& path, const RecordOptions& o, Collector& c) {
  LineReader in(path);
  std::string line;
  for (LineReader::Result r; (r = in.next(line)) != LineReader::Result::kEnd;) {
    const std::string where = fmt::format("{}:{}", path, in.line_number());
    Record rec;
    if (r == LineReader::Result::kTooLong) {
      c.add(where,
            fmt::format("the line is longer than {} bytes, more than a record may be (is this "
                        "a .jsonl file?)",
                        kMaxJsonLineBytes),
            std::move(rec));
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    bool wrong_format = false;
    std::string err = try_parse_json(line, j);
    err = err.empty() ? parse_value(j, o, &rec, &wrong_format) : jsonl_error(err);
    c.add(where, err, std::move(rec), wrong_format);
  }
}

void read_json(const std::string& path, const RecordOptions& o, Collector& c) {
  const std::string text = read_input_file(path, "the dataset", kMaxJsonDatasetBytes);
  json j;
  if (const std::string err = try_parse_json(text, j); !err.empty())
    usage_error("{}: {}; a .json dataset is one array of records", path, err);
  if (!j.is_array()) {
    usage_error(
        "{}: the file holds {}; a .json dataset is one array of records (or use .jsonl, "
        "one record per line)",
        path, type_of(j));
  }
  for (size_t i = 0; i < j.size(); ++i) {
    Record r;
    bool wrong_format = false;
    std::string err = parse_value(j[i], o, &r, &wrong_format);
    c.add(fmt::format("{}: element {}", path, i), err, std::move(r), wrong_format);
  }
}

}  // namespace

std::string sharegpt_role(const std::string& from) {
  if (from == "human" || from == "user") return "user";
  if (from == "gpt" || from == "assistant" || from == "chatgpt" || from == "bard" ||
      from == "bing" || from == "model")
    return "assistant";
  if (from == "system") return "system";
  return "";
}

std::string parse_record(const std::string& json_text, const RecordOptions& o, Record* out) {
  json j;
  if (std::string err = try_parse_json(json_text, j); !err.empty()) return err;
  bool wrong_format = false;
  return parse_value(j, o, out, &wrong_format);
}

std::vector<Record> read_records(const std::vector<std::string>& files, const RecordOptions& o,
                                 RecordStats* stats) {
  Collector c(o, stats);
  for (const std::string& path : files) {
    const bool jsonl = path.ends_with(".jsonl");
    if (!jsonl && !path.ends_with(".json")) {
      usage_error(
          "{}: a fine-tuning dataset is a .jsonl file (one JSON record per line) or a "
          ".json file (one array of records)",
          path);
    }
    if (jsonl) {
      read_jsonl(path, o, c);
    } else {
      read_json(path, o, c);
    }
  }
  return c.take();
}

RecordSplits read_splits(const std::vector<std::string>& train, const std::vector<std::string>& val,
                         double val_fraction, const RecordOptions& o, RecordStats* stats) {
  RecordSplits s;
  s.train = read_records(train, o, stats);
  if (!val.empty()) {
    s.val = read_records(val, o, stats);
  } else if (val_fraction > 0.0 && s.train.size() >= 2) {
    size_t n = size_t(std::ceil(val_fraction * double(s.train.size())));
    n = std::clamp<size_t>(n, 1, s.train.size() - 1);
    s.val.assign(std::make_move_iterator(s.train.end() - std::ptrdiff_t(n)),
                 std::make_move_iterator(s.train.end()));
    s.train.resize(s.train.size() - n);
  }
  return s;
}

void reject_record(const std::string& where, const std::string& reason, const RecordOptions& o,
                   RecordStats* stats) {
  if (stats) --stats->records;
  reject(where, reason, o, stats);
}

}  // namespace fd::data
