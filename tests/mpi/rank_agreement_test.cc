// engine::check_ranks_agree under mpirun -n 2 and -n 4 (issue 40): ranks that run one build with
// one recipe pass; a rank whose recipe differs (another zero.stage, another data file list) or
// has another optional section is refused on every rank alike, naming the first such rank, its
// host and the fields that differ; the job goes on afterwards (the check's collectives matched).
// Another build on a host: tests/multihost/multihost_test.sh.
#include "lib/engine/rank_agreement.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/base/build_id.h"
#include "lib/base/error.h"
#include "lib/config/load.h"
#include "tests/mpi/mpi_test_main.h"

namespace fd {
namespace {

dist::Communicator* g_comm = nullptr;

const char* kRecipe = R"(
model: {n_layer: 2, n_head: 2, d_model: 32, vocab_size: 256, max_seq_len: 32}
data: {format: text, train: [/usr/share/games/fortunes/fortunes], val_fraction: 0.0, seq_len: 16}
batch: {micro: 2}
steps: 3
)";

config::Recipe recipe(const std::vector<std::string>& overrides) {
  config::LoadResult r = config::try_parse_recipe(kRecipe, "agree.yaml", overrides);
  EXPECT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  return r.recipe;
}

// The message every rank gets from check_ranks_agree, or "" when it passes.
std::string refusal(const config::Recipe& r) {
  try {
    engine::check_ranks_agree(*g_comm, r);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    return e.what();
  }
  return "";
}

TEST(RankAgreement, BinaryHasABuildId) { EXPECT_EQ(build_id().size(), 40u) << build_id(); }

TEST(RankAgreement, SameRecipeAndBuildPass) { EXPECT_EQ(refusal(recipe({"zero.stage=2"})), ""); }

TEST(RankAgreement, ARankWithAnotherRecipeIsNamedOnEveryRank) {
  const int last = g_comm->size() - 1;
  // The last rank read zero.stage 3 and another train list.
  const bool odd = g_comm->rank() == last;
  const std::string got = refusal(
      recipe(odd ? std::vector<std::string>{"zero.stage=3",
                                            "data.train=[/usr/share/games/fortunes/fortunes, "
                                            "/usr/share/games/fortunes/literature]"}
                 : std::vector<std::string>{"zero.stage=2"}));
  EXPECT_NE(got.find("rank " + std::to_string(last) + " (host "), std::string::npos) << got;
  EXPECT_NE(got.find("resolved another recipe than rank 0 (host "), std::string::npos) << got;
  EXPECT_NE(got.find("2 field(s) differ: "), std::string::npos) << got;
  EXPECT_NE(got.find("zero.stage ("), std::string::npos) << got;
  EXPECT_NE(got.find("data.train ("), std::string::npos) << got;
  EXPECT_NE(got.find("every rank must read the same recipe and overrides"), std::string::npos)
      << got;
  // The collectives matched: the world still works.
  EXPECT_EQ(refusal(recipe({})), "");
}

TEST(RankAgreement, ARankWithAnotherSectionIsNamed) {
  const bool odd = g_comm->rank() == 1;
  const std::string got =
      refusal(recipe(odd ? std::vector<std::string>{"lora={r: 4, targets: [all-linear]}"}
                         : std::vector<std::string>{}));
  EXPECT_NE(got.find("rank 1 (host "), std::string::npos) << got;
  EXPECT_NE(got.find("fields, rank 0's"), std::string::npos) << got;
  EXPECT_EQ(refusal(recipe({})), "");
}

}  // namespace
}  // namespace fd

int main(int argc, char** argv) {
  return fd::dist::testing::run_mpi_tests(argc, argv, &fd::g_comm);
}
