// The one check that a tokenizer fits a model: every id it produces must index
// the model's embedding, so a tokenizer with more ids than the model's
// vocabulary is refused before anything is encoded. Training checks the
// recipe's data.tokenizer against model.vocab_size (assemble.cc); eval and
// generate check a tokenizer directory against the model they loaded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "lib/text/tokenizer.h"

namespace fd::engine {

// A usage fd::Error "TOKENIZER has N ids but MODEL M: ADVICE" when `tok` has
// more ids than `vocab_size`; nothing otherwise. `tokenizer` names the
// tokenizer ("the tokenizer DIR"), `model` the vocabulary it is checked
// against ("the model PATH only"), `advice` what to do.
void require_tokenizer_fits(const text::Tokenizer& tok, int64_t vocab_size,
                            std::string_view tokenizer, std::string_view model,
                            std::string_view advice);

// eval and generate: DIR's tokenizer.json, checked against the loaded model
// `model_name` of `vocab_size` ids.
std::unique_ptr<text::Tokenizer> load_model_tokenizer(const std::string& dir, int64_t vocab_size,
                                                      const std::string& model_name);

}  // namespace fd::engine
