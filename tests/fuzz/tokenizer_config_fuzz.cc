// Fuzz target: tokenizer_config.json (lib/data: load_tokenizer's bos_token
// and eos_token, ChatTemplate::load's chat_template and special tokens).
//
// Input: a tokenizer_config.json (any bytes), written into a scratch
// tokenizer directory beside a fixed tokenizer.json that knows the special
// tokens of the real files the seeds come from (fuzz_tokenizer_dir.h).
// Checked: loading the tokenizer either succeeds or throws fd::Error, and its
// BOS, EOS and stop ids lie inside its vocabulary; loading the tokenizer's
// chat template either succeeds or throws fd::Error, and a template that
// loads renders a small conversation (with and without the generation
// prompt), its assistant targets (spans inside the text, in order) and its
// end-of-turn token, or throws fd::Error.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "lib/data/chat_template.h"
#include "lib/text/hf_tokenizer.h"
#include "lib/text/tokenizer.h"
#include "tests/fuzz/fuzz_tokenizer_dir.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "tokenizer_config_fuzz: %s\n", what.c_str());
  std::abort();
}

void check_ids(const fd::text::Tokenizer& tok) {
  const int64_t v = tok.vocab_size();
  auto inside = [&](int64_t id, const char* what) {
    if (id < 0 || id >= v)
      broken(std::string(what) + " " + std::to_string(id) + " outside the vocabulary");
  };
  if (tok.bos_id()) inside(*tok.bos_id(), "bos id");
  if (tok.eos_id()) inside(*tok.eos_id(), "eos id");
  for (const int32_t id : tok.stop_ids()) inside(id, "stop id");
}

fd::data::Record conversation() {
  fd::data::Record r;
  r.messages = {{"system", "Be brief."},
                {"user", "Hi {{ x }} \xc3\xa9"},
                {"assistant", "Hello."},
                {"user", ""},
                {"assistant", " two "}};
  r.where = "fuzz conversation";
  return r;
}

void check_template(const fd::data::ChatTemplate& t, const std::vector<std::string>& special) {
  static const fd::data::Record r = conversation();
  for (const bool prompt : {false, true})
    fd::fuzz::expect_clean([&] { (void)t.render(r, prompt); });
  fd::fuzz::expect_clean([&] {
    const fd::data::RenderedChat c = t.render_targets(r, special);
    int64_t last = 0;
    for (const fd::data::TextSpan& s : c.targets) {
      if (s.begin < last || s.begin > s.end || s.end > static_cast<int64_t>(c.text.size()))
        broken("a target span outside the text or out of order");
      last = s.end;
    }
  });
  (void)t.end_of_turn(special);  // refusals are "" here, never an exception
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    std::string d = fd::fuzz::scratch_dir() + "/tokenizer";
    std::filesystem::create_directories(d);
    fd::fuzz::write_file(d + "/tokenizer.json", fd::fuzz::tokenizer_json_with_specials());
    return d;
  }();
  // The special tokens of the fixed tokenizer.json, for the templates' targets.
  static const std::vector<std::string> special =
      fd::text::HfTokenizer::from_strings(fd::fuzz::tokenizer_json_with_specials(), "",
                                          dir + "/tokenizer.json")
          ->special_tokens();
  fd::fuzz::write_file(dir + "/tokenizer_config.json", fd::fuzz::as_view(data, size));
  fd::fuzz::expect_clean([&] { check_ids(*fd::text::load_tokenizer(dir)); });
  fd::fuzz::expect_clean([&] { check_template(fd::data::ChatTemplate::load("", dir), special); });
  // A built-in template takes only bos_token and eos_token from the file.
  fd::fuzz::expect_clean(
      [&] { check_template(fd::data::ChatTemplate::load("llama3", dir), special); });
  return 0;
}
