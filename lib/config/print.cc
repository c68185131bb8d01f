// to_yaml(): the resolved recipe, written by hand so that the layout is fixed
// (sections in schema order, one key per line) and numbers round-trip.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <utility>
#include <vector>

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

std::string int_list(const std::vector<int>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }

std::string boolean(bool b) { return b ? "true" : "false"; }

}  // namespace

std::vector<RecipeField> recipe_fields(const Recipe& r) {
  std::vector<RecipeField> f;
  auto add = [&](const char* path, std::string value) {
    f.push_back({path, std::move(value), {}, false});
  };
  auto add_list = [&](const char* path, const std::vector<std::string>& files) {
    RecipeField x{path, "", {}, true};
    for (const auto& s : files) x.items.push_back(str(s));
    f.push_back(std::move(x));
  };
  const auto& m = r.model;
  add("model.arch", std::string(to_string(m.arch)));
  add("model.n_layer", std::to_string(m.n_layer));
  add("model.n_head", std::to_string(m.n_head));
  add("model.d_model", std::to_string(m.d_model));
  add("model.vocab_size", std::to_string(m.vocab_size));
  add("model.max_seq_len", std::to_string(m.max_seq_len));
  if (m.arch != Arch::kGpt2) {  // the Llama family's keys, as loaded (defaults filled in)
    add("model.n_kv_head", std::to_string(m.n_kv_head));
    add("model.head_dim", std::to_string(m.head_dim));
    add("model.d_ff", std::to_string(m.d_ff));
    add("model.norm_eps", number(m.norm_eps));
    add("model.rope_theta", number(m.rope_theta));
    add("model.rope_scaling", std::string(to_string(m.rope_scaling)));
    add("model.rope_factor", number(m.rope_factor));
    add("model.rope_low_freq_factor", number(m.rope_low_freq_factor));
    add("model.rope_high_freq_factor", number(m.rope_high_freq_factor));
    add("model.rope_original_max_seq_len", std::to_string(m.rope_original_max_seq_len));
    add("model.tie_embeddings", m.tie_embeddings ? "true" : "false");
    add("model.attention_bias", m.attention_bias ? "true" : "false");
    add("model.mlp_bias", m.mlp_bias ? "true" : "false");
    add("model.qk_norm", m.qk_norm ? "true" : "false");
  }
  add("model.init_from", str(m.init_from));
  if (!m.quantize) {
    add("model.quantize", "null");
  } else {
    add("model.quantize.type", std::string(to_string(m.quantize->type)));
    add("model.quantize.block_size", std::to_string(m.quantize->block_size));
    add("model.quantize.double_quant", boolean(m.quantize->double_quant));
  }
  const auto& d = r.data;
  add("data.format", std::string(to_string(d.format)));
  add_list("data.train", d.train);
  add_list("data.val", d.val);
  add("data.val_fraction", number(d.val_fraction));
  add("data.seq_len", std::to_string(d.seq_len));
  add("data.tokenizer", str(d.tokenizer));
  add("data.chat_template", str(d.chat_template));
  add("data.template_vars", d.template_vars.empty() ? "{}" : d.template_vars);
  add("data.train_on_prompt", d.train_on_prompt ? "true" : "false");
  add("data.packing", d.packing ? "true" : "false");
  add("data.packing_order", std::string(to_string(d.packing_order)));
  add("data.truncation", std::string(to_string(d.truncation)));
  add("data.on_bad_record", std::string(to_string(d.on_bad_record)));
  add("data.max_length", std::to_string(d.max_length));
  add("data.messages_field", str(d.messages_field));
  add("data.instruction_field", str(d.instruction_field));
  add("data.input_field", str(d.input_field));
  add("data.output_field", str(d.output_field));
  add("data.text_field", str(d.text_field));
  const auto& b = r.batch;
  add("batch.micro", std::to_string(b.micro));
  add("batch.accumulation", std::to_string(b.accumulation));
  add("batch.global", std::to_string(b.global));
  const auto& o = r.optimizer;
  add("optimizer.name", std::string(to_string(o.name)));
  add("optimizer.lr", number(o.lr));
  add("optimizer.betas", fmt::format("[{}, {}]", number(o.betas[0]), number(o.betas[1])));
  add("optimizer.eps", number(o.eps));
  add("optimizer.weight_decay", number(o.weight_decay));
  add("optimizer.grad_clip", number(o.grad_clip));
  const auto& s = r.schedule;
  add("schedule.name", std::string(to_string(s.name)));
  add("schedule.warmup_steps", std::to_string(s.warmup_steps));
  add("schedule.min_lr", number(s.min_lr));
  add("precision", std::string(to_string(r.precision)));
  const auto& l = r.loss_scale;
  add("loss_scale.loss_scale", number(l.loss_scale));
  add("loss_scale.initial_scale_power", std::to_string(l.initial_scale_power));
  add("loss_scale.loss_scale_window", std::to_string(l.loss_scale_window));
  add("loss_scale.hysteresis", std::to_string(l.hysteresis));
  add("loss_scale.consecutive_hysteresis", boolean(l.consecutive_hysteresis));
  add("loss_scale.min_loss_scale", number(l.min_loss_scale));
  add("zero.stage", std::to_string(r.zero.stage));
  add("zero.overlap_comm", boolean(r.zero.overlap_comm));
  add("zero.reduce_dtype", std::string(to_string(r.zero.reduce_dtype)));
  add("zero.reductions_in_flight", std::to_string(r.zero.reductions_in_flight));
  const auto& oo = r.zero.offload_optimizer;
  add("zero.offload_optimizer.device", std::string(to_string(oo.device)));
  add("zero.offload_optimizer.path", str(oo.path));
  add("zero.offload_optimizer.buffer_mib", std::to_string(oo.buffer_mib));
  const auto& op = r.zero.offload_params;
  add("zero.offload_params.device", std::string(to_string(op.device)));
  add("zero.quantized_weights", boolean(r.zero.quantized_weights));
  add("zero.hierarchical_partition", boolean(r.zero.hierarchical_partition));
  add("zero.quantized_gradients", std::string(to_string(r.zero.quantized_gradients)));
  add("dist.timeout_s", number(r.dist.timeout_s));
  add("dist.hierarchical", boolean(r.dist.hierarchical));
  const auto& pp = r.parallel;
  add("parallel.pipeline", std::to_string(pp.pipeline));
  add("parallel.schedule", std::string(to_string(pp.schedule)));
  add("parallel.partition", pp.partition == PartitionName::kList
                                ? int_list(pp.partition_blocks)
                                : std::string(to_string(pp.partition)));
  add("parallel.tensor", std::to_string(pp.tensor));
  add("parallel.sequence_parallel", boolean(pp.sequence_parallel));
  add("parallel.sequence", std::to_string(pp.sequence));
  if (!r.lora) {
    add("lora", "null");
  } else {
    const auto& a = *r.lora;
    add("lora.r", std::to_string(a.r));
    add("lora.alpha", number(a.alpha));
    add("lora.dropout", number(a.dropout));
    std::vector<std::string> targets;
    for (const auto& t : a.targets) targets.push_back(str(t));
    add("lora.targets", fmt::format("[{}]", fmt::join(targets, ", ")));
    add("lora.layers", a.layers.empty() ? std::string("all") : int_list(a.layers));
    add("lora.adapter", str(a.adapter));
  }
  if (!r.objective) {
    add("objective", "null");
  } else {
    const auto& o = *r.objective;
    add("objective.name", std::string(to_string(o.name)));
    add("objective.loss_type", std::string(to_string(o.loss_type)));
    add("objective.beta", number(o.beta));
    add("objective.label_smoothing", number(o.label_smoothing));
    add("objective.gamma", number(o.gamma));
    add("objective.cpo_alpha", number(o.cpo_alpha));
    add("objective.reference", str(o.reference));
  }
  const auto& ac = r.activation_checkpointing;
  add("activation_checkpointing.layers",
      ac.layers.empty() ? std::string("none") : int_list(ac.layers));
  add("checkpoint.every", std::to_string(r.checkpoint.every));
  add("checkpoint.keep_last", std::to_string(r.checkpoint.keep_last));
  add("checkpoint.at_end", boolean(r.checkpoint.at_end));
  add("checkpoint.async", boolean(r.checkpoint.async));
  const auto& g = r.logging;
  add("logging.every", std::to_string(g.every));
  add("logging.eval_every", std::to_string(g.eval_every));
  add("logging.eval_batches", std::to_string(g.eval_batches));
  add("logging.sample_tokens", std::to_string(g.sample_tokens));
  add("logging.sample_prompt", str(g.sample_prompt));
  add("logging.sample_temperature", number(g.sample_temperature));
  add("logging.sample_top_k", std::to_string(g.sample_top_k));
  add("device", std::string(to_string(r.device)));
  add("tf32", r.tf32 ? "true" : "false");
  add("threads", std::to_string(r.threads));
  add("seed", std::to_string(r.seed));
  add("steps", std::to_string(r.steps));
  add("max_loss", number(r.max_loss));
  return f;
}

std::string to_yaml(const Recipe& r) {
  std::string y = std::string(kResolvedHeader) +
                  ": includes inlined, defaults filled in,\n"
                  "# data globs expanded. See docs/RECIPE.md.\n";
  std::string section, map;  // the section (and map in it) whose keys are being written
  for (const RecipeField& f : recipe_fields(r)) {
    const size_t dot = f.path.find('.');
    const std::string sec = dot == std::string::npos ? "" : f.path.substr(0, dot);
    std::string key = dot == std::string::npos ? f.path : f.path.substr(dot + 1);
    // A nested key (zero.offload_optimizer.device) is written in its map, one level deeper.
    const size_t dot2 = key.find('.');
    const std::string sub = dot2 == std::string::npos ? "" : key.substr(0, dot2);
    if (!sub.empty()) key = key.substr(dot2 + 1);
    if (!sec.empty() && sec != section) y += sec + ":\n";
    if (!sub.empty() && (sub != map || sec != section)) y += "  " + sub + ":\n";
    section = sec;
    map = sub;
    const std::string indent = sec.empty() ? "" : sub.empty() ? "  " : "    ";
    if (f.block) {
      // A block list of paths, one per line ([] when empty).
      if (f.items.empty()) {
        y += indent + key + ": []\n";
      } else {
        y += indent + key + ":\n";
        for (const std::string& item : f.items) y += indent + "  - " + item + "\n";
      }
    } else {
      y += indent + key + ": " + f.value + "\n";
    }
  }
  return y;
}

}  // namespace fd::config
