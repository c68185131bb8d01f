// Layer partitions: the per-part parameter counts add up to
// DecoderConfig::num_params(); uniform follows its remainder rule; parameters
// reaches the least largest stage (checked against every partition); explicit
// lists are checked; stages map to the decoder's segments.
#include "lib/pipe/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "lib/base/error.h"

namespace fd::pipe {
namespace {

nn::DecoderConfig gpt2_124m() { return nn::gpt2_config({12, 12, 768, 50257, 1024}); }

// Llama-style with GQA and an untied head (Llama-2 7B's proportions, scaled).
nn::DecoderConfig llama_gqa_untied(int layers = 8) {
  nn::DecoderConfig c;
  c.family = nn::ModelFamily::kLlama;
  c.hidden_size = 512;
  c.intermediate_size = 1376;
  c.num_layers = layers;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 32000;
  c.max_position_embeddings = 2048;
  c.tie_word_embeddings = false;
  c.validate();
  return c;
}

std::string show(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return "[" + s + "]";
}

std::string usage_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    return e.what();
  }
  return "";
}

TEST(PipePartition, PartsAddUpToTheModel) {
  std::vector<nn::DecoderConfig> configs = {gpt2_124m(), nn::gpt2_config({4, 4, 128, 256, 256}),
                                            llama_gqa_untied()};
  nn::DecoderConfig tied = llama_gqa_untied();
  tied.tie_word_embeddings = true;
  configs.push_back(tied);
  nn::DecoderConfig qwen2 = llama_gqa_untied();
  qwen2.family = nn::ModelFamily::kQwen2;
  qwen2.attention_bias = true;
  configs.push_back(qwen2);
  nn::DecoderConfig qwen3 = llama_gqa_untied();
  qwen3.family = nn::ModelFamily::kQwen3;
  qwen3.qk_norm = true;
  qwen3.head_dim = 128;  // n_head * head_dim != hidden
  configs.push_back(qwen3);
  nn::DecoderConfig biased = llama_gqa_untied();
  biased.attention_bias = biased.o_proj_bias = biased.mlp_bias = true;
  configs.push_back(biased);
  for (const nn::DecoderConfig& c : configs) {
    const ModelParts p = model_parts(c);
    EXPECT_EQ(p.total(), c.num_params()) << c.summary();
    EXPECT_EQ(p.num_blocks, c.num_layers);
    const int64_t final_norm =
        c.norm == nn::NormKind::kLayerNorm ? 2 * c.hidden_size : c.hidden_size;
    EXPECT_EQ(p.head, final_norm + (c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size))
        << c.summary();
    for (int stages = 1; stages <= c.num_layers; ++stages) {
      const std::vector<int> blocks = partition_blocks(c, stages, {});
      const std::vector<int64_t> params = stage_params(c, blocks);
      EXPECT_EQ(std::accumulate(params.begin(), params.end(), int64_t{0}), c.num_params());
    }
  }
  // GPT-2 124M by its published count, part by part.
  const ModelParts g = model_parts(gpt2_124m());
  EXPECT_EQ(g.embedding, 50257 * 768 + 1024 * 768);
  EXPECT_EQ(g.block, 7087872);
  EXPECT_EQ(g.head, 2 * 768);  // the final norm; tied: the head's weights are the embedding's
  EXPECT_EQ(g.total(), 124439808);
  // The untied head is the last stage's.
  const ModelParts l = model_parts(llama_gqa_untied());
  EXPECT_EQ(l.head, 512 + 32000 * 512);  // the final norm (RMSNorm) and the untied head
  EXPECT_EQ(l.embedding, 32000 * 512);
  EXPECT_EQ(l.block, 2 * 512 + 512 * 512 * 2 + 2 * 512 * 128 + 3 * 512 * 1376);
}

// The remainder goes to the stages nearest the middle, ties to the lower stage.
TEST(PipePartition, UniformGivesTheRemainderToTheMiddle) {
  auto uniform = [](int layers, int stages) {
    nn::DecoderConfig c = llama_gqa_untied(layers);
    return partition_blocks(c, stages, {PartitionKind::kUniform, {}});
  };
  EXPECT_EQ(uniform(8, 1), (std::vector<int>{8}));
  EXPECT_EQ(uniform(8, 4), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(uniform(10, 4), (std::vector<int>{2, 3, 3, 2}));
  EXPECT_EQ(uniform(9, 4), (std::vector<int>{2, 3, 2, 2}));
  EXPECT_EQ(uniform(11, 4), (std::vector<int>{3, 3, 3, 2}));
  EXPECT_EQ(uniform(5, 3), (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(uniform(4, 3), (std::vector<int>{1, 2, 1}));
  EXPECT_EQ(uniform(7, 2), (std::vector<int>{4, 3}));
  EXPECT_EQ(uniform(12, 5), (std::vector<int>{2, 3, 3, 2, 2}));
  EXPECT_EQ(uniform(6, 6), (std::vector<int>(6, 1)));
  for (int layers = 1; layers <= 24; ++layers)
    for (int stages = 1; stages <= layers; ++stages) {
      const std::vector<int> b = uniform(layers, stages);
      EXPECT_EQ(std::accumulate(b.begin(), b.end(), 0), layers);
      EXPECT_LE(*std::max_element(b.begin(), b.end()) - *std::min_element(b.begin(), b.end()), 1);
    }
}

// Every way to split `layers` blocks over `stages` stages, each at least one.
void compositions(int layers, int stages, std::vector<int>* prefix,
                  const std::function<void(const std::vector<int>&)>& visit) {
  if (stages == 1) {
    prefix->push_back(layers);
    visit(*prefix);
    prefix->pop_back();
    return;
  }
  for (int first = 1; first <= layers - (stages - 1); ++first) {
    prefix->push_back(first);
    compositions(layers - first, stages - 1, prefix, visit);
    prefix->pop_back();
  }
}

int64_t largest(const nn::DecoderConfig& c, const std::vector<int>& blocks) {
  const std::vector<int64_t> p = stage_params(c, blocks);
  return *std::max_element(p.begin(), p.end());
}

// parameters is exact: no partition has a smaller largest stage.
TEST(PipePartition, ParametersMinimisesTheLargestStage) {
  std::vector<nn::DecoderConfig> configs = {gpt2_124m(), nn::gpt2_config({9, 4, 128, 256, 256}),
                                            nn::gpt2_config({10, 2, 16, 4000, 64}),
                                            llama_gqa_untied(11)};
  nn::DecoderConfig tied = llama_gqa_untied(10);
  tied.tie_word_embeddings = true;
  configs.push_back(tied);
  nn::DecoderConfig big_vocab = llama_gqa_untied(12);
  big_vocab.vocab_size = 128256;  // Llama 3's: the ends are worth several blocks
  configs.push_back(big_vocab);
  for (const nn::DecoderConfig& c : configs)
    for (int stages = 1; stages <= c.num_layers; ++stages) {
      const std::vector<int> got = partition_blocks(c, stages, {PartitionKind::kParameters, {}});
      ASSERT_EQ(int(got.size()), stages);
      EXPECT_EQ(std::accumulate(got.begin(), got.end(), 0), c.num_layers);
      EXPECT_GE(*std::min_element(got.begin(), got.end()), 1);
      int64_t best = -1;
      std::vector<int> prefix;
      compositions(c.num_layers, stages, &prefix, [&](const std::vector<int>& b) {
        const int64_t l = largest(c, b);
        if (best < 0 || l < best) best = l;
      });
      EXPECT_EQ(largest(c, got), best) << c.summary() << " P=" << stages << " " << show(got);
    }
}

TEST(PipePartition, ParametersExamples) {
  // GPT-2 124M: the embedding (39.4M with the positions) is worth 5.6 blocks
  // (7.1M each) and the tied head counts on stage 0, so stage 0 gets fewer.
  EXPECT_EQ(partition_blocks(gpt2_124m(), 2, {}), (std::vector<int>{3, 9}));
  EXPECT_EQ(partition_blocks(gpt2_124m(), 4, {}), (std::vector<int>{1, 4, 4, 3}));
  // Untied Llama: the embedding and the head weigh the same, at both ends.
  EXPECT_EQ(partition_blocks(llama_gqa_untied(8), 2, {}), (std::vector<int>{4, 4}));
  // Each end worth about 3 blocks (vocabulary 16000 x 512 against 2.77M a block).
  nn::DecoderConfig vocab16k = llama_gqa_untied(12);
  vocab16k.vocab_size = 16000;
  EXPECT_EQ(partition_blocks(vocab16k, 3, {}), (std::vector<int>{3, 6, 3}));
  // Llama 3's vocabulary: each end outweighs 23 blocks, so it keeps just one.
  nn::DecoderConfig big_vocab = llama_gqa_untied(12);
  big_vocab.vocab_size = 128256;
  EXPECT_EQ(partition_blocks(big_vocab, 3, {}), (std::vector<int>{1, 10, 1}));
  EXPECT_EQ(partition_blocks(gpt2_124m(), 1, {}), (std::vector<int>{12}));
}

TEST(PipePartition, ExplicitListsAreChecked) {
  const nn::DecoderConfig c = llama_gqa_untied(8);
  EXPECT_EQ(partition_blocks(c, 3, {PartitionKind::kExplicit, {2, 5, 1}}),
            (std::vector<int>{2, 5, 1}));
  EXPECT_EQ(usage_message([&] {
              partition_blocks(c, 2, {PartitionKind::kExplicit, {2, 5, 1}});
            }),
            "the partition [2, 5, 1] lists 3 stage(s) for a pipeline of 2; give one block count "
            "per stage");
  EXPECT_EQ(usage_message([&] {
              partition_blocks(c, 3, {PartitionKind::kExplicit, {4, 4, 0}});
            }),
            "the partition [4, 4, 0] gives stage 2 0 blocks; every stage needs at least one");
  EXPECT_EQ(usage_message([&] {
              partition_blocks(c, 3, {PartitionKind::kExplicit, {2, 2, 2}});
            }),
            "the partition [2, 2, 2] sums to 6 blocks but the model has 8; every block belongs "
            "to exactly one stage");
  EXPECT_EQ(usage_message([&] { partition_blocks(c, 9, {}); }),
            "9 pipeline stages but the model has 8 transformer block(s); each stage needs at "
            "least one block: use at most 8 stages");
  EXPECT_EQ(usage_message([&] { partition_blocks(c, 0, {}); }),
            "a pipeline needs at least one stage, got 0");
}

// Stage s runs segments first..last of nn::Decoder, found in its published
// list: together they are 0 .. L + 1 in order, each once; stage 0 starts with
// the embedding and the last stage ends with the final segment, as the
// numbering the list gives (embed, h.0 .. h.{L-1}, final) says.
TEST(PipePartition, StagesCoverTheSegments) {
  auto segments = [](int layers) { return nn::decoder_segments(llama_gqa_untied(layers)); };
  EXPECT_EQ(stage_segments(segments(4), {2, 2}, 0), (StageSegments{0, 2}));
  EXPECT_EQ(stage_segments(segments(4), {2, 2}, 1), (StageSegments{3, 5}));
  EXPECT_EQ(stage_segments(segments(4), {1, 2, 1}, 1), (StageSegments{2, 3}));
  EXPECT_EQ(stage_segments(segments(4), {4}, 0), (StageSegments{0, 5}));
  EXPECT_EQ(segment_stages(segments(4), {1, 2, 1}), (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(first_block({3, 1, 4}, 2), 4);
  for (const std::vector<int>& blocks :
       {std::vector<int>{1}, {3, 9}, {1, 4, 4, 3}, {1, 1, 1, 1, 1}, {2, 5, 1}}) {
    const int layers = std::accumulate(blocks.begin(), blocks.end(), 0);
    const std::vector<nn::SegmentInfo> segs = segments(layers);
    const std::vector<int> owner = segment_stages(segs, blocks);
    ASSERT_EQ(owner.size(), segs.size());
    int next = 0;
    for (int s = 0; s < int(blocks.size()); ++s) {
      const StageSegments seg = stage_segments(segs, blocks, s);
      EXPECT_EQ(seg.first, next) << show(blocks) << " stage " << s;
      EXPECT_LE(seg.first, seg.last);
      // The blocks are segments 1 + first_block .. first_block + blocks[s]
      // (the numbering before the model published its segments).
      const int before = first_block(blocks, s);
      EXPECT_EQ(seg.first, s == 0 ? 0 : 1 + before);
      EXPECT_EQ(seg.last, s + 1 == int(blocks.size()) ? layers + 1 : before + blocks[size_t(s)]);
      for (int g = seg.first; g <= seg.last; ++g) EXPECT_EQ(owner[size_t(g)], s);
      next = seg.last + 1;
    }
    EXPECT_EQ(next, layers + 2) << show(blocks);
  }
}

}  // namespace
}  // namespace fd::pipe
