#include "lib/dist/fault.h"

#include <fmt/format.h>

#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib/base/error.h"

namespace fd::dist {
namespace {

constexpr std::string_view kForm =
    "kill|stall|throw|inf|ckptkill|ckptslow|ckptfail:rank=R:step=S[:point=P][:ms=M] (e.g. "
    "kill:rank=1:step=5)";

[[noreturn]] void malformed(std::string_view text, std::string_view why) {
  usage_error("FDTRAIN_FAULT='{}': {}; expected {}", text, why, kForm);
}

template <typename T>
bool parse_int(std::string_view s, T* out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size() && *out >= 0;
}

}  // namespace

FaultSpec parse_fault(std::string_view text) {
  FaultSpec spec;
  if (text.empty()) return spec;
  std::vector<std::string_view> parts;
  size_t pos = 0;
  for (;;) {
    size_t colon = text.find(':', pos);
    parts.push_back(text.substr(pos, colon == std::string_view::npos ? colon : colon - pos));
    if (colon == std::string_view::npos) break;
    pos = colon + 1;
  }
  if (parts[0] == "kill") {
    spec.kind = FaultSpec::kKill;
  } else if (parts[0] == "stall") {
    spec.kind = FaultSpec::kStall;
  } else if (parts[0] == "throw") {
    spec.kind = FaultSpec::kThrow;
  } else if (parts[0] == "inf") {
    spec.kind = FaultSpec::kInf;
  } else if (parts[0] == "ckptkill") {
    spec.kind = FaultSpec::kCkptKill;
  } else if (parts[0] == "ckptslow") {
    spec.kind = FaultSpec::kCkptSlow;
  } else if (parts[0] == "ckptfail") {
    spec.kind = FaultSpec::kCkptFail;
  } else {
    malformed(text, fmt::format("unknown fault kind '{}'", parts[0]));
  }
  bool have_rank = false, have_step = false, have_point = false, have_ms = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::string_view p = parts[i];
    if (p.starts_with("rank=") && !have_rank) {
      if (!parse_int(p.substr(5), &spec.rank)) malformed(text, "rank must be an integer >= 0");
      have_rank = true;
    } else if (p.starts_with("step=") && !have_step) {
      if (!parse_int(p.substr(5), &spec.step)) malformed(text, "step must be an integer >= 0");
      have_step = true;
    } else if (p.starts_with("point=") && !have_point && spec.kind == FaultSpec::kCkptKill) {
      int64_t point = 0;
      if (!parse_int(p.substr(6), &point) || point < 1 || point > 4)
        malformed(text, "point must be 1, 2, 3 or 4");
      spec.point = int(point);
      have_point = true;
    } else if (p.starts_with("ms=") && !have_ms && spec.kind == FaultSpec::kCkptSlow) {
      if (!parse_int(p.substr(3), &spec.ms) || spec.ms > 3600000)
        malformed(text, "ms must be an integer from 0 to 3600000");
      have_ms = true;
    } else {
      malformed(text, fmt::format("unexpected field '{}'", p));
    }
  }
  if (!have_rank || !have_step) malformed(text, "both rank= and step= are required");
  if (spec.kind == FaultSpec::kCkptKill && !have_point)
    malformed(text, "ckptkill needs point=1..4");
  if (spec.kind == FaultSpec::kCkptSlow && !have_ms) malformed(text, "ckptslow needs ms=M");
  return spec;
}

FaultSpec fault_from_env() {
  const char* v = std::getenv("FDTRAIN_FAULT");
  return v == nullptr ? FaultSpec{} : parse_fault(v);
}

bool fault_fires(const FaultSpec& spec, FaultSpec::Kind kind, int rank, int64_t step) {
  return spec.kind == kind && spec.rank == rank && spec.step == step;
}

void inject_fault(const FaultSpec& spec, int rank, int64_t step) {
  if (spec.kind != FaultSpec::kKill && spec.kind != FaultSpec::kStall &&
      spec.kind != FaultSpec::kThrow)
    return;
  if (spec.rank != rank || spec.step != step) return;
  const char* what = spec.kind == FaultSpec::kKill    ? "kill (SIGKILL)"
                     : spec.kind == FaultSpec::kStall ? "stall (SIGSTOP)"
                                                      : "throw";
  std::fputs(fmt::format("fdtrain: rank {}: injected fault {} at step {} (FDTRAIN_FAULT)\n", rank,
                         what, step)
                 .c_str(),
             stderr);
  std::fflush(stderr);
  switch (spec.kind) {
    case FaultSpec::kKill:
      std::raise(SIGKILL);
      break;
    case FaultSpec::kStall:
      std::raise(SIGSTOP);
      break;
    case FaultSpec::kThrow:
      runtime_error("injected fault at rank {} step {} (FDTRAIN_FAULT)", rank, step);
    default:
      break;
  }
}

}  // namespace fd::dist
