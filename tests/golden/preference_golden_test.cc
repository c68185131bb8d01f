// PyTorch golden data for preference training (DPO, SimPO, ORPO; issue #38): fdtrain's real
// path (nn::Decoder with engine::PreferenceHead installed, ops::linear_token_logps, the
// lib/objective functions, the tape's backward) against tests/golden/preference/, written by
// tests/golden/make_golden_preference.py (the llama3 golden decoder in plain PyTorch, each
// sequence run alone, the objectives written out from shared/REFERENCE.md).
//
// The policy is tests/golden/llama/llama3, the reference tests/golden/preference/reference (the
// same architecture, perturbed weights). Pairs are laid out as preference rows hold them
// (data::BatchBuffers): a sequence of n tokens takes n - 1 positions (inputs tokens[0..n-2],
// targets tokens[1..n-1]), chosen then rejected, doc_starts restarting attention and positions
// at each; targets only at completion positions (and, for ORPO, the chosen prompt's, role 2);
// roles 4 * p + kind. Two layouts: one pair per row, and the five pairs packed in two rows.
//
// Compared, each within 1e-5 relative (the largest relative difference printed per quantity):
// the summed completion log-probs of both models; per configuration the loss (the returned
// value and the tally), every TRL metric, and for dpo_sigmoid, simpo_cpo and orpo every
// parameter gradient (||ours - ref|| / ||ref||). Policy = reference gives ln 2 and zero rewards.
// Split invariance: the pairs over two micro-batches give the one batch's loss, tally and
// gradients to 1e-6.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/engine/preference.h"
#include "lib/engine/step.h"
#include "lib/nn/config/hf_config.h"
#include "lib/nn/decoder.h"
#include "lib/tensor/safetensors.h"
#include "tests/golden/parity_util.h"

namespace fd {
namespace {

using engine::Batch;
using engine::PreferenceHead;
using engine::PreferenceTally;
using golden::compare;
using golden::Diff;
using nlohmann::json;

constexpr double kTol = 1e-5;       // against PyTorch
constexpr double kSplitTol = 1e-6;  // two micro-batches against one

std::string golden_dir() { return std::string(FD_SOURCE_DIR) + "/tests/golden/preference"; }

const json& golden() {
  static const json g = [] {
    std::ifstream f(golden_dir() + "/golden.json");
    EXPECT_TRUE(f.good()) << golden_dir() + "/golden.json";
    return json::parse(f);
  }();
  return g;
}

const SafetensorsFile& golden_grads() {
  static const SafetensorsFile f = SafetensorsFile::open(golden_dir() + "/grads.safetensors");
  return f;
}

std::unique_ptr<nn::Decoder> load_model(const std::string& dir) {
  auto model = std::make_unique<nn::Decoder>(nn::read_hf_config(dir));
  SafetensorsFile weights = SafetensorsFile::open(dir + "/model.safetensors");
  size_t loaded = 0;
  for (const nn::Parameter* p : model->parameters()) {
    EXPECT_TRUE(weights.contains(p->name)) << p->name;
    if (!weights.contains(p->name)) continue;
    EXPECT_EQ(weights.shape(p->name), p->value.shape()) << p->name;
    p->value.copy_from(weights.load(p->name));
    ++loaded;
  }
  EXPECT_EQ(loaded, weights.names().size()) << dir << ": every tensor is a parameter";
  return model;
}

nn::Decoder& policy() {
  static const auto m = load_model(golden_dir() + "/" + golden()["policy"].get<std::string>());
  return *m;
}
nn::Decoder& reference() {
  static const auto m = load_model(golden_dir() + "/" + golden()["reference"].get<std::string>());
  return *m;
}

struct Pair {
  std::vector<int32_t> prompt, chosen, rejected;
};

std::vector<Pair> pairs() {
  std::vector<Pair> out;
  for (const json& p : golden()["pairs"])
    out.push_back({p["prompt"].get<std::vector<int32_t>>(), p["chosen"].get<std::vector<int32_t>>(),
                   p["rejected"].get<std::vector<int32_t>>()});
  return out;
}

objective::PreferenceOptions options_of(const json& o) {
  objective::PreferenceOptions opt;
  const std::string kind = o["objective"];
  opt.objective = kind == "dpo"     ? objective::Objective::kDpo
                  : kind == "simpo" ? objective::Objective::kSimpo
                                    : objective::Objective::kOrpo;
  EXPECT_TRUE(kind == "dpo" || kind == "simpo" || kind == "orpo") << kind;
  if (o.contains("dpo_loss")) {
    const std::string l = o["dpo_loss"];
    opt.dpo_loss = l == "sigmoid" ? objective::DpoLoss::kSigmoid
                   : l == "ipo"   ? objective::DpoLoss::kIpo
                   : l == "hinge" ? objective::DpoLoss::kHinge
                                  : objective::DpoLoss::kRobust;
  }
  opt.beta = o["beta"].get<double>();
  opt.label_smoothing = o.value("label_smoothing", 0.0);
  opt.gamma = o.value("gamma", opt.gamma);
  opt.cpo_alpha = o.value("cpo_alpha", 0.0);
  return opt;
}

// A micro-batch holding pairs `rows[b]` (global indices) in row b, as a preference source
// fills it. prompt_nll: the chosen prompt's positions carry targets (role 2), for ORPO.
Batch pair_batch(const std::vector<Pair>& all, const std::vector<std::vector<int>>& rows,
                 bool prompt_nll) {
  auto positions = [](const Pair& p) {
    return int64_t(p.prompt.size() + p.chosen.size() - 1 + p.prompt.size() + p.rejected.size() - 1);
  };
  int64_t T = 0;
  for (const auto& row : rows) {
    int64_t n = 0;
    for (int p : row) n += positions(all[size_t(p)]);
    T = std::max(T, n);
  }
  const int64_t B = int64_t(rows.size());
  Batch b;
  b.tokens = Tensor::empty(Shape{B, T}, DType::kI32);
  b.targets = Tensor::empty(Shape{B, T}, DType::kI32);
  b.doc_starts = Tensor::empty(Shape{B, T}, DType::kI32);
  b.roles = Tensor::empty(Shape{B, T}, DType::kI32);
  b.pairs = std::make_shared<Batch::Pairs>();
  int32_t* tok = b.tokens.data<int32_t>();
  int32_t* tgt = b.targets.data<int32_t>();
  int32_t* doc = b.doc_starts.data<int32_t>();
  int32_t* role = b.roles.data<int32_t>();
  int32_t local = 0;  // the pair's index in this micro-batch
  for (int64_t r = 0; r < B; ++r) {
    int64_t at = r * T;
    const int64_t end = at + T;
    auto sequence = [&](const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer,
                        int kind) {
      std::vector<int32_t> s = prompt;
      s.insert(s.end(), answer.begin(), answer.end());
      const int64_t start = at - r * T;
      for (size_t j = 0; j + 1 < s.size(); ++j, ++at) {
        tok[at] = s[j];
        doc[at] = int32_t(start);
        const bool completion = j + 1 >= prompt.size();
        const bool scored = completion || (kind == 0 && prompt_nll);
        tgt[at] = scored ? s[j + 1] : -1;
        role[at] = scored ? 4 * local + (completion ? kind : 2) : -1;
      }
    };
    for (int p : rows[size_t(r)]) {
      const Pair& pr = all[size_t(p)];
      sequence(pr.prompt, pr.chosen, 0);
      sequence(pr.prompt, pr.rejected, 1);
      b.pairs->examples.push_back(p);
      ++local;
    }
    const int32_t pad_start = int32_t(at - r * T);  // padding: a document of its own
    for (; at < end; ++at) {
      tok[at] = 0;
      tgt[at] = -1;
      doc[at] = pad_start;
      role[at] = -1;
    }
  }
  b.pairs->count = local;
  b.pairs->examples.resize(size_t(std::max<int64_t>(B * T / 2, local)));
  return b;
}

// Layouts of the five pairs: one per row, and packed two rows.
std::vector<std::vector<int>> one_per_row() {
  std::vector<std::vector<int>> rows;
  for (size_t p = 0; p < pairs().size(); ++p) rows.push_back({int(p)});
  return rows;
}
std::vector<std::vector<int>> packed_two_rows() {
  std::vector<std::vector<int>> rows(2);
  for (size_t p = 0; p < pairs().size(); ++p) rows[p < 3 ? 0 : 1].push_back(int(p));
  return rows;
}

// `model`'s summed completion log-probs per pair (chosen, rejected), through kReference.
std::vector<double> completion_logps(nn::Decoder& model, PreferenceHead& head,
                                     const std::vector<Batch>& batches) {
  std::vector<double> out(2 * pairs().size(), std::nan(""));
  head.set_reference(&out);
  head.set_mode(PreferenceHead::Mode::kReference);
  head.install(model);
  for (const Batch& b : batches) {
    head.register_batch(b);
    autograd::NoGradGuard no_grad;
    model.loss(b.tokens, b.targets, nullptr, b.doc_starts);
  }
  PreferenceHead::uninstall(model);
  head.set_reference(nullptr);
  return out;
}

struct TrainResult {
  double loss = 0.0;  // the returned values, weighed as the trainer weighs them
  PreferenceTally tally;
  std::vector<std::vector<float>> grads;  // by policy().parameters()
};

// Training micro-batches on the policy: each batch's backward seeded with its share of the
// step's pairs (count / totals.pairs), as the trainer's grad_seed does (count_targets of a
// preference batch is its pair count); the gradients accumulate.
TrainResult train(nn::Decoder& model, PreferenceHead& head, std::vector<double>& ref,
                  const std::vector<Batch>& batches, const objective::StepTotals& totals) {
  model.zero_grads();
  head.set_reference(&ref);
  head.set_mode(PreferenceHead::Mode::kTrain);
  head.set_totals(totals);
  head.install(model);
  TrainResult r;
  for (const Batch& b : batches) {
    head.register_batch(b);
    EXPECT_EQ(engine::count_targets(b), b.pairs->count);
    const double share = double(b.pairs->count) / double(totals.pairs);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    autograd::Variable loss = model.loss(b.tokens, b.targets, nullptr, b.doc_starts);
    r.loss += double(loss.value().to_vector()[0]) * share;
    tape.backward(loss, float(share));
  }
  PreferenceHead::uninstall(model);
  r.tally = head.take_tally();
  for (const nn::Parameter* p : model.parameters()) r.grads.push_back(p->grad.to_vector());
  return r;
}

objective::StepTotals totals_of(const json& c) {
  objective::StepTotals t;
  t.pairs = int64_t(pairs().size());
  const std::string nll = c["nll"];
  for (const json& s : golden()["policy_summaries"])
    t.nll_tokens += nll == "prompt+completion" ? s["n_pc"].get<int64_t>() : s["n_c"].get<int64_t>();
  return t;
}

double rel_diff(double ours, double ref) {
  return std::fabs(ours - ref) / std::max(std::fabs(ref), 1e-300);
}

// Prints and checks one scalar against its golden value: |ours - ref| / max(|ref|, scale)
// (absolute where both are 0). `scale`: the size of the terms the value is a difference of,
// whose own float32 rounding a plain relative check of a small difference would magnify (DPO's
// rewards are beta * (policy - reference) of sums near -15; margins and log_odds_chosen are
// differences of chosen and rejected terms). Prints the plain relative difference and, where
// the scale is larger than |ref|, the checked measure. Returns the checked measure.
double check_scalar(const std::string& what, double ours, double ref, double tol = kTol,
                    double scale = 0.0) {
  const double den = std::max(std::fabs(ref), scale);
  const double d = den == 0.0 ? std::fabs(ours) : std::fabs(ours - ref) / den;
  if (ref == 0.0 && den == 0.0)
    std::printf("  %-28s ours %+.10e ref %+.10e abs %.3e\n", what.c_str(), ours, ref, d);
  else if (scale > std::fabs(ref) * (1.0 + 1e-9))
    std::printf("  %-28s ours %+.10e ref %+.10e rel %.3e (of the terms' scale %.3e: %.3e)\n",
                what.c_str(), ours, ref, std::fabs(ours - ref) / std::fabs(ref), scale, d);
  else
    std::printf("  %-28s ours %+.10e ref %+.10e rel %.3e\n", what.c_str(), ours, ref, d);
  EXPECT_LE(d, tol) << what << ": ours " << ours << " ref " << ref;
  return d;
}

// The scale check_scalar measures metric `key` of `m` (TRL names; beta the objective's) by:
// rewards are beta * log-probs (DPO: beta * (policy - reference)), margins and log_odds_chosen
// chosen - rejected terms.
double metric_scale(const json& m, const std::string& key, double beta) {
  auto at = [&](const char* k) { return m.contains(k) ? std::fabs(m[k].get<double>()) : 0.0; };
  if (key == "rewards/chosen") return beta * at("logps/chosen");
  if (key == "rewards/rejected") return beta * at("logps/rejected");
  if (key == "rewards/margins") return beta * (at("logps/chosen") + at("logps/rejected"));
  if (key == "log_odds_chosen") return at("logps/chosen") + at("logps/rejected");
  return 0.0;
}

// Both layouts' reference and policy log-probs against the script's per-pair sums.
TEST(PreferenceGolden, CompletionLogProbsOfBothModels) {
  const std::vector<Pair> all = pairs();
  PreferenceHead head({}, 7);  // a chunk of 7 rows: chunks straddle sequences
  for (const auto& layout : {one_per_row(), packed_two_rows()}) {
    const std::vector<Batch> batches = {pair_batch(all, layout, false)};
    std::printf("layout: %zu rows of %lld positions\n", layout.size(),
                (long long)batches[0].tokens.shape()[1]);
    for (const auto& [name, model, key] :
         {std::tuple{"reference", &reference(), "reference_summaries"},
          std::tuple{"policy", &policy(), "policy_summaries"}}) {
      const std::vector<double> lp = completion_logps(*model, head, batches);
      double worst = 0.0;
      for (size_t p = 0; p < all.size(); ++p) {
        const json& s = golden()[key][p];
        for (int k = 0; k < 2; ++k) {
          const double ref = s[k == 0 ? "logp_c" : "logp_r"];
          const double d = rel_diff(lp[2 * p + size_t(k)], ref);
          worst = std::max(worst, d);
          EXPECT_LE(d, kTol) << name << " pair " << p << (k == 0 ? " chosen" : " rejected");
        }
      }
      std::printf("  %-10s summed completion log-probs, worst rel %.3e\n", name, worst);
    }
  }
}

// Every configuration of golden.json in both layouts: loss, metrics, gradients.
TEST(PreferenceGolden, LossMetricsAndGradientsAgainstPyTorch) {
  const std::vector<Pair> all = pairs();
  const SafetensorsFile& gg = golden_grads();
  const std::vector<const nn::Parameter*> params = policy().parameters();
  for (const json& c : golden()["cases"]) {
    const std::string name = c["name"];
    const objective::PreferenceOptions opt = options_of(c["options"]);
    const bool prompt_nll = c["nll"] == "prompt+completion";
    for (const auto& layout : {one_per_row(), packed_two_rows()}) {
      SCOPED_TRACE(name + (layout.size() == 2 ? " packed" : " one pair per row"));
      std::printf("== %s, %s\n", name.c_str(),
                  layout.size() == 2 ? "packed in two rows" : "one pair per row");
      PreferenceHead head(opt, 16);
      EXPECT_EQ(head.uses_nll(), c["nll"] != "none");
      const std::vector<Batch> batches = {pair_batch(all, layout, prompt_nll)};
      std::vector<double> ref = completion_logps(reference(), head, batches);
      const TrainResult r = train(policy(), head, ref, batches, totals_of(c));
      const double ref_loss = c["loss"];
      double worst = check_scalar("loss (returned)", r.loss, ref_loss);
      worst = std::max(worst, check_scalar("loss (tally)", r.tally.loss(), ref_loss));
      const json ours = r.tally.to_json(opt);
      std::vector<std::string> ours_keys, ref_keys;
      for (const auto& [k, v] : ours.items()) ours_keys.push_back(k);
      for (const auto& [k, v] : c["metrics"].items()) ref_keys.push_back(k);
      EXPECT_EQ(ours_keys, ref_keys) << "the logged metrics are TRL's";
      for (const auto& [k, v] : c["metrics"].items())
        if (ours.contains(k))
          worst = std::max(worst, check_scalar(k, ours[k].get<double>(), v.get<double>()));
      std::printf("  largest scalar rel %.3e\n", worst);
      if (!c["grads"].get<bool>()) continue;
      double worst_grad = 0.0;
      std::string worst_name;
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string key = name + ".grad." + params[i]->name;
        ASSERT_TRUE(gg.contains(key)) << key;
        const Diff d = compare(r.grads[i], gg.load(key).to_vector());
        EXPECT_LE(d.rel, kTol) << key;
        if (d.rel >= worst_grad) worst_grad = d.rel, worst_name = params[i]->name;
      }
      std::printf("  gradients: %zu parameters, largest rel %.3e (%s)\n", params.size(), worst_grad,
                  worst_name.c_str());
    }
  }
}

// DPO sigmoid with the policy as its own reference: ln 2, every reward 0, no accuracy.
TEST(PreferenceGolden, PolicyAsItsOwnReferenceGivesLn2) {
  const json& g = golden()["policy_equals_reference"];
  const objective::PreferenceOptions opt = options_of(g["options"]);
  PreferenceHead head(opt, 16);
  const std::vector<Batch> batches = {pair_batch(pairs(), packed_two_rows(), false)};
  std::vector<double> ref = completion_logps(policy(), head, batches);
  const TrainResult r = train(policy(), head, ref, batches, {.pairs = 5, .nll_tokens = 0});
  std::printf("== policy = reference\n");
  check_scalar("loss (returned)", r.loss, std::log(2.0), 1e-7);  // a float32 value
  check_scalar("loss (tally)", r.tally.loss(), std::log(2.0), 1e-15);
  const objective::PreferenceMetrics m = r.tally.metrics();
  EXPECT_EQ(m.rewards_chosen, 0.0);
  EXPECT_EQ(m.rewards_rejected, 0.0);
  EXPECT_EQ(m.rewards_margins, 0.0);
  EXPECT_EQ(m.rewards_accuracies, 0.0);
  for (const auto& [k, v] : g["metrics"].items())
    check_scalar(k, r.tally.to_json(opt)[k].get<double>(), v.get<double>());
}

// The pairs split over two micro-batches, with the same step totals, against one batch of all
// five (packed in two rows): the loss, the tally and every accumulated gradient. Both runs read
// the same reference log-probs (the one batch's), so that only the policy side is compared.
// Two splits: the one batch's rows as two micro-batches (rows {0, 1, 2} and {3, 4}), and pairs
// interleaved over new rows (rows {0, 2}, {4} and {1}, {3}), whose positions move, so that the
// float32 log-probs differ in their last bits. Metrics that are differences of larger terms are
// measured against the terms' scale (metric_scale): the split moves the float32 log-probs by
// ~1e-8 relative, which a relative check of SimPO's rewards/margins (0.063, a difference of two
// rewards near -9.2) would magnify to 2e-6.
TEST(PreferenceGolden, TwoMicroBatchesEqualOne) {
  const std::vector<Pair> all = pairs();
  for (const json& c : golden()["cases"]) {
    if (!c["grads"].get<bool>()) continue;
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const objective::PreferenceOptions opt = options_of(c["options"]);
    const bool prompt_nll = c["nll"] == "prompt+completion";
    PreferenceHead head(opt, 16);
    const std::vector<Batch> one = {pair_batch(all, packed_two_rows(), prompt_nll)};
    std::vector<double> ref = completion_logps(reference(), head, one);
    const TrainResult a = train(policy(), head, ref, one, totals_of(c));
    const std::vector<std::pair<std::string, std::vector<Batch>>> splits = {
        {"rows {0,1,2} | {3,4}",
         {pair_batch(all, {{0, 1, 2}}, prompt_nll), pair_batch(all, {{3, 4}}, prompt_nll)}},
        {"rows {0,2},{4} | {1},{3}",
         {pair_batch(all, {{0, 2}, {4}}, prompt_nll), pair_batch(all, {{1}, {3}}, prompt_nll)}}};
    for (const auto& [what, two] : splits) {
      const TrainResult b = train(policy(), head, ref, two, totals_of(c));
      std::printf("== %s: two micro-batches (%s) against one\n", name.c_str(), what.c_str());
      double worst = check_scalar("loss (returned)", b.loss, a.loss, kSplitTol);
      worst =
          std::max(worst, check_scalar("loss (tally)", b.tally.loss(), a.tally.loss(), kSplitTol));
      const json ma = a.tally.to_json(opt), mb = b.tally.to_json(opt);
      for (const auto& [k, v] : ma.items())
        worst = std::max(worst, check_scalar(k, mb[k].get<double>(), v.get<double>(), kSplitTol,
                                             metric_scale(ma, k, opt.beta)));
      double worst_grad = 0.0;
      for (size_t i = 0; i < a.grads.size(); ++i) {
        const Diff d = compare(b.grads[i], a.grads[i]);
        EXPECT_LE(d.rel, kSplitTol) << what << ": " << policy().parameters()[i]->name;
        worst_grad = std::max(worst_grad, d.rel);
      }
      std::printf("  largest scalar rel %.3e, largest gradient rel %.3e\n", worst, worst_grad);
    }
  }
}

}  // namespace
}  // namespace fd
