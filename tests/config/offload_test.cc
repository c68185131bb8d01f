// zero.offload_optimizer / zero.offload_params: the nested maps, their
// overrides, and every combination that makes no sense refused with a reason.
#include <gtest/gtest.h>

#include <filesystem>

#include "lib/config/paths.h"
#include "tests/config/test_util.h"

namespace fd::config {
namespace {

constexpr const char* kBase = "data: {train: tests/config/data/tiny.txt}\nsteps: 1\n";

LoadResult parse(const std::string& extra, const std::vector<std::string>& overrides = {}) {
  return try_parse_recipe(std::string(kBase) + extra, "inline.yaml", overrides);
}

TEST_F(ConfigTest, OffloadDefaultsToNone) {
  LoadResult r = parse("");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.zero.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(r.recipe.zero.offload_optimizer.buffer_mib, 64);
  EXPECT_EQ(r.recipe.zero.offload_params.device, OffloadDevice::kNone);
}

TEST_F(ConfigTest, OffloadNvmeLoadsAndPrintsAsNestedMaps) {
  LoadResult r = parse(
      "zero:\n  stage: 3\n  offload_optimizer: {device: nvme, path: tests/config/data, "
      "buffer_mib: 8}\n  offload_params:\n    device: nvme\n");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  const ZeroOptions& z = r.recipe.zero;
  EXPECT_EQ(z.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(z.offload_optimizer.buffer_mib, 8);
  EXPECT_EQ(z.offload_params.device, OffloadDevice::kNvme);
  // Printed as block maps under zero, and read back to the same recipe.
  const std::string y = to_yaml(r.recipe);
  EXPECT_NE(y.find("  offload_optimizer:\n    device: nvme\n"), std::string::npos) << y;
  EXPECT_NE(y.find("    buffer_mib: 8\n  offload_params:\n    device: nvme\n"), std::string::npos)
      << y;
  LoadResult again = try_parse_recipe(y, "resolved.yaml");
  ASSERT_TRUE(again.ok()) << ::testing::PrintToString(again.errors);
  EXPECT_EQ(again.recipe.zero, r.recipe.zero);
}

TEST_F(ConfigTest, OffloadOverridesReachNestedKeys) {
  LoadResult r = parse("", {"zero.offload_optimizer.device=nvme",
                            "zero.offload_optimizer.path=tests/config/data",
                            "zero.offload_optimizer.buffer_mib=2"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.zero.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(r.recipe.zero.offload_optimizer.buffer_mib, 2);
  make_paths_absolute(r.recipe, "/work");  // as the trainer does with its working directory
  EXPECT_EQ(r.recipe.zero.offload_optimizer.path, "/work/tests/config/data");
  EXPECT_EQ(parse("", {"zero.offload_optimizer.devcie=nvme"}).errors,
            (Lines{"override 'zero.offload_optimizer.devcie=nvme': "
                   "zero.offload_optimizer.devcie: unknown key; did you mean 'device'?"}));
  EXPECT_EQ(parse("", {"zero.offload_optimizer.device.x=nvme"}).errors,
            (Lines{"override 'zero.offload_optimizer.device.x=nvme': "
                   "zero.offload_optimizer.device.x: unknown key "
                   "(zero.offload_optimizer.device takes a value, not keys)"}));
}

TEST_F(ConfigTest, OffloadBadValuesAndCombinations) {
  auto errors = [](const std::string& zero) { return parse("zero: " + zero + "\n").errors; };
  EXPECT_EQ(errors("{offload_optimizer: {device: disk}}"),
            (Lines{"inline.yaml:3:36: zero.offload_optimizer.device: expected one of none, host, "
                   "nvme, got 'disk'"}));
  EXPECT_EQ(errors("{offload_optimizer: nvme}"),
            (Lines{"inline.yaml:3:27: zero.offload_optimizer: expected a map ({device: none | "
                   "nvme, path: DIR, buffer_mib: N}), got 'nvme'"}));
  // An unknown key is the one error about the map (not also the missing path it meant).
  EXPECT_EQ(errors("{offload_optimizer: {device: nvme, pth: /tmp}}"),
            (Lines{"inline.yaml:3:42: zero.offload_optimizer.pth: unknown key; did you mean "
                   "'path'?"}));
  EXPECT_EQ(errors("{offload_optimizer: {device: nvme}}"),
            (Lines{"inline.yaml:3:36: zero.offload_optimizer.path: required with device: nvme: "
                   "an existing directory on a fast local disk; each rank keeps one file there "
                   "(fdtrain estimate says how large)"}));
  EXPECT_EQ(errors("{offload_optimizer: {device: nvme, path: tests/config/no_such_dir}}"),
            (Lines{"inline.yaml:3:48: zero.offload_optimizer.path: tests/config/no_such_dir does "
                   "not exist; create the directory (on a fast local disk) first"}));
  EXPECT_EQ(errors("{offload_optimizer: {device: nvme, path: tests/config/data/tiny.txt}}"),
            (Lines{"inline.yaml:3:48: zero.offload_optimizer.path: tests/config/data/tiny.txt "
                   "is a regular file, not a directory"}));
  EXPECT_EQ(errors("{offload_optimizer: {path: /tmp, buffer_mib: 4}}"),
            (Lines{"inline.yaml:3:34: zero.offload_optimizer.path: is only used with device: "
                   "nvme (device is none); remove it",
                   "inline.yaml:3:52: zero.offload_optimizer.buffer_mib: is only used when the "
                   "optimizer state is offloaded (device is none); remove it"}));
  EXPECT_EQ(errors("{offload_optimizer: {device: nvme, path: /tmp, buffer_mib: 0}}"),
            (Lines{"inline.yaml:3:66: zero.offload_optimizer.buffer_mib: must be in [1, "
                   "1048576], got 0"}));
  EXPECT_EQ(errors("{offload_optimizer: {device: host}}"),
            (Lines{"inline.yaml:3:36: zero.offload_optimizer.device: host on a cpu run: the "
                   "optimizer state already lives in host memory, which is the default placement "
                   "(device: none); use nvme to move it out of memory"}));
  EXPECT_EQ(errors("{stage: 2, offload_params: {device: nvme}}"),
            (Lines{"inline.yaml:3:43: zero.offload_params.device: parameters are partitioned "
                   "only by ZeRO stage 3; at stage 2 every rank holds all of them, so there is "
                   "no partition to offload: set zero.stage: 3, or remove zero.offload_params"}));
  EXPECT_EQ(errors("{stage: 3, offload_params: {device: host}}"),
            (Lines{"inline.yaml:3:43: zero.offload_params.device: expected one of none, nvme, "
                   "got 'host'"}));
  // GPU runs: the optimizer state in host memory (or a file); parameters stay on the GPU.
  LoadResult gpu = parse("device: cuda\nzero: {offload_optimizer: {device: host, buffer_mib: 16}}\n");
  EXPECT_TRUE(gpu.ok()) << ::testing::PrintToString(gpu.errors);
  EXPECT_EQ(parse("device: cuda\nzero: {stage: 3, offload_optimizer: {device: nvme, path: /tmp}, "
                  "offload_params: {device: nvme}}\n")
                .errors,
            (Lines{"inline.yaml:4:90: zero.offload_params.device: parameter offload of a GPU run "
                   "is not supported yet (each gather would need its partition copied to the GPU "
                   "first); offload the optimizer state alone (zero.offload_optimizer.device: "
                   "host or nvme)"}));
  EXPECT_EQ(errors("{stage: 3, offload_params: {device: nvme, path: /tmp}}"),
            (Lines{"inline.yaml:3:49: zero.offload_params.path: unknown key"}));
  EXPECT_EQ(errors("{stage: 3, offload_params: {device: nvme}}"),
            (Lines{"inline.yaml:3:43: zero.offload_params.device: the parameters are offloaded "
                   "into the optimizer's file (each step rewrites them from their fp32 master "
                   "copy, which must not stay in memory either): set "
                   "zero.offload_optimizer.device: nvme and its path too"}));
}

}  // namespace
}  // namespace fd::config
