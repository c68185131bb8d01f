// ChatTemplate: a model's chat template (the Jinja `chat_template` of its
// tokenizer_config.json, a built-in, or a file) rendered exactly as Hugging
// Face's apply_chat_template renders it (jinja.h), and where the assistant's
// answers lie in the rendered text.
//
// Targets. Each assistant message's content is tagged before rendering, so
// the renderer reports which bytes of the output came from it, through
// whatever the template does to it (trim, split, slicing: jinja.h's
// provenance). The target of an assistant turn runs from the first byte of its
// content to the end of the first special token the template writes after it
// (Llama 3's <|eot_id|>, ChatML's <|im_end|>, Gemma's <end_of_turn>, an
// eos_token): the answer and its end of turn, which is what the model must
// learn to generate. A template that rewrites the content so that none of it
// survives as given (upper-casing it, say), or that writes no special token
// after it, is refused with the message index: the labels could only be
// guessed.
//
// strftime_now() (Llama 3.2's "Today Date") renders 26 Jul 2024 in every rendering, so
// that a run's data never depend on the day it runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/data/sft_records.h"

namespace fd::jinja {
class Template;
}

namespace fd::data {

// A byte range [begin, end) of a rendered conversation.
struct TextSpan {
  int64_t begin = 0, end = 0;
};

struct RenderedChat {
  std::string text;
  std::vector<TextSpan> targets;  // one per assistant message, in order (render_targets only)
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

  // The conversation as text, as apply_chat_template(messages, tokenize=False,
  // add_generation_prompt) gives it. Throws fd::Error (kUsage) for the template's
  // raise_exception (its message) and other render errors, prefixed with record.where.
  std::string render(const Record& record, bool add_generation_prompt) const;

  // The same text (add_generation_prompt false) and each assistant turn's target span as
  // the header says; special_tokens: the tokenizer's (Tokenizer::special_tokens()).
  RenderedChat render_targets(const Record& record,
                              const std::vector<std::string>& special_tokens) const;

  // The special token that ends an assistant turn, found by rendering a probe
  // conversation (user "Hi.", assistant "Hello."); "" when the template writes none.
  // generate --chat stops at it.
  std::string end_of_turn(const std::vector<std::string>& special_tokens) const;

 private:
  ChatTemplate() = default;

  std::string name_;
  std::string bos_, eos_;
  std::unique_ptr<jinja::Template> template_;
};

}  // namespace fd::data
