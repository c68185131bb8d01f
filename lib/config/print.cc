// to_yaml(): the resolved recipe, written by hand so that the layout is fixed
// (sections in schema order, one key per line) and numbers round-trip.
#include <fmt/format.h>

#include <iterator>
#include <string>

#include "lib/config/load.h"

namespace fd::config {
namespace {

// Shortest text that reads back as exactly `v`, always with a '.' or an
// exponent so that it reads as a number with a fraction ("1.0", "3e-04").
std::string number(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

bool plain_ok(const std::string& s) {
  if (s.empty()) return false;
  static const char* kReserved[] = {"null",  "Null",  "NULL",  "~",   "true", "True", "TRUE",
                                    "false", "False", "FALSE", "yes", "Yes",  "YES",  "no",
                                    "No",    "NO",    "on",    "On",  "ON",   "off",  "Off",
                                    "OFF",   "y",     "Y",     "n",   "N"};
  for (const char* r : kReserved) {
    if (s == r) return false;
  }
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '/' || c == '-' || c == '*';
    if (!ok) return false;
  }
  // Anything that starts like a number or an indicator is quoted.
  const char c0 = s[0];
  return !((c0 >= '0' && c0 <= '9') || c0 == '-' || c0 == '.' || c0 == '*');
}

// A YAML scalar for string `s`: plain when unambiguous, else double-quoted.
std::string str(const std::string& s) {
  if (plain_ok(s)) return s;
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string path_list(const std::vector<std::string>& files) {
  if (files.empty()) return " []\n";
  std::string out = "\n";
  for (const auto& f : files) out += fmt::format("    - {}\n", str(f));
  return out;
}

std::string int_list(const std::vector<int>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }

}  // namespace

std::string to_yaml(const Recipe& r) {
  std::string y;
  auto out = std::back_inserter(y);
  fmt::format_to(out, "# fdtrain recipe, fully resolved: includes inlined, defaults filled in,\n");
  fmt::format_to(out, "# data globs expanded. See docs/RECIPE.md.\n");
  const auto& m = r.model;
  fmt::format_to(out, "model:\n");
  fmt::format_to(out, "  arch: {}\n", to_string(m.arch));
  fmt::format_to(out, "  n_layer: {}\n  n_head: {}\n  d_model: {}\n", m.n_layer, m.n_head,
                 m.d_model);
  fmt::format_to(out, "  vocab_size: {}\n  max_seq_len: {}\n", m.vocab_size, m.max_seq_len);
  fmt::format_to(out, "  init_from: {}\n", str(m.init_from));
  const auto& d = r.data;
  fmt::format_to(out, "data:\n  format: {}\n", to_string(d.format));
  fmt::format_to(out, "  train:{}", path_list(d.train));
  fmt::format_to(out, "  val:{}", path_list(d.val));
  fmt::format_to(out, "  val_fraction: {}\n  seq_len: {}\n", number(d.val_fraction), d.seq_len);
  const auto& b = r.batch;
  fmt::format_to(out, "batch:\n  micro: {}\n  accumulation: {}\n  global: {}\n", b.micro,
                 b.accumulation, b.global);
  const auto& o = r.optimizer;
  fmt::format_to(out, "optimizer:\n  name: {}\n  lr: {}\n", to_string(o.name), number(o.lr));
  fmt::format_to(out, "  betas: [{}, {}]\n", number(o.betas[0]), number(o.betas[1]));
  fmt::format_to(out, "  eps: {}\n  weight_decay: {}\n  grad_clip: {}\n", number(o.eps),
                 number(o.weight_decay), number(o.grad_clip));
  const auto& s = r.schedule;
  fmt::format_to(out, "schedule:\n  name: {}\n  warmup_steps: {}\n  min_lr: {}\n",
                 to_string(s.name), s.warmup_steps, number(s.min_lr));
  fmt::format_to(out, "precision: {}\n", to_string(r.precision));
  const auto& l = r.loss_scale;
  fmt::format_to(out, "loss_scale:\n  loss_scale: {}\n  initial_scale_power: {}\n",
                 number(l.loss_scale), l.initial_scale_power);
  fmt::format_to(out, "  loss_scale_window: {}\n  hysteresis: {}\n", l.loss_scale_window,
                 l.hysteresis);
  fmt::format_to(out, "  consecutive_hysteresis: {}\n  min_loss_scale: {}\n",
                 l.consecutive_hysteresis, number(l.min_loss_scale));
  const auto& z = r.zero;
  fmt::format_to(out, "zero:\n  stage: {}\n  overlap_comm: {}\n", z.stage, z.overlap_comm);
  fmt::format_to(out, "dist:\n  timeout_s: {}\n", number(r.dist.timeout_s));
  if (!r.lora) {
    fmt::format_to(out, "lora: null\n");
  } else {
    const auto& a = *r.lora;
    fmt::format_to(out, "lora:\n  r: {}\n  alpha: {}\n  dropout: {}\n", a.r, number(a.alpha),
                   number(a.dropout));
    std::vector<std::string> targets;
    for (const auto& t : a.targets) targets.push_back(str(t));
    fmt::format_to(out, "  targets: [{}]\n", fmt::join(targets, ", "));
    fmt::format_to(out, "  layers: {}\n",
                   a.layers.empty() ? std::string("all") : int_list(a.layers));
    fmt::format_to(out, "  adapter: {}\n", str(a.adapter));
  }
  const auto& ac = r.activation_checkpointing;
  fmt::format_to(out, "activation_checkpointing:\n  layers: {}\n",
                 ac.layers.empty() ? std::string("none") : int_list(ac.layers));
  fmt::format_to(out, "checkpoint:\n  every: {}\n  keep_last: {}\n  at_end: {}\n",
                 r.checkpoint.every, r.checkpoint.keep_last, r.checkpoint.at_end);
  const auto& g = r.logging;
  fmt::format_to(out, "logging:\n  every: {}\n  eval_every: {}\n  eval_batches: {}\n", g.every,
                 g.eval_every, g.eval_batches);
  fmt::format_to(out, "  sample_tokens: {}\n  sample_prompt: {}\n", g.sample_tokens,
                 str(g.sample_prompt));
  fmt::format_to(out, "  sample_temperature: {}\n  sample_top_k: {}\n",
                 number(g.sample_temperature), g.sample_top_k);
  fmt::format_to(out, "device: {}\nthreads: {}\nseed: {}\nsteps: {}\n", to_string(r.device),
                 r.threads, r.seed, r.steps);
  fmt::format_to(out, "max_loss: {}\n", number(r.max_loss));
  return y;
}

}  // namespace fd::config
