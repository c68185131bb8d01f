#include "lib/text/token_decoder.h"

#include <nlohmann/json.hpp>

#include "lib/base/error.h"
#include "lib/text/utf8.h"

namespace fd::text {

using json = nlohmann::json;

struct TokenDecoder::Step {
  virtual ~Step() = default;
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};

namespace {

class ByteLevelStep : public TokenDecoder::Step {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, to_valid_utf8(all));
  }
};

class ReplaceStep : public TokenDecoder::Step {
 public:
  ReplaceStep(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      size_t pos = 0;
      for (size_t hit; (hit = t.find(from_, pos)) != std::string::npos; pos = hit + from_.size()) {
        out.append(t, pos, hit - pos);
        out += to_;
      }
      out.append(t, pos);
      t = std::move(out);
    }
  }

 private:
  std::string from_, to_;
};

class ByteFallbackStep : public TokenDecoder::Step {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    size_t count = 0;
    auto flush = [&] {
      if (count == 0) return;
      if (is_valid_utf8(bytes)) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < count; ++i) out.emplace_back(kReplacementChar);
      }
      bytes.clear();
      count = 0;
    };
    for (std::string& t : tokens) {
      if (const int b = byte_of(t); b >= 0) {
        bytes.push_back(static_cast<char>(b));
        ++count;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  // The byte of a "<0xNN>" token (hex digits in either case), or -1.
  static int byte_of(const std::string& t) {
    if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; ++i) {
      const char c = t[size_t(i)];
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else {
        return -1;
      }
      v = v * 16 + d;
    }
    return v;
  }
};

class FuseStep : public TokenDecoder::Step {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripStep : public TokenDecoder::Step {
 public:
  StripStep(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && t.compare(b, content_.size(), content_) == 0 && b < e; ++k)
        b += content_.size();
      for (size_t k = 0; k < stop_ && e >= b + content_.size() &&
                         t.compare(e - content_.size(), content_.size(), content_) == 0;
           ++k)
        e -= content_.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class MetaspaceStep : public TokenDecoder::Step {
 public:
  MetaspaceStep(std::string replacement, bool prepend)
      : replacement_(std::move(replacement)), prepend_(prepend) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      std::string out;
      size_t pos = 0;
      for (size_t hit; (hit = t.find(replacement_, pos)) != std::string::npos;
           pos = hit + replacement_.size()) {
        out.append(t, pos, hit - pos);
        // Hugging Face drops every replacement character of the first token when it prepends one.
        if (!(i == 0 && prepend_)) out.push_back(' ');
      }
      out.append(t, pos);
      t = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool prepend_;
};

std::string string_field(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) usage_error("{}: \"{}\" must be a string", where, key);
  return it->get<std::string>();
}

void add_steps(const json& j, const std::string& where,
               std::vector<std::unique_ptr<TokenDecoder::Step>>& steps) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    usage_error("{}: a decoder must be an object with a \"type\"", where);
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    const auto it = j.find("decoders");
    if (it == j.end() || !it->is_array())
      usage_error("{}: a Sequence needs a \"decoders\" list", where);
    for (size_t i = 0; i < it->size(); ++i)
      add_steps((*it)[i], fmt::format("{}.decoders[{}]", where, i), steps);
  } else if (type == "ByteLevel") {
    steps.push_back(std::make_unique<ByteLevelStep>());
  } else if (type == "Replace") {
    const auto pattern = j.find("pattern");
    if (pattern == j.end() || !pattern->is_object() || !pattern->contains("String")) {
      usage_error("{}: fdtrain supports a Replace decoder with a String pattern only", where);
    }
    const std::string from = string_field(*pattern, "String", where + ".pattern");
    if (from.empty()) usage_error("{}.pattern: an empty String pattern replaces nothing", where);
    steps.push_back(std::make_unique<ReplaceStep>(from, string_field(j, "content", where)));
  } else if (type == "ByteFallback") {
    steps.push_back(std::make_unique<ByteFallbackStep>());
  } else if (type == "Fuse") {
    steps.push_back(std::make_unique<FuseStep>());
  } else if (type == "Strip") {
    auto count = [&](const char* key) {
      const auto it = j.find(key);
      if (it == j.end() || !it->is_number_unsigned())
        usage_error("{}: \"{}\" must be a non-negative integer", where, key);
      return it->get<size_t>();
    };
    steps.push_back(
        std::make_unique<StripStep>(string_field(j, "content", where), count("start"),
                                    count("stop")));
  } else if (type == "Metaspace") {
    std::string replacement = "\u2581";
    if (j.contains("replacement")) replacement = string_field(j, "replacement", where);
    bool prepend = true;
    if (const auto it = j.find("prepend_scheme"); it != j.end() && it->is_string()) {
      prepend = it->get<std::string>() != "never";
    } else if (const auto it2 = j.find("add_prefix_space"); it2 != j.end() && it2->is_boolean()) {
      prepend = it2->get<bool>();
    }
    steps.push_back(std::make_unique<MetaspaceStep>(replacement, prepend));
  } else {
    usage_error("{}: the decoder type \"{}\" is not supported by fdtrain (supported: ByteLevel, "
                "Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)",
                where, type);
  }
}

}  // namespace

TokenDecoder::TokenDecoder() = default;
TokenDecoder::TokenDecoder(TokenDecoder&&) noexcept = default;
TokenDecoder& TokenDecoder::operator=(TokenDecoder&&) noexcept = default;
TokenDecoder::~TokenDecoder() = default;

TokenDecoder TokenDecoder::from_json(const json& j, const std::string& where) {
  TokenDecoder d;
  if (j.is_null()) return d;
  d.any_ = true;
  add_steps(j, where, d.steps_);
  return d;
}

std::string TokenDecoder::decode(std::vector<std::string> tokens) const {
  std::string out;
  if (!any_) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out += tokens[i];
    }
    return to_valid_utf8(out);
  }
  for (const auto& step : steps_) step->apply(tokens);
  for (const std::string& t : tokens) out += t;
  return to_valid_utf8(out);
}

}  // namespace fd::text
