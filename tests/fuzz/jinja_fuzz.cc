// Fuzz target: the Jinja chat-template interpreter (lib/jinja/jinja.h).
//
// Input: a template (any bytes). Checked: parsing either succeeds or throws
// fd::Error; a template that parses renders (with and without the generation
// prompt) over a small fixed chat context, within tight bounds on steps,
// output and nesting, to text and spans, or throws fd::Error; the spans lie
// inside the text, sorted, and a second render gives the same result.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "lib/jinja/jinja.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using fd::jinja::Rendered;
using fd::jinja::Value;

Value context(bool add_generation_prompt) {
  static const nlohmann::ordered_json base = nlohmann::ordered_json::parse(R"({
    "bos_token": "<s>", "eos_token": "</s>", "n": 3, "f": 2.5, "xs": [3, 1, 2],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"a": 1}}}],
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": " hi {{ x }} \u00e9\ud83d\ude00 "},
      {"role": "assistant", "content": "<think>\nr\n</think>\n\nanswer"},
      {"role": "user", "content": ""},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "abcdefghi",
        "function": {"name": "f", "arguments": {"a": 1}}}]},
      {"role": "tool", "content": "42", "tool_call_id": "abcdefghi"}]})");
  Value ctx = Value::from_json(base);
  Value messages = Value::array();
  for (size_t i = 0; i < ctx.find("messages")->size(); ++i) {
    Value m = ctx.find("messages")->at(i);
    if (m.find("role")->str() == "assistant")
      m.set("content", Value::string(m.find("content")->str(), static_cast<int32_t>(i)));
    messages.push_back(m);
  }
  ctx.set("messages", messages);
  ctx.set("add_generation_prompt", Value::boolean(add_generation_prompt));
  return ctx;
}

void check(const Rendered& r) {
  int64_t last = 0;
  for (const auto& s : r.spans) {
    if (s.begin < last || s.begin > s.end || s.end > static_cast<int64_t>(r.text.size()) ||
        s.tag < 0) {
      std::fprintf(stderr, "jinja_fuzz: bad span [%lld, %lld) tag %d in %zu bytes\n",
                   static_cast<long long>(s.begin), static_cast<long long>(s.end), s.tag,
                   r.text.size());
      std::abort();
    }
    last = s.begin;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  const std::string_view source = fd::fuzz::as_view(data, size);
  static const Value with_prompt = context(true), without = context(false);
  fd::jinja::RenderOptions options;
  options.max_steps = 200'000;
  options.max_output_bytes = 1 << 20;
  options.max_depth = 64;
  options.now_unix_seconds = 1'700'000'000;
  fd::fuzz::expect_clean([&] {
    const auto t = fd::jinja::Template::parse(source, "fuzz");
    for (const Value* ctx : {&with_prompt, &without}) {
      fd::fuzz::expect_clean([&] {
        const Rendered a = t.render(*ctx, options);
        check(a);
        const Rendered b = t.render(*ctx, options);
        if (a.text != b.text || a.spans != b.spans) {
          std::fprintf(stderr, "jinja_fuzz: a second render differs\n");
          std::abort();
        }
      });
    }
  });
  return 0;
}
