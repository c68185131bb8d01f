#include "lib/engine/preference.h"

#include <algorithm>
#include <cmath>

#include "lib/autograd/tape.h"
#include "lib/base/check.h"
#include "lib/ops/linear_cross_entropy.h"
#include "lib/ops/vocab_parallel_cross_entropy.h"

namespace fd::engine {
namespace {

using autograd::Variable;

// The per-token average log-prob an ORPO pair may have at most: log(1 - e^c) needs c < 0, and
// a model certain of every token (float log-probs rounded to 0) would reach it.
constexpr double kMaxAverageLogp = -1e-30;

}  // namespace

objective::PreferenceMetrics PreferenceTally::metrics() const {
  objective::PreferenceMetrics m;
  m.rewards_chosen = v[1];
  m.rewards_rejected = v[2];
  m.rewards_accuracies = v[3];
  m.rewards_margins = v[4];
  m.logps_chosen = v[5];
  m.logps_rejected = v[6];
  m.nll_loss = v[7];
  m.log_odds_ratio = v[8];
  m.log_odds_chosen = v[9];
  return m;
}

void PreferenceTally::add(double loss, const objective::PreferenceMetrics& m) {
  const double add[kFields] = {loss,
                               m.rewards_chosen,
                               m.rewards_rejected,
                               m.rewards_accuracies,
                               m.rewards_margins,
                               m.logps_chosen,
                               m.logps_rejected,
                               m.nll_loss,
                               m.log_odds_ratio,
                               m.log_odds_chosen};
  for (int i = 0; i < kFields; ++i) v[i] += add[i];
}

nlohmann::json PreferenceTally::to_json(const objective::PreferenceOptions& o) const {
  const objective::PreferenceMetrics m = metrics();
  nlohmann::json j = {{"rewards/chosen", m.rewards_chosen},
                      {"rewards/rejected", m.rewards_rejected},
                      {"rewards/accuracies", m.rewards_accuracies},
                      {"rewards/margins", m.rewards_margins},
                      {"logps/chosen", m.logps_chosen},
                      {"logps/rejected", m.logps_rejected}};
  if (o.objective == objective::Objective::kOrpo ||
      (o.objective == objective::Objective::kSimpo && o.cpo_alpha != 0.0))
    j["nll_loss"] = m.nll_loss;
  if (o.objective == objective::Objective::kOrpo) {
    j["log_odds_ratio"] = m.log_odds_ratio;
    j["log_odds_chosen"] = m.log_odds_chosen;
  }
  return j;
}

PreferenceHead::PreferenceHead(const objective::PreferenceOptions& options, int64_t chunk_rows)
    : options_(options), chunk_rows_(chunk_rows) {}

bool PreferenceHead::uses_nll() const {
  return options_.objective == objective::Objective::kOrpo ||
         (options_.objective == objective::Objective::kSimpo && options_.cpo_alpha != 0.0);
}

void PreferenceHead::install(nn::Decoder& model) {
  model_ = &model;
  tp_ = model.tensor_parallel();
  sp_ = model.sequence_parallel();
  vocab_size_ = model.config().vocab_size;
  vocab_begin_ = tp_.enabled() ? ops::vocab_shard_range(vocab_size_, tp_.rank, tp_.size).begin : 0;
  counts_ = tp_.rank == 0 && sp_.rank == 0;
  model.set_head_loss([this](const Variable& h, const Variable& w, const Tensor& targets) {
    return head(h, w, targets);
  });
}

void PreferenceHead::uninstall(nn::Decoder& model) { model.set_head_loss({}); }

void PreferenceHead::register_batch(const Batch& batch) {
  FD_CHECK(batch.roles.defined(), "a preference batch carries roles");
  batches_[batch.targets.is_meta() ? nullptr : batch.targets.data<int32_t>()] = &batch;
}

void PreferenceHead::reduce_over_sequence(std::vector<objective::PairInput>& pairs) const {
  constexpr size_t kSums = 6;
  std::vector<double> sums(kSums * pairs.size());
  for (size_t p = 0; p < pairs.size(); ++p) {
    const objective::PairInput& in = pairs[p];
    const double v[kSums] = {in.logp_c,      in.logp_r,  double(in.n_c),
                             double(in.n_r), in.nll_sum, double(in.nll_tokens)};
    std::copy(v, v + kSums, sums.begin() + ptrdiff_t(kSums * p));
  }
  sp_.group->all_reduce_f64(sums.data(), int64_t(sums.size()));
  for (size_t p = 0; p < pairs.size(); ++p) {
    objective::PairInput& in = pairs[p];
    const double* v = sums.data() + kSums * p;
    in.logp_c = v[0];
    in.logp_r = v[1];
    in.n_c = int64_t(v[2]);
    in.n_r = int64_t(v[3]);
    in.nll_sum = v[4];
    in.nll_tokens = int64_t(v[5]);
  }
}

PreferenceTally PreferenceHead::take_tally() {
  PreferenceTally t = tally_;
  tally_ = PreferenceTally();
  return t;
}

Variable PreferenceHead::head(const Variable& h, const Variable& weight, const Tensor& targets) {
  const bool meta = targets.is_meta();
  const auto it = batches_.find(meta ? nullptr : targets.data<int32_t>());
  FD_CHECK(it != batches_.end(), "preference head: a batch that was not registered");
  const Batch& batch = *it->second;
  // Ulysses: this rank's columns of the rows (h holds only those).
  auto mine = [this](const Tensor& t) {
    return sp_.enabled() ? nn::Decoder::columns(t, sp_.rank, sp_.size) : t;
  };
  const Tensor my_targets = mine(targets);
  // The model's plan (one chunk, its logits kept, when they fit what the forward holds).
  const int64_t chunk_rows =
      chunk_rows_ > 0 ? chunk_rows_ : model_->head_chunk_rows(h.shape().rows());
  // Tensor parallelism: this rank's rows of the head; with Megatron's sequence parallelism h
  // is the gathered sequence, whose backward sums the dh partials.
  Variable logps = tp_.enabled() ? ops::vocab_parallel_token_logps(
                                       h, weight, my_targets, vocab_begin_, vocab_size_, *tp_.group,
                                       -1, chunk_rows, !tp_.sequence_parallel)
                                 : ops::linear_token_logps(h, weight, my_targets, -1, chunk_rows);
  const int64_t R = logps.shape().numel();
  const bool record = logps.requires_grad() && mode_ == Mode::kTrain;
  // What the backward sends each position: d loss / d logp_r, times the micro-batch's
  // pairs-to-step ratio undone (see below). Allocated on meta too (the estimate counts it).
  Tensor seeds = Tensor::empty(Shape{R}, DType::kF32, MemCategory::kActivations,
                               meta ? Device::meta() : Device::cpu());
  double value = 0.0;
  if (!meta) {
    const float* lp = logps.value().data<float>();
    const Tensor my_roles = mine(batch.roles);
    FD_CHECK(my_roles.numel() == R, "preference head: {} roles for {} positions", my_roles.numel(),
             R);
    const int32_t* roles = my_roles.data<int32_t>();
    const int32_t count = batch.pairs->count;
    std::vector<objective::PairInput> pairs(size_t(std::max(count, 0)));
    for (int64_t r = 0; r < R; ++r) {
      const int32_t role = roles[r];
      if (role < 0) continue;
      const int32_t p = role / 4, kind = role % 4;
      FD_CHECK(p < count, "preference head: role {} names pair {} of {}", role, p, count);
      objective::PairInput& in = pairs[size_t(p)];
      const double v = double(lp[r]);
      if (kind == 0) {
        in.logp_c += v;
        ++in.n_c;
      } else if (kind == 1) {
        in.logp_r += v;
        ++in.n_r;
      }
      if (kind == 0 || kind == 2) {
        in.nll_sum -= v;
        ++in.nll_tokens;
      }
    }
    // Every sp rank holds the same batch, so all of them reduce or none.
    if (sp_.enabled() && count > 0) reduce_over_sequence(pairs);
    for (int32_t p = 0; p < count; ++p) {
      objective::PairInput& in = pairs[size_t(p)];
      const int64_t example = batch.pairs->examples[size_t(p)];
      if (mode_ == Mode::kReference) {
        FD_CHECK(reference_ != nullptr && 2 * example + 1 < int64_t(reference_->size()),
                 "preference head: no reference slot for pair {}", example);
        if (counts_) {  // the others leave 0 for the trainer's sum over the world
          (*reference_)[size_t(2 * example)] = in.logp_c;
          (*reference_)[size_t(2 * example + 1)] = in.logp_r;
        }
        continue;
      }
      if (uses_reference()) {
        FD_CHECK(reference_ != nullptr && 2 * example + 1 < int64_t(reference_->size()),
                 "preference head: no reference log-probs for pair {}", example);
        in.ref_c = (*reference_)[size_t(2 * example)];
        in.ref_r = (*reference_)[size_t(2 * example + 1)];
      }
      if (options_.objective == objective::Objective::kOrpo) {
        in.logp_c = std::min(in.logp_c, kMaxAverageLogp * double(in.n_c));
        in.logp_r = std::min(in.logp_r, kMaxAverageLogp * double(in.n_r));
      }
    }
    std::fill(seeds.data<float>(), seeds.data<float>() + R, 0.0f);
    if (mode_ != Mode::kReference && count > 0) {
      const objective::BatchResult b = objective::evaluate_batch(pairs, options_, totals_);
      if (counts_) tally_.add(b.loss, b.metrics);
      // The trainer weighs this micro-batch's value by count / totals.pairs (its share of the
      // step's pairs) and seeds its backward with that ratio: undo it, so the sum over the
      // step's micro-batches is evaluate_batch's over all its pairs. An sp group's values
      // are added up: the whole on its rank 0.
      const double ratio = double(totals_.pairs) / double(count);
      value = sp_.rank == 0 ? b.loss * ratio : 0.0;
      float* s = seeds.data<float>();
      for (int64_t r = 0; r < R; ++r) {
        const int32_t role = roles[r];
        if (role < 0) continue;
        const objective::PairGradient& g = b.grads[size_t(role / 4)];
        const int32_t kind = role % 4;
        double d = kind == 0 ? g.dlogp_c : kind == 1 ? g.dlogp_r : 0.0;
        if (kind == 0 || kind == 2) d -= g.dnll_sum;  // nll_sum = -sum logp
        s[r] = float(d * ratio);
      }
    }
  }
  Tensor out = Tensor::empty(Shape{}, DType::kF32);
  if (!out.is_meta()) out.data<float>()[0] = float(value);
  Variable loss = Variable::op_output(out, record);
  if (record) {
    auto ys = loss.slot();
    auto ls = logps.slot();
    autograd::current_tape().record({"preference_objective", {ys}, [ys, ls, seeds] {
                                       if (!ls->requires_grad) return;
                                       const Tensor& g = ls->ensure_grad();
                                       if (g.is_meta()) return;
                                       const float seed = ys->grad.to_vector()[0];
                                       const float* s = seeds.data<float>();
                                       float* d = g.data<float>();
                                       for (int64_t r = 0; r < g.numel(); ++r) d[r] += seed * s[r];
                                     }});
  }
  return loss;
}

}  // namespace fd::engine
