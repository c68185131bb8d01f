// Each pair's loss is split into its pair term (the preference loss, averaged over pairs) and
// the NLL term (ORPO, SimPO with cpo_alpha: summed over the chosen NLL tokens and divided by the
// step's count of them). Sums are divided once at the end, so a single pair's values are not
// touched by a reciprocal's rounding (policy = reference gives exactly ln 2).
#include "lib/objective/preference.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "lib/base/check.h"

namespace fd::objective {
namespace {

double softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x))); }

// The pair term before averaging: its loss, its derivatives with respect to the summed log-probs,
// and its metrics (nll_loss left to the caller).
struct PairTerm {
  double loss = 0.0;
  double d_c = 0.0;
  double d_r = 0.0;
  PreferenceMetrics metrics;
};

void set_rewards(double reward_c, double reward_r, double logps_c, double logps_r,
                 PreferenceMetrics& m) {
  m.rewards_chosen = reward_c;
  m.rewards_rejected = reward_r;
  m.rewards_accuracies = reward_c > reward_r ? 1.0 : 0.0;
  m.rewards_margins = reward_c - reward_r;
  m.logps_chosen = logps_c;
  m.logps_rejected = logps_r;
}

PairTerm dpo_term(const PairInput& p, const PreferenceOptions& o) {
  const double beta = o.beta;
  const double cl = p.logp_c - p.ref_c;
  const double rl = p.logp_r - p.ref_r;
  const double x = beta * (cl - rl);
  PairTerm t;
  double d_delta = 0.0;  // d loss / d (cl - rl), for sigmoid, hinge and robust
  switch (o.dpo_loss) {
    case DpoLoss::kSigmoid:
      t.loss = softplus(-x);  // -log sigmoid(x)
      d_delta = -beta * sigmoid(-x);
      break;
    case DpoLoss::kRobust: {
      const double eps = o.label_smoothing;
      t.loss = ((1.0 - eps) * softplus(-x) - eps * softplus(x)) / (1.0 - 2.0 * eps);
      d_delta = -beta * ((1.0 - eps) * sigmoid(-x) + eps * sigmoid(x)) / (1.0 - 2.0 * eps);
      break;
    }
    case DpoLoss::kHinge:
      // relu's derivative at 0 is 0, as torch's: at the kink (x == 1) the gradient is 0.
      t.loss = std::max(0.0, 1.0 - x);
      d_delta = 1.0 - x > 0.0 ? -beta : 0.0;
      break;
    case DpoLoss::kIpo: {
      // Per-token averages of the log-ratios, as TRL's IPO.
      const double n_c = static_cast<double>(p.n_c);
      const double n_r = static_cast<double>(p.n_r);
      const double h = cl / n_c - rl / n_r - 1.0 / (2.0 * beta);
      t.loss = h * h;
      t.d_c = 2.0 * h / n_c;
      t.d_r = -2.0 * h / n_r;
      break;
    }
  }
  if (o.dpo_loss != DpoLoss::kIpo) {
    t.d_c = d_delta;
    t.d_r = -d_delta;
  }
  set_rewards(beta * cl, beta * rl, p.logp_c, p.logp_r, t.metrics);
  return t;
}

PairTerm simpo_term(const PairInput& p, const PreferenceOptions& o) {
  const double beta = o.beta;
  const double eps = o.label_smoothing;
  const double n_c = static_cast<double>(p.n_c);
  const double n_r = static_cast<double>(p.n_r);
  const double c = p.logp_c / n_c;
  const double r = p.logp_r / n_r;
  const double x = beta * (c - r) - o.gamma;  // beta * z, z = (c - r) - gamma / beta
  PairTerm t;
  t.loss = (1.0 - eps) * softplus(-x) + eps * softplus(x);
  const double d_x = -(1.0 - eps) * sigmoid(-x) + eps * sigmoid(x);
  t.d_c = d_x * beta / n_c;
  t.d_r = -d_x * beta / n_r;
  set_rewards(beta * c, beta * r, c, r, t.metrics);
  return t;
}

PairTerm orpo_term(const PairInput& p, const PreferenceOptions& o) {
  const double beta = o.beta;
  const double n_c = static_cast<double>(p.n_c);
  const double n_r = static_cast<double>(p.n_r);
  const double c = p.logp_c / n_c;
  const double r = p.logp_r / n_r;
  FD_CHECK(c < 0.0 && r < 0.0,
           "ORPO needs negative per-token average log-probs (log(1 - e^c) is undefined for "
           "c >= 0): chosen {} / {} = {}, rejected {} / {} = {}",
           p.logp_c, p.n_c, c, p.logp_r, p.n_r, r);
  const double log_odds = (c - r) - (log1m_exp(c) - log1m_exp(r));
  PairTerm t;
  t.loss = -beta * log_sigmoid(log_odds);
  const double d_lo = -beta * sigmoid(-log_odds);
  // d log_odds / dc = 1 / (1 - e^c) = -1 / expm1(c); d log_odds / dr = 1 / expm1(r).
  t.d_c = d_lo * (-1.0 / std::expm1(c)) / n_c;
  t.d_r = d_lo * (1.0 / std::expm1(r)) / n_r;
  set_rewards(beta * c, beta * r, c, r, t.metrics);
  t.metrics.log_odds_ratio = log_sigmoid(log_odds);
  t.metrics.log_odds_chosen = log_odds;
  return t;
}

// The NLL term's weight: ORPO's is 1, SimPO's cpo_alpha, DPO has none.
double nll_weight(const PreferenceOptions& o) {
  switch (o.objective) {
    case Objective::kOrpo:
      return 1.0;
    case Objective::kSimpo:
      return o.cpo_alpha;
    case Objective::kDpo:
      return 0.0;
  }
  return 0.0;
}

void check_options(const PreferenceOptions& o) {
  FD_CHECK(o.beta > 0.0 && std::isfinite(o.beta), "beta must be positive, got {}", o.beta);
  FD_CHECK(o.label_smoothing >= 0.0 && o.label_smoothing < 0.5,
           "label_smoothing must be in [0, 0.5), got {}", o.label_smoothing);
  FD_CHECK(std::isfinite(o.gamma) && std::isfinite(o.cpo_alpha),
           "gamma ({}) and cpo_alpha ({}) must be finite", o.gamma, o.cpo_alpha);
}

void add_scaled(PreferenceMetrics& sum, const PreferenceMetrics& m) {
  sum.rewards_chosen += m.rewards_chosen;
  sum.rewards_rejected += m.rewards_rejected;
  sum.rewards_accuracies += m.rewards_accuracies;
  sum.rewards_margins += m.rewards_margins;
  sum.logps_chosen += m.logps_chosen;
  sum.logps_rejected += m.logps_rejected;
  sum.log_odds_ratio += m.log_odds_ratio;
  sum.log_odds_chosen += m.log_odds_chosen;
}

}  // namespace

double sigmoid(double x) {
  if (x >= 0.0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

double log_sigmoid(double x) { return -softplus(-x); }

double log1m_exp(double c) {
  FD_CHECK(c < 0.0, "log(1 - e^c) needs c < 0 (a per-token average log-prob), got {}", c);
  // Maechler's split: expm1 keeps the digits near 0, log1p for large negative c.
  return c > -std::numbers::ln2 ? std::log(-std::expm1(c)) : std::log1p(-std::exp(c));
}

BatchResult evaluate_batch(std::span<const PairInput> pairs, const PreferenceOptions& options,
                           const StepTotals& totals) {
  check_options(options);
  const double w = nll_weight(options);
  const bool uses_nll = options.objective == Objective::kOrpo || w != 0.0;
  FD_CHECK(totals.pairs > 0, "a step needs at least one pair, got {}", totals.pairs);
  FD_CHECK(!uses_nll || totals.nll_tokens > 0,
           "the NLL term needs the step's chosen NLL token count, got {}", totals.nll_tokens);
  const double num_pairs = static_cast<double>(totals.pairs);
  const double nll_tokens = static_cast<double>(totals.nll_tokens);

  BatchResult out;
  out.grads.resize(pairs.size());
  double loss_sum = 0.0;
  double nll_sum = 0.0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const PairInput& p = pairs[i];
    FD_CHECK(p.n_c > 0 && p.n_r > 0, "pair {}: completion token counts must be positive, got {}/{}",
             i, p.n_c, p.n_r);
    PairTerm t;
    switch (options.objective) {
      case Objective::kDpo:
        t = dpo_term(p, options);
        break;
      case Objective::kSimpo:
        t = simpo_term(p, options);
        break;
      case Objective::kOrpo:
        t = orpo_term(p, options);
        break;
    }
    loss_sum += t.loss;
    add_scaled(out.metrics, t.metrics);
    PairGradient& g = out.grads[i];
    g.dlogp_c = t.d_c / num_pairs;
    g.dlogp_r = t.d_r / num_pairs;
    if (uses_nll) {
      nll_sum += p.nll_sum;
      g.dnll_sum = w / nll_tokens;
    }
  }
  out.loss = loss_sum / num_pairs;
  PreferenceMetrics& m = out.metrics;
  for (double* v :
       {&m.rewards_chosen, &m.rewards_rejected, &m.rewards_accuracies, &m.rewards_margins,
        &m.logps_chosen, &m.logps_rejected, &m.log_odds_ratio, &m.log_odds_chosen}) {
    *v /= num_pairs;
  }
  if (uses_nll) {
    m.nll_loss = nll_sum / nll_tokens;
    out.loss += w * m.nll_loss;
  }
  return out;
}

BatchResult evaluate_batch(std::span<const PairInput> pairs, const PreferenceOptions& options) {
  StepTotals totals;
  totals.pairs = static_cast<int64_t>(pairs.size());
  for (const PairInput& p : pairs) totals.nll_tokens += p.nll_tokens;
  return evaluate_batch(pairs, options, totals);
}

PairResult evaluate_pair(const PairInput& pair, const PreferenceOptions& options) {
  const BatchResult b = evaluate_batch(std::span<const PairInput>(&pair, 1), options,
                                       StepTotals{.pairs = 1, .nll_tokens = pair.nll_tokens});
  return PairResult{.loss = b.loss, .grad = b.grads[0], .metrics = b.metrics};
}

}  // namespace fd::objective
