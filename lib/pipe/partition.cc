#include "lib/pipe/partition.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "lib/base/check.h"
#include "lib/base/error.h"

namespace fd::pipe {

ModelParts model_parts(const nn::DecoderConfig& c) {
  const std::vector<nn::SegmentInfo> segments = nn::decoder_segments(c);
  const int first = nn::find_segment(segments, nn::SegmentRole::kBlock, 0);
  const int last = nn::find_segment(segments, nn::SegmentRole::kBlock, c.num_layers - 1);
  ModelParts p;
  for (int g = 0; g < first; ++g) p.embedding += segments[size_t(g)].params;
  p.block = segments[size_t(first)].params;
  p.num_blocks = c.num_layers;
  for (size_t g = size_t(last) + 1; g < segments.size(); ++g) p.head += segments[g].params;
  return p;
}

namespace {

// Stages in the order they receive extra blocks: nearest the middle first,
// ties to the lower stage.
std::vector<int> middle_first(int stages) {
  std::vector<int> order(static_cast<size_t>(stages));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return std::abs(2 * a - (stages - 1)) < std::abs(2 * b - (stages - 1));
  });
  return order;
}

std::vector<int> uniform(int layers, int stages) {
  std::vector<int> blocks(static_cast<size_t>(stages), layers / stages);
  const std::vector<int> order = middle_first(stages);
  for (int i = 0; i < layers % stages; ++i) ++blocks[size_t(order[size_t(i)])];
  return blocks;
}

// Water-filling: every stage starts with one block; each further block goes to
// the stage whose parameters stay smallest with it (ties in middle-first
// order). With equal blocks this picks the L - P smallest of the values
// extra_s + n * block (n >= 2) over all stages, which is the least largest
// stage any partition can reach.
std::vector<int> by_parameters(const nn::DecoderConfig& model, int stages) {
  const ModelParts p = model_parts(model);
  std::vector<int64_t> extra(static_cast<size_t>(stages), 0);
  extra.front() += p.embedding;
  extra.back() += p.head;
  std::vector<int> blocks(static_cast<size_t>(stages), 1);
  const std::vector<int> order = middle_first(stages);
  for (int added = stages; added < p.num_blocks; ++added) {
    int best = -1;
    int64_t best_cost = 0;
    for (int s : order) {
      const int64_t cost = extra[size_t(s)] + (blocks[size_t(s)] + 1) * p.block;
      if (best < 0 || cost < best_cost) {
        best = s;
        best_cost = cost;
      }
    }
    ++blocks[size_t(best)];
  }
  return blocks;
}

}  // namespace

std::vector<int> partition_blocks(const nn::DecoderConfig& model, int stages,
                                  const PartitionSpec& spec) {
  const int layers = model.num_layers;
  if (stages < 1) usage_error("a pipeline needs at least one stage, got {}", stages);
  if (stages > layers)
    usage_error(
        "{} pipeline stages but the model has {} transformer block(s); each stage needs at "
        "least one block: use at most {} stages",
        stages, layers, layers);
  switch (spec.kind) {
    case PartitionKind::kUniform:
      return uniform(layers, stages);
    case PartitionKind::kParameters:
      return by_parameters(model, stages);
    case PartitionKind::kExplicit:
      break;
  }
  const std::vector<int>& b = spec.blocks;
  if (int(b.size()) != stages)
    usage_error(
        "the partition [{}] lists {} stage(s) for a pipeline of {}; give one block "
        "count per stage",
        fmt::join(b, ", "), b.size(), stages);
  for (size_t s = 0; s < b.size(); ++s)
    if (b[s] < 1)
      usage_error("the partition [{}] gives stage {} {} blocks; every stage needs at least one",
                  fmt::join(b, ", "), s, b[s]);
  const int64_t sum = std::accumulate(b.begin(), b.end(), int64_t{0});
  if (sum != layers)
    usage_error(
        "the partition [{}] sums to {} blocks but the model has {}; every block "
        "belongs to exactly one stage",
        fmt::join(b, ", "), sum, layers);
  return b;
}

std::vector<int64_t> stage_params(const nn::DecoderConfig& model, const std::vector<int>& blocks) {
  FD_CHECK(!blocks.empty());
  const ModelParts p = model_parts(model);
  std::vector<int64_t> out;
  for (int n : blocks) out.push_back(n * p.block);
  out.front() += p.embedding;
  out.back() += p.head;
  return out;
}

int first_block(const std::vector<int>& blocks, int stage) {
  FD_CHECK(0 <= stage && stage < int(blocks.size()), "stage {} of {}", stage, blocks.size());
  return std::accumulate(blocks.begin(), blocks.begin() + stage, 0);
}

StageSegments stage_segments(const std::vector<nn::SegmentInfo>& segments,
                             const std::vector<int>& blocks, int stage) {
  const int first = first_block(blocks, stage);
  StageSegments s;
  s.first = stage == 0 ? 0 : nn::find_segment(segments, nn::SegmentRole::kBlock, first);
  s.last = stage == int(blocks.size()) - 1 ? int(segments.size()) - 1
                                           : nn::find_segment(segments, nn::SegmentRole::kBlock,
                                                              first + blocks[size_t(stage)] - 1);
  return s;
}

std::vector<int> segment_stages(const std::vector<nn::SegmentInfo>& segments,
                                const std::vector<int>& blocks) {
  std::vector<int> out;
  for (int stage = 0; stage < int(blocks.size()); ++stage) {
    const StageSegments s = stage_segments(segments, blocks, stage);
    FD_CHECK(s.first == int(out.size()) && s.first <= s.last, "stage {}: segments {}..{}", stage,
             s.first, s.last);
    out.resize(size_t(s.last) + 1, stage);
  }
  return out;
}

}  // namespace fd::pipe
