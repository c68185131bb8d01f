// Which transformer blocks each pipeline stage owns.
//
// A stage owns a contiguous run of blocks. The model's other segments, as it
// publishes them (nn::decoder_segments, lib/nn/config/segments.h), go with the
// nearest block: those before the first block (the embedding, "embed") with
// stage 0, those after the last block (the final norm, the head and the loss,
// "final") with the last stage. Nothing here assumes which index is which:
// stages are found by the segments' roles and blocks. With a tied head the
// head's weights are those of the segment it is tied to (the embedding's),
// owned and counted there, while the last stage still computes the head
// (nn::Decoder::stage_loss).
//
// Three ways to split (parallel.partition in a recipe):
//   kUniform     as equal block counts as possible. The L mod P extra blocks
//                go to the stages nearest the middle first, ties to the lower
//                stage: in order of |2s - (P - 1)|, then s. The ends carry the
//                embedding (stage 0) and the head and loss (stage P-1) besides
//                their blocks, and of the two the head is the heavier compute,
//                so the last stage is the last to get an extra block.
//   kParameters  balance parameter counts: stage s holds its blocks' parameters
//                plus, on stage 0, those of the segments before the first block
//                and, on stage P-1, those after the last (the final norm and
//                an untied head). Only parameters count (not
//                compute: a tied head's GEMM runs on the last stage but its
//                parameters are stage 0's). The largest stage is made as small
//                as possible (exact: every block of a decoder has the same
//                parameters, so adding blocks one at a time to the stage that
//                stays smallest is optimal); among the partitions that achieve
//                it, ties go as in kUniform, so with nothing outside the blocks
//                this is kUniform.
//   kExplicit    the blocks per stage, as given.
// Every stage gets at least one block; the counts sum to the model's blocks.
// LoRA adapters and padding are not counted (they are small, and per stage
// the same for every block).
#pragma once

#include <cstdint>
#include <vector>

#include "lib/nn/config/decoder_config.h"
#include "lib/nn/config/segments.h"

namespace fd::pipe {

// The parameters of a decoder's parts, from its published segments; their sum
// (total()) is DecoderConfig::num_params().
struct ModelParts {
  int64_t embedding = 0;  // the segments before the first block (token embedding, + learned
                          // positions): stage 0
  int64_t block = 0;      // each transformer block (norms, attention, MLP)
  int num_blocks = 0;     // L
  int64_t head = 0;       // the segments after the last block (the final norm, + an untied
                          // head's matrix): the last stage
  int64_t total() const { return embedding + block * num_blocks + head; }
};
ModelParts model_parts(const nn::DecoderConfig& model);

enum class PartitionKind { kParameters, kUniform, kExplicit };

struct PartitionSpec {
  PartitionKind kind = PartitionKind::kParameters;
  std::vector<int> blocks;  // kExplicit: blocks per stage; unused otherwise
};

// Blocks per stage for `stages` stages: `stages` entries, each >= 1, summing to
// model.num_layers. Throws fd::Error (kUsage) when stages < 1, stages >
// model.num_layers, or an explicit list does not have `stages` entries, has
// one below 1, or does not sum to model.num_layers.
std::vector<int> partition_blocks(const nn::DecoderConfig& model, int stages,
                                  const PartitionSpec& spec);

// The parameters each stage holds under `blocks` (as partition_blocks returns).
std::vector<int64_t> stage_params(const nn::DecoderConfig& model, const std::vector<int>& blocks);

// The segments (indices into `segments`, nn::decoder_segments) a stage runs,
// first..last inclusive: its blocks' segments, and on stage 0 every segment
// before the first block, on the last stage every segment after the last
// block. Stage 0 starts at segment 0 and the last stage ends at the last one.
struct StageSegments {
  int first = 0;
  int last = 0;
  bool operator==(const StageSegments&) const = default;
};
StageSegments stage_segments(const std::vector<nn::SegmentInfo>& segments,
                             const std::vector<int>& blocks, int stage);

// For each segment, the stage whose own segments (stage_segments) include it.
std::vector<int> segment_stages(const std::vector<nn::SegmentInfo>& segments,
                                const std::vector<int>& blocks);

// The index of the first block of `stage`.
int first_block(const std::vector<int>& blocks, int stage);

}  // namespace fd::pipe
