#include "lib/nn/config/segments.h"

#include <fmt/format.h>

#include "lib/base/check.h"

namespace fd::nn {

std::vector<SegmentInfo> decoder_segments(const DecoderConfig& c) {
  // As DecoderConfig::num_params() counts them, segment by segment.
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, D = c.head_dim;
  const int64_t q_out = int64_t{c.num_heads} * D, kv_out = int64_t{c.num_kv_heads} * D;
  const int64_t norm = c.norm == NormKind::kLayerNorm ? 2 * H : H;  // weight (+ bias)

  int64_t attn = H * q_out + 2 * H * kv_out + q_out * H;  // q, k, v, o
  if (c.attention_bias) attn += q_out + 2 * kv_out;
  if (c.o_proj_bias) attn += H;
  if (c.qk_norm) attn += 2 * D;
  int64_t mlp = 0;
  if (c.mlp == MlpKind::kSwiGlu) {
    mlp = 3 * H * I;  // gate, up, down
    if (c.mlp_bias) mlp += 2 * I + H;
  } else {
    mlp = 2 * H * I;  // c_fc, c_proj
    if (c.mlp_bias) mlp += I + H;
  }

  std::vector<SegmentInfo> out;
  SegmentInfo embed{"embed", SegmentRole::kEmbedding, -1, V * H, -1};
  if (c.positions == PositionKind::kLearned) embed.params += c.max_position_embeddings * H;
  out.push_back(embed);
  const int embedding = 0;
  for (int l = 0; l < c.num_layers; ++l)
    out.push_back({fmt::format("h.{}", l), SegmentRole::kBlock, l, 2 * norm + attn + mlp, -1});
  // The final norm, and the head's matrix unless it is the embedding's.
  out.push_back({"final", SegmentRole::kHead, -1, norm + (c.tie_word_embeddings ? 0 : V * H),
                 c.tie_word_embeddings ? embedding : -1});
  return out;
}

int find_segment(const std::vector<SegmentInfo>& segments, SegmentRole role, int block) {
  for (size_t g = 0; g < segments.size(); ++g)
    if (segments[g].role == role && (role != SegmentRole::kBlock || segments[g].block == block))
      return int(g);
  FD_CHECK(false, "no segment of role {} (block {}) among {}", int(role), block, segments.size());
  return -1;
}

}  // namespace fd::nn
