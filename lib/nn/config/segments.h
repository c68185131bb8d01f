// The segments a decoder is made of, as the model publishes them
// (docs/DESIGN.md, decision 16). A segment is one FlatParamGroup of
// nn::Decoder: the unit of ZeRO partitions, gradient buckets, activation
// checkpointing, pipeline stages and checkpoint files (which name it).
//
// This list is the one place that numbers them. Pipeline partitions
// (lib/pipe/partition.h), the tied head's hand-over between stages
// (lib/engine/pipeline.cc), activation checkpointing (assemble.cc), the
// estimate's labels and the decoder's own forward find a segment here, by
// role or block, and the weights a segment shares through `tied_to`; none of
// them assumes which index is the embedding or the head.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/nn/config/decoder_config.h"

namespace fd::nn {

// What a segment computes.
enum class SegmentRole {
  kEmbedding,  // tokens -> the first hidden state (the token embedding, + learned positions)
  kBlock,      // one transformer block: hidden state -> hidden state
  kHead,       // hidden state -> loss: the final norm, the lm head and the cross-entropy
};

struct SegmentInfo {
  // Its FlatParamGroup's name (and checkpoints'): "embed", "h.0" .. "h.{L-1}", "final".
  std::string name;
  SegmentRole role = SegmentRole::kBlock;
  int block = -1;      // kBlock: the block's index (0 .. L-1); -1 otherwise
  int64_t params = 0;  // parameters it owns (the base model's: LoRA adapters not counted)
  int tied_to = -1;    // the segment whose weights it also reads (a tied head: the
                       // embedding's index; those weights are owned and counted there); -1: none
};

// The segments of nn::Decoder for `config`, in forward order, from the
// configuration alone (nothing allocated): "embed" (kEmbedding), "h.i" (kBlock,
// block i) for each block, "final" (kHead, tied_to the embedding when
// config.tie_word_embeddings). Their params sum to config.num_params().
std::vector<SegmentInfo> decoder_segments(const DecoderConfig& config);

// The index in `segments` of the segment with `role` (kBlock: of block
// `block`). The segment must exist (FD_CHECK).
int find_segment(const std::vector<SegmentInfo>& segments, SegmentRole role, int block = -1);

}  // namespace fd::nn
