// The segments a decoder publishes (lib/nn/config/segments.h): names, roles,
// blocks and parameters, for GPT-2 (tied head, learned positions) and a Llama
// (untied head, GQA); the parameters add up to DecoderConfig::num_params() and
// are those of the groups nn::Decoder builds, segment by segment; a tied head
// names the embedding as the owner of its weights.
#include "lib/nn/config/segments.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/nn/decoder.h"

namespace fd::nn {
namespace {

DecoderConfig llama_gqa_untied() {
  DecoderConfig c;
  c.family = ModelFamily::kLlama;
  c.hidden_size = 64;
  c.intermediate_size = 176;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 300;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = false;
  c.validate();
  return c;
}

int64_t sum_params(const std::vector<SegmentInfo>& segments) {
  int64_t n = 0;
  for (const SegmentInfo& s : segments) n += s.params;
  return n;
}

// Each segment's params are the elements of the parameters nn::Decoder puts
// in it (segment_specs, the layout the constructor builds), and the names agree.
void expect_matches_decoder(const DecoderConfig& c) {
  const std::vector<SegmentInfo> segments = decoder_segments(c);
  const std::vector<SegmentSpec> specs = Decoder::segment_specs(c);
  ASSERT_EQ(segments.size(), specs.size());
  for (size_t g = 0; g < segments.size(); ++g) {
    int64_t numel = 0;
    for (const ParamSpec& p : specs[g].params) numel += p.shape.numel();
    EXPECT_EQ(segments[g].name, specs[g].name);
    EXPECT_EQ(segments[g].params, numel) << segments[g].name;
  }
}

TEST(DecoderSegments, Gpt2TinyPublishesItsSegments) {
  const DecoderConfig c = gpt2_config({4, 4, 128, 256, 256});
  const std::vector<SegmentInfo> s = decoder_segments(c);
  ASSERT_EQ(s.size(), 6u);
  const std::vector<std::string> names = {"embed", "h.0", "h.1", "h.2", "h.3", "final"};
  for (size_t g = 0; g < s.size(); ++g) EXPECT_EQ(s[g].name, names[g]);
  EXPECT_EQ(s[0].role, SegmentRole::kEmbedding);
  EXPECT_EQ(s[0].params, 256 * 128 + 256 * 128);  // tokens and learned positions
  for (int l = 0; l < 4; ++l) {
    const SegmentInfo& b = s[size_t(1 + l)];
    EXPECT_EQ(b.role, SegmentRole::kBlock);
    EXPECT_EQ(b.block, l);
    EXPECT_EQ(b.tied_to, -1);
    // ln_1, ln_2; c_attn (128, 384) + bias, c_proj (128, 128) + bias; c_fc (128, 512) + bias,
    // c_proj (512, 128) + bias.
    EXPECT_EQ(b.params, 2 * 2 * 128 + (128 * 384 + 384 + 128 * 128 + 128) +
                            (128 * 512 + 512 + 512 * 128 + 128));
  }
  EXPECT_EQ(s[5].role, SegmentRole::kHead);
  EXPECT_EQ(s[5].params, 2 * 128);  // ln_f: the head's matrix is the embedding's
  EXPECT_EQ(s[5].tied_to, 0);       // ... owned by the embedding
  EXPECT_EQ(s[0].tied_to, -1);
  EXPECT_EQ(sum_params(s), c.num_params());
  expect_matches_decoder(c);
  EXPECT_EQ(find_segment(s, SegmentRole::kEmbedding), 0);
  EXPECT_EQ(find_segment(s, SegmentRole::kBlock, 2), 3);
  EXPECT_EQ(find_segment(s, SegmentRole::kHead), 5);
}

TEST(DecoderSegments, LlamaPublishesItsSegments) {
  const DecoderConfig c = llama_gqa_untied();
  const std::vector<SegmentInfo> s = decoder_segments(c);
  ASSERT_EQ(s.size(), 5u);
  EXPECT_EQ(s[0].name, "embed");
  EXPECT_EQ(s[0].role, SegmentRole::kEmbedding);
  EXPECT_EQ(s[0].params, 300 * 64);  // RoPE: no position table
  for (int l = 0; l < 3; ++l) {
    const SegmentInfo& b = s[size_t(1 + l)];
    EXPECT_EQ(b.name, "h." + std::to_string(l));
    EXPECT_EQ(b.role, SegmentRole::kBlock);
    EXPECT_EQ(b.block, l);
    // two RMSNorms; q (64 -> 64), k and v (64 -> 32), o (64 -> 64); gate, up, down (64 x 176).
    EXPECT_EQ(b.params, 2 * 64 + (64 * 64 + 2 * 64 * 32 + 64 * 64) + 3 * 64 * 176);
  }
  EXPECT_EQ(s[4].name, "final");
  EXPECT_EQ(s[4].role, SegmentRole::kHead);
  EXPECT_EQ(s[4].params, 64 + 300 * 64);  // the final norm and the untied head
  EXPECT_EQ(s[4].tied_to, -1);
  EXPECT_EQ(sum_params(s), c.num_params());
  expect_matches_decoder(c);

  DecoderConfig tied = c;
  tied.tie_word_embeddings = true;
  const std::vector<SegmentInfo> t = decoder_segments(tied);
  EXPECT_EQ(t.back().tied_to, find_segment(t, SegmentRole::kEmbedding));
  EXPECT_EQ(t.back().params, 64);
  EXPECT_EQ(sum_params(t), tied.num_params());
  expect_matches_decoder(tied);
}

// The decoder reads its own segments from the list.
TEST(DecoderSegments, TheDecoderUsesThePublishedList) {
  const DecoderConfig c = gpt2_config({2, 2, 32, 64, 16});
  const Decoder m(c);
  const std::vector<SegmentInfo> s = decoder_segments(c);
  ASSERT_EQ(m.segment_info().size(), s.size());
  ASSERT_EQ(m.segments().size(), s.size());
  for (size_t g = 0; g < s.size(); ++g) {
    EXPECT_EQ(m.segment_info()[g].name, s[g].name);
    EXPECT_EQ(m.segments()[g]->name(), s[g].name);
  }
  EXPECT_EQ(m.embedding_segment(), 0);
  EXPECT_EQ(m.head_segment(), 3);
}

}  // namespace
}  // namespace fd::nn
