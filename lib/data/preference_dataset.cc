#include "lib/data/preference_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/base/sha256.h"
#include "lib/data/row_order.h"

namespace fd::data {
namespace {

// Where `full` stops continuing `prefix`: the first index that differs, or -1 when `full`
// starts with `prefix`.
int64_t first_difference(const std::vector<int32_t>& prefix, const std::vector<int32_t>& full) {
  const size_t n = std::min(prefix.size(), full.size());
  for (size_t i = 0; i < n; ++i)
    if (prefix[i] != full[i]) return int64_t(i);
  return prefix.size() <= full.size() ? -1 : int64_t(n);
}

std::string encode_with(const Record& record, const PreferenceDatasetOptions& o,
                        text::EncodeCache& cache, EncodedPair* out) {
  const text::Tokenizer& tok = *o.tokenizer;
  out->where = record.where;
  std::string eos;  // standard rows: appended to each answer that does not end with it
  if (record.conversational) {
    if (o.chat_template == nullptr) {
      usage_error(
          "{}: a conversational pair is rendered with a chat template, and there is none: set "
          "data.chat_template (chatml, llama3, alpaca or a file), or use a data.tokenizer with "
          "a chat_template",
          record.where);
    }
    Record prompt;
    prompt.messages = record.messages;
    prompt.where = record.where;
    tok.encode(o.chat_template->render(prompt, true), false, out->prompt, cache);
  } else {
    if (tok.eos_id()) eos = tok.decode(std::vector<int32_t>{*tok.eos_id()});
    tok.encode(record.text, true, out->prompt, cache);
  }
  if (out->prompt.empty()) return "the prompt encodes to no tokens: nothing to answer";
  for (bool chosen : {true, false}) {
    const char* name = chosen ? "chosen" : "rejected";
    std::vector<int32_t>& full = chosen ? out->chosen_full : out->rejected_full;
    if (record.conversational) {
      Record both;
      both.messages = record.messages;
      const std::vector<Message>& answer = chosen ? record.chosen : record.rejected;
      both.messages.insert(both.messages.end(), answer.begin(), answer.end());
      both.where = record.where;
      tok.encode(o.chat_template->render(both, false), false, full, cache);
    } else {
      std::string answer = chosen ? record.chosen_text : record.rejected_text;
      if (!eos.empty() && !answer.ends_with(eos)) answer += eos;
      tok.encode(record.text + answer, true, full, cache);
    }
    if (const int64_t d = first_difference(out->prompt, full); d >= 0) {
      return record.conversational
                 ? fmt::format(
                       "the prompt followed by the {} answer does not render to the prompt's "
                       "tokens (rendered with the generation prompt) and then the answer's: they "
                       "differ at token {} of {}, so the answer's tokens cannot be told apart "
                       "(the chat template writes the prompt differently when an answer follows)",
                       name, d, out->prompt.size())
                 : fmt::format(
                       "prompt + {} does not encode to the prompt's tokens and then the answer's: "
                       "they differ at token {} of {} (the prompt's last characters merge with the "
                       "answer's first: end the prompt with a space or newline, or start the "
                       "answer with one, consistently)",
                       name, d, out->prompt.size());
    }
    std::vector<int32_t>& completion = chosen ? out->chosen : out->rejected;
    completion.assign(full.begin() + std::ptrdiff_t(out->prompt.size()), full.end());
    if (completion.empty()) return fmt::format("the {} answer renders to no tokens", name);
  }
  return "";
}

struct Encoded {
  std::string error;
  EncodedPair pair;
};

void hash_ints(Sha256& h, const auto* data, size_t n) { h.update(data, n * sizeof(*data)); }

}  // namespace

std::string encode_pair(const Record& record, const PreferenceDatasetOptions& o, EncodedPair* out) {
  FD_CHECK(o.tokenizer != nullptr, "encode_pair needs a tokenizer");
  text::EncodeCache cache;
  return encode_with(record, o, cache, out);
}

PreferenceDataset::PreferenceDataset(const PreferenceDatasetOptions& options) : options_(options) {
  FD_CHECK(options_.tokenizer != nullptr && options_.seq_len > 0 &&
               options_.records.format == RecordFormat::kPreference,
           "PreferenceDataset options");
  max_length_ = options_.max_length > 0 ? options_.max_length : options_.seq_len / 2 + 1;
  if (2 * int64_t(max_length_ - 1) > options_.seq_len) {
    usage_error(
        "data.max_length {}: a pair's chosen and rejected sequences share one row of "
        "data.seq_len positions ({} each at most, {} > {}); raise data.seq_len or lower "
        "data.max_length (at most data.seq_len / 2 + 1 = {})",
        max_length_, max_length_ - 1, 2 * (max_length_ - 1), options_.seq_len,
        options_.seq_len / 2 + 1);
  }
  if (options_.tokenizer->eos_id()) pad_id_ = *options_.tokenizer->eos_id();
  const RecordSplits splits = read_splits(options_.train_files, options_.val_files,
                                          options_.val_fraction, options_.records, &stats_.records);
  build(train_, splits.train, true);
  build(val_, splits.val, false);
  if (train_.num_rows() == 0) {
    usage_error(
        "data.train: no training pair left ({} records kept, {} bad records skipped, {} "
        "dropped for a prompt of data.max_length = {} tokens or more)",
        stats_.records.records, stats_.records.skipped, stats_.dropped - stats_.val_dropped,
        max_length_);
  }
  if (!splits.val.empty() && val_.num_rows() == 0) {
    usage_error(
        "{}: no validation pair left of {} records ({} dropped for a prompt of data.max_length "
        "= {} tokens or more); raise data.max_length{}",
        options_.val_files.empty()
            ? "data.val_fraction (the validation records at the end of data.train)"
            : "data.val",
        splits.val.size(), stats_.val_dropped, max_length_,
        options_.val_files.empty() ? " or set data.val_fraction: 0" : "");
  }
}

void PreferenceDataset::build(Split& split, const std::vector<Record>& records, bool is_train) {
  const PreferenceDatasetOptions& o = options_;
  std::vector<std::vector<Encoded>> parts =
      map_on_threads<Encoded>(records.size(), o.threads, [&](size_t i, text::EncodeCache& cache) {
        Encoded e;
        e.error = encode_with(records[i], o, cache, &e.pair);
        return e;
      });
  const size_t L = size_t(max_length_);
  split.offsets.push_back(0);
  for (std::vector<Encoded>& part : parts) {
    for (Encoded& e : part) {
      EncodedPair& p = e.pair;
      if (!e.error.empty()) {
        reject_record(p.where, e.error, o.records, &stats_.records);
        continue;
      }
      for (const std::vector<int32_t>* ids : {&p.chosen_full, &p.rejected_full}) {
        for (int32_t id : *ids) {
          if (id < 0 || id >= o.vocab_size) {
            usage_error(
                "{}: token id {} is outside model.vocab_size = {} (is data.tokenizer the "
                "model's tokenizer?)",
                p.where, id, o.vocab_size);
          }
        }
      }
      if (p.prompt.size() >= L) {  // nothing of an answer would be left: TRL drops the pair
        ++stats_.dropped;
        if (!is_train) ++stats_.val_dropped;
        continue;
      }
      const bool cut = p.chosen_full.size() > L || p.rejected_full.size() > L;
      p.chosen_full.resize(std::min(p.chosen_full.size(), L));
      p.rejected_full.resize(std::min(p.rejected_full.size(), L));
      if (cut) {
        ++stats_.truncated;
        if (!is_train) ++stats_.val_truncated;
      }
      const auto completion = [&](const std::vector<int32_t>& full) {
        return std::vector<int32_t>(full.begin() + std::ptrdiff_t(p.prompt.size()), full.end());
      };
      if (completion(p.chosen_full) == completion(p.rejected_full)) {
        ++stats_.identical;
        if (stats_.identical_where.size() < RecordStats::kMaxReasons)
          stats_.identical_where.push_back(p.where);
      }
      split.tokens.insert(split.tokens.end(), p.chosen_full.begin(), p.chosen_full.end());
      split.tokens.insert(split.tokens.end(), p.rejected_full.begin(), p.rejected_full.end());
      split.offsets.push_back(int64_t(split.tokens.size()));
      split.prompt.push_back(int32_t(p.prompt.size()));
      split.chosen.push_back(int32_t(p.chosen_full.size()));
    }
    part.clear();
    part.shrink_to_fit();
  }
  const int64_t pairs = split.num_pairs();
  std::vector<int64_t> positions(static_cast<size_t>(pairs));
  for (int64_t e = 0; e < pairs; ++e)
    positions[size_t(e)] = split.offsets[size_t(e) + 1] - split.offsets[size_t(e)] - 2;
  RowFill fill = fill_rows(positions, o.seq_len, o.packing, o.pack_order, o.seed, is_train);
  split.order = std::move(fill.order);
  split.rows = std::move(fill.rows);
  if (split.rows.empty()) split.rows.push_back(0);
  if (is_train) {
    stats_.train_pairs = pairs;
    stats_.train_rows = split.num_rows();
    stats_.train_tokens = std::accumulate(positions.begin(), positions.end(), int64_t{0});
    stats_.efficiency = split.num_rows() > 0
                            ? double(stats_.train_tokens) / (double(split.num_rows()) * o.seq_len)
                            : 0.0;
  } else {
    stats_.val_pairs = pairs;
    stats_.val_rows = split.num_rows();
  }
}

void PreferenceDataset::fill_row(const Split& split, int64_t row, int seq_len, bool prompt_targets,
                                 const BatchBuffers& out, int b, int32_t* pairs) const {
  const size_t o = size_t(b) * size_t(seq_len);
  int32_t* tokens = out.tokens + o;
  int32_t* targets = out.targets + o;
  int32_t* starts = out.doc_starts + o;
  int32_t* roles = out.roles ? out.roles + o : nullptr;
  int64_t p = 0;
  const int64_t first = row < 0 ? 0 : split.rows[size_t(row)];
  const int64_t last = row < 0 ? 0 : split.rows[size_t(row) + 1];
  for (int64_t k = first; k < last; ++k) {
    const int32_t e = split.order[size_t(k)];
    const int32_t pair = (*pairs)++;
    if (out.pair_examples) out.pair_examples[pair] = e;
    const int64_t begin = split.offsets[size_t(e)];
    const int64_t n_prompt = split.prompt[size_t(e)];
    const int64_t n_chosen = split.chosen[size_t(e)];
    const int64_t n_rejected = split.offsets[size_t(e) + 1] - begin - n_chosen;
    for (int kind : {0, 1}) {
      const int32_t* seq = split.tokens.data() + begin + (kind == 0 ? 0 : n_chosen);
      const int64_t n = kind == 0 ? n_chosen : n_rejected;
      const int64_t start = p;
      for (int64_t j = 0; j + 1 < n; ++j, ++p) {
        FD_CHECK(p < seq_len, "row {} overflows seq_len {}", row, seq_len);
        const bool completion = j + 1 >= n_prompt;
        const bool target = completion || (kind == 0 && prompt_targets);
        tokens[p] = seq[j];
        targets[p] = target ? seq[j + 1] : -1;
        starts[p] = int32_t(start);
        if (roles) roles[p] = target ? 4 * pair + (completion ? kind : 2) : -1;
      }
    }
  }
  for (; p < seq_len; ++p) {  // padding: no loss, attends only to itself
    tokens[p] = pad_id_;
    targets[p] = -1;
    starts[p] = int32_t(p);
    if (roles) roles[p] = -1;
  }
}

int64_t PreferenceDataset::train_row(int64_t step, int64_t global_index,
                                     int64_t global_batch) const {
  return epoch_row(options_.seed, step, global_index, global_batch, train_.num_rows());
}

void PreferenceDataset::train_batch(const MicroBatch& m, int seq_len,
                                    const BatchBuffers& out) const {
  FD_CHECK(0 <= m.rank && m.rank < m.world && m.batch > 0 && m.micro >= 0 &&
               m.micro < m.accumulation && seq_len == options_.seq_len,
           "rank {} of {}, batch {}, micro-batch {} of {}, seq_len {}", m.rank, m.world, m.batch,
           m.micro, m.accumulation, seq_len);
  FD_CHECK(out.doc_starts != nullptr, "preference rows need doc_starts");
  const int64_t first = (int64_t(m.micro) * m.world + m.rank) * m.batch;
  int32_t pairs = 0;
  for (int b = 0; b < m.batch; ++b) {
    fill_row(train_, train_row(m.step, first + b, m.global_batch()), seq_len,
             options_.prompt_targets, out, b, &pairs);
  }
  if (out.pair_count) *out.pair_count = pairs;
}

int64_t PreferenceDataset::train_targets(int64_t step, int64_t global_batch, int) const {
  int64_t n = 0;
  for (int64_t g = 0; g < global_batch; ++g) {
    const int64_t r = train_row(step, g, global_batch);
    n += train_.rows[size_t(r) + 1] - train_.rows[size_t(r)];
  }
  return n;
}

void PreferenceDataset::val_batch(int64_t batch_index, int rank, int world, int batch, int seq_len,
                                  const BatchBuffers& out) const {
  FD_CHECK(has_val(), "val_batch without a validation split");
  FD_CHECK(out.doc_starts != nullptr && seq_len == options_.seq_len,
           "preference rows need doc_starts and seq_len {}", options_.seq_len);
  const int64_t R = val_.num_rows();
  int32_t pairs = 0;
  for (int b = 0; b < batch; ++b) {
    const int64_t row = (batch_index * world * batch + int64_t(rank) * batch + b) % R;
    fill_row(val_, row, seq_len, options_.prompt_targets, out, b, &pairs);
  }
  if (out.pair_count) *out.pair_count = pairs;
}

int64_t PreferenceDataset::reference_batches(bool val, int world, int batch) const {
  const int64_t per = int64_t(world) * batch;
  FD_CHECK(per > 0, "reference_batches: world {} batch {}", world, batch);
  return ((val ? val_ : train_).num_rows() + per - 1) / per;
}

void PreferenceDataset::reference_batch(bool val, int64_t batch_index, int rank, int world,
                                        int batch, int seq_len, const BatchBuffers& out) const {
  FD_CHECK(out.doc_starts != nullptr && seq_len == options_.seq_len && 0 <= rank && rank < world &&
               batch > 0,
           "reference_batch: rank {} of {}, batch {}, seq_len {}", rank, world, batch, seq_len);
  const Split& split = val ? val_ : train_;
  int32_t pairs = 0;
  for (int b = 0; b < batch; ++b) {
    const int64_t row = batch_index * world * batch + int64_t(rank) * batch + b;
    fill_row(split, row < split.num_rows() ? row : -1, seq_len, options_.prompt_targets, out, b,
             &pairs);
  }
  if (out.pair_count) *out.pair_count = pairs;
}

std::string PreferenceDataset::digest() const {
  Sha256 h;
  const std::string tag = "fdtrain preference rows 1";
  h.update(tag.data(), tag.size());
  const int T = options_.seq_len;
  const int64_t seq_len = T;
  hash_ints(h, &seq_len, 1);
  const size_t n = static_cast<size_t>(T);
  std::vector<int32_t> tokens(n), targets(n), starts(n);
  std::vector<int64_t> examples(n / 2 + 1);
  for (const Split* split : {&train_, &val_}) {
    const int64_t rows = split->num_rows();
    hash_ints(h, &rows, 1);
    for (int64_t r = 0; r < rows; ++r) {
      BatchBuffers out{tokens.data(), targets.data(), starts.data()};
      out.pair_examples = examples.data();
      int32_t pairs = 0;
      fill_row(*split, r, T, false, out, 0, &pairs);
      hash_ints(h, tokens.data(), tokens.size());
      hash_ints(h, targets.data(), targets.size());
      hash_ints(h, starts.data(), starts.size());
      hash_ints(h, &pairs, 1);
      hash_ints(h, examples.data(), size_t(pairs));
    }
  }
  return h.hex_digest();
}

std::string PreferenceDataset::summary() const {
  const PreferenceStats& s = stats_;
  std::string line = fmt::format(
      "preference: {} training pairs -> {} {}rows of {} ({:.1f}% of positions hold tokens), "
      "max_length {}",
      s.train_pairs, s.train_rows,
      options_.packing ? fmt::format("packed ({}) ", pack_order_name(options_.pack_order)) : "",
      options_.seq_len, 100.0 * s.efficiency, max_length_);
  if (s.val_pairs > 0) line += fmt::format(", {} validation pairs", s.val_pairs);
  if (s.records.skipped > 0) line += fmt::format(", {} bad records skipped", s.records.skipped);
  const auto of_which_val = [](int64_t n) {
    return n > 0 ? fmt::format(" ({} of them validation)", n) : std::string();
  };
  if (s.dropped > 0) {
    line += fmt::format(", {} dropped for a prompt of max_length tokens or more{}", s.dropped,
                        of_which_val(s.val_dropped));
  }
  if (s.truncated > 0)
    line += fmt::format(", {} truncated{}", s.truncated, of_which_val(s.val_truncated));
  if (s.identical > 0) {
    line += fmt::format(", {} with identical chosen and rejected answers (first: {})", s.identical,
                        s.identical_where.front());
  }
  return line;
}

}  // namespace fd::data
