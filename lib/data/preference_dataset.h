// PreferenceDataset: preference pairs (sft_records.h's preference records) as token rows
// for DPO-style objectives, tokenized and split as current TRL's DPOTrainer (0.29 and
// later) does.
//
// Encoding. Conversational: P = ids(render(prompt, add_generation_prompt)), PC =
// ids(render(prompt + answer)), each rendering encoded without special tokens. Standard:
// the tokenizer's EOS text is appended to the answer unless it ends with it, P =
// encode(prompt) and PC = encode(prompt + answer) with the tokenizer's special tokens (its
// post-processor: Llama 3's BOS). The completion is PC[len(P):]; no EOS is added. A record
// is bad (FILE:LINE, data.on_bad_record) when PC does not start with P (TRL would
// misalign the answer; we refuse), when an answer's completion is empty or the prompt
// encodes to nothing.
//
// Lengths. Each sequence (prompt + completion) keeps its first max_length tokens; a pair
// whose prompt alone has max_length tokens or more is dropped and counted (training and
// validation alike). A pair whose chosen and rejected completions are the same tokens
// (after the cut) is kept and counted as identical: its loss cannot move.
//
// Rows. A pair is two documents in one row: the chosen sequence (n_c tokens, n_c - 1
// positions: inputs tokens 0 .. n-2, targets 1 .. n-1), then the rejected one, doc_starts
// marking each (packed() is always true). Targets lie only on completion tokens (target
// index >= len(P)); with prompt_targets also on the chosen prompt's tokens 1 .. len(P)-1
// (ORPO's NLL). Without packing one pair per row, padded (EOS or 0, target -1); with
// packing whole pairs share rows as pack_order says (row_order.h: best fit decreasing, or
// first come first served, in a seeded shuffled order), never split.
// A pair takes at most 2 * (max_length - 1) positions: max_length <= seq_len / 2 + 1.
//
// Sampling is ExampleDataset's (row_order.h): training row g of step s is a pure function
// of (seed, s, g); validation rows are read in order, wrapping. train_targets() counts
// pairs (pairs() is true).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/data/batch_source.h"
#include "lib/data/chat_template.h"
#include "lib/data/row_order.h"
#include "lib/data/sft_records.h"
#include "lib/text/tokenizer.h"

namespace fd::data {

struct PreferenceDatasetOptions {
  std::vector<std::string> train_files;  // data.train, expanded
  std::vector<std::string> val_files;    // data.val; empty: hold out the last val_fraction
  double val_fraction = 0.05;            // of the records, when val_files is empty
  RecordOptions records = {.format = RecordFormat::kPreference,  // on_bad_record
                           .fields = {},
                           .bad = BadRecords::kError,
                           .require_assistant = true};
  int seq_len = 0;                                    // positions per row
  int max_length = 0;                                 // tokens per sequence; 0: seq_len / 2 + 1
  int64_t vocab_size = 0;                             // every id must be below it
  std::shared_ptr<const text::Tokenizer> tokenizer;   // required
  std::shared_ptr<const ChatTemplate> chat_template;  // required by conversational records
  bool prompt_targets = false;  // also targets on the chosen prompt (set by the objective)
  bool packing = false;
  PackOrder pack_order = PackOrder::kBestFit;  // with packing: which examples share a row
  uint64_t seed = 0;                           // the packing order and the epochs' permutations
  int threads = 1;                             // encoding threads
};

// What summary.json reports about the pairs (docs/RUN_DIR.md).
struct PreferenceStats {
  RecordStats records;  // read, and bad records skipped (reading or encoding)
  int64_t train_pairs = 0, val_pairs = 0;
  int64_t train_rows = 0, val_rows = 0;
  int64_t dropped = 0, val_dropped = 0;      // prompt >= max_length (val_: of which validation)
  int64_t truncated = 0, val_truncated = 0;  // a sequence cut to max_length
  int64_t identical = 0;                     // chosen completion == rejected completion
  std::vector<std::string> identical_where;  // the first kMaxReasons of them, FILE:LINE
  int64_t train_tokens = 0;                  // positions holding a token (training rows)
  double efficiency = 0.0;                   // train_tokens / (train_rows * seq_len)
};

// One pair as the dataset encodes it, before the max_length cut.
struct EncodedPair {
  std::string where;
  std::vector<int32_t> prompt;                      // P
  std::vector<int32_t> chosen, rejected;            // the completions
  std::vector<int32_t> chosen_full, rejected_full;  // PC of each
};

// Encodes one record as the dataset does (preview, tests): "" and `out`, or why the record
// is bad. Throws fd::Error (kUsage) for template errors, as ChatTemplate::render does.
std::string encode_pair(const Record& record, const PreferenceDatasetOptions& o, EncodedPair* out);

class PreferenceDataset : public BatchSource {
 public:
  // Reads and encodes every record. Throws fd::Error (kUsage): bad records (with
  // BadRecords::kError), template errors, no training pair left, validation records but no
  // validation pair left, ids outside the vocabulary, max_length too large for seq_len.
  explicit PreferenceDataset(const PreferenceDatasetOptions& options);

  const PreferenceStats& stats() const { return stats_; }
  int max_length() const { return max_length_; }
  bool packing() const { return options_.packing; }  // several pairs per row
  PackOrder pack_order() const { return options_.pack_order; }
  // One line for the log: "preference: 1200 training pairs -> 1200 rows of 1024 ...".
  std::string summary() const;

  // BatchSource.
  bool packed() const override { return true; }
  bool pairs() const override { return true; }
  void train_batch(const MicroBatch& m, int seq_len, const BatchBuffers& out) const override;
  // Pairs in the step's rows.
  int64_t train_targets(int64_t step, int64_t global_batch, int seq_len) const override;
  bool has_val() const override { return val_.num_rows() > 0; }
  void val_batch(int64_t batch_index, int rank, int world, int batch, int seq_len,
                 const BatchBuffers& out) const override;

  // The reference pass: every row of a split once, in order. Batch k on rank r holds rows
  // k * world * batch + r * batch + b; rows past the end are padding (targets -1, no pair).
  int64_t num_pairs(bool val) const { return val ? stats_.val_pairs : stats_.train_pairs; }
  int64_t reference_batches(bool val, int world, int batch) const;
  void reference_batch(bool val, int64_t batch_index, int rank, int world, int batch, int seq_len,
                       const BatchBuffers& out) const;

  // SHA-256 (hex) of what decides each pair's log-probabilities: every row of both splits
  // (tokens, completion targets, doc_starts, pair indices) and seq_len. Not prompt_targets.
  std::string digest() const;

  // The training row sample g of step `step` reads (tests).
  int64_t train_row(int64_t step, int64_t global_index, int64_t global_batch) const;

 private:
  struct Split {
    std::vector<int32_t> tokens;          // each pair's chosen sequence, then its rejected one
    std::vector<int64_t> offsets;         // pair e's tokens start at offsets[e] (size pairs + 1)
    std::vector<int32_t> prompt, chosen;  // per pair: len(P), chosen sequence length
    std::vector<int32_t> order;           // pairs in row order
    std::vector<int64_t> rows;            // row r holds order[rows[r] .. rows[r + 1])
    int64_t num_pairs() const { return int64_t(prompt.size()); }
    int64_t num_rows() const { return rows.empty() ? 0 : int64_t(rows.size()) - 1; }
  };
  void build(Split& split, const std::vector<Record>& records, bool is_train);
  // Writes `row` (padding for row -1) at row `b` of `out`, numbering its pairs from *pairs
  // on (advanced past them).
  void fill_row(const Split& split, int64_t row, int seq_len, bool prompt_targets,
                const BatchBuffers& out, int b, int32_t* pairs) const;

  PreferenceDatasetOptions options_;
  PreferenceStats stats_;
  Split train_, val_;
  int max_length_ = 0;
  int32_t pad_id_ = 0;
};

}  // namespace fd::data
