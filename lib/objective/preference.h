// Preference objectives: DPO (sigmoid, IPO, hinge, robust), SimPO and ORPO as pure functions
// of per-sequence summaries, following current TRL (0.29 and later; docs/OBJECTIVES.md).
//
// The model's forward produces, for every pair, the policy's summed completion log-probs of the
// chosen and rejected answers (and their token counts), the reference model's sums, and for
// ORPO/SimPO-with-NLL the chosen sequence's summed negative log-likelihood. This module turns
// those numbers into the step's loss, its metrics, and the derivative of the loss with respect
// to every policy input: what the trainer seeds the backward of each summed log-prob with.
// Everything is computed in double precision; nothing here touches tensors.
//
// Normalisation: a step's loss is the mean over the step's pairs (all ranks, all micro-batches),
// and the NLL term is the sum of the step's chosen NLL over the step's chosen NLL tokens.
// TRL pools the NLL per batch; fdtrain normalises over the step's global token count so the
// result does not depend on how pairs are split over ranks and micro-batches.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace fd::objective {

enum class Objective {
  kDpo,    // reference-relative rewards; the loss chosen by DpoLoss
  kSimpo,  // reference-free, length-normalised, with a target margin gamma (TRL's CPO, simpo)
  kOrpo,   // odds ratio plus the chosen answer's NLL (TRL's ORPO; lambda is beta)
};

// DPO's loss_type. label_smoothing is used by kRobust only: current TRL ignores it for kSigmoid
// (older TRL's conservative DPO is not provided).
enum class DpoLoss { kSigmoid, kIpo, kHinge, kRobust };

struct PreferenceOptions {
  Objective objective = Objective::kDpo;
  // Which DPO loss (objective kDpo only).
  DpoLoss dpo_loss = DpoLoss::kSigmoid;
  // DPO's beta, SimPO's beta, ORPO's lambda. Must be > 0.
  double beta = 0.1;
  // Epsilon of DPO's robust loss and of SimPO's smoothed loss, in [0, 0.5). Ignored by DPO's
  // sigmoid, IPO and hinge losses and by ORPO, as current TRL ignores it.
  double label_smoothing = 0.0;
  // SimPO's target reward margin (z = (c - r) - gamma / beta).
  double gamma = 0.5;
  // SimPO's weight of the chosen NLL term (TRL's cpo_alpha); 0 is pure SimPO.
  double cpo_alpha = 0.0;
};

// One pair's per-sequence summaries. Log-probs are sums over the completion's scored tokens.
struct PairInput {
  double logp_c = 0.0;  // policy: sum of log p(chosen completion tokens)
  double logp_r = 0.0;  // policy: sum of log p(rejected completion tokens)
  int64_t n_c = 0;      // chosen completion tokens (> 0)
  int64_t n_r = 0;      // rejected completion tokens (> 0)
  double ref_c = 0.0;   // reference: sum of log p(chosen completion tokens) (DPO only)
  double ref_r = 0.0;   // reference: sum of log p(rejected completion tokens) (DPO only)
  // The chosen sequence's summed negative log-likelihood and its token count: for ORPO, and for
  // SimPO when cpo_alpha != 0 (then nll_tokens > 0). Which tokens it covers is the caller's
  // choice (TRL: ORPO scores prompt and answer, CPO the answer).
  double nll_sum = 0.0;
  int64_t nll_tokens = 0;
};

// d loss / d input, for the policy's inputs (the reference and the counts get none).
struct PairGradient {
  double dlogp_c = 0.0;
  double dlogp_r = 0.0;
  double dnll_sum = 0.0;
};

// TRL's logged metrics. For DPO the rewards are beta * (logp - ref) of the sums and the logps are
// the sums; for SimPO and ORPO (TRL's CPO and ORPO trainers) the rewards are beta * the per-token
// average log-prob and the logps are those averages. The ORPO fields are 0 for other objectives;
// nll_loss is also reported for SimPO with cpo_alpha != 0.
struct PreferenceMetrics {
  double rewards_chosen = 0.0;
  double rewards_rejected = 0.0;
  double rewards_accuracies = 0.0;  // chosen reward > rejected reward (strict: a tie counts 0)
  double rewards_margins = 0.0;     // chosen reward - rejected reward
  double logps_chosen = 0.0;
  double logps_rejected = 0.0;
  double nll_loss = 0.0;         // chosen NLL per token
  double log_odds_ratio = 0.0;   // ORPO: log sigmoid(log_odds)
  double log_odds_chosen = 0.0;  // ORPO: log_odds
};

struct PairResult {
  double loss = 0.0;
  PairGradient grad;
  PreferenceMetrics metrics;
};

// The counts a batch's values are normalised over: the step's pairs and the step's chosen NLL
// tokens, across all ranks and micro-batches.
struct StepTotals {
  int64_t pairs = 0;       // > 0
  int64_t nll_tokens = 0;  // > 0 when the objective uses the NLL term
};

struct BatchResult {
  double loss = 0.0;
  PreferenceMetrics metrics;        // each metric's sum over the pairs / totals
  std::vector<PairGradient> grads;  // one per pair, already carrying 1 / totals
};

// One pair on its own: the loss, its derivatives and its metrics (the NLL term over the pair's
// own nll_tokens). Preconditions (FD_CHECK): n_c, n_r > 0; beta > 0; label_smoothing in
// [0, 0.5); for ORPO nll_tokens > 0 and both per-token averages logp / n < 0 (log(1 - e^c)
// needs c < 0).
PairResult evaluate_pair(const PairInput& pair, const PreferenceOptions& options);

// The step's pairs: mean loss, mean metrics, and each pair's gradient scaled by 1 / pairs.size()
// (and the NLL term's by 1 / the pairs' total nll_tokens).
BatchResult evaluate_batch(std::span<const PairInput> pairs, const PreferenceOptions& options);

// A part of the step (one rank's or one micro-batch's pairs) normalised by the whole step's
// totals: summing the parts' losses, metrics and gradients gives evaluate_batch over all pairs.
BatchResult evaluate_batch(std::span<const PairInput> pairs, const PreferenceOptions& options,
                           const StepTotals& totals);

// Numerically stable helpers, exposed for the trainer and the tests.
double log_sigmoid(double x);  // log(1 / (1 + e^-x)) = -softplus(-x), finite for every finite x
double sigmoid(double x);
// log(1 - e^c) for c < 0 (FD_CHECK otherwise), accurate near 0 and for large negative c.
double log1m_exp(double c);

}  // namespace fd::objective
