#include "lib/engine/estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>

#include "lib/base/check.h"
#include "lib/base/error.h"

namespace fd::engine {
namespace {

constexpr int64_t kWord = 4;  // bytes of an fp32 value or an i32 id: every activation here

// Query rows per block in ops::causal_attention (lib/ops/attention.cc): its
// score scratch is min(T, kAttnBlock) x T floats (twice that in backward).
constexpr int64_t kAttnBlock = 128;

std::string human(int64_t b) {
  const double d = double(b);
  if (b == 0) return "0";
  if (b < (int64_t(1) << 20)) return fmt::format("{:.1f} KiB", d / 1024.0);
  if (b < (int64_t(1) << 30)) return fmt::format("{:.2f} MiB", d / double(1 << 20));
  return fmt::format("{:.2f} GiB", d / double(1 << 30));
}

// 1234567 -> "1,234,567" (v >= 0).
std::string grouped(int64_t v) {
  const std::string digits = std::to_string(v);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

// `text` word-wrapped to `width` columns, the first line after `first`, the others after `rest`.
std::string wrapped(const std::string& text, const std::string& first, const std::string& rest,
                    size_t width) {
  std::string out, cur = first;
  bool line_empty = true;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line_empty && cur.size() + 1 + word.size() > width) {
      out += cur + "\n";
      cur = rest;
      line_empty = true;
    }
    cur += (line_empty ? "" : " ") + word;
    line_empty = false;
    start = end + 1;
  }
  return out + cur + "\n";
}

const char* paper_formula(int stage) {
  static const char* const f[] = {"16Ψ", "8Ψ + 8Ψ/N", "4Ψ + 12Ψ/N", "16Ψ/N"};
  return f[stage];
}

double paper_bytes(int stage, double psi, double n) {
  switch (stage) {
    case 0:
      return 16 * psi;
    case 1:
      return 8 * psi + 8 * psi / n;
    case 2:
      return 4 * psi + 12 * psi / n;
    default:
      return 16 * psi / n;
  }
}

std::string comm_formula(int stage, int accumulation) {
  if (stage == 3) return accumulation == 1 ? "3P(N-1)/N x 4 B" : "3aP(N-1)/N x 4 B";
  return accumulation == 1 ? "2P(N-1)/N x 4 B" : "(a+1)P(N-1)/N x 4 B";
}

}  // namespace

ActivationEstimate estimate_activations(const nn::GptConfig& m, int micro, int seq_len) {
  FD_CHECK(micro >= 1 && seq_len >= 1 && m.n_layer >= 1, "micro {} seq_len {} n_layer {}", micro,
           seq_len, m.n_layer);
  // Everything below counts 4-byte words; N rows of the (B*T, .) activations.
  const int64_t N = int64_t(micro) * seq_len;
  const int64_t C = m.d_model, V = m.vocab_size, H = m.n_head, L = m.n_layer;
  const int64_t score_block = std::min<int64_t>(seq_len, kAttnBlock) * seq_len;

  // Embedding: x0 = wte[ids] + wpe[pos] (the two lookups are freed after the
  // add), and each embedding's copy of its ids (i32).
  const int64_t embed = N * C + 2 * N;
  // One block, what its ops save: ln_1 its output h and mean/rstd (its input
  // is the previous block's output); the qkv matmul h (counted); attention qkv
  // (3NC) and its logsumexp (H per row); the projection attention's output;
  // x2 = x + proj (saved by ln_2); ln_2 its output and mean/rstd; c_fc its
  // input (counted), GELU its input fc (4NC); c_proj GELU's output (4NC); the
  // block's output (saved by the next ln). Projection outputs are freed by
  // the residual adds, which save nothing.
  const int64_t block = (N * C + 2 * N) + 3 * N * C + (N * C + H * N) + N * C + (N * C + 2 * N) +
                        4 * N * C + 4 * N * C + N * C;
  // Head: ln_f's output and mean/rstd, the logits (saved by cross-entropy),
  // cross-entropy's logsumexp and its copy of the targets.
  const int64_t head = (N * C + 2 * N) + N * V + N + N;
  const int64_t loss = 1;  // the scalar loss, alive through backward

  const int64_t all = embed + L * block;          // saved by embed and every block
  const int64_t below = embed + (L - 1) * block;  // under the top block (its input included)
  const int64_t top_saved = block - N * C;        // the top block's own, its output freed by then

  // Backward frees each op's saved tensors and its output gradient right after
  // the op, so the peak is at one of these moments (the others are dominated;
  // docs/ZERO.md). Gradients named d<x>.
  struct Moment {
    const char* name;
    int64_t words;
  };
  const Moment moments[] = {
      // dlogits (NV) next to the logits, the loss gradient and a 2V row scratch.
      {"cross-entropy backward", all + head + loss + 1 + N * V + 2 * V},
      // dlogits and dh_f (NC); logits, lse and targets freed.
      {"lm head backward", all + (N * C + 2 * N) + loss + N * V + N * C},
      // dh_f and dx_L (NC each) and a C-wide scratch; dlogits and h_f freed.
      {"ln_f backward", all + 2 * N + loss + 2 * N * C + C},
      // Top block: dx2 + d(mlp out) + d(gelu out) = 6NC while every saved tensor is alive.
      {"MLP projection backward (top block)", below + loss + top_saved + 6 * N * C},
      // Top block: att, x2, ln_2's, fc and gelu's tensors freed; dx, datt, dqkv
      // (5NC) and two score blocks of scratch.
      {"attention backward (top block)",
       below + loss + top_saved - 11 * N * C - 2 * N + 5 * N * C + 2 * score_block},
  };
  ActivationEstimate a;
  a.per_block = block * kWord;
  a.embed = embed * kWord;
  a.head = head * kWord;
  a.saved = (all + head) * kWord;
  for (const Moment& mo : moments) {
    if (mo.words * kWord > a.peak) {
      a.peak = mo.words * kWord;
      a.peak_at = mo.name;
    }
  }
  return a;
}

std::vector<int64_t> segment_padded_numel(const nn::GptConfig& model, int world) {
  const nn::GroupLayout layout =
      zero::layout_for(0, world);  // padding does not depend on the stage
  std::vector<int64_t> out;
  for (const nn::SegmentSpec& s : nn::Gpt::segment_specs(model))
    out.push_back(nn::FlatParamGroup::padded_numel(s.params, layout));
  return out;
}

// A replay of ZeroEngine's buffer protocol (lib/zero/zero_engine.cc), tracking
// only the buffers accounted as MemCategory::kComm: full parameters of stage 3
// (pinned around a segment's forward and backward; the embedding stays pinned
// from the head's forward to its own backward), full gradients of stages 2-3
// (acquired before a segment's backward, released when its reduce-scatter
// completes) and reduce-scatter outputs that are not the gradient shard.
int64_t comm_buffer_bytes(int stage, int world, int accumulation, bool overlap_comm,
                          const std::vector<int64_t>& numel) {
  FD_CHECK(stage >= 0 && stage <= 3 && world >= 1 && accumulation >= 1 && numel.size() >= 2,
           "stage {} world {} accumulation {} segments {}", stage, world, accumulation,
           numel.size());
  const int n = int(numel.size());
  const int embed = 0, final = n - 1;  // the final segment also needs the embedding (tied head)
  const size_t max_in_flight = overlap_comm ? 2 : 0;  // ZeroEngine's kMaxInFlight
  const bool grad_shard_own = stage >= 2 || accumulation > 1;
  std::vector<int> pins(size_t(n), 0), deferred(size_t(n), 0);
  std::vector<bool> grads_resident(size_t(n), false);
  int64_t current = 0, peak = 0;
  auto add = [&](int64_t bytes) {
    current += bytes;
    peak = std::max(peak, current);
  };
  auto bytes_of = [&](int g) { return numel[size_t(g)] * kWord; };
  auto pin = [&](int g) {
    if (stage >= 3 && pins[size_t(g)]++ == 0) add(bytes_of(g));
  };
  auto unpin = [&](int g) {
    if (stage >= 3 && --pins[size_t(g)] == 0) current -= bytes_of(g);
  };
  auto ensure_grads = [&](int g) {
    if (stage < 2 || grads_resident[size_t(g)]) return;
    grads_resident[size_t(g)] = true;
    add(bytes_of(g));
  };
  struct Pending {
    int segment;
    int64_t recv_bytes;
  };
  std::deque<Pending> pending;
  auto complete_front = [&] {
    const Pending p = pending.front();
    pending.pop_front();
    current -= p.recv_bytes;
    if (stage >= 2) {
      grads_resident[size_t(p.segment)] = false;
      current -= bytes_of(p.segment);
    }
  };
  for (int micro = 0; micro < accumulation; ++micro) {
    auto also = [&](int g) { return g == final ? std::vector<int>{embed} : std::vector<int>{}; };
    for (int g = 0; g < n; ++g) {  // forward
      pin(g);
      for (int a : also(g)) pin(a);
      unpin(g);
    }
    for (int g = n - 1; g >= 0; --g) {  // backward
      pin(g);
      ensure_grads(g);
      for (int a : also(g)) ensure_grads(a);
      unpin(g);
      for (int a : also(g)) deferred[size_t(a)]++;
      for (; deferred[size_t(g)] > 0; --deferred[size_t(g)]) unpin(g);
      const bool into_shard = micro == 0 && grad_shard_own;
      const int64_t recv = into_shard ? 0 : numel[size_t(g)] / world * kWord;
      add(recv);
      pending.push_back({g, recv});
      while (pending.size() > max_in_flight) complete_front();
    }
    while (!pending.empty()) complete_front();
  }
  return peak;
}

int64_t comm_bytes_per_step(int stage, int world, int accumulation, int64_t P) {
  FD_CHECK(P % world == 0, "padded parameter count {} not divisible by world {}", P, world);
  // One collective over all P elements sends (N-1)/N * 4P bytes per rank.
  const int64_t pass = (P / world) * (world - 1) * kWord;
  const int64_t passes = stage == 3 ? 3 * int64_t(accumulation) : int64_t(accumulation) + 1;
  return passes * pass;
}

Estimate estimate(const config::Recipe& r, int world) {
  FD_CHECK(world >= 1, "world size {}", world);
  config::check_world_size(r, world);
  // Never print fp32 numbers for a run that would not be fp32 or would recompute activations.
  if (r.precision != config::Precision::kFp32) {
    usage_error(
        "{}: precision: the estimate covers fp32 only so far, not {}; set precision to fp32",
        r.where("precision"), config::to_string(r.precision));
  }
  if (!r.activation_checkpointing.layers.empty()) {
    usage_error(
        "{}: activation_checkpointing.layers: the estimate does not cover activation "
        "checkpointing yet; set layers to none",
        r.where("activation_checkpointing.layers"));
  }
  Estimate e;
  e.model.n_layer = r.model.n_layer;
  e.model.n_head = r.model.n_head;
  e.model.d_model = r.model.d_model;
  e.model.vocab_size = r.model.vocab_size;
  e.model.max_seq_len = r.model.max_seq_len;
  e.micro = r.batch.micro;
  e.seq_len = r.data.seq_len;
  e.accumulation = r.batch.accumulation;
  e.world = world;
  e.recipe_stage = r.zero.stage;
  e.overlap_comm = r.zero.overlap_comm;
  e.num_params = e.model.num_params();
  const std::vector<int64_t> numel = segment_padded_numel(e.model, world);
  for (int64_t v : segment_padded_numel(e.model, 1)) e.padded_params_1 += v;
  for (int64_t v : numel) e.padded_params += v;
  e.activations = estimate_activations(e.model, e.micro, e.seq_len);
  for (int s = 0; s < 4; ++s) {
    StageEstimate& st = e.stages[size_t(s)];
    st.stage = s;
    st.model_states = zero::model_state_bytes(s, world, e.accumulation, e.padded_params);
    st.activations = e.activations.peak;
    st.comm_buffers = comm_buffer_bytes(s, world, e.accumulation, e.overlap_comm, numel);
    st.other = 3 * int64_t(e.micro) * e.seq_len * kWord;  // tokens, targets, positions (i32)
    st.comm_bytes_per_step = comm_bytes_per_step(s, world, e.accumulation, e.padded_params);
    st.paper_bytes = paper_bytes(s, double(e.num_params), double(world));
  }
  return e;
}

std::vector<std::string> estimate_assumptions(const Estimate& e) {
  std::vector<std::string> a = {
      "Precision fp32: the (sharded) parameters are the master weights (master = 0); Adam keeps "
      "m and v (8 bytes per parameter). 16-bit parameters and gradients come with a later "
      "precision feature; the paper's mixed-precision figures are printed for reference.",
      fmt::format("Padding: every parameter starts on a {}-element boundary and each segment is "
                  "padded to a multiple of {} x N elements, so that it splits into N equal "
                  "shards; model states are counted on P (padded), not on Ψ.",
                  nn::FlatParamGroup::kAlignElems, nn::FlatParamGroup::kAlignElems),
      "Model states (params, grads, master, optimizer) are what a run of this recipe measures "
      "in summary.json 'memory', to the byte.",
      fmt::format(
          "Activations: the tensors the ops save for backward at micro batch B = {} and "
          "sequence T = {} (layernorm input, output feeding the next matmul, mean and rstd; matmul "
          "inputs; "
          "attention qkv and logsumexp; GELU input; cross-entropy logits, logsumexp and targets), "
          "plus the transient gradients at the highest point of backward; one micro-batch at a "
          "time (accumulation does not add); no activation checkpointing yet. The formula mirrors "
          "the current ops exactly (tests/engine/estimate_test.cc compares it with a measured "
          "step).",
          e.micro, e.seq_len),
      "Comm buffers: stage 3's gathered full segments (the current one, and the embedding kept "
      "from the tied head's forward to its own backward) and stages 2-3's full-gradient "
      "buckets (at most 2 reduce-scatters in flight plus the one being launched), plus "
      "reduce-scatter outputs that are not the gradient shard itself (stages 0-1, and every "
      "micro-batch after the first). Peak during a training step only.",
      "Not counted: setup transients (the model is built with full buffers before ZeRO releases "
      "them; initialisation stages one parameter at a time), evaluation (no gradients: smaller "
      "than training), the optional sample at the end, the BLAS library's own buffers and the "
      "MPI library's memory.",
      "Total = the sum of the per-category peaks, an upper bound of the simultaneous peak.",
      "Communication per step and rank, ring model (what summary.json 'comm_bytes_per_step' "
      "counts): stages 0-2 reduce-scatter the gradients each micro-batch and all-gather once "
      "(gradients for stage 0, parameters for 1-2); stage 3 all-gathers each segment for its "
      "forward and again for its backward and reduce-scatters its gradient, every "
      "micro-batch.",
  };
  return a;
}

std::string format_estimate(const Estimate& e) {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  const nn::GptConfig& m = e.model;
  line(fmt::format("fdtrain estimate{}: bytes per rank at world size N = {}",
                   e.recipe_path.empty() ? "" : " for " + e.recipe_path, e.world));
  line(
      fmt::format("model: GPT-2 L{} H{} C{} V{} T{}; micro batch {} x {} tokens, accumulation {}; "
                  "precision fp32",
                  m.n_layer, m.n_head, m.d_model, m.vocab_size, m.max_seq_len, e.micro, e.seq_len,
                  e.accumulation));
  line(fmt::format(
      "Ψ = {} parameters; P = {} padded at N = {} (+{}: +{} aligning each parameter "
      "to 16 elements, +{} splitting segments into {} shard{})",
      grouped(e.num_params), grouped(e.padded_params), e.world,
      grouped(e.padded_params - e.num_params), grouped(e.padded_params_1 - e.num_params),
      grouped(e.padded_params - e.padded_params_1), e.world, e.world == 1 ? "" : "s"));
  line("");
  const int w0 = 26, w = 14;
  auto row = [&](const std::string& label, auto cell) {
    std::string s = fmt::format("{:<{}}", label, w0);
    for (const StageEstimate& st : e.stages) s += fmt::format("{:>{}}", cell(st), w);
    line(s);
  };
  row("", [&](const StageEstimate& st) {
    return fmt::format("{}stage {}", st.stage == e.recipe_stage ? "*" : "", st.stage);
  });
  row("params", [](const StageEstimate& s) { return human(s.model_states.params); });
  row("grads", [](const StageEstimate& s) { return human(s.model_states.grads); });
  row("master", [](const StageEstimate& s) { return human(s.model_states.master); });
  row("optimizer (Adam m+v)",
      [](const StageEstimate& s) { return human(s.model_states.optimizer); });
  row("= model states", [](const StageEstimate& s) { return human(s.model_states.total()); });
  row("activations", [](const StageEstimate& s) { return human(s.activations); });
  row("comm buffers", [](const StageEstimate& s) { return human(s.comm_buffers); });
  row("other (token batch)", [](const StageEstimate& s) { return human(s.other); });
  row("total", [](const StageEstimate& s) { return human(s.total()); });
  line("");
  row("paper, fp32", [](const StageEstimate& s) { return std::string(paper_formula(s.stage)); });
  row("  at Ψ", [](const StageEstimate& s) { return human(int64_t(s.paper_bytes + 0.5)); });
  row("comm per step", [](const StageEstimate& s) { return human(s.comm_bytes_per_step); });
  line(fmt::format("{:<{}}stages 0-2: {}; stage 3: {}", "", w0, comm_formula(0, e.accumulation),
                   comm_formula(3, e.accumulation)));
  line(fmt::format("(* the recipe's stage, zero.stage = {})", e.recipe_stage));
  line("");
  line("Model states per rank, fp32 (P padded parameters, N ranks, a = accumulation):");
  line("  stage 0: params 4P + grads 4P + Adam 8P            = 16P");
  line("  stage 1: params 4P + grads 4P + Adam 8P/N          = 8P + 8P/N");
  line("  stage 2: params 4P + grad shard 4P/N + Adam 8P/N   = 4P + 12P/N");
  line("  stage 3: param shard 4P/N + grad 4P/N + Adam 8P/N  = 16P/N");
  line("  stages 0-1 with a > 1 add a 4P/N gradient accumulator; with P = Ψ and a = 1 these are");
  line("  the paper's fp32 figures. With 16-bit params and grads (a later precision) the paper");
  line("  gives 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N.");
  out += wrapped(
      fmt::format("Activations: {} per block x {} + embedding {} + head {} = {} saved at the end "
                  "of forward; peak {} at {}.",
                  human(e.activations.per_block), m.n_layer, human(e.activations.embed),
                  human(e.activations.head), human(e.activations.saved), human(e.activations.peak),
                  e.activations.peak_at),
      "", "  ", 96);
  line("");
  line("Assumptions:");
  for (const std::string& a : estimate_assumptions(e)) out += wrapped(a, "  - ", "    ", 96);
  return out;
}

nlohmann::ordered_json estimate_json(const Estimate& e) {
  nlohmann::ordered_json j;
  j["recipe"] = e.recipe_path;
  j["world_size"] = e.world;
  j["recipe_stage"] = e.recipe_stage;
  j["precision"] = "fp32";
  j["model"] = {{"n_layer", e.model.n_layer},
                {"n_head", e.model.n_head},
                {"d_model", e.model.d_model},
                {"vocab_size", e.model.vocab_size},
                {"max_seq_len", e.model.max_seq_len}};
  j["micro"] = e.micro;
  j["seq_len"] = e.seq_len;
  j["accumulation"] = e.accumulation;
  j["num_params"] = e.num_params;
  j["padded_params"] = e.padded_params;
  j["padding"] = e.padded_params - e.num_params;
  j["alignment_padding"] = e.padded_params_1 - e.num_params;
  j["world_padding"] = e.padded_params - e.padded_params_1;
  j["activations"] = {{"per_block", e.activations.per_block}, {"embed", e.activations.embed},
                      {"head", e.activations.head},           {"saved", e.activations.saved},
                      {"peak", e.activations.peak},           {"peak_at", e.activations.peak_at}};
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (const StageEstimate& s : e.stages) {
    stages.push_back({{"stage", s.stage},
                      {"params", s.model_states.params},
                      {"grads", s.model_states.grads},
                      {"master", s.model_states.master},
                      {"optimizer", s.model_states.optimizer},
                      {"model_states", s.model_states.total()},
                      {"activations", s.activations},
                      {"comm_buffers", s.comm_buffers},
                      {"other", s.other},
                      {"total", s.total()},
                      {"paper_formula", paper_formula(s.stage)},
                      {"paper_bytes", s.paper_bytes},
                      {"comm_bytes_per_step", s.comm_bytes_per_step},
                      {"comm_formula", comm_formula(s.stage, e.accumulation)}});
  }
  j["stages"] = stages;
  j["assumptions"] = estimate_assumptions(e);
  return j;
}

}  // namespace fd::engine
