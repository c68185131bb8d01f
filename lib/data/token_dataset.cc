#include "lib/data/token_dataset.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/data/document_encoder.h"

namespace fd::data {
namespace {

std::shared_ptr<const std::vector<TokenFile>> open_all(const std::vector<std::string>& paths,
                                                       const DatasetOptions& options) {
  auto files = std::make_shared<std::vector<TokenFile>>();
  for (const std::string& p : paths) {
    if (options.tokenizer && options.format == TokenFormat::kText) {
      const text::Tokenizer& tok = *options.tokenizer;
      std::vector<int32_t> ids;
      encode_documents({p}, tok, document_wrap(tok), options.text_field, 1,
                       [&](std::span<const int32_t> batch, size_t) {
                         ids.insert(ids.end(), batch.begin(), batch.end());
                       });
      files->push_back(TokenFile::from_tokens(p, std::move(ids), options.vocab_size));
    } else {
      files->push_back(TokenFile::open(p, options.format, options.vocab_size));
    }
  }
  return files;
}

void check_split(const char* split, int64_t size, const DatasetOptions& o, const char* fix) {
  if (size < int64_t(o.seq_len) + 1)
    usage_error("data: the {} split holds {} tokens, fewer than seq_len + 1 = {}; {}", split, size,
                int64_t(o.seq_len) + 1, fix);
}

}  // namespace

TokenStream::TokenStream(std::shared_ptr<const std::vector<TokenFile>> files, int64_t begin,
                         int64_t end)
    : files_(std::move(files)), begin_(begin), end_(end) {
  int64_t at = 0;
  for (const TokenFile& f : *files_) {
    starts_.push_back(at);
    at += f.size();
  }
  FD_CHECK(0 <= begin && begin <= end && end <= at, "stream [{}, {}) of {}", begin, end, at);
}

void TokenStream::copy(int64_t start, int64_t count, int32_t* out) const {
  FD_CHECK(start >= 0 && count >= 0 && start + count <= size(), "copy [{}, {}) of {} tokens", start,
           start + count, size());
  int64_t pos = begin_ + start;
  // The last file starting at or before pos.
  size_t i = size_t(std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin()) - 1;
  while (count > 0) {
    const TokenFile& f = (*files_)[i];
    int64_t local = pos - starts_[i];
    int64_t n = std::min(count, f.size() - local);
    f.copy(local, n, out);
    out += n;
    pos += n;
    count -= n;
    ++i;
  }
}

int32_t TokenStream::operator[](int64_t i) const {
  int32_t v;
  copy(i, 1, &v);
  return v;
}

TokenDataset::TokenDataset(const DatasetOptions& options) : options_(options) {
  const DatasetOptions& o = options_;
  if (o.train_files.empty()) usage_error("data: no training files; set data.train");
  if (o.seq_len <= 0) usage_error("data: seq_len must be positive, got {}", o.seq_len);
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    usage_error("data: val_fraction must be in [0, 1), got {}", o.val_fraction);
  std::set<std::string> train_set(o.train_files.begin(), o.train_files.end());
  for (const std::string& v : o.val_files)
    if (train_set.count(v))
      usage_error("data: {} is both a training and a validation file; the splits must not overlap",
                  v);

  auto train_files = open_all(o.train_files, o);
  int64_t total = 0;
  for (const TokenFile& f : *train_files) total += f.size();
  train_files_ = int64_t(o.train_files.size());
  val_files_ = int64_t(o.val_files.size());

  if (!o.val_files.empty()) {
    train_ = TokenStream(train_files, 0, total);
    auto val_files = open_all(o.val_files, o);
    int64_t val_total = 0;
    for (const TokenFile& f : *val_files) val_total += f.size();
    val_ = TokenStream(val_files, 0, val_total);
    check_split("training", train_.size(), o, "add training data or lower data.seq_len");
    check_split("validation", val_.size(), o, "add validation data or lower data.seq_len");
  } else {
    int64_t n_val = int64_t(std::floor(double(total) * o.val_fraction));
    train_ = TokenStream(train_files, 0, total - n_val);
    val_ = TokenStream(train_files, total - n_val, total);
    check_split("training", train_.size(), o, "add data, lower data.val_fraction or data.seq_len");
    if (o.val_fraction > 0.0)
      check_split("validation", val_.size(), o,
                  "add data, lower data.val_fraction or data.seq_len");
  }
}

std::string TokenDataset::summary() const {
  std::string s = fmt::format("train {} tokens ({} file{})", train_.size(), train_files_,
                              train_files_ == 1 ? "" : "s");
  if (val_files_ > 0)
    return s + fmt::format(", val {} tokens ({} file{})", val_.size(), val_files_,
                           val_files_ == 1 ? "" : "s");
  if (has_val())
    return s + fmt::format(", val {} tokens (last {:g}% of train)", val_.size(),
                           options_.val_fraction * 100.0);
  return s + ", no validation split";
}

}  // namespace fd::data
