// Recipes that would make the loader expand YAML aliases without bound: each
// is refused with one error line naming the file and position, quickly.
// (Found by tests/fuzz/recipe_fuzz.cc; the inputs are also replayed from
// tests/fuzz/regressions/recipe/.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "tests/config/test_util.h"

namespace fd::config {
namespace {

// An alias chain: 10 levels of 10 aliases each would be 10^10 values.
std::string alias_bomb() {
  std::string y = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 10; ++i) {
    y += fmt::format("a{}: &a{} [", i, i);
    for (int j = 0; j < 10; ++j) y += fmt::format("{}*a{}", j ? ", " : "", i - 1);
    y += "]\n";
  }
  y += "steps: 1\n";
  return y;
}

TEST_F(ConfigTest, HostileAliasBombIsRefusedQuickly) {
  auto start = std::chrono::steady_clock::now();
  LoadResult r = try_parse_recipe(alias_bomb(), "bomb.yaml");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.errors.size(), 1u) << ::testing::PrintToString(r.errors);
  EXPECT_NE(r.errors[0].find("bomb.yaml:"), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[0].find("expands to more than 100000 values"), std::string::npos)
      << r.errors[0];
  EXPECT_LT(secs, 5.0);
}

TEST_F(ConfigTest, HostileSelfReferencingAliasIsRefused) {
  for (const char* y : {"a: &a [*a]\nsteps: 1\n", "a: &a\n  b: *a\nsteps: 1\n"}) {
    LoadResult r = try_parse_recipe(y, "self.yaml");
    ASSERT_EQ(r.errors.size(), 1u) << y << ::testing::PrintToString(r.errors);
    EXPECT_NE(r.errors[0].find("nests values more than 100 levels deep"), std::string::npos)
        << r.errors[0];
  }
}

TEST_F(ConfigTest, HostileAliasBombInAnOverrideIsRefused) {
  LoadResult r = try_parse_recipe("steps: 1\n", "r.yaml",
                                  {"logging={a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], "
                                   "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a], "
                                   "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b], "
                                   "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c], "
                                   "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d], "
                                   "f: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]}"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.errors[0].find("override 'logging="), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[0].find("expands to more than"), std::string::npos) << r.errors[0];
}

// Nesting deeper than yaml-cpp's own parser goes (500 levels) is refused by it before our
// bound applies, without overflowing the stack: the message says so, not "bad file".
TEST_F(ConfigTest, HostileDeepNestingIsRefused) {
  const auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  std::string block = "x:\n";
  for (int i = 1; i < 3000; ++i) block += std::string(size_t(2 * i), ' ') + "-\n";
  for (const std::string& y : {"x: " + repeat("[", 100000) + repeat("]", 100000) + "\n",
                               "x: " + repeat("{a: ", 100000) + "1" + repeat("}", 100000) + "\n",
                               block, "x: " + repeat("[", 300) + repeat("]", 300) + "\n"}) {
    LoadResult r = try_parse_recipe(y + "steps: 1\n", "deep.yaml");
    ASSERT_EQ(r.errors.size(), 1u) << ::testing::PrintToString(r.errors);
    EXPECT_NE(r.errors[0].find("deep.yaml:"), std::string::npos) << r.errors[0];
    EXPECT_NE(r.errors[0].find("nests values more than 100 levels deep"), std::string::npos)
        << r.errors[0];
  }
}

// Anchors and aliases within the bounds still work.
TEST_F(ConfigTest, HostileSmallAliasesStillWork) {
  LoadResult r = try_parse_recipe(
      "model: {n_layer: 1, n_head: 1, d_model: 8}\n"
      "data: {train: [recipes/quickstart.yaml], seq_len: &len 8}\n"
      "model_len: &m 16\n"
      "steps: 1\n",
      "ok.yaml");
  // model_len is not a recipe key: one error, not a limit error.
  ASSERT_EQ(r.errors.size(), 1u) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.errors[0].find("expands"), std::string::npos) << r.errors[0];
}

}  // namespace
}  // namespace fd::config
