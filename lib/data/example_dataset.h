// ExampleDataset: supervised fine-tuning examples (chat, instruct or text
// records, sft_records.h) as token rows with loss only where the model should
// learn to answer, padded or packed.
//
// Encoding. A chat or instruct record is rendered with the chat template and
// its target spans found (chat_template.h: each assistant answer and its
// end-of-turn token). The text is cut at every span boundary and the pieces
// are encoded one after another (Tokenizer::encode_piece, each piece after the
// first continuing the text), so no token straddles a boundary: the tokens of
// a prompt are those the prompt alone encodes to, which is what the model sees
// at inference before it generates the answer. Where no token of the whole
// text's encoding crosses a boundary (the usual case: special tokens and
// pre-tokenizer splits sit there) this is the whole text's encoding. A text
// record is BOS + its text + EOS, all targets. With train_on_prompt every
// token of the rendered text is a target (encoded whole).
//
// An example of n tokens fills n - 1 positions of a row: inputs tokens 0 .. n-2,
// targets tokens 1 .. n-1 where the token is a target, else -1; its last token
// is only ever a target. Longer than seq_len + 1 tokens: an error naming the
// record (Truncation::kError), or cut keeping the first / last seq_len + 1
// tokens. An example left with no target is dropped and counted. Validation
// examples are cut and dropped alike, and counted too; validation records of
// which no example is left are an error (the run would have no eval_loss).
//
// Rows. Without packing each example is one row, padded (token: EOS or 0,
// target -1). With packing, whole examples share rows as pack_order says
// (row_order.h: best fit decreasing over windows of a seeded shuffle, or
// first come first served in that shuffle); doc_starts say where each
// example begins, so attention stays inside it and positions restart
// (BatchSource::packed()).
//
// Sampling. Training row g of step s is row perm_e(i mod R) with i = s * G + g
// over the R training rows, e = i div R the epoch and perm_e a seeded
// permutation (a Feistel network, so nothing is stored): every row once per
// epoch, in a new order each epoch, a pure function of (seed, step, g).
// Validation rows are read in order: row b of evaluation batch k on rank r is
// row (k * world * batch + r * batch + b) mod R_val.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/data/batch_source.h"
#include "lib/data/chat_template.h"
#include "lib/data/row_order.h"
#include "lib/data/sft_records.h"
#include "lib/text/tokenizer.h"

namespace fd::data {

enum class Truncation { kError, kRight, kLeft };

struct ExampleOptions {
  std::vector<std::string> train_files;  // data.train, expanded
  std::vector<std::string> val_files;    // data.val; empty: hold out the last val_fraction
  double val_fraction = 0.05;            // of the records, when val_files is empty
  RecordOptions records;                 // format, field names, on_bad_record
  int seq_len = 0;                       // positions per row
  int64_t vocab_size = 0;                // every id must be below it
  std::shared_ptr<const text::Tokenizer> tokenizer;   // required
  std::shared_ptr<const ChatTemplate> chat_template;  // chat and instruct: required
  bool train_on_prompt = false;                       // chat/instruct: targets everywhere
  Truncation truncation = Truncation::kError;
  bool packing = false;
  PackOrder pack_order = PackOrder::kBestFit;  // with packing: which examples share a row
  uint64_t seed = 0;                           // the packing order and the epochs' permutations
  int threads = 1;                             // encoding threads
};

// What summary.json reports about the data (docs/RUN_DIR.md).
struct ExampleStats {
  RecordStats records;
  int64_t train_examples = 0, val_examples = 0;
  int64_t train_rows = 0, val_rows = 0;
  int64_t train_tokens = 0;         // positions holding an example's token (train rows)
  int64_t train_target_tokens = 0;  // of which targets
  int64_t truncated = 0;            // examples cut to fit seq_len (training and validation)
  int64_t without_targets = 0;      // examples dropped for having no target left (both)
  int64_t val_truncated = 0;        // of `truncated`, validation examples
  int64_t val_without_targets = 0;  // of `without_targets`, validation examples
  // train_tokens / (train_rows * seq_len): how full the rows are (packing or padding).
  double efficiency = 0.0;
  // Messages whose text the chat template did not write (RenderedChat::not_written), by
  // "ROLE KEY" ("assistant reasoning_content", "system content"), over the kept examples;
  // and the first such message, "FILE:LINE messages[i]".
  std::map<std::string, int64_t> not_written;
  std::string not_written_where;
};

// One example as the model sees it, for `fdtrain data preview`.
struct EncodedExample {
  std::string where;  // the record's FILE:LINE
  std::vector<int32_t> tokens;
  std::vector<uint8_t> target;  // per token: 1 if the model is trained to produce it
  std::string error;            // the dataset's own encoding: why it was refused (skip)
  // "ROLE KEY" of each message text the template did not write, and where the first is
  // ("messages[i]").
  std::vector<std::string> not_written;
  std::string not_written_at;
};

// Encodes one record as the dataset does (preview and tests).
EncodedExample encode_example(const Record& record, const ExampleOptions& o);

class ExampleDataset : public BatchSource {
 public:
  // Reads, renders and encodes every record. Throws fd::Error (kUsage): bad records (with
  // BadRecords::kError), template errors, an example too long (Truncation::kError), no
  // training example left, validation records but no validation example left, ids outside
  // the vocabulary.
  explicit ExampleDataset(const ExampleOptions& options);

  const ExampleStats& stats() const { return stats_; }
  // One line for the log: "chat: 1200 examples -> 310 packed rows of 512 (94.1% full), ...".
  std::string summary() const;
  // "" or one line: which message texts the chat template did not write, how many, the
  // first's FILE:LINE (stats().not_written), for a warning.
  std::string not_written_warning() const;

  // BatchSource.
  bool packed() const override { return options_.packing; }
  PackOrder pack_order() const { return options_.pack_order; }
  void train_batch(const MicroBatch& m, int seq_len, const BatchBuffers& out) const override;
  int64_t train_targets(int64_t step, int64_t global_batch, int seq_len) const override;
  bool has_val() const override { return val_.num_rows() > 0; }
  void val_batch(int64_t batch_index, int rank, int world, int batch, int seq_len,
                 const BatchBuffers& out) const override;

  // The training row sample g of step `step` reads (tests).
  int64_t train_row(int64_t step, int64_t global_index, int64_t global_batch) const;

 private:
  // Encoded examples and the rows they form.
  struct Split {
    std::vector<int32_t> tokens;   // every example's tokens, one after another
    std::vector<uint8_t> target;   // per token
    std::vector<int64_t> offsets;  // example e is tokens [offsets[e], offsets[e + 1])
    std::vector<int32_t> order;    // examples in row order
    std::vector<int64_t> rows;     // row r holds order[rows[r] .. rows[r + 1])
    std::vector<int32_t> row_targets;
    int64_t num_rows() const { return rows.empty() ? 0 : int64_t(rows.size()) - 1; }
  };
  void build(Split& split, const std::vector<Record>& records, bool is_train);
  void fill_row(const Split& split, int64_t row, int seq_len, int32_t* tokens, int32_t* targets,
                int32_t* doc_starts) const;

  ExampleOptions options_;
  ExampleStats stats_;
  Split train_, val_;
  int32_t pad_id_ = 0;
};

}  // namespace fd::data
