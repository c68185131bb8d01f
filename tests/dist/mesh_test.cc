// Mesh: the documented placement (row-major, the last axis fastest; a run's
// {pp, dp} stage-major), the groups of any set of axes, neighbours along an
// axis, and the run mesh's refusals.
#include "lib/dist/mesh.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "lib/base/error.h"
#include "lib/dist/counting_communicator.h"

namespace fd::dist {
namespace {

TEST(Mesh, StageMajorRunMesh) {
  const Mesh m = Mesh::pipeline_data(6, 2);  // P = 2, D = 3
  EXPECT_EQ(m.world(), 6);
  EXPECT_EQ(m.size("pp"), 2);
  EXPECT_EQ(m.size("dp"), 3);
  EXPECT_EQ(m.size("tp"), 1);  // absent: size 1, coordinate 0
  const std::vector<int> stage = {0, 0, 0, 1, 1, 1}, replica = {0, 1, 2, 0, 1, 2};
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(m.coord(r, "pp"), stage[size_t(r)]) << r;
    EXPECT_EQ(m.coord(r, "dp"), replica[size_t(r)]) << r;
    EXPECT_EQ(m.coord(r, "tp"), 0);
  }
  EXPECT_EQ(m.step(4, "pp", -1), 1);
  EXPECT_EQ(m.step(1, "pp", +1), 4);
  EXPECT_EQ(m.step(1, "pp", -1), -1);
  EXPECT_EQ(m.step(4, "pp", +1), -1);
  EXPECT_EQ(m.step(4, "dp", +1), 5);
  EXPECT_EQ(m.step(4, "tp", 0), 4);
  EXPECT_EQ(m.group_ranks(4, {"dp"}), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(m.group_ranks(4, {"pp"}), (std::vector<int>{1, 4}));
}

// Every (pp, dp) of world 8: each group's ranks are exactly those the
// placement rank = stage * D + replica gives, in group order, and the split
// keys make those groups.
TEST(Mesh, EveryRunMeshOfWorld8) {
  const int world = 8;
  for (int P = 1; P <= world; ++P) {
    if (world % P != 0) continue;
    const int D = world / P;
    const Mesh m = Mesh::pipeline_data(world, P);
    ASSERT_EQ(m.world(), world);
    const SplitPlan dp = m.plan({"dp"}), pp = m.plan({"pp"});
    for (int r = 0; r < world; ++r) {
      const int s = m.coord(r, "pp"), d = m.coord(r, "dp");
      ASSERT_EQ(r, s * D + d) << "P " << P;
      std::vector<int> stage_group, pipeline;
      for (int q = 0; q < D; ++q) stage_group.push_back(s * D + q);  // consecutive ranks
      for (int t = 0; t < P; ++t) pipeline.push_back(t * D + d);
      EXPECT_EQ(m.group_ranks(r, {"dp"}), stage_group) << "P " << P << " rank " << r;
      EXPECT_EQ(m.group_ranks(r, {"pp"}), pipeline) << "P " << P << " rank " << r;
      EXPECT_EQ(dp.group_size(r), D);
      EXPECT_EQ(dp.group_rank(r), d);
      EXPECT_EQ(pp.group_size(r), P);
      EXPECT_EQ(pp.group_rank(r), s);
      EXPECT_EQ(m.step(r, "pp", -1), s > 0 ? r - D : -1);
      EXPECT_EQ(m.step(r, "pp", +1), s + 1 < P ? r + D : -1);
      // Both axes: the world; none: every rank alone.
      EXPECT_EQ(m.group_ranks(r, {"pp", "dp"}).size(), size_t(world));
      EXPECT_EQ(m.plan({"dp", "pp"}).group_rank(r), r);
      EXPECT_EQ(m.group_ranks(r, {}), (std::vector<int>{r}));
    }
    // P groups of D, D groups of P: one color per group.
    std::map<int, int> dp_colors, pp_colors;
    for (int r = 0; r < world; ++r) {
      ++dp_colors[dp.of(r).color];
      ++pp_colors[pp.of(r).color];
    }
    EXPECT_EQ(int(dp_colors.size()), P);
    EXPECT_EQ(int(pp_colors.size()), D);
  }
}

// Three axes, the last fastest: a tensor-parallel group is consecutive ranks
// (one node under mpirun --map-by slot), data-parallel ranks are tp apart.
TEST(Mesh, ThreeAxesLastFastest) {
  const Mesh m({{"pp", 2}, {"dp", 2}, {"tp", 2}});
  EXPECT_EQ(m.world(), 8);
  EXPECT_EQ(m.group_ranks(5, {"tp"}), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group_ranks(5, {"dp"}), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.group_ranks(5, {"pp"}), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.group_ranks(5, {"dp", "tp"}), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(m.group_ranks(5, {"tp", "pp"}), (std::vector<int>{0, 1, 4, 5}));
  for (int r = 0; r < 8; ++r)
    EXPECT_EQ(r, m.coord(r, "pp") * 4 + m.coord(r, "dp") * 2 + m.coord(r, "tp"));
}

// With N ranks per node filled in order, a stage's data-parallel group stays
// inside one node when D divides N.
TEST(Mesh, DataParallelGroupsStayOnANode) {
  const int per_node = 4;
  for (const int P : {4, 8}) {  // D = 4: one stage per node; D = 2: two
    const Mesh m = Mesh::pipeline_data(16, P);
    for (int r = 0; r < 16; ++r)
      for (int q : m.group_ranks(r, {"dp"})) EXPECT_EQ(r / per_node, q / per_node);
  }
}

TEST(Mesh, GroupSplitsTheWorld) {
  const Mesh m = Mesh::pipeline_data(8, 2);
  CountingCommunicator world(6, 8);
  EXPECT_EQ(m.group(world, {"dp"})->size(), 4);
  EXPECT_EQ(m.group(world, {"dp"})->rank(), 2);
  EXPECT_EQ(m.group(world, {"pp"})->rank(), 1);
}

// One simulated rank at a time, as the estimate runs them: every rank of a
// 2x2 {pp, dp} and a 2x2x2 {pp, dp, tp} mesh splits the world into each
// axis's group on the counting backend, gets the documented rank and size
// there, and a collective on the group is counted for the group's size (the
// ring model: an all-reduce of n bytes sends 2 (g-1)/g n).
TEST(Mesh, CountingRanksOfTwoAndThreeAxisMeshes) {
  for (const Mesh& m : {Mesh({{"pp", 2}, {"dp", 2}}), Mesh({{"pp", 2}, {"dp", 2}, {"tp", 2}})}) {
    for (int r = 0; r < m.world(); ++r) {
      CountingCommunicator world(r, m.world());
      for (const MeshAxis& axis : m.axes()) {
        std::unique_ptr<Communicator> g = m.group(world, {axis.name});
        const std::vector<int> ranks = m.group_ranks(r, {axis.name});
        ASSERT_EQ(g->size(), axis.size) << axis.name;
        ASSERT_EQ(ranks[size_t(g->rank())], r) << axis.name;
        EXPECT_EQ(g->rank(), m.coord(r, axis.name)) << axis.name;
        g->all_reduce(nullptr, 100, DType::kF32);  // 400 bytes over 2 ranks: 2 * 1/2 * 400
        EXPECT_EQ(g->bytes_sent(), 400) << axis.name;
      }
      // All axes but dp: the ranks that hold different parts of a model.
      std::vector<std::string_view> parts;
      for (const MeshAxis& axis : m.axes())
        if (axis.name != "dp") parts.push_back(axis.name);
      std::unique_ptr<Communicator> g = m.group(world, parts);
      EXPECT_EQ(g->size(), m.world() / 2);
      EXPECT_EQ(world.bytes_sent(), 0);  // the groups count their own traffic
    }
  }
}

TEST(Mesh, StagesMustDivideTheWorld) {
  try {
    Mesh::pipeline_data(6, 4);
    FAIL() << "expected an fd::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_STREQ(e.what(),
                 "4 pipeline stages do not divide 6 rank(s): the ranks are stages x "
                 "data-parallel replicas; start a multiple of 4 ranks or use a divisor of 6 "
                 "stages");
  }
  EXPECT_THROW(Mesh::pipeline_data(4, 0), Error);
  EXPECT_THROW(Mesh::pipeline_data(0, 1), Error);
}

// Tensor parallelism innermost: {pp, dp, tp}, a tp group T consecutive ranks, a replica's dp
// group strided by T; tensor 1 is the pipeline_data mesh.
TEST(Mesh, LayoutPutsTensorGroupsInnermost) {
  const Mesh m = Mesh::layout(8, 1, 2);  // D = 4, T = 2
  EXPECT_EQ(m.size("pp"), 1);
  EXPECT_EQ(m.size("dp"), 4);
  EXPECT_EQ(m.size("tp"), 2);
  EXPECT_EQ(m.group_ranks(5, {"tp"}), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group_ranks(5, {"dp"}), (std::vector<int>{1, 3, 5, 7}));
  const Mesh p = Mesh::layout(8, 2, 2);  // P = 2, D = 2, T = 2
  EXPECT_EQ(p.coord(6, "pp"), 1);
  EXPECT_EQ(p.coord(6, "dp"), 1);
  EXPECT_EQ(p.coord(6, "tp"), 0);
  EXPECT_EQ(p.group_ranks(6, {"pp"}), (std::vector<int>{2, 6}));
  EXPECT_EQ(Mesh::layout(6, 2, 1).axes().size(), Mesh::pipeline_data(6, 2).axes().size());
  try {
    Mesh::layout(6, 1, 4);
    FAIL() << "expected an fd::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_STREQ(e.what(),
                 "1 pipeline stage(s) x 4 tensor-parallel ranks do not divide 6 rank(s): the "
                 "ranks are stages x data-parallel replicas x tensor-parallel ranks; start a "
                 "multiple of 4 ranks");
  }
  EXPECT_THROW(Mesh::layout(4, 1, 0), Error);
}

TEST(MeshDeathTest, BadAxes) {
  EXPECT_DEATH(Mesh({{"dp", 2}, {"dp", 2}}), "named twice");
  EXPECT_DEATH(Mesh({{"dp", 0}}), "of size 0");
  const Mesh m = Mesh::pipeline_data(4, 2);
  EXPECT_DEATH(m.coord(4, "dp"), "rank 4 outside a mesh of 4");
  CountingCommunicator two(0, 2);
  EXPECT_DEATH(m.group(two, {"dp"}), "a mesh of 4 ranks over a communicator of 2");
}

}  // namespace
}  // namespace fd::dist
