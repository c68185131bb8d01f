// Fuzz target: the conversation `fdtrain template --messages FILE` renders.
//
// The command's reader (apps/fdtrain/chat_cmd.cc: read_conversation) is CLI
// code; this target runs the same steps through the library functions it
// calls: the file's JSON (fd::read_json_file: a regular file, size, nesting
// and syntax checked), a bare array taken as {"messages": [...]},
// data::parse_record as a chat record that needs no assistant message, then
// the chat templates: the built-ins (chatml, llama3, alpaca) and two real
// ones (Llama 3.2's and Qwen2.5's, the jinja target's seeds).
//
// Input: a messages file (any bytes), written to a scratch file. Checked:
// every step either succeeds or throws fd::Error (parse_record: returns "" or
// a reason); every template renders the conversation (with and without the
// generation prompt) and its assistant targets (spans inside the text, in
// order), or throws fd::Error.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/base/input_file.h"
#include "lib/data/chat_template.h"
#include "lib/data/sft_records.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "chat_messages_fuzz: %s\n", what.c_str());
  std::abort();
}

// A template of the jinja target's seed corpus, found from this file's path.
fd::data::ChatTemplate seed_template(const char* name, const std::string& bos,
                                     const std::string& eos) {
  const std::filesystem::path p =
      std::filesystem::path(__FILE__).parent_path() / "corpus" / "jinja" / name;
  std::ifstream in(p, std::ios::binary);
  if (!in) broken("cannot read " + p.string());
  const std::string source{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return fd::data::ChatTemplate::from_source(source, name, bos, eos);
}

const std::vector<fd::data::ChatTemplate>& templates() {
  static const std::vector<fd::data::ChatTemplate> t = [] {
    std::vector<fd::data::ChatTemplate> v;
    for (const std::string& name : fd::data::ChatTemplate::builtin_names())
      v.push_back(fd::data::ChatTemplate::load(name, ""));
    v.push_back(seed_template("llama3_2", "<|begin_of_text|>", "<|eot_id|>"));
    v.push_back(seed_template("qwen2_5", "", "<|im_end|>"));
    return v;
  }();
  return t;
}

// read_conversation's steps.
fd::data::Record read_conversation(const std::string& path) {
  nlohmann::json j = fd::read_json_file(path, "--messages");
  if (j.is_array()) j = nlohmann::json{{"messages", j}};
  fd::data::Record r;
  fd::data::RecordOptions o;
  o.format = fd::data::RecordFormat::kChat;
  o.require_assistant = false;
  const std::string err = fd::data::parse_record(j.dump(), o, &r);
  if (!err.empty()) fd::usage_error("--messages {}: {}", path, err);
  if (r.messages.empty()) broken("a conversation without messages was accepted");
  r.where = path;
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::string> special = {
      "<|im_start|>",        "<|im_end|>",        "<|endoftext|>", "<|begin_of_text|>",
      "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",    "</s>"};
  static const std::string path = fd::fuzz::scratch_dir() + "/messages.json";
  fd::fuzz::write_file(path, fd::fuzz::as_view(data, size));
  fd::fuzz::expect_clean([&] {
    const fd::data::Record r = read_conversation(path);
    for (const fd::data::ChatTemplate& t : templates()) {
      for (const bool prompt : {false, true})
        fd::fuzz::expect_clean([&] { (void)t.render(r, prompt); });
      fd::fuzz::expect_clean([&] {
        const fd::data::RenderedChat c = t.render_targets(r, special);
        int64_t last = 0;
        for (const fd::data::TextSpan& s : c.targets) {
          if (s.begin < last || s.begin > s.end || s.end > static_cast<int64_t>(c.text.size()))
            broken("a target span outside the text or out of order (" + t.name() + ")");
          last = s.end;
        }
      });
    }
  });
  return 0;
}
