#include "lib/text/text_normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "lib/base/error.h"
#include "lib/text/regex.h"

namespace fd::text {

using json = nlohmann::json;

struct TextNormalizer::Step {
  virtual ~Step() = default;
  virtual void apply(std::string_view in, std::string& out) const = 0;
  virtual bool marks_start() const { return false; }  // Prepend
};

namespace {

// Unicode normalization forms through utf8proc. ASCII is invariant under all
// four, so ASCII text (most of it) is copied without calling utf8proc.
class UnicodeForm : public TextNormalizer::Step {
 public:
  explicit UnicodeForm(int options) : options_(options) {}
  void apply(std::string_view in, std::string& out) const override {
    bool ascii = true;
    for (const char c : in) ascii &= static_cast<unsigned char>(c) < 0x80;
    if (ascii) {
      out.assign(in);
      return;
    }
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(in.data()),
                     static_cast<utf8proc_ssize_t>(in.size()), &result,
                     static_cast<utf8proc_option_t>(options_));
    if (n < 0) {
      runtime_error("Unicode normalization failed: {}", utf8proc_errmsg(n));
    }
    out.assign(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
    std::free(result);
  }

 private:
  int options_;
};

class Prepend : public TextNormalizer::Step {
 public:
  explicit Prepend(std::string s) : prefix_(std::move(s)) {}
  bool marks_start() const override { return true; }
  void apply(std::string_view in, std::string& out) const override {
    out.clear();
    if (!in.empty()) out.append(prefix_);
    out.append(in);
  }

 private:
  std::string prefix_;
};

class ReplaceLiteral : public TextNormalizer::Step {
 public:
  ReplaceLiteral(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void apply(std::string_view in, std::string& out) const override {
    out.clear();
    out.reserve(in.size() + in.size() / 8);
    size_t pos = 0;
    for (size_t hit; (hit = in.find(from_, pos)) != std::string_view::npos;
         pos = hit + from_.size()) {
      out.append(in.substr(pos, hit - pos));
      out.append(to_);
    }
    out.append(in.substr(pos));
  }

 private:
  std::string from_, to_;
};

class ReplaceRegex : public TextNormalizer::Step {
 public:
  ReplaceRegex(Regex re, std::string to) : re_(std::move(re)), to_(std::move(to)) {}
  void apply(std::string_view in, std::string& out) const override {
    thread_local Regex::Matcher m;
    out.clear();
    size_t pos = 0;
    re_.for_each_match(in, m, [&](size_t b, size_t e) {
      out.append(in.substr(pos, b - pos));
      out.append(to_);
      pos = e;
    });
    out.append(in.substr(pos));
  }

 private:
  Regex re_;
  std::string to_;
};

std::string string_field(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string())
    usage_error("{}: \"{}\" must be a string", where, key);
  return it->get<std::string>();
}

void add_steps(const json& j, const std::string& where,
               std::vector<std::unique_ptr<TextNormalizer::Step>>& steps) {
  if (j.is_null()) return;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    usage_error("{}: a normalizer must be an object with a \"type\"", where);
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    const auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array())
      usage_error("{}: a Sequence needs a \"normalizers\" list", where);
    for (size_t i = 0; i < it->size(); ++i)
      add_steps((*it)[i], fmt::format("{}.normalizers[{}]", where, i), steps);
  } else if (type == "NFC") {
    steps.push_back(std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  } else if (type == "NFD") {
    steps.push_back(std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
  } else if (type == "NFKC") {
    steps.push_back(
        std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  } else if (type == "NFKD") {
    steps.push_back(
        std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  } else if (type == "Prepend") {
    steps.push_back(std::make_unique<Prepend>(string_field(j, "prepend", where)));
  } else if (type == "Replace") {
    const std::string content = string_field(j, "content", where);
    const auto pattern = j.find("pattern");
    if (pattern != j.end() && pattern->is_object() && pattern->contains("String")) {
      const std::string from = string_field(*pattern, "String", where + ".pattern");
      if (from.empty()) usage_error("{}.pattern: an empty String pattern replaces nothing", where);
      steps.push_back(std::make_unique<ReplaceLiteral>(from, content));
    } else if (pattern != j.end() && pattern->is_object() && pattern->contains("Regex")) {
      steps.push_back(std::make_unique<ReplaceRegex>(
          Regex::compile(string_field(*pattern, "Regex", where + ".pattern"),
                         where + ".pattern.Regex"),
          content));
    } else {
      usage_error("{}: a Replace needs \"pattern\": {{\"String\": ...}} or {{\"Regex\": ...}}",
                  where);
    }
  } else {
    usage_error("{}: the normalizer type \"{}\" is not supported by fdtrain (supported: NFC, NFD, "
                "NFKC, NFKD, Prepend, Replace, Sequence)",
                where, type);
  }
}

}  // namespace

TextNormalizer::TextNormalizer() = default;
TextNormalizer::TextNormalizer(TextNormalizer&&) noexcept = default;
TextNormalizer& TextNormalizer::operator=(TextNormalizer&&) noexcept = default;
TextNormalizer::~TextNormalizer() = default;

TextNormalizer TextNormalizer::from_json(const json& j, const std::string& where) {
  TextNormalizer n;
  add_steps(j, where, n.steps_);
  return n;
}

void TextNormalizer::apply(std::string_view text, std::string& out, bool continuation) const {
  out.assign(text);
  std::string tmp;
  for (const auto& step : steps_) {
    if (continuation && step->marks_start()) continue;
    tmp.swap(out);
    step->apply(tmp, out);
  }
}

}  // namespace fd::text
