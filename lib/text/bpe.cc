#include "lib/text/bpe.h"

#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>

#include "lib/base/error.h"
#include "lib/text/tokenizer.h"
#include "lib/text/utf8.h"

namespace fd::text {

using json = nlohmann::json;

namespace {

// GPT-2's bytes_to_unicode, inverted: the byte each of the 256 characters stands for.
std::unordered_map<char32_t, uint8_t> unicode_to_byte() {
  std::unordered_map<char32_t, uint8_t> m;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    m[printable ? char32_t(b) : char32_t(256 + n++)] = uint8_t(b);
  }
  return m;
}

// The bytes a byte-level token spells, or nullopt when it has a character
// outside the 256 (such a token can only be an added token's).
std::optional<std::string> byte_level_bytes(std::string_view token,
                                            const std::unordered_map<char32_t, uint8_t>& map) {
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const size_t n = utf8_sequence_length(token, i);
    if (n == 0) return std::nullopt;
    const auto it = map.find(utf8_decode(token.data() + i, n));
    if (it == map.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
    i += n;
  }
  return out;
}

}  // namespace

void Bpe::PairTable::build(const std::vector<std::pair<uint64_t, Merge>>& entries) {
  size_t cap = 16;
  while (cap < entries.size() * 2) cap <<= 1;
  keys.assign(cap, kEmpty);
  values.assign(cap, Merge{0, 0});
  mask = cap - 1;
  for (const auto& [key, merge] : entries) {
    uint64_t h = mix(key) & mask;
    while (keys[h] != kEmpty && keys[h] != key) h = (h + 1) & mask;
    keys[h] = key;  // a repeated pair keeps its last rank, as Hugging Face's map does
    values[h] = merge;
  }
}

Bpe Bpe::from_json(const json& model, bool byte_level, const std::string& where) {
  if (!model.is_object()) usage_error("{}: must be an object", where);
  // (json::value() would throw a json exception for a "type" that is not a string.)
  const auto type_it = model.find("type");
  if (type_it != model.end() && !type_it->is_string())
    usage_error("{}.type: must be a string such as \"BPE\" (got {})", where, type_it->dump());
  const std::string type = type_it == model.end() ? "BPE" : type_it->get<std::string>();
  if (type != "BPE") {
    usage_error("{}.type: the model type \"{}\" is not supported by fdtrain (supported: BPE)",
                where, type);
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    usage_error("{}.dropout: BPE dropout ({}) is a training-time randomisation fdtrain does not "
                "apply; set it to null",
                where, model["dropout"].dump());
  }
  Bpe bpe;
  bpe.byte_level_ = byte_level;
  auto flag = [&](const char* key) {
    const auto it = model.find(key);
    if (it == model.end() || it->is_null()) return false;
    if (!it->is_boolean()) usage_error("{}.{}: must be true or false", where, key);
    return it->get<bool>();
  };
  auto text = [&](const char* key) {
    const auto it = model.find(key);
    if (it == model.end() || it->is_null()) return std::string();
    if (!it->is_string()) usage_error("{}.{}: must be a string or null", where, key);
    return it->get<std::string>();
  };
  bpe.ignore_merges_ = flag("ignore_merges");
  bpe.byte_fallback_ = flag("byte_fallback");
  bpe.fuse_unk_ = flag("fuse_unk");
  bpe.prefix_ = text("continuing_subword_prefix");
  bpe.suffix_ = text("end_of_word_suffix");
  if (byte_level && (!bpe.prefix_.empty() || !bpe.suffix_.empty())) {
    usage_error("{}: continuing_subword_prefix / end_of_word_suffix with a byte-level vocabulary "
                "is not supported by fdtrain",
                where);
  }

  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object())
    usage_error("{}.vocab: must be an object mapping tokens to ids", where);
  const auto map = unicode_to_byte();
  int32_t max_id = -1;
  std::vector<std::pair<std::string, int32_t>> entries;
  entries.reserve(vocab->size());
  for (const auto& [key, value] : vocab->items()) {
    if (!value.is_number_integer())
      usage_error("{}.vocab[\"{}\"]: the id must be a non-negative integer", where, key);
    const std::optional<int64_t> checked = json_token_id(value);
    if (!checked) {
      usage_error("{}.vocab[\"{}\"]: the id {} is outside the ids a tokenizer may use ([0, {})): "
                  "the file is damaged",
                  where, key, value.dump(), kMaxTokenIds);
    }
    const auto id = static_cast<int32_t>(*checked);
    max_id = std::max(max_id, id);
    if (byte_level) {
      if (auto bytes = byte_level_bytes(key, map)) {
        entries.emplace_back(std::move(*bytes), id);
      } else {
        entries.emplace_back(key, id);  // decodes as its own text; BPE never reaches it
      }
    } else {
      entries.emplace_back(key, id);
    }
  }
  bpe.tokens_.assign(size_t(max_id + 1), std::string());
  bpe.vocab_.reserve(entries.size());
  for (auto& [token, id] : entries) {
    bpe.tokens_[size_t(id)] = token;
    bpe.vocab_.insert_or_assign(std::move(token), id);
  }

  std::fill(std::begin(bpe.byte_ids_), std::end(bpe.byte_ids_), -1);
  std::fill(std::begin(bpe.ascii_ids_), std::end(bpe.ascii_ids_), -1);
  std::fill(std::begin(bpe.byte_fallback_ids_), std::end(bpe.byte_fallback_ids_), -1);
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    if (const auto id = bpe.id(one)) {
      if (byte_level) bpe.byte_ids_[b] = *id;
      if (!byte_level && b < 128) bpe.ascii_ids_[b] = *id;
    }
    if (const auto id = bpe.id(fmt::format("<0x{:02X}>", b))) bpe.byte_fallback_ids_[b] = *id;
  }
  if (const std::string unk = text("unk_token"); !unk.empty()) {
    const auto id = bpe.id(unk);
    if (!id) usage_error("{}.unk_token: \"{}\" is not in the vocabulary", where, unk);
    bpe.unk_id_ = id;
  }

  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array())
    usage_error("{}.merges: must be a list of merges", where);
  // A merge's rank is its index, an int32.
  if (merges->size() >= size_t(INT32_MAX))
    usage_error("{}.merges: {} merges, more than a rank can count", where, merges->size());
  std::vector<std::pair<uint64_t, Merge>> table;
  table.reserve(merges->size());
  auto to_id = [&](const std::string& token, size_t i) {
    std::optional<int32_t> id;
    if (byte_level) {
      if (auto bytes = byte_level_bytes(token, map)) id = bpe.id(*bytes);
    } else {
      id = bpe.id(token);
    }
    if (!id) {
      usage_error("{}.merges[{}]: \"{}\" is not in the vocabulary: the file is inconsistent", where,
                  i, token);
    }
    return *id;
  };
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& m = (*merges)[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        usage_error("{}.merges[{}]: \"{}\" is not two tokens separated by one space", where, i,
                    s);
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      usage_error("{}.merges[{}]: must be \"a b\" or [\"a\", \"b\"] (got {})", where, i,
                  m.dump());
    }
    const int32_t ia = to_id(a, i), ib = to_id(b, i);
    std::string merged = a + (!bpe.prefix_.empty() && b.starts_with(bpe.prefix_)
                                  ? b.substr(bpe.prefix_.size())
                                  : b);
    const int32_t im = to_id(merged, i);
    table.emplace_back((uint64_t(uint32_t(ia)) << 32) | uint32_t(ib),
                       Merge{static_cast<int32_t>(i), im});
  }
  bpe.merges_.build(table);

  // Where a long SentencePiece-style word may be cut (see bpe.h): before "▁", unless a token
  // has the preceding character followed by "▁", or that character is not itself a token
  // (byte-fallback and unknown symbols are spelled differently from the text).
  if (!byte_level && bpe.prefix_.empty() && bpe.suffix_.empty()) {
    constexpr std::string_view kSpace = "\u2581";
    for (const std::string& t : bpe.tokens_) {
      for (size_t at = t.find(kSpace, 1); at != std::string::npos; at = t.find(kSpace, at + 1)) {
        size_t b = at - 1;
        while (b > 0 && (static_cast<unsigned char>(t[b]) & 0xC0) == 0x80) --b;
        const size_t n = utf8_sequence_length(t, b);
        if (n == 0) continue;
        const char32_t c = utf8_decode(t.data() + b, n);
        if (c != U'\u2581') bpe.no_cut_after_[c] = true;
      }
    }
    bpe.cut_before_space_ = bpe.id(kSpace).has_value();
  }
  return bpe;
}

std::optional<int32_t> Bpe::id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void Bpe::initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const {
  symbols.clear();
  if (byte_level_) {
    for (const char c : word) {
      const int32_t id = byte_ids_[static_cast<unsigned char>(c)];
      if (id >= 0) {
        symbols.push_back(id);
      } else if (unk_id_) {
        if (!(fuse_unk_ && !symbols.empty() && symbols.back() == *unk_id_))
          symbols.push_back(*unk_id_);
      }
    }
    return;
  }
  const bool affixes = !prefix_.empty() || !suffix_.empty();
  std::string piece;
  bool previous_unk = false;
  for (size_t i = 0; i < word.size();) {
    size_t n = utf8_sequence_length(word, i);
    if (n == 0) n = 1;  // not reached: text is valid UTF-8 by now
    const std::string_view ch = word.substr(i, n);
    std::optional<int32_t> id;
    if (!affixes && n == 1) {
      if (ascii_ids_[static_cast<unsigned char>(ch[0])] >= 0)
        id = ascii_ids_[static_cast<unsigned char>(ch[0])];
    } else if (!affixes) {
      id = this->id(ch);
    } else {
      piece.clear();
      if (i > 0) piece += prefix_;
      piece += ch;
      if (i + n == word.size()) piece += suffix_;
      id = this->id(piece);
    }
    i += n;
    if (id) {
      symbols.push_back(*id);
      previous_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (const char c : ch) all &= byte_fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (const char c : ch) symbols.push_back(byte_fallback_ids_[static_cast<unsigned char>(c)]);
        previous_unk = false;
        continue;
      }
    }
    if (unk_id_) {
      if (!(fuse_unk_ && previous_unk)) symbols.push_back(*unk_id_);
      previous_unk = true;
    }
  }
}

void Bpe::merge(std::vector<int32_t>& s, Cache& cache) const {
  if (s.size() < 2) return;
  if (s.size() > kShortWord) {
    merge_long(s, cache);
    return;
  }
  // ranks[i]: the rank of the pair (s[i], s[i+1]), INT_MAX when it does not merge.
  int32_t ranks[kShortWord];
  int32_t ids[kShortWord];
  size_t n = s.size();
  for (size_t i = 0; i + 1 < n; ++i) {
    const Merge* m = merges_.find(s[i], s[i + 1]);
    ranks[i] = m ? m->rank : INT_MAX;
    ids[i] = m ? m->id : -1;
  }
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == INT_MAX) break;
    s[best] = ids[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      s[i] = s[i + 1];
      ranks[i] = ranks[i + 1];
      ids[i] = ids[i + 1];
    }
    --n;
    auto update = [&](size_t i) {
      const Merge* m = merges_.find(s[i], s[i + 1]);
      ranks[i] = m ? m->rank : INT_MAX;
      ids[i] = m ? m->id : -1;
    };
    if (best > 0) update(best - 1);
    if (best + 1 < n) update(best);
  }
  s.resize(n);
}

// The heap holds (rank << 32 | position): lowest rank first, leftmost among
// equal ranks. An entry is stale when its left symbol was merged away or its
// pair changed since it was pushed; it is checked and skipped when popped.
void Bpe::merge_long(std::vector<int32_t>& s, Cache& cache) const {
  const size_t n = s.size();
  auto& prev = cache.prev;
  auto& next = cache.next;
  auto& heap = cache.heap;
  prev.resize(n);
  next.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i) {
    prev[i] = int32_t(i) - 1;
    next[i] = i + 1 < n ? int32_t(i + 1) : -1;
  }
  auto push = [&](int32_t i) {
    if (i < 0 || next[size_t(i)] < 0) return;
    const Merge* m = merges_.find(s[size_t(i)], s[size_t(next[size_t(i)])]);
    if (m == nullptr) return;
    heap.push_back((uint64_t(uint32_t(m->rank)) << 32) | uint32_t(i));
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
  constexpr int32_t kGone = -2;  // prev[] of a symbol merged into its left neighbour
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const uint64_t top = heap.back();
    heap.pop_back();
    const auto i = static_cast<int32_t>(top & 0xffffffffu);
    const auto rank = static_cast<int32_t>(top >> 32);
    if (prev[size_t(i)] == kGone || next[size_t(i)] < 0) continue;
    const int32_t j = next[size_t(i)];
    const Merge* m = merges_.find(s[size_t(i)], s[size_t(j)]);
    if (m == nullptr || m->rank != rank) continue;  // the pair changed since
    s[size_t(i)] = m->id;
    next[size_t(i)] = next[size_t(j)];
    if (next[size_t(j)] >= 0) prev[size_t(next[size_t(j)])] = i;
    prev[size_t(j)] = kGone;
    push(prev[size_t(i)]);
    push(i);
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[size_t(i)]) s[w++] = s[size_t(i)];
  s.resize(w);
}

bool Bpe::cut_allowed(std::string_view word, size_t at) const {
  size_t b = at - 1;
  while (b > 0 && (static_cast<unsigned char>(word[b]) & 0xC0) == 0x80) --b;
  const size_t n = utf8_sequence_length(word, b);
  if (n == 0 || b + n != at) return false;
  const std::string_view prev = word.substr(b, n);
  if (prev == "\u2581" || !id(prev)) return false;
  return !no_cut_after_.contains(utf8_decode(prev.data(), n));
}

void Bpe::encode_word(std::string_view word, Cache& cache, std::vector<int32_t>& out) const {
  if (cut_before_space_ && word.size() > kShortWord) {
    if (ignore_merges_) {
      if (const auto whole = id(word)) {
        out.push_back(*whole);
        return;
      }
    }
    constexpr std::string_view kSpace = "\u2581";
    size_t begin = 0;
    for (size_t at = word.find(kSpace, 1); at != std::string_view::npos;
         at = word.find(kSpace, at + kSpace.size())) {
      if (!cut_allowed(word, at)) continue;
      encode_piece(word.substr(begin, at - begin), cache, out);
      begin = at;
    }
    encode_piece(word.substr(begin), cache, out);
    return;
  }
  encode_piece(word, cache, out);
}

void Bpe::encode_piece(std::string_view word, Cache& cache, std::vector<int32_t>& out) const {
  constexpr size_t kMaxCachedWord = 256;
  constexpr size_t kMaxCachedWords = 1 << 16;
  const bool cacheable = word.size() <= kMaxCachedWord;
  if (cacheable) {
    const auto it = cache.words.find(word);
    if (it != cache.words.end()) {
      const auto [offset, count] = it->second;
      out.insert(out.end(), cache.ids.begin() + offset, cache.ids.begin() + offset + count);
      return;
    }
  }
  std::vector<int32_t>& s = cache.symbols;
  const auto whole = ignore_merges_ ? id(word) : std::nullopt;
  if (whole) {
    s.assign(1, *whole);
  } else {
    initial_symbols(word, s);
    merge(s, cache);
  }
  out.insert(out.end(), s.begin(), s.end());
  if (cacheable) {
    if (cache.words.size() >= kMaxCachedWords) {
      cache.words.clear();
      cache.ids.clear();
    }
    cache.words.emplace(std::string(word),
                        std::make_pair(uint32_t(cache.ids.size()), uint32_t(s.size())));
    cache.ids.insert(cache.ids.end(), s.begin(), s.end());
  }
}

}  // namespace fd::text
