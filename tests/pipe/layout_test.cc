// The rank layout: stage-major (a stage's replicas are consecutive ranks),
// the inverse maps, neighbours, and the split keys that make each stage's
// data-parallel group and each replica's pipeline.
#include "lib/pipe/layout.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

#include "lib/base/error.h"

namespace fd::pipe {
namespace {

TEST(PipeLayout, StageMajor) {
  const Layout l(6, 2);  // P = 2, D = 3
  EXPECT_EQ(l.stages(), 2);
  EXPECT_EQ(l.replicas(), 3);
  EXPECT_EQ(l.world(), 6);
  const std::vector<int> stage = {0, 0, 0, 1, 1, 1}, replica = {0, 1, 2, 0, 1, 2};
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(l.stage_of(r), stage[size_t(r)]) << r;
    EXPECT_EQ(l.replica_of(r), replica[size_t(r)]) << r;
  }
  EXPECT_EQ(l.rank_of(1, 2), 5);
  EXPECT_EQ(l.prev_rank(4), 1);
  EXPECT_EQ(l.next_rank(1), 4);
  EXPECT_EQ(l.prev_rank(1), -1);
  EXPECT_EQ(l.next_rank(4), -1);
  EXPECT_TRUE(l.is_first_stage(2));
  EXPECT_TRUE(l.is_last_stage(3));
}

TEST(PipeLayout, InverseMapsAndGroups) {
  for (int world = 1; world <= 24; ++world)
    for (int stages = 1; stages <= world; ++stages) {
      if (world % stages != 0) continue;
      const Layout l(world, stages);
      const int D = world / stages;
      std::map<int, std::set<int>> dp, pp;               // color -> ranks
      std::map<int, std::map<int, int>> dp_key, pp_key;  // color -> key -> rank
      for (int r = 0; r < world; ++r) {
        const int s = l.stage_of(r), d = l.replica_of(r);
        ASSERT_EQ(l.rank_of(s, d), r);
        ASSERT_EQ(r, s * D + d);
        const SplitKey a = l.data_parallel_split(r), b = l.pipeline_split(r);
        EXPECT_GE(a.color, 0);
        EXPECT_GE(b.color, 0);
        dp[a.color].insert(r);
        pp[b.color].insert(r);
        EXPECT_TRUE(dp_key[a.color].emplace(a.key, r).second) << "duplicate key";
        EXPECT_TRUE(pp_key[b.color].emplace(b.key, r).second) << "duplicate key";
        // Neighbours are the same replica's adjacent stages.
        if (s > 0) {
          EXPECT_EQ(l.prev_rank(r), l.rank_of(s - 1, d));
        }
        if (s + 1 < stages) {
          EXPECT_EQ(l.next_rank(r), l.rank_of(s + 1, d));
        }
      }
      // P data-parallel groups of D consecutive ranks, ranked by replica.
      ASSERT_EQ(int(dp.size()), stages);
      for (const auto& [color, keys] : dp_key) {
        ASSERT_EQ(int(keys.size()), D);
        int key = 0;
        for (const auto& [k, r] : keys) {
          EXPECT_EQ(k, key++);
          EXPECT_EQ(r, color * D + k);  // consecutive ranks: one host under --map-by slot
        }
      }
      // D pipelines of P ranks, ranked by stage.
      ASSERT_EQ(int(pp.size()), D);
      for (const auto& [color, keys] : pp_key) {
        ASSERT_EQ(int(keys.size()), stages);
        int key = 0;
        for (const auto& [k, r] : keys) {
          EXPECT_EQ(k, key++);
          EXPECT_EQ(l.stage_of(r), k);
          EXPECT_EQ(l.replica_of(r), color);
        }
      }
    }
}

// With N ranks per node filled in order (mpirun --map-by slot), a stage's
// data-parallel group stays inside one node when D divides N.
TEST(PipeLayout, DataParallelGroupsStayOnANode) {
  const int per_node = 4;
  const Layout l(16, 4);  // P = 4, D = 4: one stage per node
  for (int r = 0; r < 16; ++r)
    for (int q = 0; q < 16; ++q)
      if (l.stage_of(r) == l.stage_of(q)) {
        EXPECT_EQ(r / per_node, q / per_node);
      }
  const Layout two(16, 8);  // D = 2: two stages per node; pipelines cross nodes
  for (int r = 0; r < 16; ++r)
    for (int q = 0; q < 16; ++q)
      if (two.stage_of(r) == two.stage_of(q)) {
        EXPECT_EQ(r / per_node, q / per_node);
      }
}

TEST(PipeLayout, NoPipelineIsPlainDataParallel) {
  const Layout l(5, 1);
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(l.stage_of(r), 0);
    EXPECT_EQ(l.replica_of(r), r);
    EXPECT_EQ(l.prev_rank(r), -1);
    EXPECT_EQ(l.next_rank(r), -1);
    EXPECT_EQ(l.data_parallel_split(r), (SplitKey{0, r}));
  }
}

TEST(PipeLayout, StagesMustDivideTheWorld) {
  try {
    Layout(6, 4);
    FAIL() << "expected an fd::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_STREQ(e.what(),
                 "4 pipeline stages do not divide 6 rank(s): the ranks are stages x "
                 "data-parallel replicas; start a multiple of 4 ranks or use a divisor of 6 "
                 "stages");
  }
  EXPECT_THROW(Layout(4, 0), Error);
  EXPECT_THROW(Layout(0, 1), Error);
}

}  // namespace
}  // namespace fd::pipe
