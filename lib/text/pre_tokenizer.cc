#include "lib/text/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "lib/base/error.h"
#include "lib/text/utf8.h"

namespace fd::text {

using json = nlohmann::json;

namespace {

// GPT-2's pattern, which Hugging Face's ByteLevel pre-tokenizer uses with use_regex.
constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Piece {
  uint32_t begin, end;
  bool is_match;
};

// Hugging Face's split-delimiter behaviours over the alternating list of
// matches and gaps of one word; appends the non-empty results (offset by base).
void apply_behavior(const std::vector<Piece>& pieces, Behavior behavior, uint32_t base,
                    std::vector<Span>& out) {
  std::vector<Span> acc;
  acc.reserve(pieces.size());
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kRemoved:
      for (const Piece& p : pieces)
        if (!p.is_match) acc.push_back({p.begin, p.end});
      break;
    case Behavior::kIsolated:
      for (const Piece& p : pieces) acc.push_back({p.begin, p.end});
      break;
    case Behavior::kMergedWithPrevious:
      for (const Piece& p : pieces) {
        if (p.is_match && !previous_match && !acc.empty()) {
          acc.back().end = p.end;
        } else {
          acc.push_back({p.begin, p.end});
        }
        previous_match = p.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (size_t k = pieces.size(); k-- > 0;) {
        const Piece& p = pieces[k];
        if (p.is_match && !previous_match && !acc.empty()) {
          acc.back().begin = p.begin;
        } else {
          acc.push_back({p.begin, p.end});
        }
        previous_match = p.is_match;
      }
      std::reverse(acc.begin(), acc.end());
      break;
    case Behavior::kContiguous:
      for (size_t k = 0; k < pieces.size(); ++k) {
        const Piece& p = pieces[k];
        if (k > 0 && p.is_match == previous_match) {
          acc.back().end = p.end;
        } else {
          acc.push_back({p.begin, p.end});
        }
        previous_match = p.is_match;
      }
      break;
  }
  for (const Span& s : acc)
    if (s.end > s.begin) out.push_back({s.begin + base, s.end + base});
}

}  // namespace

// One step: words in (spans of `in`), words out. Steps that only cut return
// spans of `in`; steps that rewrite the text build `out_text` and return true.
struct PreTokenizer::Step {
  virtual ~Step() = default;
  virtual bool run(std::string_view in, const std::vector<Span>& words, PreTokenizer::Place place,
                   Scratch& scratch, std::string& out_text, std::vector<Span>& out) const = 0;
};

namespace {

// Split with a regex (a String pattern is a regex of the escaped literal).
class SplitStep : public PreTokenizer::Step {
 public:
  SplitStep(Regex re, Behavior behavior, bool invert)
      : re_(std::move(re)), behavior_(behavior), invert_(invert) {}

  bool run(std::string_view in, const std::vector<Span>& words, PreTokenizer::Place, PreTokenizer::Scratch& s,
           std::string&, std::vector<Span>& out) const override {
    std::vector<Piece> pieces;
    for (const Span& w : words) {
      const std::string_view word = in.substr(w.begin, w.end - w.begin);
      cut(word, s.matcher, pieces);
      apply_behavior(pieces, behavior_, w.begin, out);
    }
    return false;
  }

  // The alternating gaps and matches of `word` (Hugging Face's find_matches).
  void cut(std::string_view word, Regex::Matcher& m, std::vector<Piece>& pieces) const {
    pieces.clear();
    if (word.empty()) return;
    uint32_t prev = 0;
    re_.for_each_match(word, m, [&](size_t b, size_t e) {
      if (prev != b) pieces.push_back({prev, uint32_t(b), invert_});
      pieces.push_back({uint32_t(b), uint32_t(e), !invert_});
      prev = uint32_t(e);
    });
    if (prev != word.size()) pieces.push_back({prev, uint32_t(word.size()), invert_});
  }

 private:
  Regex re_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelStep : public PreTokenizer::Step {
 public:
  ByteLevelStep(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space),
        split_(use_regex ? std::make_unique<SplitStep>(Regex::compile(kGpt2Pattern, where),
                                                       Behavior::kIsolated, false)
                         : nullptr) {}

  bool run(std::string_view in, const std::vector<Span>& words, PreTokenizer::Place place,
           PreTokenizer::Scratch& s, std::string& out_text,
           std::vector<Span>& out) const override {
    std::string_view text = in;
    const std::vector<Span>* cur = &words;
    std::vector<Span> prefixed;
    bool rewrote = false;
    if (add_prefix_space_) {
      bool needed = false;
      // A continuing text's first word continues a word: no prefix.
      auto wants = [&](const Span& w) {
        return in[w.begin] != ' ' && !((place & PreTokenizer::kContinuing) && w.begin == 0);
      };
      for (const Span& w : words) needed |= wants(w);
      if (needed) {
        out_text.clear();
        for (const Span& w : words) {
          const uint32_t b = uint32_t(out_text.size());
          if (wants(w)) out_text.push_back(' ');
          out_text.append(in.substr(w.begin, w.end - w.begin));
          prefixed.push_back({b, uint32_t(out_text.size())});
        }
        text = out_text;
        cur = &prefixed;
        rewrote = true;
      }
    }
    if (split_ != nullptr) {
      split_->run(text, *cur, place, s, out_text, out);
    } else {
      out = *cur;
    }
    return rewrote;
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<SplitStep> split_;
};

class MetaspaceStep : public PreTokenizer::Step {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspaceStep(std::string replacement, Prepend prepend, bool split, const std::string& where)
      : replacement_(std::move(replacement)),
        prepend_(prepend),
        split_(split ? std::make_unique<SplitStep>(Regex::literal(replacement_, where),
                                                   Behavior::kMergedWithNext, false)
                     : nullptr) {}

  bool run(std::string_view in, const std::vector<Span>& words, PreTokenizer::Place place,
           PreTokenizer::Scratch& s, std::string& out_text,
           std::vector<Span>& out) const override {
    out_text.clear();
    std::vector<Span> replaced;
    replaced.reserve(words.size());
    for (const Span& w : words) {
      const uint32_t b = uint32_t(out_text.size());
      const std::string_view word = in.substr(w.begin, w.end - w.begin);
      const bool starts_with_rep = word.starts_with(' ') || word.starts_with(replacement_);
      const bool continuing = (place & PreTokenizer::kContinuing) && w.begin == 0;
      const bool prepend =
          !starts_with_rep && !continuing &&
          (prepend_ == Prepend::kAlways ||
           (prepend_ == Prepend::kFirst && (place & PreTokenizer::kAtStart) && w.begin == 0));
      if (prepend) out_text.append(replacement_);
      for (const char c : word) {
        if (c == ' ') {
          out_text.append(replacement_);
        } else {
          out_text.push_back(c);
        }
      }
      replaced.push_back({b, uint32_t(out_text.size())});
    }
    if (split_ != nullptr) {
      split_->run(out_text, replaced, place, s, out_text, out);
    } else {
      out = std::move(replaced);
    }
    return true;
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  std::unique_ptr<SplitStep> split_;
};

class DigitsStep : public PreTokenizer::Step {
 public:
  explicit DigitsStep(bool individual) : individual_(individual) {}
  bool run(std::string_view in, const std::vector<Span>& words, PreTokenizer::Place, PreTokenizer::Scratch&,
           std::string&, std::vector<Span>& out) const override {
    std::vector<Piece> pieces;
    for (const Span& w : words) {
      pieces.clear();
      uint32_t last = 0;
      const std::string_view word = in.substr(w.begin, w.end - w.begin);
      for (uint32_t i = 0; i < word.size(); ++i) {
        if (word[i] >= '0' && word[i] <= '9') {
          if (last < i) pieces.push_back({last, i, false});
          pieces.push_back({i, i + 1, true});
          last = i + 1;
        }
      }
      if (last < word.size()) pieces.push_back({last, uint32_t(word.size()), false});
      apply_behavior(pieces, individual_ ? Behavior::kIsolated : Behavior::kContiguous, w.begin,
                     out);
    }
    return false;
  }

 private:
  bool individual_;
};

bool bool_field(const json& j, const char* key, bool fallback, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) usage_error("{}: \"{}\" must be true or false", where, key);
  return it->get<bool>();
}

Behavior behavior_field(const json& j, const std::string& where) {
  const auto it = j.find("behavior");
  const std::string b = it != j.end() && it->is_string() ? it->get<std::string>() : "";
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  usage_error("{}: \"behavior\" must be one of Removed, Isolated, MergedWithPrevious, "
              "MergedWithNext, Contiguous (got {})",
              where, it == j.end() ? "nothing" : it->dump());
}

void add_steps(const json& j, const std::string& where,
               std::vector<std::unique_ptr<PreTokenizer::Step>>& steps, bool& byte_level) {
  if (j.is_null()) return;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    usage_error("{}: a pre-tokenizer must be an object with a \"type\"", where);
  if (byte_level) {
    usage_error("{}: a pre-tokenizer after ByteLevel is not supported by fdtrain (ByteLevel must "
                "come last)",
                where);
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    const auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array())
      usage_error("{}: a Sequence needs a \"pretokenizers\" list", where);
    for (size_t i = 0; i < it->size(); ++i)
      add_steps((*it)[i], fmt::format("{}.pretokenizers[{}]", where, i), steps, byte_level);
  } else if (type == "Split") {
    const auto pattern = j.find("pattern");
    std::optional<Regex> re;
    if (pattern != j.end() && pattern->is_object() && pattern->contains("String") &&
        (*pattern)["String"].is_string()) {
      re = Regex::literal((*pattern)["String"].get<std::string>(), where + ".pattern.String");
    } else if (pattern != j.end() && pattern->is_object() && pattern->contains("Regex") &&
               (*pattern)["Regex"].is_string()) {
      re = Regex::compile((*pattern)["Regex"].get<std::string>(), where + ".pattern.Regex");
    } else {
      usage_error("{}: a Split needs \"pattern\": {{\"String\": ...}} or {{\"Regex\": ...}}",
                  where);
    }
    steps.push_back(std::make_unique<SplitStep>(std::move(*re), behavior_field(j, where),
                                                bool_field(j, "invert", false, where)));
  } else if (type == "ByteLevel") {
    const bool prefix = bool_field(j, "add_prefix_space", true, where);
    const bool regex = bool_field(j, "use_regex", true, where);
    byte_level = true;
    // Without a prefix space or the regex, ByteLevel only maps bytes to
    // characters, which the byte-level vocabulary already accounts for.
    if (prefix || regex) steps.push_back(std::make_unique<ByteLevelStep>(prefix, regex, where));
  } else if (type == "Metaspace") {
    std::string replacement = "\u2581";
    if (const auto it = j.find("replacement"); it != j.end()) {
      if (!it->is_string() || it->get<std::string>().empty())
        usage_error("{}: \"replacement\" must be a one-character string", where);
      replacement = it->get<std::string>();
    }
    auto prepend = MetaspaceStep::Prepend::kAlways;
    if (const auto it = j.find("prepend_scheme"); it != j.end() && !it->is_null()) {
      const std::string s = it->is_string() ? it->get<std::string>() : "";
      if (s == "always") {
        prepend = MetaspaceStep::Prepend::kAlways;
      } else if (s == "first") {
        prepend = MetaspaceStep::Prepend::kFirst;
      } else if (s == "never") {
        prepend = MetaspaceStep::Prepend::kNever;
      } else {
        usage_error("{}: \"prepend_scheme\" must be always, first or never (got {})", where,
                    it->dump());
      }
    } else if (!bool_field(j, "add_prefix_space", true, where)) {
      prepend = MetaspaceStep::Prepend::kNever;  // the older spelling
    }
    steps.push_back(std::make_unique<MetaspaceStep>(replacement, prepend,
                                                    bool_field(j, "split", true, where), where));
  } else if (type == "Digits") {
    steps.push_back(
        std::make_unique<DigitsStep>(bool_field(j, "individual_digits", false, where)));
  } else {
    usage_error("{}: the pre-tokenizer type \"{}\" is not supported by fdtrain (supported: Split, "
                "ByteLevel, Metaspace, Digits, Sequence)",
                where, type);
  }
}

}  // namespace

PreTokenizer::PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

PreTokenizer PreTokenizer::from_json(const json& j, const std::string& where) {
  PreTokenizer p;
  add_steps(j, where, p.steps_, p.byte_level_);
  return p;
}

std::string_view PreTokenizer::split(std::string_view text, Place place, Scratch& scratch,
                                     std::vector<Span>& words) const {
  words.clear();
  if (text.empty()) return text;
  words.push_back({0, uint32_t(text.size())});
  std::string_view cur = text;
  int buf = 0;  // the scratch text buffer a rewriting step writes next
  for (const auto& step : steps_) {
    std::vector<Span>& out = scratch.spans[0];
    out.clear();
    std::string& out_text = scratch.text[buf];
    if (step->run(cur, words, place, scratch, out_text, out)) {
      cur = out_text;
      buf ^= 1;
    }
    words.swap(out);
  }
  return cur;
}

}  // namespace fd::text
