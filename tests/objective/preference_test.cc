// The preference losses against the REFERENCE formulas written out here in plain float64 (no
// library helper), every derivative against central finite differences, and the edge cases the
// trainer relies on: policy = reference, chosen == rejected, the hinge's kink, batch means and
// 1/N gradients, and a step split into parts summing to the whole.
#include "lib/objective/preference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <string>
#include <vector>

namespace fd::objective {
namespace {

// A few pairs with typical magnitudes: summed log-probs of tens of tokens.
std::vector<PairInput> sample_pairs() {
  std::vector<PairInput> pairs;
  pairs.push_back({.logp_c = -31.5,
                   .logp_r = -40.25,
                   .n_c = 21,
                   .n_r = 27,
                   .ref_c = -33.0,
                   .ref_r = -38.0,
                   .nll_sum = 55.0,
                   .nll_tokens = 40});
  pairs.push_back({.logp_c = -12.0,
                   .logp_r = -9.5,
                   .n_c = 8,
                   .n_r = 5,
                   .ref_c = -11.0,
                   .ref_r = -10.75,
                   .nll_sum = 20.0,
                   .nll_tokens = 17});
  pairs.push_back({.logp_c = -60.0,
                   .logp_r = -61.0,
                   .n_c = 30,
                   .n_r = 44,
                   .ref_c = -62.5,
                   .ref_r = -58.0,
                   .nll_sum = 90.0,
                   .nll_tokens = 52});
  return pairs;
}

// ---- Reference formulas (shared/REFERENCE.md, "Preference objectives"), written out naively ----

double ref_logsig(double x) { return std::log(1.0 / (1.0 + std::exp(-x))); }

double ref_dpo(const PairInput& p, DpoLoss type, double beta, double eps) {
  const double cl = p.logp_c - p.ref_c;
  const double rl = p.logp_r - p.ref_r;
  const double d = cl - rl;
  switch (type) {
    case DpoLoss::kSigmoid:
      return -ref_logsig(beta * d);
    case DpoLoss::kRobust:
      return (-(1 - eps) * ref_logsig(beta * d) + eps * ref_logsig(-beta * d)) / (1 - 2 * eps);
    case DpoLoss::kHinge:
      return std::max(0.0, 1 - beta * d);
    case DpoLoss::kIpo: {
      const double h = cl / p.n_c - rl / p.n_r - 1 / (2 * beta);
      return h * h;
    }
  }
  return NAN;
}

double ref_simpo(const PairInput& p, double beta, double gamma, double eps) {
  const double c = p.logp_c / p.n_c;
  const double r = p.logp_r / p.n_r;
  const double z = (c - r) - gamma / beta;
  return -(1 - eps) * ref_logsig(beta * z) - eps * ref_logsig(-beta * z);
}

double ref_log_odds(const PairInput& p) {
  const double c = p.logp_c / p.n_c;
  const double r = p.logp_r / p.n_r;
  return (c - r) - (std::log(1 - std::exp(c)) - std::log(1 - std::exp(r)));
}

double rel_diff(double a, double b) {
  return std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-300});
}

PreferenceOptions dpo(DpoLoss type, double beta = 0.1, double eps = 0.0) {
  return {.objective = Objective::kDpo, .dpo_loss = type, .beta = beta, .label_smoothing = eps};
}

// Every configuration the derivative and edge-case tests sweep.
struct Case {
  std::string name;
  PreferenceOptions options;
};
std::vector<Case> all_cases() {
  return {
      {"dpo_sigmoid", dpo(DpoLoss::kSigmoid, 0.1)},
      {"dpo_sigmoid_beta2", dpo(DpoLoss::kSigmoid, 2.0)},
      {"dpo_robust", dpo(DpoLoss::kRobust, 0.5, 0.2)},
      {"dpo_hinge", dpo(DpoLoss::kHinge, 0.1)},
      {"dpo_ipo", dpo(DpoLoss::kIpo, 0.1)},
      {"simpo", {.objective = Objective::kSimpo, .beta = 2.0, .gamma = 0.5}},
      {"simpo_smoothed_nll",
       {.objective = Objective::kSimpo,
        .beta = 2.5,
        .label_smoothing = 0.1,
        .gamma = 1.4,
        .cpo_alpha = 0.3}},
      {"orpo", {.objective = Objective::kOrpo, .beta = 0.1}},
      {"orpo_beta1", {.objective = Objective::kOrpo, .beta = 1.0}},
  };
}

// ---- Losses and metrics against the reference ----

TEST(PreferenceTest, DpoLossesMatchReference) {
  const auto pairs = sample_pairs();
  double worst = 0;
  for (DpoLoss type : {DpoLoss::kSigmoid, DpoLoss::kRobust, DpoLoss::kHinge, DpoLoss::kIpo}) {
    for (double beta : {0.1, 0.5, 3.0}) {
      const double eps = type == DpoLoss::kRobust ? 0.15 : 0.0;
      double mean = 0;
      for (const PairInput& p : pairs) {
        const double expected = ref_dpo(p, type, beta, eps);
        mean += expected / pairs.size();
        const PairResult r = evaluate_pair(p, dpo(type, beta, eps));
        worst = std::max(worst, rel_diff(r.loss, expected));
        EXPECT_NEAR(r.loss, expected, 1e-12 * std::max(1.0, std::abs(expected)));
      }
      EXPECT_NEAR(evaluate_batch(pairs, dpo(type, beta, eps)).loss, mean, 1e-12);
    }
  }
  std::printf("DPO losses: largest relative difference %.3g\n", worst);
}

TEST(PreferenceTest, DpoMetricsMatchReference) {
  const auto pairs = sample_pairs();
  const double beta = 0.2;
  const BatchResult b = evaluate_batch(pairs, dpo(DpoLoss::kSigmoid, beta));
  double chosen = 0, rejected = 0, acc = 0, margin = 0, lc = 0, lr = 0;
  for (const PairInput& p : pairs) {
    chosen += beta * (p.logp_c - p.ref_c) / 3;
    rejected += beta * (p.logp_r - p.ref_r) / 3;
    acc += (beta * (p.logp_c - p.ref_c) > beta * (p.logp_r - p.ref_r) ? 1.0 : 0.0) / 3;
    margin += beta * ((p.logp_c - p.ref_c) - (p.logp_r - p.ref_r)) / 3;
    lc += p.logp_c / 3;
    lr += p.logp_r / 3;
  }
  EXPECT_NEAR(b.metrics.rewards_chosen, chosen, 1e-13);
  EXPECT_NEAR(b.metrics.rewards_rejected, rejected, 1e-13);
  EXPECT_NEAR(b.metrics.rewards_accuracies, acc, 1e-15);
  EXPECT_DOUBLE_EQ(b.metrics.rewards_accuracies, 2.0 / 3.0);  // pair 2 has a lower chosen reward
  EXPECT_NEAR(b.metrics.rewards_margins, margin, 1e-13);
  EXPECT_NEAR(b.metrics.logps_chosen, lc, 1e-12);
  EXPECT_NEAR(b.metrics.logps_rejected, lr, 1e-12);
  EXPECT_EQ(b.metrics.nll_loss, 0.0);
  EXPECT_EQ(b.metrics.log_odds_chosen, 0.0);
}

TEST(PreferenceTest, SimpoMatchesReference) {
  const auto pairs = sample_pairs();
  for (double eps : {0.0, 0.1}) {
    for (double alpha : {0.0, 0.7}) {
      PreferenceOptions o{.objective = Objective::kSimpo,
                          .beta = 2.0,
                          .label_smoothing = eps,
                          .gamma = 0.8,
                          .cpo_alpha = alpha};
      double pair_mean = 0, nll = 0, tokens = 0, chosen = 0, lc = 0;
      for (const PairInput& p : pairs) {
        pair_mean += ref_simpo(p, 2.0, 0.8, eps) / 3;
        nll += p.nll_sum;
        tokens += p.nll_tokens;
        chosen += 2.0 * (p.logp_c / p.n_c) / 3;
        lc += (p.logp_c / p.n_c) / 3;
      }
      const double expected = pair_mean + alpha * nll / tokens;
      const BatchResult b = evaluate_batch(pairs, o);
      EXPECT_NEAR(b.loss, expected, 1e-12) << "eps " << eps << " alpha " << alpha;
      EXPECT_NEAR(b.metrics.rewards_chosen, chosen, 1e-13);
      EXPECT_NEAR(b.metrics.logps_chosen, lc, 1e-13);
      EXPECT_NEAR(b.metrics.nll_loss, alpha != 0 ? nll / tokens : 0.0, 1e-13);
      for (const PairInput& p : pairs) {
        const double single = ref_simpo(p, 2.0, 0.8, eps) + alpha * p.nll_sum / p.nll_tokens;
        EXPECT_NEAR(evaluate_pair(p, o).loss, single, 1e-12);
      }
    }
  }
}

TEST(PreferenceTest, SimpoIgnoresReference) {
  PairInput p = sample_pairs()[0];
  PreferenceOptions o{.objective = Objective::kSimpo};
  const double before = evaluate_pair(p, o).loss;
  p.ref_c = -1.0;
  p.ref_r = -500.0;
  EXPECT_EQ(evaluate_pair(p, o).loss, before);
}

TEST(PreferenceTest, OrpoMatchesReference) {
  const auto pairs = sample_pairs();
  const double beta = 0.25;
  double ratio = 0, lo_mean = 0, nll = 0, tokens = 0, rc = 0, rr = 0, acc = 0;
  for (const PairInput& p : pairs) {
    const double lo = ref_log_odds(p);
    ratio += ref_logsig(lo) / 3;
    lo_mean += lo / 3;
    nll += p.nll_sum;
    tokens += p.nll_tokens;
    rc += beta * (p.logp_c / p.n_c) / 3;
    rr += beta * (p.logp_r / p.n_r) / 3;
    acc += (p.logp_c / p.n_c > p.logp_r / p.n_r ? 1.0 : 0.0) / 3;
  }
  const BatchResult b = evaluate_batch(pairs, {.objective = Objective::kOrpo, .beta = beta});
  EXPECT_NEAR(b.loss, nll / tokens - beta * ratio, 1e-12);
  EXPECT_NEAR(b.metrics.nll_loss, nll / tokens, 1e-13);
  EXPECT_NEAR(b.metrics.log_odds_ratio, ratio, 1e-12);
  EXPECT_NEAR(b.metrics.log_odds_chosen, lo_mean, 1e-12);
  EXPECT_NEAR(b.metrics.rewards_chosen, rc, 1e-13);
  EXPECT_NEAR(b.metrics.rewards_rejected, rr, 1e-13);
  EXPECT_NEAR(b.metrics.rewards_accuracies, acc, 1e-15);
  // The reference model plays no part.
  auto moved = pairs;
  for (PairInput& p : moved) p.ref_c = p.ref_r = -1e6;
  EXPECT_EQ(evaluate_batch(moved, {.objective = Objective::kOrpo, .beta = beta}).loss, b.loss);
}

// ---- Derivatives against central finite differences ----

TEST(PreferenceTest, GradientsMatchFiniteDifferences) {
  const auto pairs = sample_pairs();
  for (const Case& c : all_cases()) {
    const BatchResult b = evaluate_batch(pairs, c.options);
    double worst = 0;
    for (size_t i = 0; i < pairs.size(); ++i) {
      for (int field = 0; field < 3; ++field) {
        auto value = [&](std::vector<PairInput>& ps) -> double& {
          return field == 0 ? ps[i].logp_c : field == 1 ? ps[i].logp_r : ps[i].nll_sum;
        };
        auto plus = pairs, minus = pairs;
        const double h = 1e-5 * std::max(1.0, std::abs(value(plus)));
        value(plus) += h;
        value(minus) -= h;
        const double fd =
            (evaluate_batch(plus, c.options).loss - evaluate_batch(minus, c.options).loss) /
            (2 * h);
        const PairGradient& g = b.grads[i];
        const double analytic = field == 0 ? g.dlogp_c : field == 1 ? g.dlogp_r : g.dnll_sum;
        const double tol = 1e-6 * std::max(std::abs(analytic), 1e-4);
        EXPECT_NEAR(analytic, fd, tol) << c.name << " pair " << i << " field " << field;
        if (analytic != 0 || fd != 0) worst = std::max(worst, rel_diff(analytic, fd));
      }
    }
    std::printf("%-20s largest relative difference to finite differences %.3g\n", c.name.c_str(),
                worst);
  }
}

// ORPO's log(1 - e^c) near c = 0, where the naive form loses its digits.
TEST(PreferenceTest, OrpoGradientNearZeroLogProb) {
  const PairInput p{
      .logp_c = -1e-6, .logp_r = -2.0, .n_c = 4, .n_r = 4, .nll_sum = 1.0, .nll_tokens = 4};
  const PreferenceOptions o{.objective = Objective::kOrpo, .beta = 0.1};
  const PairResult r = evaluate_pair(p, o);
  ASSERT_TRUE(std::isfinite(r.loss));
  auto plus = p, minus = p;
  const double h = 1e-9;
  plus.logp_c += h;
  minus.logp_c -= h;
  const double fd = (evaluate_pair(plus, o).loss - evaluate_pair(minus, o).loss) / (2 * h);
  EXPECT_NEAR(r.grad.dlogp_c, fd, 1e-5 * std::abs(fd));
  // log(1 - e^c) = log(-c) + c/2 + O(c^2) for small c.
  EXPECT_NEAR(log1m_exp(-1e-20), std::log(1e-20), 1e-15);
  EXPECT_NEAR(log1m_exp(-1e-8), std::log(1e-8) - 0.5e-8, 1e-14);
  EXPECT_NEAR(log1m_exp(-40.0), -std::exp(-40.0), 1e-30);
}

// ---- Edge cases ----

TEST(PreferenceTest, PolicyEqualsReferenceGivesLn2AndZeroRewards) {
  PairInput p{
      .logp_c = -17.25, .logp_r = -23.5, .n_c = 9, .n_r = 12, .ref_c = -17.25, .ref_r = -23.5};
  const PairResult r = evaluate_pair(p, dpo(DpoLoss::kSigmoid));
  EXPECT_NEAR(r.loss, std::numbers::ln2, 1e-15);
  EXPECT_EQ(r.metrics.rewards_chosen, 0.0);
  EXPECT_EQ(r.metrics.rewards_rejected, 0.0);
  EXPECT_EQ(r.metrics.rewards_margins, 0.0);
  EXPECT_EQ(r.metrics.rewards_accuracies, 0.0);  // a tie counts 0
  EXPECT_DOUBLE_EQ(r.grad.dlogp_c, -0.1 * 0.5);
  EXPECT_DOUBLE_EQ(r.grad.dlogp_r, 0.1 * 0.5);
  // A batch of such pairs: the same, with gradients / N.
  const std::vector<PairInput> batch(4, p);
  const BatchResult b = evaluate_batch(batch, dpo(DpoLoss::kSigmoid));
  EXPECT_NEAR(b.loss, std::numbers::ln2, 1e-15);
  EXPECT_EQ(b.metrics.rewards_accuracies, 0.0);
  EXPECT_DOUBLE_EQ(b.grads[3].dlogp_c, -0.05 / 4);
}

TEST(PreferenceTest, ChosenEqualsRejectedIsFinite) {
  const PairInput p{.logp_c = -20.0,
                    .logp_r = -20.0,
                    .n_c = 10,
                    .n_r = 10,
                    .ref_c = -21.0,
                    .ref_r = -21.0,
                    .nll_sum = 30.0,
                    .nll_tokens = 15};
  for (const Case& c : all_cases()) {
    const PairResult r = evaluate_pair(p, c.options);
    const PreferenceMetrics& m = r.metrics;
    for (double v : {r.loss, r.grad.dlogp_c, r.grad.dlogp_r, r.grad.dnll_sum, m.rewards_chosen,
                     m.rewards_rejected, m.rewards_accuracies, m.rewards_margins, m.logps_chosen,
                     m.logps_rejected, m.nll_loss, m.log_odds_ratio, m.log_odds_chosen}) {
      EXPECT_TRUE(std::isfinite(v)) << c.name;
    }
    EXPECT_EQ(m.rewards_accuracies, 0.0) << c.name;
    EXPECT_EQ(m.rewards_margins, 0.0) << c.name;
  }
}

TEST(PreferenceTest, ExtremeMarginsStayFinite) {
  for (double d : {-1e5, 1e5}) {
    const PairInput p{
        .logp_c = -10.0 + d, .logp_r = -10.0, .n_c = 5, .n_r = 5, .ref_c = -10.0, .ref_r = -10.0};
    for (DpoLoss type : {DpoLoss::kSigmoid, DpoLoss::kRobust}) {
      const PairResult r = evaluate_pair(p, dpo(type, 1.0, 0.1));
      EXPECT_TRUE(std::isfinite(r.loss) && std::isfinite(r.grad.dlogp_c)) << d;
    }
    EXPECT_NEAR(evaluate_pair(p, dpo(DpoLoss::kSigmoid, 1.0)).loss, d > 0 ? 0.0 : 1e5, 1e-9);
  }
}

TEST(PreferenceTest, BatchIsMeanOfPairsWithGradientsOverN) {
  const auto pairs = sample_pairs();
  for (const Case& c : all_cases()) {
    const BatchResult b = evaluate_batch(pairs, c.options);
    double tokens = 0;
    for (const PairInput& p : pairs) tokens += p.nll_tokens;
    const double w = c.options.objective == Objective::kOrpo    ? 1.0
                     : c.options.objective == Objective::kSimpo ? c.options.cpo_alpha
                                                                : 0.0;
    double loss = 0, chosen = 0, acc = 0, lo = 0, nll = 0;
    for (size_t i = 0; i < pairs.size(); ++i) {
      const PairResult r = evaluate_pair(pairs[i], c.options);
      // A pair's own loss holds its NLL term over its own tokens; the batch pools them.
      const double own_nll = w * pairs[i].nll_sum / pairs[i].nll_tokens;
      loss += (r.loss - own_nll) / 3;
      nll += pairs[i].nll_sum;
      chosen += r.metrics.rewards_chosen / 3;
      acc += r.metrics.rewards_accuracies / 3;
      lo += r.metrics.log_odds_chosen / 3;
      EXPECT_NEAR(b.grads[i].dlogp_c, r.grad.dlogp_c / 3, 1e-15) << c.name;
      EXPECT_NEAR(b.grads[i].dlogp_r, r.grad.dlogp_r / 3, 1e-15) << c.name;
      EXPECT_DOUBLE_EQ(b.grads[i].dnll_sum, w / tokens) << c.name;
    }
    EXPECT_NEAR(b.loss, loss + w * nll / tokens, 1e-12) << c.name;
    EXPECT_NEAR(b.metrics.rewards_chosen, chosen, 1e-13) << c.name;
    EXPECT_NEAR(b.metrics.rewards_accuracies, acc, 1e-15) << c.name;
    EXPECT_NEAR(b.metrics.log_odds_chosen, lo, 1e-13) << c.name;
  }
}

// Parts of a step, each normalised by the step's totals, sum to the whole step: the result does
// not depend on how pairs are split over ranks and micro-batches.
TEST(PreferenceTest, PartsWithStepTotalsSumToWhole) {
  const auto pairs = sample_pairs();
  for (const Case& c : all_cases()) {
    const BatchResult whole = evaluate_batch(pairs, c.options);
    const StepTotals totals{.pairs = 3, .nll_tokens = 40 + 17 + 52};
    const std::span<const PairInput> all(pairs);
    const BatchResult a = evaluate_batch(all.subspan(0, 1), c.options, totals);
    const BatchResult b = evaluate_batch(all.subspan(1), c.options, totals);
    EXPECT_NEAR(a.loss + b.loss, whole.loss, 1e-12) << c.name;
    EXPECT_NEAR(a.metrics.rewards_margins + b.metrics.rewards_margins,
                whole.metrics.rewards_margins, 1e-13)
        << c.name;
    EXPECT_NEAR(a.metrics.nll_loss + b.metrics.nll_loss, whole.metrics.nll_loss, 1e-13);
    EXPECT_EQ(a.grads[0].dlogp_c, whole.grads[0].dlogp_c) << c.name;
    EXPECT_EQ(b.grads[1].dlogp_r, whole.grads[2].dlogp_r) << c.name;
    EXPECT_EQ(b.grads[0].dnll_sum, whole.grads[1].dnll_sum) << c.name;
  }
}

TEST(PreferenceTest, RobustWithZeroEpsilonIsSigmoid) {
  for (const PairInput& p : sample_pairs()) {
    const PairResult s = evaluate_pair(p, dpo(DpoLoss::kSigmoid, 0.3));
    const PairResult r = evaluate_pair(p, dpo(DpoLoss::kRobust, 0.3, 0.0));
    EXPECT_EQ(r.loss, s.loss);
    EXPECT_EQ(r.grad.dlogp_c, s.grad.dlogp_c);
    EXPECT_EQ(r.grad.dlogp_r, s.grad.dlogp_r);
  }
}

TEST(PreferenceTest, SigmoidIgnoresLabelSmoothing) {
  for (const PairInput& p : sample_pairs()) {
    const PairResult a = evaluate_pair(p, dpo(DpoLoss::kSigmoid, 0.3, 0.0));
    const PairResult b = evaluate_pair(p, dpo(DpoLoss::kSigmoid, 0.3, 0.3));
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grad.dlogp_c, b.grad.dlogp_c);
  }
}

TEST(PreferenceTest, HingeKink) {
  // beta * delta = 0.5 * 2 = 1 exactly: the kink; loss 0 and (as torch's relu) gradient 0.
  PairInput p{.logp_c = -8.0, .logp_r = -12.0, .n_c = 4, .n_r = 4, .ref_c = -9.0, .ref_r = -11.0};
  const PairResult at = evaluate_pair(p, dpo(DpoLoss::kHinge, 0.5));
  EXPECT_EQ(at.loss, 0.0);
  EXPECT_EQ(at.grad.dlogp_c, 0.0);
  EXPECT_EQ(at.grad.dlogp_r, 0.0);
  // Just inside the margin: loss 1 - beta * delta, gradient -beta / +beta.
  p.logp_c -= 0.25;
  const PairResult inside = evaluate_pair(p, dpo(DpoLoss::kHinge, 0.5));
  EXPECT_DOUBLE_EQ(inside.loss, 0.125);
  EXPECT_EQ(inside.grad.dlogp_c, -0.5);
  EXPECT_EQ(inside.grad.dlogp_r, 0.5);
  // Beyond it: nothing.
  p.logp_c += 1.0;
  const PairResult beyond = evaluate_pair(p, dpo(DpoLoss::kHinge, 0.5));
  EXPECT_EQ(beyond.loss, 0.0);
  EXPECT_EQ(beyond.grad.dlogp_c, 0.0);
}

TEST(PreferenceTest, IpoUsesPerTokenAverages) {
  // Scaling every sum and count of a pair by k leaves the per-token averages, hence IPO's loss,
  // unchanged; the sigmoid loss would change.
  const PairInput p{
      .logp_c = -6.0, .logp_r = -9.0, .n_c = 3, .n_r = 4, .ref_c = -7.0, .ref_r = -8.0};
  PairInput scaled = p;
  const int k = 5;
  scaled.logp_c *= k;
  scaled.logp_r *= k;
  scaled.ref_c *= k;
  scaled.ref_r *= k;
  scaled.n_c *= k;
  scaled.n_r *= k;
  const double beta = 0.1;
  const double h = (-6.0 + 7.0) / 3 - (-9.0 + 8.0) / 4 - 1 / (2 * beta);
  EXPECT_NEAR(evaluate_pair(p, dpo(DpoLoss::kIpo, beta)).loss, h * h, 1e-12);
  EXPECT_NEAR(evaluate_pair(scaled, dpo(DpoLoss::kIpo, beta)).loss, h * h, 1e-12);
  EXPECT_GT(std::abs(evaluate_pair(scaled, dpo(DpoLoss::kSigmoid, beta)).loss -
                     evaluate_pair(p, dpo(DpoLoss::kSigmoid, beta)).loss),
            0.01);
  // Its metrics are current TRL's: beta times the summed log-ratios, not the averages.
  EXPECT_NEAR(evaluate_pair(p, dpo(DpoLoss::kIpo, beta)).metrics.rewards_chosen, beta * 1.0, 1e-15);
}

TEST(PreferenceDeathTest, OrpoRefusesNonNegativeAverageLogProb) {
  const PairInput p{
      .logp_c = 0.0, .logp_r = -2.0, .n_c = 4, .n_r = 4, .nll_sum = 1.0, .nll_tokens = 4};
  EXPECT_DEATH(evaluate_pair(p, {.objective = Objective::kOrpo}),
               "ORPO needs negative per-token average log-probs");
  EXPECT_DEATH(log1m_exp(0.0), "needs c < 0");
}

TEST(PreferenceDeathTest, RefusesMissingCounts) {
  PairInput p{.logp_c = -1.0, .logp_r = -2.0, .n_c = 0, .n_r = 4};
  EXPECT_DEATH(evaluate_pair(p, {}), "completion token counts must be positive");
  p.n_c = 3;  // ORPO without the NLL token count
  EXPECT_DEATH(evaluate_pair(p, {.objective = Objective::kOrpo}), "NLL token count");
  EXPECT_DEATH(evaluate_pair(p, dpo(DpoLoss::kRobust, 0.1, 0.5)), "label_smoothing");
}

TEST(PreferenceTest, StableHelpers) {
  EXPECT_EQ(log_sigmoid(0.0), -std::numbers::ln2);
  EXPECT_NEAR(log_sigmoid(-800.0), -800.0, 1e-12);
  EXPECT_NEAR(log_sigmoid(40.0), -std::exp(-40.0), 1e-30);
  EXPECT_EQ(sigmoid(-800.0), 0.0);
  EXPECT_EQ(sigmoid(800.0), 1.0);
  EXPECT_NEAR(sigmoid(1.5), 1 / (1 + std::exp(-1.5)), 1e-16);
}

}  // namespace
}  // namespace fd::objective
