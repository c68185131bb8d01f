// open_dataset(): the data a recipe names, opened and checked as training
// opens it. `fdtrain validate` calls it to find, without training, every data
// problem `fdtrain train` would stop at (an empty or malformed file, a token
// id past model.vocab_size, a split shorter than data.seq_len + 1).
#pragma once

#include <memory>

#include "lib/config/recipe.h"
#include "lib/data/token_dataset.h"

namespace fd::engine {

// Opens data.train and data.val (data.format, data.val_fraction,
// data.seq_len, model.vocab_size) as a TokenDataset. Throws fd::Error
// (kUsage) for a bad file or split; the message starts with where the
// recipe names the file at fault ("r.yaml:9:11: data.train[0]: ...", else
// where the data section is), then the problem and what to do.
std::unique_ptr<data::TokenDataset> open_dataset(const config::Recipe& recipe);

}  // namespace fd::engine
