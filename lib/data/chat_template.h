// ChatTemplate: a model's chat template (the Jinja `chat_template` of its
// tokenizer_config.json, a built-in, or a file) rendered exactly as Hugging
// Face's apply_chat_template renders it (jinja.h), and where the assistant's
// answers lie in the rendered text.
//
// Targets: what the model generates for each assistant message. Every message's content
// (and a tool call's name and id) is tagged before rendering, so the renderer reports which
// bytes of the output came from it, through whatever the template does to it (trim, split,
// slicing: jinja.h's provenance). An assistant turn's target starts where its generation
// prompt ends: the conversation up to it is rendered again with add_generation_prompt, and
// from the end of the last message before it (its last tagged byte, in both renderings)
// the two agree up to the start of the target (Qwen 3's "<think>\n\n</think>\n\n" of a
// last answer, Qwen's "<tool_call>\n{\"name\": \"", Mistral's "[TOOL_CALLS][" are the
// model's to write; with enable_thinking false, Qwen 3's empty think block is the
// prompt's). It never starts after the first byte of the content, nor inside a special
// token (a generation prompt ending within one: the target starts at the token). Where the
// renderings do not agree on the text between the two messages (a template that places text by what
// comes last), the target starts at the content's first byte; a turn with tool calls is
// then refused, as its start could only be guessed. The target ends with the first special
// token written after the content (Llama 3's <|eot_id|>, ChatML's <|im_end|>, Gemma's
// <end_of_turn>, an eos_token), or for a turn with tool calls with the first end-of-turn
// token (end_of_turn()) after its calls. A template that rewrites the content so that none
// of it survives as given (upper-casing it, say) or drops a turn's tool calls, or that
// writes no end of turn after it, is refused with the message index: the labels could
// only be guessed. Tool results (role tool) are never targets.
//
// Context: messages (role, content, and tool_calls, tool_call_id, name where given, in
// that order, then the message's other keys as the record gives them (Message::extra:
// Qwen 3's reasoning_content), as Hugging Face's templates read them; a tool call as {id, type:
// "function", function: {name, arguments: an object}}), bos_token, eos_token,
// add_generation_prompt, the record's tools when it has some, then data.template_vars
// (set_variables()). Content given as text parts reaches the template as the list of parts when the
// template iterates them (Gemma 3's does), else as one string (their concatenation).
//
// strftime_now() (Llama 3.2's "Today Date") renders 26 Jul 2024 in every rendering, so
// that a run's data never depend on the day it runs (date_string in data.template_vars sets
// another).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "lib/data/sft_records.h"

namespace fd::jinja {
class Template;
class Value;
struct Rendered;
}  // namespace fd::jinja

namespace fd::data {

// A byte range [begin, end) of a rendered conversation.
struct TextSpan {
  int64_t begin = 0, end = 0;
};

// A message's text the rendering does not hold (the template dropped it): `key` is
// "content" or another key of the message (Message::extra: "reasoning_content", ...).
struct NotWritten {
  size_t message = 0;
  std::string key;
};

struct RenderedChat {
  std::string text;
  std::vector<TextSpan> targets;  // one per assistant message, in order (render_targets only)
  // render_targets only: each non-empty content, and each non-empty string of a message's
  // other keys, found neither by its tag nor as written (plain or JSON-escaped) in the text:
  // Qwen 3's reasoning_content of turns before the last user message, a key no template
  // reads. Not an error (apply_chat_template drops them the same way); the dataset warns.
  std::vector<NotWritten> not_written;
};

class ChatTemplate {
 public:
  // The built-in templates data.chat_template can name: chatml, llama3, alpaca.
  static const std::vector<std::string>& builtin_names();

  // spec: "" (the tokenizer's own: tokenizer_config.json's chat_template, a string or the
  // entry named "default" of a list), a built-in name, or the path of a file holding a
  // Jinja template. tokenizer: the directory with tokenizer_config.json (or its
  // tokenizer.json, as load_tokenizer() takes it), whose bos_token and eos_token the
  // template sees ("" for none). Throws fd::Error (kUsage): a tokenizer directory that
  // does not exist, no template in the tokenizer (say which built-ins exist), a file that
  // is not a regular file, too large or not JSON (lib/base/input_file.h), a template the
  // renderer does not support (its position).
  static ChatTemplate load(const std::string& spec, const std::string& tokenizer);
  // From a template's source (tests): `name` is used in messages.
  static ChatTemplate from_source(const std::string& source, const std::string& name,
                                  const std::string& bos_token, const std::string& eos_token);

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // Where the template came from: "tokenizer_config.json's chat_template", "built-in
  // chatml", or the file's path.
  const std::string& name() const { return name_; }

  // data.template_vars: variables every rendering sees, as apply_chat_template(**kwargs)
  // passes them (a JSON object; `where` names it in messages). Throws fd::Error (kUsage) for
  // a name the context sets itself (messages, bos_token, eos_token, add_generation_prompt,
  // tools: a record's own) or a Jinja global (range, namespace, true, ...), and for a value
  // of the wrong type where the real templates say what they expect (enable_thinking,
  // tools_in_user_message: a boolean; date_string: a string; custom_tools, builtin_tools,
  // documents: a list). Returns the names the template never names (the caller warns:
  // they change nothing).
  std::vector<std::string> set_variables(const nlohmann::ordered_json& vars,
                                         const std::string& where);

  // Whether the template reads a message's content given as a list of text parts by
  // iterating it (found by rendering a probe conversation); else it sees their concatenation.
  bool iterates_parts() const { return iterates_parts_; }

  // The conversation as text, as apply_chat_template(messages, tokenize=False,
  // add_generation_prompt) gives it. Throws fd::Error (kUsage) for the template's
  // raise_exception (its message) and other render errors, prefixed with record.where.
  std::string render(const Record& record, bool add_generation_prompt) const;

  // The same text (add_generation_prompt false) and each assistant turn's target span as
  // the header says; special_tokens: the tokenizer's (Tokenizer::special_tokens()).
  RenderedChat render_targets(const Record& record,
                              const std::vector<std::string>& special_tokens) const;

  // The special token that ends an assistant turn, found by rendering a probe
  // conversation (user "Hi.", assistant "Hello.") the first time it is asked for given
  // special tokens; "" when the template writes none. generate --chat stops at it.
  std::string end_of_turn(const std::vector<std::string>& special_tokens) const;

 private:
  ChatTemplate();

  std::string probe_end_of_turn(const std::vector<std::string>& special_tokens) const;
  // A rendering of messages [0, count) (tag: with provenance, chat_template.cc).
  jinja::Rendered render_prefix(const Record& r, size_t count, bool add_generation_prompt,
                                bool tag) const;

  std::string name_;
  std::string bos_, eos_;
  std::unique_ptr<jinja::Template> template_;
  struct Variables;                             // data.template_vars, as template values
  std::shared_ptr<const Variables> variables_;  // null: none
  bool iterates_parts_ = false;
  struct EndOfTurn;  // end_of_turn()'s answer, found once (threads share it)
  std::shared_ptr<EndOfTurn> end_of_turn_;
};

}  // namespace fd::data
