#include "lib/data/example_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/data/document_encoder.h"
#include "lib/data/row_order.h"

namespace fd::data {
namespace {

const char* truncation_name(Truncation t) {
  switch (t) {
    case Truncation::kError:
      return "error";
    case Truncation::kRight:
      return "right";
    case Truncation::kLeft:
      return "left";
  }
  return "?";
}

std::string format_name(RecordFormat f) {
  switch (f) {
    case RecordFormat::kChat:
      return "chat";
    case RecordFormat::kInstruct:
      return "instruct";
    case RecordFormat::kText:
      return "text";
    case RecordFormat::kPreference:
      return "preference";
  }
  return "?";
}

// Encodes text[begin, end) after what came before it.
void encode_range(const text::Tokenizer& tok, const std::string& text, int64_t begin, int64_t end,
                  std::vector<int32_t>& out, text::EncodeCache& cache) {
  if (end <= begin) return;
  tok.encode_piece(std::string_view(text).substr(size_t(begin), size_t(end - begin)), begin > 0,
                   out, cache);
}

EncodedExample encode_with(const Record& record, const ExampleOptions& o,
                           text::EncodeCache& cache) {
  const text::Tokenizer& tok = *o.tokenizer;
  EncodedExample e;
  e.where = record.where;
  // Marks the tokens encoded since the last call as targets (1) or not (0).
  auto mark = [&](uint8_t value) { e.target.resize(e.tokens.size(), value); };
  if (o.records.format == RecordFormat::kText) {
    const DocumentWrap wrap = document_wrap(tok);
    if (wrap.bos) e.tokens.push_back(*wrap.bos);
    tok.encode(record.text, false, e.tokens, cache);
    if (wrap.eos) e.tokens.push_back(*wrap.eos);
    mark(1);
    return e;
  }
  FD_CHECK(o.chat_template != nullptr, "encode_example: {} records need a chat template",
           format_name(o.records.format));
  if (o.train_on_prompt) {
    const std::string text = o.chat_template->render(record, false);
    tok.encode(text, false, e.tokens, cache);
    mark(1);
    return e;
  }
  const RenderedChat r = o.chat_template->render_targets(record, tok.special_tokens());
  for (const NotWritten& n : r.not_written) {
    if (e.not_written.empty()) e.not_written_at = fmt::format("messages[{}]", n.message);
    e.not_written.push_back(record.messages[n.message].role + " " + n.key);
  }
  int64_t at = 0;
  for (const TextSpan& t : r.targets) {
    encode_range(tok, r.text, at, t.begin, e.tokens, cache);
    mark(0);
    encode_range(tok, r.text, t.begin, t.end, e.tokens, cache);
    mark(1);
    at = t.end;
  }
  encode_range(tok, r.text, at, int64_t(r.text.size()), e.tokens, cache);
  mark(0);
  return e;
}

}  // namespace

EncodedExample encode_example(const Record& record, const ExampleOptions& o) {
  text::EncodeCache cache;
  return encode_with(record, o, cache);
}

ExampleDataset::ExampleDataset(const ExampleOptions& options) : options_(options) {
  FD_CHECK(options_.tokenizer != nullptr && options_.seq_len > 0 &&
               options_.records.format != RecordFormat::kPreference,
           "ExampleDataset options");
  if (options_.tokenizer->eos_id()) pad_id_ = *options_.tokenizer->eos_id();
  RecordSplits splits = read_splits(options_.train_files, options_.val_files, options_.val_fraction,
                                    options_.records, &stats_.records);
  const std::vector<Record>& train = splits.train;
  const std::vector<Record>& val = splits.val;
  build(train_, train, true);
  build(val_, val, false);
  if (train_.num_rows() == 0) {
    usage_error(
        "data.train: no training example left ({} records read, {} skipped, {} without "
        "targets)",
        stats_.records.records, stats_.records.skipped,
        stats_.without_targets - stats_.val_without_targets);
  }
  // Validation records that all lose their targets (a chat example cut by truncation: right
  // keeps its prompt, not its answer) would leave the run without eval_loss, silently.
  if (!val.empty() && val_.num_rows() == 0) {
    usage_error(
        "{}: no validation example left of {} records ({} cut to data.seq_len + 1 = {} tokens "
        "by data.truncation: {}, {} without a target left); raise data.seq_len{}",
        options_.val_files.empty() ? "data.val_fraction (the validation records at the end of "
                                     "data.train)"
                                   : "data.val",
        val.size(), stats_.val_truncated, options_.seq_len + 1,
        truncation_name(options_.truncation), stats_.val_without_targets,
        std::string(options_.truncation == Truncation::kRight ? ", use data.truncation: left"
                                                              : "") +
            (options_.val_files.empty() ? " or set data.val_fraction: 0" : ""));
  }
}

void ExampleDataset::build(Split& split, const std::vector<Record>& records, bool is_train) {
  const ExampleOptions& o = options_;
  // Encode on threads, kept in record order.
  std::vector<std::vector<EncodedExample>> parts = map_on_threads<EncodedExample>(
      records.size(), o.threads, [&](size_t i, text::EncodeCache& cache) {
        if (o.records.bad != BadRecords::kSkip) return encode_with(records[i], o, cache);
        // on_bad_record: skip: a record the template refuses (its raise_exception, labels
        // that cannot be found) is left out and counted, as a malformed one is.
        try {
          return encode_with(records[i], o, cache);
        } catch (const Error& e) {
          if (e.kind() != ErrorKind::kUsage) throw;
          EncodedExample bad;
          bad.where = records[i].where;
          bad.error = e.what();
          return bad;
        }
      });
  const int64_t T = o.seq_len;
  split.offsets.push_back(0);
  int64_t examples = 0;
  for (std::vector<EncodedExample>& part : parts) {
    for (EncodedExample& e : part) {
      if (!e.error.empty()) {
        const std::string prefix = e.where + ": ";
        reject_record(e.where,
                      e.error.starts_with(prefix) ? e.error.substr(prefix.size()) : e.error,
                      o.records, &stats_.records);
        continue;
      }
      if (!e.not_written.empty() && stats_.not_written_where.empty())
        stats_.not_written_where = e.where + " " + e.not_written_at;
      for (const std::string& what : e.not_written) ++stats_.not_written[what];
      for (int32_t id : e.tokens) {
        if (id < 0 || id >= o.vocab_size) {
          usage_error(
              "{}: token id {} is outside model.vocab_size = {} (is data.tokenizer the "
              "model's tokenizer?)",
              e.where, id, o.vocab_size);
        }
      }
      int64_t len = int64_t(e.tokens.size());
      int64_t from = 0;
      if (len > T + 1) {
        if (o.truncation == Truncation::kError) {
          usage_error(
              "{}: the example is {} tokens, longer than data.seq_len + 1 = {} (set "
              "data.truncation: right or left to cut it, or raise data.seq_len)",
              e.where, len, T + 1);
        }
        from = o.truncation == Truncation::kLeft ? len - (T + 1) : 0;
        len = T + 1;
        ++stats_.truncated;
        if (!is_train) ++stats_.val_truncated;
      }
      // Targets among tokens 1 .. len-1 (token 0 is never predicted).
      int64_t targets = 0;
      for (int64_t j = 1; j < len; ++j) targets += e.target[size_t(from + j)];
      if (len < 2 || targets == 0) {
        ++stats_.without_targets;
        if (!is_train) ++stats_.val_without_targets;
        continue;
      }
      split.tokens.insert(split.tokens.end(), e.tokens.begin() + from,
                          e.tokens.begin() + from + len);
      split.target.insert(split.target.end(), e.target.begin() + from,
                          e.target.begin() + from + len);
      split.offsets.push_back(int64_t(split.tokens.size()));
      ++examples;
    }
    part.clear();
    part.shrink_to_fit();
  }
  // Which examples share a row (row_order.h): packed rows mix examples from the whole
  // dataset; unpacked rows are the examples in file order.
  std::vector<int64_t> positions(static_cast<size_t>(examples));
  for (int64_t e = 0; e < examples; ++e)
    positions[size_t(e)] = split.offsets[size_t(e) + 1] - split.offsets[size_t(e)] - 1;
  RowFill fill = fill_rows(positions, T, o.packing, o.pack_order, o.seed, is_train);
  split.order = std::move(fill.order);
  split.rows = std::move(fill.rows);
  if (split.rows.empty()) split.rows.push_back(0);
  int64_t target_positions = 0;
  const int64_t positions_total = std::accumulate(positions.begin(), positions.end(), int64_t{0});
  split.row_targets.resize(size_t(split.num_rows()));
  for (int64_t r = 0; r < split.num_rows(); ++r) {
    int32_t count = 0;
    for (int64_t k = split.rows[size_t(r)]; k < split.rows[size_t(r) + 1]; ++k) {
      const int32_t e = split.order[size_t(k)];
      for (int64_t j = split.offsets[size_t(e)] + 1; j < split.offsets[size_t(e) + 1]; ++j)
        count += split.target[size_t(j)];
    }
    split.row_targets[size_t(r)] = count;
    target_positions += count;
  }
  if (is_train) {
    stats_.train_examples = examples;
    stats_.train_rows = split.num_rows();
    stats_.train_tokens = positions_total;
    stats_.train_target_tokens = target_positions;
    stats_.efficiency = split.num_rows() > 0
                            ? double(positions_total) / (double(split.num_rows()) * double(T))
                            : 0.0;
  } else {
    stats_.val_examples = examples;
    stats_.val_rows = split.num_rows();
  }
}

void ExampleDataset::fill_row(const Split& split, int64_t row, int seq_len, int32_t* tokens,
                              int32_t* targets, int32_t* doc_starts) const {
  int64_t p = 0;
  for (int64_t k = split.rows[size_t(row)]; k < split.rows[size_t(row) + 1]; ++k) {
    const int32_t e = split.order[size_t(k)];
    const int64_t begin = split.offsets[size_t(e)], end = split.offsets[size_t(e) + 1];
    const int64_t start = p;
    for (int64_t j = begin; j + 1 < end; ++j, ++p) {
      FD_CHECK(p < seq_len, "row {} overflows seq_len {}", row, seq_len);
      tokens[p] = split.tokens[size_t(j)];
      targets[p] = split.target[size_t(j) + 1] ? split.tokens[size_t(j) + 1] : -1;
      if (doc_starts) doc_starts[p] = int32_t(start);
    }
  }
  for (; p < seq_len; ++p) {  // padding: no loss, attends only to itself
    tokens[p] = pad_id_;
    targets[p] = -1;
    if (doc_starts) doc_starts[p] = int32_t(p);
  }
}

int64_t ExampleDataset::train_row(int64_t step, int64_t global_index, int64_t global_batch) const {
  return epoch_row(options_.seed, step, global_index, global_batch, train_.num_rows());
}

void ExampleDataset::train_batch(const MicroBatch& m, int seq_len, const BatchBuffers& out) const {
  FD_CHECK(0 <= m.rank && m.rank < m.world && m.batch > 0 && m.micro >= 0 &&
               m.micro < m.accumulation && seq_len == options_.seq_len,
           "rank {} of {}, batch {}, micro-batch {} of {}, seq_len {}", m.rank, m.world, m.batch,
           m.micro, m.accumulation, seq_len);
  FD_CHECK(!packed() || out.doc_starts != nullptr, "packed rows need doc_starts");
  const int64_t first = (int64_t(m.micro) * m.world + m.rank) * m.batch;
  for (int b = 0; b < m.batch; ++b) {
    const size_t o = size_t(b) * size_t(seq_len);
    fill_row(train_, train_row(m.step, first + b, m.global_batch()), seq_len, out.tokens + o,
             out.targets + o, out.doc_starts ? out.doc_starts + o : nullptr);
  }
}

int64_t ExampleDataset::train_targets(int64_t step, int64_t global_batch, int) const {
  int64_t n = 0;
  for (int64_t g = 0; g < global_batch; ++g)
    n += train_.row_targets[size_t(train_row(step, g, global_batch))];
  return n;
}

std::string ExampleDataset::not_written_warning() const {
  if (stats_.not_written.empty()) return "";
  std::string what;
  for (const auto& [key, count] : stats_.not_written)
    what += fmt::format("{}{} {}", what.empty() ? "" : ", ", count, key);
  return fmt::format(
      "{} does not write these message texts: {} (messages; the first at {}), so the model "
      "never sees them (Hugging Face's apply_chat_template drops them alike; Qwen 3 writes "
      "reasoning_content only after the last user message)",
      options_.chat_template ? options_.chat_template->name() : std::string("the chat template"),
      what, stats_.not_written_where);
}

void ExampleDataset::val_batch(int64_t batch_index, int rank, int world, int batch, int seq_len,
                               const BatchBuffers& out) const {
  FD_CHECK(has_val(), "val_batch without a validation split");
  FD_CHECK(!packed() || out.doc_starts != nullptr, "packed rows need doc_starts");
  const int64_t R = val_.num_rows();
  for (int b = 0; b < batch; ++b) {
    const int64_t row = (batch_index * world * batch + int64_t(rank) * batch + b) % R;
    const size_t o = size_t(b) * size_t(seq_len);
    fill_row(val_, row, seq_len, out.tokens + o, out.targets + o,
             out.doc_starts ? out.doc_starts + o : nullptr);
  }
}

std::string ExampleDataset::summary() const {
  const ExampleStats& s = stats_;
  std::string line = fmt::format(
      "{}: {} training examples -> {} {}rows of {} ({:.1f}% of positions hold tokens, {} "
      "targets, {:.1f} a row)",
      format_name(options_.records.format), s.train_examples, s.train_rows,
      options_.packing ? fmt::format("packed ({}) ", pack_order_name(options_.pack_order)) : "",
      options_.seq_len, 100.0 * s.efficiency, s.train_target_tokens,
      s.train_rows > 0 ? double(s.train_target_tokens) / double(s.train_rows) : 0.0);
  if (s.val_examples > 0) line += fmt::format(", {} validation examples", s.val_examples);
  if (s.records.skipped > 0) line += fmt::format(", {} bad records skipped", s.records.skipped);
  const auto of_which_val = [](int64_t n) {
    return n > 0 ? fmt::format(" ({} of them validation)", n) : std::string();
  };
  if (s.truncated > 0)
    line += fmt::format(", {} truncated{}", s.truncated, of_which_val(s.val_truncated));
  if (s.without_targets > 0) {
    line += fmt::format(", {} without targets dropped{}", s.without_targets,
                        of_which_val(s.val_without_targets));
  }
  return line;
}

}  // namespace fd::data
