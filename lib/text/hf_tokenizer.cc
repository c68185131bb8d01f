#include "lib/text/hf_tokenizer.h"

#include <malloc.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/text/utf8.h"

namespace fd::text {

using json = nlohmann::json;

struct EncodeCache::State {
  Bpe::Cache bpe;
  PreTokenizer::Scratch pre;
  std::string valid, normalized;
  std::vector<TextPiece> raw_pieces, pieces;
  std::vector<Span> words;
};

EncodeCache::EncodeCache() = default;
EncodeCache::EncodeCache(EncodeCache&&) noexcept = default;
EncodeCache& EncodeCache::operator=(EncodeCache&&) noexcept = default;
EncodeCache::~EncodeCache() = default;
void EncodeCache::reset(std::unique_ptr<State> s) { state_ = std::move(s); }

std::optional<int64_t> json_token_id(const json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    return u < uint64_t(kMaxTokenIds) ? std::optional<int64_t>(int64_t(u)) : std::nullopt;
  }
  if (!v.is_number_integer()) return std::nullopt;
  const auto i = v.get<int64_t>();
  return i >= 0 && i < kMaxTokenIds ? std::optional<int64_t>(i) : std::nullopt;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  EncodeCache cache;
  std::vector<int32_t> out;
  encode(text, add_special, out, cache);
  return out;
}

namespace {

// A Hugging Face file beside tokenizer.json, read with the shared limits (a regular file, a size
// cap, JSON nesting at most kMaxJsonDepth: lib/base/input_file.h).
json read_json(const std::string& path, std::string_view what) {
  return read_json_file(path, what, kMaxConfigFileBytes);
}

// A token named in tokenizer_config.json: a string, {"content": ...}, or null.
std::optional<std::string> config_token(const json& config, const char* key,
                                        const std::string& where) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  usage_error("{}: \"{}\" must be a token string, {{\"content\": ...}} or null (got {})", where,
              key, it->dump());
}

// The eos_token_id of a generation_config.json / config.json (an id or a list of ids; anything
// else names no stop token), each checked to be an id of the tokenizer.
void add_eos_ids(const json& j, int64_t vocab_size, const std::string& where,
                 const std::string& tokenizer, std::vector<int32_t>& out) {
  const auto it = j.find("eos_token_id");
  if (it == j.end()) return;
  auto add = [&](const json& v) {
    if (!v.is_number_integer()) return;
    const std::optional<int64_t> id = json_token_id(v);
    if (!id || *id >= vocab_size) {
      usage_error("{}: eos_token_id {} is outside the tokenizer's {} ids ({})", where, v.dump(),
                  vocab_size, tokenizer);
    }
    out.push_back(int32_t(*id));
  };
  if (it->is_array()) {
    for (const json& v : *it) add(v);
  } else {
    add(*it);
  }
}

}  // namespace

std::unique_ptr<HfTokenizer> HfTokenizer::load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    usage_error(
        "tokenizer.json not found: {} (a Hugging Face tokenizer directory holds tokenizer.json, "
        "usually with tokenizer_config.json)",
        path);
  }
  const std::string text = read_input_file(path, "tokenizer.json", kMaxTokenizerFileBytes);
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  const std::string config_path = (dir / "tokenizer_config.json").string();
  // Absent: no BOS/EOS from it. Present but not a regular file: refused by read_input_file.
  const std::string config = std::filesystem::exists(config_path, ec)
                                 ? read_input_file(config_path, "tokenizer_config.json")
                                 : "";
  auto tok = from_strings(text, config, path);
  // The parsed JSON (several times the file's size) is gone: give its pages back.
  malloc_trim(0);
  // The model's own end-of-generation ids (Llama 3 Instruct: <|eot_id|> and <|end_of_text|>).
  for (const char* name : {"generation_config.json", "config.json"}) {
    const std::string p = (dir / name).string();
    if (!std::filesystem::exists(p, ec)) continue;
    const json j = read_json(p, name);
    if (j.is_object()) add_eos_ids(j, tok->vocab_size_, p, path, tok->stop_);
  }
  std::sort(tok->stop_.begin(), tok->stop_.end());
  tok->stop_.erase(std::unique(tok->stop_.begin(), tok->stop_.end()), tok->stop_.end());
  return tok;
}

std::unique_ptr<HfTokenizer> HfTokenizer::from_strings(const std::string& tokenizer_json,
                                                       const std::string& config_json,
                                                       const std::string& where) {
  const json j = parse_json_input(tokenizer_json, where);
  if (!j.is_object()) usage_error("{}: a tokenizer.json is a JSON object", where);
  for (const char* key : {"model", "added_tokens"}) {
    if (!j.contains(key))
      usage_error("{}: \"{}\" is missing: this is not a tokenizer.json", where, key);
  }
  std::unique_ptr<HfTokenizer> t(new HfTokenizer());
  t->where_ = where;
  auto field = [&](const char* key) -> const json& {
    static const json null;
    const auto it = j.find(key);
    return it == j.end() ? null : *it;
  };
  if (const json& trunc = field("truncation"); !trunc.is_null()) {
    usage_error(
        "{}: truncation: fdtrain does not truncate inside the tokenizer (set it to null; "
        "sequence length is the recipe's)",
        where);
  }
  t->normalizer_ = TextNormalizer::from_json(field("normalizer"), where + ": normalizer");
  t->pre_tokenizer_ = PreTokenizer::from_json(field("pre_tokenizer"), where + ": pre_tokenizer");
  t->model_ = Bpe::from_json(j["model"], t->pre_tokenizer_.byte_level(), where + ": model");
  t->added_ = AddedTokens::from_json(j["added_tokens"], t->normalizer_, where + ": added_tokens");
  t->decoder_ = TokenDecoder::from_json(field("decoder"), where + ": decoder");
  t->vocab_size_ = t->model_.size();
  for (const AddedToken& a : t->added_.tokens())
    t->vocab_size_ = std::max<int64_t>(t->vocab_size_, int64_t(a.id) + 1);
  // Each id was checked below kMaxTokenIds where it was read (Bpe, AddedTokens).
  FD_CHECK(t->vocab_size_ <= kMaxTokenIds, "vocab_size {}", t->vocab_size_);
  t->read_post_processor(field("post_processor"), where + ": post_processor");
  if (!config_json.empty()) {
    const std::string cw =
        (std::filesystem::path(where).parent_path() / "tokenizer_config.json").string();
    const json config = parse_json_input(config_json, cw);
    if (!config.is_object()) usage_error("{}: must be a JSON object", cw);
    t->read_config(config, cw);
  }
  if (t->eos_) t->stop_.push_back(*t->eos_);
  return t;
}

void HfTokenizer::read_post_processor(const json& j, const std::string& where) {
  if (j.is_null()) return;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    usage_error("{}: a post-processor must be an object with a \"type\"", where);
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    const auto it = j.find("processors");
    if (it == j.end() || !it->is_array())
      usage_error("{}: a Sequence needs a \"processors\" list", where);
    for (size_t i = 0; i < it->size(); ++i)
      read_post_processor((*it)[i], fmt::format("{}.processors[{}]", where, i));
    return;
  }
  if (type == "ByteLevel") return;  // only moves offsets; ids are untouched
  if (type != "TemplateProcessing") {
    usage_error(
        "{}: the post-processor type \"{}\" is not supported by fdtrain (supported: "
        "TemplateProcessing, ByteLevel, Sequence)",
        where, type);
  }
  const auto single = j.find("single");
  const auto specials = j.find("special_tokens");
  if (single == j.end() || !single->is_array())
    usage_error("{}: a TemplateProcessing needs a \"single\" template list", where);
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& item = (*single)[i];
    const std::string at = fmt::format("{}.single[{}]", where, i);
    if (item.contains("Sequence")) {
      if (seen_sequence) usage_error("{}: a second Sequence in the single template", at);
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
        !item["SpecialToken"]["id"].is_string()) {
      usage_error("{}: must be {{\"SpecialToken\": {{\"id\": ...}}}} or {{\"Sequence\": ...}}", at);
    }
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    if (specials == j.end() || !specials->contains(name) || !(*specials)[name].contains("ids") ||
        !(*specials)[name]["ids"].is_array()) {
      usage_error("{}: the special token \"{}\" is not in special_tokens", at, name);
    }
    for (const json& id : (*specials)[name]["ids"]) {
      const std::optional<int64_t> v = json_token_id(id);
      if (!v || *v >= vocab_size_) {
        usage_error("{}: \"{}\" has the id {}, outside the tokenizer's {} ids", at, name, id.dump(),
                    vocab_size_);
      }
      (seen_sequence ? suffix_ids_ : prefix_ids_).push_back(int32_t(*v));
    }
  }
  if (!seen_sequence) usage_error("{}.single: the template has no Sequence (the text)", where);
}

void HfTokenizer::read_config(const json& config, const std::string& where) {
  auto resolve = [&](const char* key) -> std::optional<int32_t> {
    const auto token = config_token(config, key, where);
    if (!token) return std::nullopt;
    const auto id = token_id(*token);
    if (!id) usage_error("{}: {} \"{}\" is not a token of {}", where, key, *token, where_);
    return id;
  };
  bos_ = resolve("bos_token");
  eos_ = resolve("eos_token");
}

std::optional<int32_t> HfTokenizer::token_id(std::string_view token) const {
  if (const AddedToken* a = added_.find_content(token)) return a->id;
  return model_.id(token);
}

std::string HfTokenizer::describe() const {
  return fmt::format("{} (BPE{}, {} ids, {} added)", where_,
                     model_.byte_level() ? ", byte-level" : "", vocab_size_,
                     added_.tokens().size());
}

void HfTokenizer::encode(std::string_view input, bool add_special, std::vector<int32_t>& out,
                         EncodeCache& cache) const {
  encode_text(input, add_special, false, out, cache);
}

void HfTokenizer::encode_piece(std::string_view text, bool continuing, std::vector<int32_t>& out,
                               EncodeCache& cache) const {
  encode_text(text, false, continuing, out, cache);
}

void HfTokenizer::encode_text(std::string_view input, bool add_special, bool continuing,
                              std::vector<int32_t>& out, EncodeCache& cache) const {
  if (cache.state() == nullptr) cache.reset(std::make_unique<EncodeCache::State>());
  EncodeCache::State& st = *cache.state();
  std::string_view text = input;
  if (!is_valid_utf8(input)) {
    st.valid = to_valid_utf8(input);
    text = st.valid;
  }
  if (add_special) out.insert(out.end(), prefix_ids_.begin(), prefix_ids_.end());
  st.raw_pieces.clear();
  added_.split_raw(text, st.raw_pieces);
  for (const TextPiece& raw : st.raw_pieces) {
    if (raw.id >= 0) {
      out.push_back(raw.id);
      continue;
    }
    std::string_view section = text.substr(raw.begin, raw.end - raw.begin);
    // The first section of a continuing piece continues the previous piece's text.
    const bool continues = continuing && raw.begin == 0;
    if (!normalizer_.identity()) {
      normalizer_.apply(section, st.normalized, continues);
      section = st.normalized;
    }
    st.pieces.clear();
    added_.split_normalized(section, st.pieces);
    for (const TextPiece& piece : st.pieces) {
      if (piece.id >= 0) {
        out.push_back(piece.id);
        continue;
      }
      const std::string_view part = section.substr(piece.begin, piece.end - piece.begin);
      PreTokenizer::Place place = PreTokenizer::kInside;
      if (raw.begin == 0 && piece.begin == 0)
        place = continues ? PreTokenizer::kContinuing : PreTokenizer::kAtStart;
      const std::string_view words_text = pre_tokenizer_.split(part, place, st.pre, st.words);
      for (const Span& w : st.words)
        model_.encode_word(words_text.substr(w.begin, w.end - w.begin), st.bpe, out);
    }
  }
  if (add_special) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
}

std::string HfTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    if (const AddedToken* a = added_.find_id(id)) {
      if (!(skip_special && a->special)) tokens.push_back(a->content);
    } else if (id >= 0 && id < model_.size()) {
      tokens.push_back(model_.token(id));
    } else {
      tokens.emplace_back(kReplacementChar);
    }
  }
  return decoder_.decode(std::move(tokens));
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    if (std::filesystem::is_regular_file(dir, ec) && dir.ends_with(".json"))
      return HfTokenizer::load(dir);
    usage_error(
        "tokenizer directory not found: {} (a Hugging Face model or tokenizer directory, "
        "holding tokenizer.json)",
        dir);
  }
  return HfTokenizer::load((std::filesystem::path(dir) / "tokenizer.json").string());
}

std::vector<std::string> HfTokenizer::special_tokens() const {
  std::vector<const AddedToken*> special;
  for (const AddedToken& a : added_.tokens())
    if (a.special) special.push_back(&a);
  std::sort(special.begin(), special.end(),
            [](const AddedToken* a, const AddedToken* b) { return a->id < b->id; });
  std::vector<std::string> out;
  for (const AddedToken* a : special) out.push_back(a->content);
  return out;
}

}  // namespace fd::text
