#include "lib/engine/estimate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/engine/assemble.h"

namespace fd::engine {
namespace {

constexpr int64_t kWord = 4;  // bytes of an fp32 value or an i32 id

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

const char* paper_formula(int stage, int c) {
  static const char* const f32[] = {"16Ψ", "8Ψ + 8Ψ/N", "4Ψ + 12Ψ/N", "16Ψ/N"};
  static const char* const f16[] = {"16Ψ", "4Ψ + 12Ψ/N", "2Ψ + 14Ψ/N", "16Ψ/N"};
  return c == 2 ? f16[stage] : f32[stage];
}

// The paper's per-rank model states with c-byte params and grads, fp32 master
// (c = 2; none for c = 4) and Adam m, v: K = 12 (c = 2) or 8 (c = 4).
double paper_bytes(int stage, double psi, double n, int c) {
  const double master_and_adam = c == 2 ? 12.0 : 8.0;
  switch (stage) {
    case 0:
      return (2 * c + master_and_adam) * psi;
    case 1:
      return 2 * c * psi + master_and_adam * psi / n;
    case 2:
      return c * psi + (c + master_and_adam) * psi / n;
    default:
      return (2 * c + master_and_adam) * psi / n;
  }
}

std::string comm_formula(int stage, int accumulation, int c) {
  const char* passes = stage == 3 ? (accumulation == 1 ? "3P" : "3aP")
                                  : (accumulation == 1 ? "2P" : "(a+1)P");
  return fmt::format("{}(N-1)/N x {} B", passes, c);
}

}  // namespace

namespace {

// A replay of one training micro-batch (and of an evaluation batch) that
// mirrors, allocation by allocation, what lib/ops, lib/autograd (Tape,
// segment) and nn::Gpt allocate in MemCategory::kActivations, with the same
// lifetimes: buffers are reference counted like the tensors they stand for,
// so a saved tensor lives exactly as long as the node (or Variable) that
// holds it. Nothing is allocated; only byte counts move.
class ActivationReplay {
 public:
  ActivationReplay(const nn::GptConfig& m, int micro, int seq_len, int compute_bytes,
                   std::vector<bool> checkpointed)
      : R_(int64_t(micro) * seq_len),
        T_(seq_len),
        C_(m.d_model),
        V_(m.vocab_size),
        H_(m.n_head),
        L_(m.n_layer),
        c_(compute_bytes),
        ckpt_(std::move(checkpointed)) {}

  int64_t peak() const { return peak_; }
  const std::string& peak_at() const { return peak_at_; }
  int64_t end_of_forward() const { return end_of_forward_; }

  void train_micro_batch();
  void evaluate_batch();

 private:
  struct Block_ {
    ActivationReplay* sim;
    int64_t bytes;
    ~Block_() { sim->current_ -= bytes; }
  };
  using Buf = std::shared_ptr<Block_>;

  // What one transformer block's recorded ops save for backward.
  struct Saved {
    Buf x, h, mean1, rstd1, qkv, lse, att, x2, h2, mean2, rstd2, fc, f;
  };

  Buf alloc(int64_t bytes) {
    if (bytes <= 0) return nullptr;
    current_ += bytes;
    if (current_ > peak_) {
      peak_ = current_;
      peak_at_ = moment_;
    }
    return Buf(new Block_{this, bytes});
  }
  Buf act(int64_t n) { return alloc(c_ * n); }  // a tensor in the compute dtype
  Buf f32(int64_t n) { return alloc(4 * n); }   // fp32 (or i32) whatever the dtype
  // F32In / F32Out (lib/ops/f32_buffer.h): an fp32 copy for 16-bit tensors only.
  Buf scratch(int64_t n) { return c_ == 4 ? nullptr : alloc(4 * n); }
  // GradSlot::ensure_grad: zeros in the slot's dtype on first use.
  void ensure(Buf& slot, int64_t n) {
    if (!slot) slot = act(n);
  }
  void at(std::string m) { moment_ = std::move(m); }

  // Forward ops: the output, and (when recording) what the node keeps.
  Buf layernorm(int64_t rows, bool rec, Buf* mean, Buf* rstd) {
    Buf out = act(rows * C_);
    Buf m = f32(rows), r = f32(rows);
    {
      Buf x = scratch(rows * C_), w = scratch(C_), b = scratch(C_), y = scratch(rows * C_);
    }
    if (rec) *mean = m, *rstd = r;
    return out;
  }
  Buf matmul(int64_t M, int64_t K, int64_t N, bool bias) {
    Buf out = act(M * N);
    Buf a = scratch(M * K), b = scratch(K * N), y = scratch(M * N);
    if (bias) Buf bv = scratch(N);
    return out;
  }
  Buf add(int64_t n) {
    Buf out = act(n);
    Buf a = scratch(n), b = scratch(n), y = scratch(n);
    return out;
  }
  Buf gelu(int64_t n) {
    Buf out = act(n);
    Buf x = scratch(n), y = scratch(n);
    return out;
  }
  Buf attention(bool rec, Buf* lse) {
    Buf out = act(R_ * C_);
    Buf l = f32(H_ * R_);
    {
      Buf x = scratch(3 * R_ * C_), y = scratch(R_ * C_), s = f32(score_block());
    }
    if (rec) *lse = l;
    return out;
  }
  Buf embedding(bool rec, Buf* ids) {
    Buf out = act(R_ * C_);
    if (rec) *ids = f32(R_);  // the node's copy of the ids (i32)
    return out;
  }
  Buf cross_entropy(bool rec, Buf* lse, Buf* targets) {
    Buf l = f32(R_);
    Buf s = f32(c_ == 4 ? 1 : V_);  // a row in fp32
    Buf loss = f32(1);
    if (rec) *lse = l, *targets = f32(R_);
    return loss;
  }
  int64_t score_block() const { return std::min<int64_t>(T_, kAttnBlock) * T_; }

  // Backward ops: read the output gradient, accumulate into the input slots.
  void add_bwd(Buf& ga, Buf& gb, int64_t n) {
    ensure(ga, n);
    { Buf s = scratch(n), d = scratch(n); }
    ensure(gb, n);
    { Buf s = scratch(n), d = scratch(n); }
  }
  void matmul_bwd(int64_t M, int64_t K, int64_t N, bool bias, Buf& ga) {
    Buf dy = scratch(M * N);
    {
      Buf b = scratch(K * N);
      ensure(ga, M * K);
      Buf da = scratch(M * K);
    }
    { Buf a = scratch(M * K), db = scratch(K * N); }
    if (bias) Buf dbias = scratch(N);
  }
  void layernorm_bwd(int64_t rows, Buf& gx) {
    Buf x = scratch(rows * C_), w = scratch(C_), dy = scratch(rows * C_);
    Buf dw = scratch(C_), db = scratch(C_);
    ensure(gx, rows * C_);
    Buf dx = scratch(rows * C_);
    Buf norm = f32(C_);
  }
  void attention_bwd(Buf& gqkv) {
    Buf x = scratch(3 * R_ * C_), dy = scratch(R_ * C_);
    ensure(gqkv, 3 * R_ * C_);
    Buf dx = scratch(3 * R_ * C_);
    Buf s = f32(2 * score_block());
  }
  void gelu_bwd(Buf& gx, int64_t n) {
    Buf x = scratch(n), dy = scratch(n);
    ensure(gx, n);
    Buf dx = scratch(n);
  }
  void embedding_bwd() {
    Buf dy = scratch(R_ * C_);
    if (c_ == 2) Buf order = f32(R_), acc = f32(C_);  // 16-bit rows are summed in fp32
  }

  // nn::Gpt::block_forward; with rec the ops record and *saved gets what they keep,
  // without (no-grad: a checkpointed block's forward, evaluation) every local
  // lives until the function returns.
  Buf block(int l, const Buf& x, bool rec, Saved* saved, const char* what) {
    const int64_t RC = R_ * C_;
    auto name = [&](const char* op) { at(fmt::format("block {} {} {}", l, op, what)); };
    Saved s;
    s.x = x;
    name("ln_1");
    s.h = layernorm(R_, rec, &s.mean1, &s.rstd1);
    name("c_attn");
    s.qkv = matmul(R_, C_, 3 * C_, true);
    name("attention");
    s.att = attention(rec, &s.lse);
    name("attn.c_proj");
    {
      Buf proj = matmul(R_, C_, C_, true);
      name("residual add");
      s.x2 = add(RC);
    }
    name("ln_2");
    s.h2 = layernorm(R_, rec, &s.mean2, &s.rstd2);
    name("c_fc");
    {
      Buf fc = matmul(R_, C_, 4 * C_, true);
      name("gelu");
      s.f = gelu(4 * RC);
      if (rec) s.fc = fc;
    }
    name("mlp.c_proj");
    Buf y;
    {
      Buf mo = matmul(R_, 4 * C_, C_, true);
      name("residual add");
      y = add(RC);
    }
    if (rec) *saved = std::move(s);
    return y;
  }

  // The recorded block's backward (its inner tape in reverse): gy is the
  // output gradient slot (released after the first node unless the caller
  // holds it too), gx the input's gradient slot.
  void block_bwd(int l, Saved s, Buf gy, Buf& gx, const char* what) {
    const int64_t RC = R_ * C_;
    auto name = [&](const char* op) { at(fmt::format("block {} {} backward{}", l, op, what)); };
    Buf gx2, gmo, gf, gfc, gh2, gproj, gatt, gqkv, gh;
    name("residual add");
    add_bwd(gx2, gmo, RC);
    gy.reset();
    name("mlp.c_proj");
    matmul_bwd(R_, 4 * C_, C_, true, gf);
    gmo.reset(), s.f.reset();
    name("gelu");
    gelu_bwd(gfc, 4 * RC);
    gf.reset(), s.fc.reset();
    name("c_fc");
    matmul_bwd(R_, C_, 4 * C_, true, gh2);
    gfc.reset(), s.h2.reset();
    name("ln_2");
    layernorm_bwd(R_, gx2);
    gh2.reset(), s.x2.reset(), s.mean2.reset(), s.rstd2.reset();
    name("residual add");
    add_bwd(gx, gproj, RC);
    gx2.reset();
    name("attn.c_proj");
    matmul_bwd(R_, C_, C_, true, gatt);
    gproj.reset(), s.att.reset();
    name("attention");
    attention_bwd(gqkv);
    gatt.reset(), s.qkv.reset(), s.lse.reset();
    name("c_attn");
    matmul_bwd(R_, C_, 3 * C_, true, gh);
    gqkv.reset(), s.h.reset();
    name("ln_1");
    layernorm_bwd(R_, gx);
    gh.reset(), s.x.reset(), s.mean1.reset(), s.rstd1.reset();
  }

  const int64_t R_, T_, C_, V_, H_;
  const int L_;
  const int64_t c_;
  const std::vector<bool> ckpt_;
  int64_t current_ = 0, peak_ = 0, end_of_forward_ = 0;
  std::string moment_, peak_at_;
};

void ActivationReplay::train_micro_batch() {
  // Forward (Gpt::loss): the embedding segment, the blocks, the head, cross-entropy.
  Buf ids_wte, ids_wpe, x;
  at("embedding forward");
  {
    Buf a = embedding(true, &ids_wte), b = embedding(true, &ids_wpe);
    x = add(R_ * C_);
  }
  std::vector<Saved> saved(static_cast<size_t>(L_));
  std::vector<Buf> node_input(static_cast<size_t>(L_));  // a checkpointed segment's node keeps its input
  for (int l = 0; l < L_; ++l) {
    if (ckpt_[size_t(l)]) {
      node_input[size_t(l)] = x;
      x = block(l, x, false, nullptr, "forward (no grad, checkpointed)");
    } else {
      x = block(l, x, true, &saved[size_t(l)], "forward");
    }
  }
  Buf h_f, mean_f, rstd_f, logits, lse, targets, loss;
  at("ln_f forward");
  h_f = layernorm(R_, true, &mean_f, &rstd_f);
  at("lm head forward");
  logits = matmul(R_, C_, V_, false);
  Buf x_top = std::move(x);  // saved by ln_f
  at("cross-entropy forward");
  loss = cross_entropy(true, &lse, &targets);
  end_of_forward_ = current_;

  // Backward: Tape::backward seeds the loss gradient, then the nodes in reverse.
  at("loss gradient");
  Buf gloss = f32(1);
  { Buf seed = f32(1); }
  at("cross-entropy backward");
  Buf glogits;
  ensure(glogits, R_ * V_);
  { Buf s = f32(2 * V_); }
  gloss.reset(), logits.reset(), lse.reset(), targets.reset();
  Buf gh_f, g;
  at("lm head backward");
  matmul_bwd(R_, C_, V_, false, gh_f);
  glogits.reset(), h_f.reset();
  at("ln_f backward");
  layernorm_bwd(R_, g);
  gh_f.reset(), x_top.reset(), mean_f.reset(), rstd_f.reset();
  for (int l = L_ - 1; l >= 0; --l) {
    Buf gin;
    if (!ckpt_[size_t(l)]) {
      block_bwd(l, std::move(saved[size_t(l)]), std::move(g), gin, "");
    } else {
      // segment.cc: recompute with recording, hand the output gradient (still
      // held by the outer node's slot) to the recomputed output, backpropagate.
      Saved again_saved;
      Buf again = block(l, node_input[size_t(l)], true, &again_saved, "recompute");
      block_bwd(l, std::move(again_saved), g, gin, " (recomputed)");
      again.reset();               // the closure returns
      g.reset();                   // the outer node's output gradient
      node_input[size_t(l)].reset();  // the node itself
    }
    g = std::move(gin);
  }
  at("embedding backward");
  Buf ga, gb;
  add_bwd(ga, gb, R_ * C_);
  g.reset();
  embedding_bwd();
  gb.reset(), ids_wpe.reset();
  embedding_bwd();
  ga.reset(), ids_wte.reset();
}

void ActivationReplay::evaluate_batch() {
  Buf x;
  at("evaluation forward");
  {
    Buf a = embedding(false, nullptr), b = embedding(false, nullptr);
    x = add(R_ * C_);
  }
  for (int l = 0; l < L_; ++l) x = block(l, x, false, nullptr, "evaluation");
  at("evaluation head");
  Buf logits;
  {
    Buf h = layernorm(R_, false, nullptr, nullptr);
    logits = matmul(R_, C_, V_, false);
  }
  x.reset();
  Buf loss = cross_entropy(false, nullptr, nullptr);
}


// The LoRA training micro-batch, replayed op by op with a miniature of
// lib/autograd: variables carry a value buffer and a gradient slot (with
// requires_grad), ops record nodes (holding what they save) only when an
// input requires a gradient, Tape::run_backward runs the nodes in reverse,
// frees each node's output gradients and saved tensors after it, and
// autograd::segment records a segment's node only when its inner tape is not
// empty and its output requires a gradient (always, for a recomputed one).
class LoraReplay {
 public:
  LoraReplay(const nn::GptConfig& m, const nn::LoraConfig& lora, int micro, int seq_len,
             int compute_bytes, std::vector<bool> checkpointed)
      : R_(int64_t(micro) * seq_len),
        T_(seq_len),
        C_(m.d_model),
        V_(m.vocab_size),
        H_(m.n_head),
        L_(m.n_layer),
        c_(compute_bytes),
        lora_(lora),
        ckpt_(std::move(checkpointed)) {}

  int64_t peak() const { return peak_; }
  const std::string& peak_at() const { return peak_at_; }
  int64_t end_of_forward() const { return end_of_forward_; }
  const std::vector<bool>& has_backward() const { return has_node_; }

  void train_micro_batch() {
    grad_ = true;
    has_node_.assign(size_t(L_) + 2, false);
    Tape outer;
    tape_ = &outer;
    Var loss;
    {
      Var logits = forward();
      at("cross-entropy forward");
      loss = cross_entropy(logits);
    }
    end_of_forward_ = current_;
    at("loss gradient");
    ensure(*loss.slot);
    { Buf seed = f32(1); }
    run_backward(outer);
  }
  void evaluate_batch() {
    grad_ = false;
    has_node_.assign(size_t(L_) + 2, false);
    Tape none;
    tape_ = &none;
    Var logits = forward();
    at("evaluation head");
    Var loss = cross_entropy(logits);
  }

 private:
  struct Block_ {
    LoraReplay* sim;
    int64_t bytes;
    ~Block_() { sim->current_ -= bytes; }
  };
  using Buf = std::shared_ptr<Block_>;
  struct Slot {
    Buf grad;
    bool rg = false;
    int64_t bytes = 0;  // of its gradient
  };
  using SlotP = std::shared_ptr<Slot>;
  struct Var {
    Buf val;
    SlotP slot;
    bool rg() const { return slot && slot->rg; }
  };
  struct Node {
    std::vector<SlotP> outs;
    std::function<void()> bwd;
  };
  struct Tape {
    std::vector<Node> nodes;
  };

  Buf alloc(int64_t bytes) {
    if (bytes <= 0) return nullptr;
    current_ += bytes;
    if (current_ > peak_) {
      peak_ = current_;
      peak_at_ = moment_;
    }
    return Buf(new Block_{this, bytes});
  }
  Buf act(int64_t n) { return alloc(c_ * n); }
  Buf f32(int64_t n) { return alloc(4 * n); }
  Buf scratch(int64_t n) { return c_ == 4 ? nullptr : alloc(4 * n); }
  void ensure(Slot& s) {
    if (!s.grad) s.grad = alloc(s.bytes);
  }
  void at(std::string m) { moment_ = std::move(m); }
  Var out(Buf v, int64_t bytes, bool rg) {
    return Var{std::move(v), std::make_shared<Slot>(Slot{nullptr, rg, bytes})};
  }
  void record(const Var& y, std::function<void()> bwd) {
    tape_->nodes.push_back(Node{{y.slot}, [this, m = moment_ + " backward", bwd = std::move(bwd)] {
                                  at(m);
                                  bwd();
                                }});
  }
  void run_backward(Tape& t) {
    const bool g = grad_;
    grad_ = false;
    for (auto it = t.nodes.rbegin(); it != t.nodes.rend(); ++it) {
      bool any = false;
      for (const SlotP& s : it->outs) any = any || s->grad != nullptr;
      if (any) it->bwd();
      for (const SlotP& s : it->outs) s->grad.reset();
      it->bwd = nullptr;
    }
    t.nodes.clear();
    grad_ = g;
  }

  // Ops (allocation order as in lib/ops).
  Var layernorm(const Var& x) {
    const bool rec = grad_ && x.rg();
    Buf o = act(R_ * C_), m = f32(R_), r = f32(R_);
    { Buf a = scratch(R_ * C_), w = scratch(C_), b = scratch(C_), y = scratch(R_ * C_); }
    Var y = out(o, c_ * R_ * C_, rec);
    if (rec)
      record(y, [this, xv = x.val, xs = x.slot, m, r] {
        Buf X = scratch(R_ * C_), W = scratch(C_), dY = scratch(R_ * C_);
        Buf dw = f32(C_), db = f32(C_);  // frozen weight and bias: fp32 zeros
        Buf dX;
        if (xs->rg) {
          ensure(*xs);
          dX = scratch(R_ * C_);
        }
        Buf norm = f32(C_);
      });
    return y;
  }
  // a (M, K) @ b (K, N) [+ bias]; b a parameter (trainable: an adapter).
  Var matmul(const Var& a, int64_t M, int64_t K, int64_t N, bool bias, bool b_rg) {
    const bool rec = grad_ && (a.rg() || b_rg);
    Buf o = act(M * N);
    {
      Buf A = scratch(M * K), B = scratch(K * N), Y = scratch(M * N);
      if (bias) Buf bv = scratch(N);
    }
    Var y = out(o, c_ * M * N, rec);
    if (rec)
      record(y, [this, as = a.slot, saved = b_rg ? a.val : Buf(), M, K, N, b_rg] {
        Buf dy = scratch(M * N);
        if (as->rg) {
          Buf B = scratch(K * N);
          ensure(*as);
          Buf dA = scratch(M * K);
        }
        if (b_rg) Buf A = scratch(M * K), dB = scratch(K * N);
      });
    return y;
  }
  Var add(const Var& a, const Var& b, int64_t n) {
    const bool rec = grad_ && (a.rg() || b.rg());
    Buf o = act(n);
    { Buf A = scratch(n), B = scratch(n), Y = scratch(n); }
    Var y = out(o, c_ * n, rec);
    if (rec)
      record(y, [this, as = a.slot, bs = b.slot, n] {
        for (const SlotP& s : {as, bs}) {
          if (!s->rg) continue;
          ensure(*s);
          Buf S = scratch(n), D = scratch(n);
        }
      });
    return y;
  }
  // scale and dropout: an elementwise op that saves nothing.
  Var unary(const Var& x, int64_t n, bool dropout) {
    const bool rec = grad_ && x.rg();
    Buf o = act(n);
    { Buf X = scratch(n), Y = scratch(n); }
    Var y = out(o, c_ * n, rec);
    if (rec)
      record(y, [this, xs = x.slot, n, dropout] {
        if (!xs->rg) return;
        Buf dY;
        if (dropout) dY = scratch(n);
        ensure(*xs);
        Buf S = dropout ? nullptr : scratch(n), D = scratch(n);
      });
    return y;
  }
  Var attention(const Var& qkv) {
    const bool rec = grad_ && qkv.rg();
    Buf o = act(R_ * C_), lse = f32(H_ * R_);
    { Buf X = scratch(3 * R_ * C_), Y = scratch(R_ * C_), s = f32(score_block()); }
    Var y = out(o, c_ * R_ * C_, rec);
    if (rec)
      record(y, [this, xs = qkv.slot, saved = qkv.val, lse] {
        if (!xs->rg) return;
        Buf X = scratch(3 * R_ * C_), dY = scratch(R_ * C_);
        ensure(*xs);
        Buf dX = scratch(3 * R_ * C_), s = f32(2 * score_block());
      });
    return y;
  }
  Var gelu(const Var& x, int64_t n) {
    const bool rec = grad_ && x.rg();
    Buf o = act(n);
    { Buf X = scratch(n), Y = scratch(n); }
    Var y = out(o, c_ * n, rec);
    if (rec)
      record(y, [this, xs = x.slot, saved = x.val, n] {
        if (!xs->rg) return;
        Buf X = scratch(n), dY = scratch(n);
        ensure(*xs);
        Buf dX = scratch(n);
      });
    return y;
  }
  Var cross_entropy(const Var& logits) {
    const bool rec = grad_ && logits.rg();
    Buf l = f32(R_);
    Buf s = f32(c_ == 4 ? 1 : V_);
    Buf loss = f32(1);
    Buf targets = rec ? f32(R_) : nullptr;
    s.reset();
    Var y = out(loss, 4, rec);
    if (rec)
      record(y, [this, xs = logits.slot, saved = logits.val, l, targets] {
        if (!xs->rg) return;
        ensure(*xs);
        Buf scr = f32(2 * V_);
      });
    return y;
  }
  int64_t score_block() const { return std::min<int64_t>(T_, kAttnBlock) * T_; }

  // nn::Gpt::linear: the frozen Conv1D, plus its adapter if any.
  Var linear(int l, const char* module, const Var& x, int64_t in, int64_t outn,
             const std::string& what) {
    at(fmt::format("block {} {} {}", l, module, what));
    Var y = matmul(x, R_, in, outn, true, false);
    if (!lora_.applies(l, module)) return y;
    at(fmt::format("block {} {} adapter {}", l, module, what));
    Var inp = lora_.dropout > 0.0f ? unary(x, R_ * in, true) : x;
    Var low = matmul(inp, R_, in, lora_.r, false, true);
    Var up = matmul(low, R_, lora_.r, outn, false, true);
    Var scaled = unary(up, R_ * outn, false);
    return add(y, scaled, R_ * outn);
  }
  Var block(int l, const Var& x, const std::string& what) {
    const int64_t RC = R_ * C_;
    at(fmt::format("block {} ln_1 {}", l, what));
    Var h = layernorm(x);
    Var qkv = linear(l, "attn.c_attn", h, C_, 3 * C_, what);
    at(fmt::format("block {} attention {}", l, what));
    Var att = attention(qkv);
    Var x2;
    {
      Var p = linear(l, "attn.c_proj", att, C_, C_, what);
      at(fmt::format("block {} residual add {}", l, what));
      x2 = add(x, p, RC);
    }
    at(fmt::format("block {} ln_2 {}", l, what));
    Var h2 = layernorm(x2);
    Var f;
    {
      Var fc = linear(l, "mlp.c_fc", h2, C_, 4 * C_, what);
      at(fmt::format("block {} gelu {}", l, what));
      f = gelu(fc, 4 * RC);
    }
    Var p = linear(l, "mlp.c_proj", f, 4 * C_, C_, what);
    at(fmt::format("block {} residual add {}", l, what));
    return add(x2, p, RC);
  }
  // autograd::segment through ZeroEngine::run.
  Var segment(int g, const std::function<Var(const Var&)>& fn, const Var& x, bool recompute) {
    if (!grad_) return fn(x);
    if (recompute) {
      Var y;
      grad_ = false;
      y = fn(x);
      grad_ = true;
      Var o = out(y.val, y.slot->bytes, true);
      y = Var{};
      has_node_[size_t(g)] = true;
      record(o, [this, fn, x, os = o.slot] {
        Tape inner;
        Var again;
        {
          const bool gr = grad_;
          Tape* old = tape_;
          grad_ = true;
          tape_ = &inner;
          again = fn(x);
          tape_ = old;
          grad_ = gr;
        }
        if (again.rg()) {
          again.slot->grad = os->grad;
          run_backward(inner);
        }
      });
      return o;
    }
    auto inner = std::make_shared<Tape>();
    Tape* old = tape_;
    tape_ = inner.get();
    Var y = fn(x);
    tape_ = old;
    if (inner->nodes.empty() || !y.rg()) return y;
    has_node_[size_t(g)] = true;
    record(y, [this, inner] { run_backward(*inner); });
    return y;
  }
  // nn::Gpt::forward: the logits.
  Var forward() {
    const char* what = grad_ ? "forward" : "evaluation";
    Var x = segment(
        0,
        [&](const Var&) {
          at(grad_ ? "embedding forward" : "evaluation forward");
          Var a = out(act(R_ * C_), c_ * R_ * C_, false);  // frozen wte, wpe: nothing recorded
          Var b = out(act(R_ * C_), c_ * R_ * C_, false);
          return add(a, b, R_ * C_);
        },
        Var{}, false);
    for (int l = 0; l < L_; ++l) {
      const bool re = ckpt_[size_t(l)];
      const std::string w = re && grad_ ? "forward (no grad, checkpointed)" : what;
      x = segment(1 + l, [this, l, re](const Var& in) {
            return block(l, in, re && grad_ ? "recompute" : (grad_ ? "forward" : "evaluation"));
          }, x, re);
      (void)w;
    }
    return segment(
        L_ + 1,
        [&](const Var& in) {
          at(grad_ ? "ln_f forward" : "evaluation head");
          Var h = layernorm(in);
          at(grad_ ? "lm head forward" : "evaluation head");
          return matmul(h, R_, C_, V_, false, false);  // tied, frozen wte
        },
        x, false);
  }

  const int64_t R_, T_, C_, V_, H_;
  const int L_;
  const int64_t c_;
  const nn::LoraConfig lora_;
  const std::vector<bool> ckpt_;
  bool grad_ = true;
  Tape* tape_ = nullptr;
  std::vector<bool> has_node_;
  int64_t current_ = 0, peak_ = 0, end_of_forward_ = 0;
  std::string moment_, peak_at_;
};

}  // namespace

ActivationEstimate estimate_activations(const nn::GptConfig& m, int micro, int seq_len,
                                        int compute_bytes, const std::vector<int>& checkpointed) {
  FD_CHECK(micro >= 1 && seq_len >= 1 && m.n_layer >= 1, "micro {} seq_len {} n_layer {}", micro,
           seq_len, m.n_layer);
  FD_CHECK(compute_bytes == 2 || compute_bytes == 4, "compute bytes {}", compute_bytes);
  std::vector<bool> ckpt(size_t(m.n_layer), false);
  for (int l : checkpointed) {
    FD_CHECK(l >= 0 && l < m.n_layer, "checkpointed layer {} of {}", l, m.n_layer);
    ckpt[size_t(l)] = true;
  }
  const int64_t R = int64_t(micro) * seq_len;
  const int64_t C = m.d_model, V = m.vocab_size, H = m.n_head, c = compute_bytes;
  ActivationEstimate a;
  a.compute_bytes = compute_bytes;
  for (bool b : ckpt) a.checkpointed += b ? 1 : 0;
  // Saved for backward, in the compute dtype (c bytes) unless noted fp32/i32 (4 bytes):
  // a block 16RC (ln_1 output, qkv 3RC, attention output, x2, ln_2 output, c_fc
  // output 4RC, GELU output 4RC, the block output) and 4R + HR fp32 (two
  // layernorms' mean and rstd, attention's logsumexp); a checkpointed block
  // only its output; the embedding its output and two i32 id copies; the head
  // ln_f's output and statistics, the logits, cross-entropy's lse and targets.
  a.per_block = c * 16 * R * C + 4 * (4 * R + H * R);
  a.per_checkpointed_block = c * R * C;
  a.embed = c * R * C + 4 * 2 * R;
  a.head = c * (R * C + R * V) + 4 * (2 * R + R + R);
  a.saved = a.embed + (m.n_layer - a.checkpointed) * a.per_block +
            a.checkpointed * a.per_checkpointed_block + a.head;
  ActivationReplay train(m, micro, seq_len, compute_bytes, ckpt);
  train.train_micro_batch();
  FD_CHECK(train.end_of_forward() == a.saved + 4, "activation replay {} != saved {} + loss",
           train.end_of_forward(), a.saved);
  ActivationReplay eval(m, micro, seq_len, compute_bytes, ckpt);
  eval.evaluate_batch();
  a.peak = train.peak();
  a.peak_at = train.peak_at();
  a.eval_peak = eval.peak();
  if (eval.peak() > a.peak) {  // not for any model so far: evaluation saves nothing
    a.peak = eval.peak();
    a.peak_at = eval.peak_at();
  }
  return a;
}

ActivationEstimate estimate_lora_activations(const nn::GptConfig& m, const nn::LoraConfig& lora,
                                             int micro, int seq_len, int compute_bytes,
                                             const std::vector<int>& checkpointed,
                                             std::vector<bool>* has_backward) {
  FD_CHECK(lora.enabled(), "LoRA rank {}", lora.r);
  FD_CHECK(micro >= 1 && seq_len >= 1 && m.n_layer >= 1, "micro {} seq_len {} n_layer {}", micro,
           seq_len, m.n_layer);
  FD_CHECK(compute_bytes == 2 || compute_bytes == 4, "compute bytes {}", compute_bytes);
  std::vector<bool> ckpt(size_t(m.n_layer), false);
  for (int l : checkpointed) {
    FD_CHECK(l >= 0 && l < m.n_layer, "checkpointed layer {} of {}", l, m.n_layer);
    ckpt[size_t(l)] = true;
  }
  ActivationEstimate a;
  a.compute_bytes = compute_bytes;
  for (bool b : ckpt) a.checkpointed += b ? 1 : 0;
  LoraReplay train(m, lora, micro, seq_len, compute_bytes, ckpt);
  train.train_micro_batch();
  a.saved = train.end_of_forward() - 4;  // the scalar loss aside
  a.peak = train.peak();
  a.peak_at = train.peak_at();
  if (has_backward != nullptr) *has_backward = train.has_backward();
  LoraReplay eval(m, lora, micro, seq_len, compute_bytes, ckpt);
  eval.evaluate_batch();
  a.eval_peak = eval.peak();
  if (eval.peak() > a.peak) {
    a.peak = eval.peak();
    a.peak_at = eval.peak_at();
  }
  return a;
}

std::vector<int64_t> frozen_padded_numel(const nn::GptConfig& model, int world) {
  const nn::GroupLayout layout = zero::frozen_layout_for(0, world);  // the same at every stage
  std::vector<int64_t> out;
  for (const nn::SegmentSpec& s : nn::Gpt::segment_specs(model))
    out.push_back(nn::FlatParamGroup::padded_numel(s.params, layout));
  return out;
}

std::vector<int64_t> lora_segment_padded_numel(const nn::GptConfig& model,
                                               const nn::LoraConfig& lora, int world) {
  const nn::GroupLayout layout = zero::layout_for(0, world);
  std::vector<int64_t> out;
  for (const nn::SegmentSpec& s : nn::Gpt::segment_specs(model, lora))
    out.push_back(nn::FlatParamGroup::padded_numel(s.params, layout));
  return out;
}

int64_t lora_stage3_comm_bytes_per_step(int world, int accumulation,
                                        const std::vector<int64_t>& numel,
                                        const std::vector<int64_t>& frozen,
                                        const std::vector<bool>& has_backward,
                                        int element_bytes) {
  FD_CHECK(numel.size() == frozen.size() && numel.size() == has_backward.size() &&
               numel.size() >= 2,
           "segments {} {} {}", numel.size(), frozen.size(), has_backward.size());
  int64_t elements = 0;  // per micro-batch, over all collectives
  for (size_t g = 0; g < numel.size(); ++g) {
    const int64_t both = numel[g] + frozen[g];
    elements += both;  // its forward
    if (g == 0) elements += both;  // the tied head's forward (the embedding was released)
    if (has_backward[g] && g != 0) elements += both;  // its backward (the embedding stays pinned)
    if (has_backward[g]) elements += numel[g];        // the gradient's reduce-scatter
  }
  FD_CHECK(elements % world == 0, "elements {} world {}", elements, world);
  return int64_t(accumulation) * (elements / world) * (world - 1) * element_bytes;
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
                          const std::vector<int64_t>& numel, int compute_bytes,
                          bool fp32_staging, const std::vector<int64_t>& frozen,
                          const std::vector<bool>& has_backward) {
  FD_CHECK(stage >= 0 && stage <= 3 && world >= 1 && accumulation >= 1 && numel.size() >= 2,
           "stage {} world {} accumulation {} segments {}", stage, world, accumulation,
           numel.size());
  const int n = int(numel.size());
  const int embed = 0, final = n - 1;  // the final segment also needs the embedding (tied head)
  const size_t max_in_flight = overlap_comm ? 2 : 0;  // ZeroEngine's kMaxInFlight
  const bool grad_shard_own = stage >= 2 || accumulation > 1;
  std::vector<int> pins(size_t(n), 0), deferred(size_t(n), 0);
  std::vector<bool> grads_resident(size_t(n), false);
  const int64_t c = compute_bytes;
  FD_CHECK(frozen.empty() || frozen.size() == numel.size(), "frozen segments {}", frozen.size());
  FD_CHECK(has_backward.empty() || has_backward.size() == numel.size(), "segments {}",
           has_backward.size());
  auto bytes_of = [&](int g) { return numel[size_t(g)] * c; };
  // Stage 3 gathers a segment's frozen base (LoRA) with its adapters.
  auto pinned_bytes_of = [&](int g) {
    return (numel[size_t(g)] + (frozen.empty() ? 0 : frozen[size_t(g)])) * c;
  };
  auto backward_runs = [&](int g) { return has_backward.empty() || has_backward[size_t(g)]; };
  // MpiCommunicator stages a 16-bit reduce-scatter through fp32 kComm buffers
  // (the full input and the shard) while its single comm thread runs it: at
  // most one reduction in flight is staged at a time; which one, and when,
  // depends on timing, so the worst case is counted.
  auto staging_of = [&](int g) {
    return fp32_staging ? 4 * (numel[size_t(g)] + numel[size_t(g)] / world) : int64_t(0);
  };
  int64_t current = 0, peak = 0;
  struct Pending {
    int segment;
    int64_t recv_bytes;
    bool ran = false;  // the comm thread has finished it (staging freed), not yet completed
  };
  std::deque<Pending> pending;
  auto staged = [&] {  // the largest staging among the reductions the comm thread may be running
    int64_t m = 0;
    for (const Pending& p : pending)
      if (!p.ran) m = std::max(m, staging_of(p.segment));
    return m;
  };
  auto add = [&](int64_t bytes) {
    current += bytes;
    peak = std::max(peak, current + staged());
  };
  auto pin = [&](int g) {
    if (stage >= 3 && pins[size_t(g)]++ == 0) {
      add(pinned_bytes_of(g));
      // The blocking all-gather queues behind the reductions in flight: when it
      // returns the comm thread has run them all (their staging is freed).
      for (Pending& p : pending) p.ran = true;
    }
  };
  auto unpin = [&](int g) {
    if (stage >= 3 && --pins[size_t(g)] == 0) current -= pinned_bytes_of(g);
  };
  auto ensure_grads = [&](int g) {
    if (stage < 2 || grads_resident[size_t(g)]) return;
    grads_resident[size_t(g)] = true;
    add(bytes_of(g));
  };
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
      if (!backward_runs(g)) continue;  // no node: no hooks (LoRA's embedding)
      pin(g);
      ensure_grads(g);
      for (int a : also(g)) ensure_grads(a);
      unpin(g);
      for (int a : also(g)) deferred[size_t(a)]++;
      for (; deferred[size_t(g)] > 0; --deferred[size_t(g)]) unpin(g);
      if (numel[size_t(g)] == 0) {  // nothing trains here: no reduce-scatter
        if (stage >= 2) grads_resident[size_t(g)] = false;
        continue;
      }
      const bool into_shard = micro == 0 && grad_shard_own;
      const int64_t recv = into_shard ? 0 : numel[size_t(g)] / world * c;
      add(recv);
      pending.push_back({g, recv, false});
      peak = std::max(peak, current + staged());
      while (pending.size() > max_in_flight) complete_front();
    }
    while (!pending.empty()) complete_front();
    // Pins left by segments whose backward never ran (LoRA's embedding, held
    // since the tied head's forward) end with the micro-batch.
    for (int g = 0; g < n; ++g)
      for (; deferred[size_t(g)] > 0; --deferred[size_t(g)]) unpin(g);
  }
  return peak;
}

int64_t comm_bytes_per_step(int stage, int world, int accumulation, int64_t P,
                            int element_bytes) {
  FD_CHECK(P % world == 0, "padded parameter count {} not divisible by world {}", P, world);
  // One collective over all P elements sends (N-1)/N * eP bytes per rank.
  const int64_t pass = (P / world) * (world - 1) * element_bytes;
  const int64_t passes = stage == 3 ? 3 * int64_t(accumulation) : int64_t(accumulation) + 1;
  return passes * pass;
}

Estimate estimate(const config::Recipe& r, int world) {
  FD_CHECK(world >= 1, "world size {}", world);
  config::check_world_size(r, world);
  const Assembly a = assemble(r, world);
  Estimate e;
  e.model = a.model;
  e.micro = r.batch.micro;
  e.seq_len = r.data.seq_len;
  e.accumulation = r.batch.accumulation;
  e.world = world;
  e.recipe_stage = r.zero.stage;
  e.overlap_comm = r.zero.overlap_comm;
  e.precision = r.precision;
  e.compute_bytes = int(dtype_size(a.dtype));
  e.checkpointed = r.activation_checkpointing.layers;
  e.lora = a.lora;
  const bool lora = e.lora.enabled();
  e.num_params = lora ? e.lora.num_params(e.model) : e.model.num_params();
  const std::vector<int64_t> numel = lora ? lora_segment_padded_numel(e.model, e.lora, world)
                                          : segment_padded_numel(e.model, world);
  for (int64_t v : lora ? lora_segment_padded_numel(e.model, e.lora, 1)
                        : segment_padded_numel(e.model, 1))
    e.padded_params_1 += v;
  for (int64_t v : numel) e.padded_params += v;
  std::vector<int64_t> frozen;
  std::vector<bool> has_backward;
  if (lora) {
    e.frozen_params = e.model.num_params();
    frozen = frozen_padded_numel(e.model, world);
    for (int64_t v : frozen) e.frozen_padded_params += v;
    e.activations = estimate_lora_activations(e.model, e.lora, e.micro, e.seq_len,
                                              e.compute_bytes, e.checkpointed, &has_backward);
  } else {
    e.activations =
        estimate_activations(e.model, e.micro, e.seq_len, e.compute_bytes, e.checkpointed);
  }
  // 16-bit reductions are staged in fp32 by MpiCommunicator (N > 1) only.
  const bool staging = e.compute_bytes == 2 && world > 1;
  for (int s = 0; s < 4; ++s) {
    StageEstimate& st = e.stages[size_t(s)];
    st.stage = s;
    st.model_states =
        zero::model_state_bytes(s, world, e.accumulation, e.padded_params, e.compute_bytes);
    st.activations = e.activations.peak;
    st.comm_step = comm_buffer_bytes(s, world, e.accumulation, e.overlap_comm, numel,
                                     e.compute_bytes, staging, frozen, has_backward);
    st.comm_staging = st.comm_step - comm_buffer_bytes(s, world, e.accumulation, e.overlap_comm,
                                                       numel, e.compute_bytes, false, frozen,
                                                       has_backward);
    st.comm_full_gather =
        s == 3 ? e.compute_bytes * (e.padded_params + e.frozen_padded_params) : 0;
    st.comm_buffers = std::max(st.comm_step, st.comm_full_gather);
    st.other = 3 * int64_t(e.micro) * e.seq_len * kWord;  // tokens, targets, positions (i32)
    st.frozen = s == 3 ? e.compute_bytes * e.frozen_padded_params / world
                       : e.compute_bytes * e.frozen_padded_params;
    st.comm_bytes_per_step =
        lora && s == 3 ? lora_stage3_comm_bytes_per_step(world, e.accumulation, numel, frozen,
                                                         has_backward, e.compute_bytes)
                       : comm_bytes_per_step(s, world, e.accumulation, e.padded_params,
                                             e.compute_bytes);
    st.paper_bytes = paper_bytes(s, double(e.num_params), double(world), e.compute_bytes);
  }
  return e;
}

std::vector<std::string> estimate_assumptions(const Estimate& e) {
  const bool mixed = e.compute_bytes == 2;
  const std::string prec(config::to_string(e.precision));
  std::string ckpt = "no activation checkpointing";
  if (!e.checkpointed.empty()) {
    std::string list;
    for (int l : e.checkpointed) list += (list.empty() ? "" : ", ") + std::to_string(l);
    ckpt = fmt::format(
        "blocks [{}] checkpointed: forward keeps only their output (their input is the previous "
        "segment's output); their backward recomputes the block's forward with recording, so its "
        "saved set, its recomputed output and the output gradient held by the segment's node are "
        "alive again for that block's backward",
        list);
  }
  std::vector<std::string> a = {
      mixed ? fmt::format("Precision {}: parameters, gradients and activations in 16 bits (c = 2 "
                          "bytes); AdamW updates fp32 master weights (4 bytes) and m, v (8 bytes) "
                          "for what the rank updates (everything at stage 0, its 1/N shard "
                          "otherwise); with P = Ψ these are the paper's mixed-precision figures.",
                          prec)
            : "Precision fp32: the (sharded) parameters are the master weights (master = 0); Adam "
              "keeps m and v (8 bytes per parameter).",
      fmt::format("Padding: every parameter starts on a {}-element boundary and each segment is "
                  "padded to a multiple of {} x N elements, so that it splits into N equal "
                  "shards; model states are counted on P (padded), not on Ψ.",
                  nn::FlatParamGroup::kAlignElems, nn::FlatParamGroup::kAlignElems),
      "Model states (params, grads, master, optimizer) are what a run of this recipe measures "
      "in summary.json 'memory', to the byte.",
      fmt::format(
          "Activations: a replay of what the ops allocate at micro batch B = {} and sequence T = "
          "{}: the tensors saved for backward (layernorm input, output feeding the next matmul, "
          "mean and rstd; matmul inputs; attention qkv and logsumexp; GELU input; cross-entropy "
          "logits, logsumexp and targets), the gradients and scratch alive at the highest point "
          "of backward{}; one micro-batch at a time (accumulation does not add); {}. It mirrors "
          "the current ops exactly (tests/engine/estimate_test.cc compares it with a measured "
          "step).",
          e.micro, e.seq_len,
          mixed ? ", in 16 bits except the fp32 statistics (mean, rstd, logsumexp), the i32 ids "
                  "and the fp32 copies every op makes of its 16-bit inputs and outputs while it "
                  "runs"
                : "",
          ckpt),
      fmt::format(
          "Comm buffers: stage 3's gathered full segments (the current one, and the embedding "
          "kept from the tied head's forward to its own backward) and stages 2-3's full-gradient "
          "buckets (at most 2 reduce-scatters in flight plus the one being launched), plus "
          "reduce-scatter outputs that are not the gradient shard itself (stages 0-1, and every "
          "micro-batch after the first){}; for stage 3 at least the full parameters (cP), "
          "which the end of a run gathers once for the weights digest (and the sample).",
          mixed && e.world > 1
              ? "; in 16 bits, plus the fp32 copies (input and shard, 4 bytes an element) of the "
                "one reduce-scatter the MPI comm thread runs at a time, counted at the worst "
                "moment: when the comm thread stages it is timing-dependent, so a run measures "
                "this much or less"
              : ""),
      "Not counted: setup (the model is built with full buffers before ZeRO releases them; "
      "summary.json's peaks start after setup), the optional sample at the end, the BLAS "
      "library's own buffers and the MPI library's memory. Evaluation (no grad) is replayed and "
      "is below training.",
      "Total = the sum of the per-category peaks, an upper bound of the simultaneous peak.",
      fmt::format(
          "Communication per step and rank, ring model (what summary.json 'comm_bytes_per_step' "
          "counts, {} bytes an element{}): stages 0-2 reduce-scatter the gradients each "
          "micro-batch and all-gather once (gradients for stage 0, parameters for 1-2); stage 3 "
          "all-gathers each segment for its forward and again for its backward and "
          "reduce-scatters its gradient, every micro-batch.",
          e.compute_bytes,
          mixed ? "; the MPI reduce-scatter itself moves its 16-bit values as fp32, so on the "
                  "wire the reductions carry twice the bytes counted"
                : ""),
  };
  if (e.lora.enabled())
    a.push_back(
        "LoRA: Ψ and P count the trainable adapters only (their model states as above); the "
        "frozen base (no gradients, no optimizer state) is cP_base per rank at stages 0-2 and "
        "cP_base/N at stage 3, where it is gathered with each segment's adapters for its forward "
        "(the embedding again for the tied head) and its backward (none for the embedding, which "
        "records nothing): stage 3 sends 3P + 2P_base elements per micro-batch; activations "
        "replay the adapter path (dropout, x A^T, (.) B^T, scale, add) and what the frozen ops "
        "keep once a gradient flows.");
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
                  "precision {}{}",
                  m.n_layer, m.n_head, m.d_model, m.vocab_size, m.max_seq_len, e.micro, e.seq_len,
                  e.accumulation, config::to_string(e.precision),
                  e.checkpointed.empty()
                      ? ""
                      : fmt::format("; {} of {} blocks checkpointed", e.checkpointed.size(),
                                    m.n_layer)));
  line(fmt::format(
      "Ψ = {} parameters; P = {} padded at N = {} (+{}: +{} aligning each parameter "
      "to 16 elements, +{} splitting segments into {} shard{})",
      grouped(e.num_params), grouped(e.padded_params), e.world,
      grouped(e.padded_params - e.num_params), grouped(e.padded_params_1 - e.num_params),
      grouped(e.padded_params - e.padded_params_1), e.world, e.world == 1 ? "" : "s"));
  if (e.lora.enabled()) {
    const StageEstimate& rs = e.stages[size_t(e.recipe_stage)];
    line(fmt::format("LoRA r = {} alpha = {} dropout = {} on [{}]: Ψ, P above are the trainable "
                     "adapters; the frozen base has Ψ_base = {}, P_base = {} (no gradients, no "
                     "optimizer state; replicated at stages 0-2, sharded at stage 3)",
                     e.lora.r, e.lora.alpha, e.lora.dropout, fmt::join(e.lora.modules, ", "),
                     grouped(e.frozen_params), grouped(e.frozen_padded_params)));
    line(fmt::format("at stage {}: frozen base: {}; trainable (adapters) states: {}",
                     e.recipe_stage, human(rs.frozen), human(rs.model_states.total())));
  }
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
  row(e.lora.enabled() ? "= trainable states" : "= model states",
      [](const StageEstimate& s) { return human(s.model_states.total()); });
  if (e.lora.enabled())
    row("frozen base", [](const StageEstimate& s) { return human(s.frozen); });
  row("activations", [](const StageEstimate& s) { return human(s.activations); });
  row("comm buffers", [](const StageEstimate& s) { return human(s.comm_buffers); });
  row("other (token batch)", [](const StageEstimate& s) { return human(s.other); });
  row("total", [](const StageEstimate& s) { return human(s.total()); });
  line("");
  const int c = e.compute_bytes;
  row(c == 2 ? "paper, mixed precision" : "paper, fp32",
      [&](const StageEstimate& s) { return std::string(paper_formula(s.stage, c)); });
  row("  at Ψ", [](const StageEstimate& s) { return human(int64_t(s.paper_bytes + 0.5)); });
  row("comm per step", [](const StageEstimate& s) { return human(s.comm_bytes_per_step); });
  line(fmt::format("{:<{}}stages 0-2: {}; stage 3: {}", "", w0, comm_formula(0, e.accumulation, c),
                   comm_formula(3, e.accumulation, c)));
  line(fmt::format("(* the recipe's stage, zero.stage = {})", e.recipe_stage));
  line("");
  if (c == 2) {
    line(fmt::format("Model states per rank, {} (P padded parameters, N ranks, a = accumulation):",
                     config::to_string(e.precision)));
    line("  stage 0: params 2P + grads 2P + master 4P + Adam 8P      = 16P");
    line("  stage 1: params 2P + grads 2P + (master + Adam) 12P/N    = 4P + 12P/N");
    line("  stage 2: params 2P + grad shard 2P/N + 12P/N             = 2P + 14P/N");
    line("  stage 3: param shard 2P/N + grad shard 2P/N + 12P/N      = 16P/N");
    line("  stages 0-1 with a > 1 add a 2P/N gradient accumulator; with P = Ψ and a = 1 these are");
    line("  the paper's mixed-precision figures.");
  } else {
    line("Model states per rank, fp32 (P padded parameters, N ranks, a = accumulation):");
    line("  stage 0: params 4P + grads 4P + Adam 8P            = 16P");
    line("  stage 1: params 4P + grads 4P + Adam 8P/N          = 8P + 8P/N");
    line("  stage 2: params 4P + grad shard 4P/N + Adam 8P/N   = 4P + 12P/N");
    line("  stage 3: param shard 4P/N + grad 4P/N + Adam 8P/N  = 16P/N");
    line("  stages 0-1 with a > 1 add a 4P/N gradient accumulator; with P = Ψ and a = 1 these are");
    line("  the paper's fp32 figures (its mixed-precision ones, 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N and");
    line("  16Ψ/N, apply with precision bf16 or fp16).");
  }
  if (e.lora.enabled()) {
    out += wrapped(fmt::format("Activations (LoRA: the frozen base saves only what a gradient "
                               "flowing to an adapter needs): {} saved at the end of forward; "
                               "peak {} at {}.",
                               human(e.activations.saved), human(e.activations.peak),
                               e.activations.peak_at),
                   "", "  ", 96);
  } else
  out += wrapped(
      fmt::format("Activations: {} per block x {}{} + embedding {} + head {} = {} saved at the "
                  "end of forward; peak {} at {}.",
                  human(e.activations.per_block), m.n_layer - e.activations.checkpointed,
                  e.activations.checkpointed == 0
                      ? ""
                      : fmt::format(" + {} per checkpointed block x {}",
                                    human(e.activations.per_checkpointed_block),
                                    e.activations.checkpointed),
                  human(e.activations.embed), human(e.activations.head),
                  human(e.activations.saved), human(e.activations.peak), e.activations.peak_at),
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
  j["precision"] = std::string(config::to_string(e.precision));
  j["compute_bytes"] = e.compute_bytes;
  j["checkpointed_layers"] = e.checkpointed;
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
  if (e.lora.enabled()) {
    j["lora"] = {{"r", e.lora.r},
                 {"alpha", e.lora.alpha},
                 {"dropout", e.lora.dropout},
                 {"modules", e.lora.modules},
                 {"layers", e.lora.layers},
                 {"trainable_params", e.num_params},
                 {"trainable_padded_params", e.padded_params},
                 {"frozen_params", e.frozen_params},
                 {"frozen_padded_params", e.frozen_padded_params}};
  }
  j["activations"] = {{"per_block", e.activations.per_block},
                      {"per_checkpointed_block", e.activations.per_checkpointed_block},
                      {"checkpointed", e.activations.checkpointed},
                      {"embed", e.activations.embed},
                      {"head", e.activations.head},
                      {"saved", e.activations.saved},
                      {"peak", e.activations.peak},
                      {"peak_at", e.activations.peak_at},
                      {"eval_peak", e.activations.eval_peak}};
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (const StageEstimate& s : e.stages) {
    stages.push_back({{"stage", s.stage},
                      {"params", s.model_states.params},
                      {"grads", s.model_states.grads},
                      {"master", s.model_states.master},
                      {"optimizer", s.model_states.optimizer},
                      {"model_states", s.model_states.total()},
                      {"frozen", s.frozen},
                      {"activations", s.activations},
                      {"comm_buffers", s.comm_buffers},
                      {"comm_step", s.comm_step},
                      {"comm_staging", s.comm_staging},
                      {"comm_full_gather", s.comm_full_gather},
                      {"other", s.other},
                      {"total", s.total()},
                      {"paper_formula", paper_formula(s.stage, e.compute_bytes)},
                      {"paper_bytes", s.paper_bytes},
                      {"comm_bytes_per_step", s.comm_bytes_per_step},
                      {"comm_formula", comm_formula(s.stage, e.accumulation, e.compute_bytes)}});
  }
  j["stages"] = stages;
  j["assumptions"] = estimate_assumptions(e);
  return j;
}

}  // namespace fd::engine
