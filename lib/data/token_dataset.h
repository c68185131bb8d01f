// TokenDataset: the training and validation token streams of a run.
//
// The train files are concatenated, in order and with nothing inserted
// between them, into one logical stream (documents run into each other, as in
// nanoGPT and llm.c). Validation comes from the val files when given;
// otherwise the last val_fraction of the train stream is held out, so the two
// splits never overlap. Every file is validated at construction; after that
// nothing here can fail.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/data/token_file.h"
#include "lib/text/tokenizer.h"

namespace fd::data {

struct DatasetOptions {
  // Training files, concatenated in this order (the recipe's data.train). Required.
  std::vector<std::string> train_files;
  // Validation files (data.val); empty: hold out the tail of train.
  std::vector<std::string> val_files;
  // How to read every file (data.format).
  TokenFormat format = TokenFormat::kAuto;
  // Fraction of the train stream held out for validation when val_files is
  // empty (data.val_fraction), in [0, 1). 0 means no validation split.
  double val_fraction = 0.1;
  // Sequence length (data.seq_len): each split must hold seq_len + 1 tokens.
  int seq_len = 0;
  // model.vocab_size: every token id must be below it.
  int64_t vocab_size = 0;
  // data.tokenizer: with format kText, each file is encoded as documents
  // (document_encoder.h: BOS + text + EOS; .jsonl: one document per line)
  // instead of read byte by byte. Null: the byte tokenizer.
  std::shared_ptr<const text::Tokenizer> tokenizer;
  // The document field of .jsonl records (data.text_field).
  std::string text_field = "text";
};

// A contiguous range [begin, end) of a concatenation of files.
class TokenStream {
 public:
  TokenStream() = default;

  int64_t size() const { return end_ - begin_; }
  bool empty() const { return size() == 0; }
  // Writes tokens [start, start + count) of this stream to out, crossing file
  // boundaries as needed; requires start + count <= size().
  void copy(int64_t start, int64_t count, int32_t* out) const;
  int32_t operator[](int64_t i) const;

 private:
  friend class TokenDataset;
  TokenStream(std::shared_ptr<const std::vector<TokenFile>> files, int64_t begin, int64_t end);

  std::shared_ptr<const std::vector<TokenFile>> files_;
  std::vector<int64_t> starts_;  // starts_[i]: first token of files_[i] in the concatenation
  int64_t begin_ = 0;
  int64_t end_ = 0;
};

class TokenDataset {
 public:
  // Opens and validates every file and forms the splits. Throws fd::Error
  // (kUsage) for a bad file, a bad option or a split shorter than seq_len + 1.
  explicit TokenDataset(const DatasetOptions& options);

  const TokenStream& train() const { return train_; }
  const TokenStream& val() const { return val_; }
  bool has_val() const { return !val_.empty(); }
  // One line for the log: "train 1000000 tokens (2 files), val 111111 tokens (last 10% of train)".
  std::string summary() const;

 private:
  DatasetOptions options_;
  TokenStream train_;
  TokenStream val_;
  int64_t train_files_ = 0;
  int64_t val_files_ = 0;
};

}  // namespace fd::data
