#include "lib/engine/tokenizer_fit.h"

#include <fmt/format.h>

#include "lib/base/error.h"

namespace fd::engine {

void require_tokenizer_fits(const text::Tokenizer& tok, int64_t vocab_size,
                            std::string_view tokenizer, std::string_view model,
                            std::string_view advice) {
  if (tok.vocab_size() > vocab_size)
    usage_error("{} has {} ids but {} {}: {}", tokenizer, tok.vocab_size(), model, vocab_size,
                advice);
}

std::unique_ptr<text::Tokenizer> load_model_tokenizer(const std::string& dir, int64_t vocab_size,
                                                      const std::string& model_name) {
  std::unique_ptr<text::Tokenizer> tok = text::load_tokenizer(dir);
  require_tokenizer_fits(*tok, vocab_size, "the tokenizer " + dir,
                         "the model " + model_name + " only", "they do not belong together");
  return tok;
}

}  // namespace fd::engine
