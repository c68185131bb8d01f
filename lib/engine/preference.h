// PreferenceHead: preference training's head (DPO, SimPO, ORPO; lib/objective, docs/OBJECTIVES.md)
// in place of the next-token loss. Installed on a Decoder (Decoder::set_head_loss), it turns a
// micro-batch of pairs (data::PreferenceDataset rows: each pair's chosen and rejected sequences
// packed in one row, with per-position roles) into the objective's loss:
//
//   logps = ops::linear_token_logps(h, W, targets)       the chunked head, per position
//   per pair: summed completion log-probs, token counts, the chosen NLL (objective::PairInput)
//   objective::evaluate_batch(pairs, options, step totals) -> loss share, metrics, d/d inputs
//
// The returned 0-d loss is the micro-batch's mean pair loss in the trainer's convention (its
// value times the micro-batch's pairs, summed over the step and divided by the step's pairs, is
// the step's loss), and its backward sends every position d loss / d logp. Normalisation is over
// the step's global pairs and chosen NLL tokens (StepTotals, set before the step), so the
// gradient does not depend on how pairs are split over micro-batches, ranks and stages.
//
// A micro-batch is found by its targets buffer: the trainer registers each Batch it loads
// (register_batch) and the head looks the targets it is given up there.
//
// Three modes: kTrain and kEval add each micro-batch's share of the loss and metrics to the
// tally (summed over ranks by the trainer); kReference stores each pair's summed completion
// log-probs as the reference's (no loss), into the arrays set_reference() holds.
//
// Parallel layouts (the installed model's; docs/OBJECTIVES.md "Parallel layouts"):
//   - tensor parallelism: the per-position log-probs come from ops::vocab_parallel_token_logps
//     over this rank's rows of the head, identical on every rank of the tp group, so every tp
//     rank evaluates the same pairs and seeds the same gradients (the op sums dh over the
//     group, or Megatron's sequence-parallel gather does);
//   - Ulysses: this rank holds its columns of each row, so each pair's sums are partial: they
//     are all-reduced over the sp group (one all_reduce_f64 of 6 doubles per pair), the
//     objective is evaluated identically on every sp rank, and each rank seeds its own
//     positions (the group's gradients add up to the micro-batch's);
//   - in both, the tally and the reference log-probs are written by the group's first rank
//     alone (tp rank 0, sp rank 0: Strategy::computes_loss), so the trainer's sums over the
//     world count each pair once; the returned loss is the micro-batch's on sp rank 0 and 0 on
//     the other sp ranks (the strategy adds an sp group's losses; it counts tp rank 0's).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "lib/engine/step.h"
#include "lib/nn/decoder.h"
#include "lib/objective/preference.h"

namespace fd::engine {

// Sums over a step's (or an evaluation's) pairs, each already divided by the totals: what
// every rank adds and the trainer all-reduces. loss and the PreferenceMetrics, in order.
struct PreferenceTally {
  static constexpr int kFields = 10;
  double v[kFields] = {};
  double loss() const { return v[0]; }
  objective::PreferenceMetrics metrics() const;
  void add(double loss, const objective::PreferenceMetrics& m);
  // TRL's names: {"rewards/chosen": ..., ...}; ORPO's and the NLL's only where they exist.
  nlohmann::json to_json(const objective::PreferenceOptions& o) const;
};

class PreferenceHead {
 public:
  enum class Mode { kTrain, kEval, kReference };

  // `nll`: the objective scores the chosen NLL (ORPO; SimPO with cpo_alpha); its positions are
  // the rows' role-2 (chosen prompt) and role-0 (chosen completion) targets.
  // chunk_rows: rows per chunk of the head; 0 = as the model's own head plans it, per batch
  // (Decoder::head_chunk_rows).
  explicit PreferenceHead(const objective::PreferenceOptions& options, int64_t chunk_rows = 0);

  // Installs the head on `model` (the model must outlive this, or the head be uninstalled),
  // taking its parallel layout (tensor_parallel(), sequence_parallel(): their groups must
  // outlive the head's use).
  void install(nn::Decoder& model);
  static void uninstall(nn::Decoder& model);

  // The batch whose targets buffer the head will be given (before its forward).
  void register_batch(const Batch& batch);

  void set_mode(Mode mode) { mode_ = mode; }
  Mode mode() const { return mode_; }
  // The totals the coming micro-batches are normalised by.
  void set_totals(const objective::StepTotals& totals) { totals_ = totals; }
  // The reference's summed completion log-probs, 2 per pair (chosen, rejected), by the pair's
  // index in its split: what kTrain/kEval read (DPO) and kReference writes. Not owned.
  void set_reference(std::vector<double>* per_pair) { reference_ = per_pair; }

  // The tally since the last take_tally(), then zeroed.
  PreferenceTally take_tally();

  const objective::PreferenceOptions& options() const { return options_; }
  bool uses_nll() const;
  bool uses_reference() const { return options_.objective == objective::Objective::kDpo; }

 private:
  autograd::Variable head(const autograd::Variable& h, const autograd::Variable& weight,
                          const Tensor& targets);

  // The pairs' summed inputs of this rank's positions, over the sp group's (Ulysses).
  void reduce_over_sequence(std::vector<objective::PairInput>& pairs) const;

  objective::PreferenceOptions options_;
  int64_t chunk_rows_;
  const nn::Decoder* model_ = nullptr;  // the installed model (its head plan)
  nn::TensorParallel tp_;               // the installed model's
  nn::SequenceParallel sp_;             // the installed model's
  int64_t vocab_begin_ = 0;             // tensor parallelism: the head's first row on this rank
  int64_t vocab_size_ = 0;              // the whole vocabulary
  bool counts_ = true;                  // tallies and writes reference log-probs (tp and sp rank 0)
  Mode mode_ = Mode::kTrain;
  objective::StepTotals totals_;
  std::vector<double>* reference_ = nullptr;
  std::map<const int32_t*, const Batch*> batches_;  // by targets buffer
  PreferenceTally tally_;
};

}  // namespace fd::engine
