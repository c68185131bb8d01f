// Interop: other tools read what fdtrain writes. h5dump (hdf5-tools) finds
// every documented attribute and dataset of a shard, with the Fletcher32
// filter; an independent Python safetensors reader (json + struct only)
// parses an export and sees exactly the values C++ wrote; the fdtrain binary's
// `ckpt inspect` / `ckpt export` exit 0 on a good checkpoint and 2, with one
// message naming the file, on a bad one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <sstream>

#include "lib/base/strings.h"
#include "lib/ckpt/export.h"
#include "tests/ckpt/ckpt_test_util.h"

namespace fd::ckpt {
namespace {

using testing::run_command;
using testing::TempDir;
namespace fs = std::filesystem;

bool have(const std::string& tool) {
  int rc = 0;
  run_command("command -v " + tool, &rc);
  return rc == 0;
}

TEST(Interop, H5dumpFindsTheDocumentedLayout) {
  ASSERT_TRUE(have("h5dump")) << "h5dump missing: ./scripts/install_deps.sh installs hdf5-tools";
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 2);
  testing::write_test_checkpoint(tmp.path("ck"), *model, 2, 7, DType::kBF16, "fp16");
  std::string shard = tmp.path("ck/rank_00001.h5");
  int rc = 0;
  std::string header = run_command("h5dump -H -p '" + shard + "'", &rc);
  ASSERT_EQ(rc, 0) << header;
  for (const char* want : {"ATTRIBUTE \"format_version\"",
                           "ATTRIBUTE \"step\"",
                           "ATTRIBUTE \"world_size\"",
                           "ATTRIBUTE \"rank\"",
                           "ATTRIBUTE \"zero_stage\"",
                           "ATTRIBUTE \"precision\"",
                           "ATTRIBUTE \"optimizer_step\"",
                           "ATTRIBUTE \"seed\"",
                           "ATTRIBUTE \"skipped_steps\"",
                           "ATTRIBUTE \"fdtrain_version\"",
                           "ATTRIBUTE \"recipe\"",
                           "ATTRIBUTE \"loss_scale\"",
                           "ATTRIBUTE \"loss_scale_iter\"",
                           "ATTRIBUTE \"loss_scale_last_overflow_iter\"",
                           "ATTRIBUTE \"loss_scale_hysteresis_left\"",
                           "GROUP \"layout\"",
                           "DATASET \"name\"",
                           "DATASET \"segment\"",
                           "DATASET \"offset\"",
                           "DATASET \"ndim\"",
                           "DATASET \"shape\"",
                           "DATASET \"decay\"",
                           "GROUP \"segments\"",
                           "GROUP \"embed\"",
                           "GROUP \"h.0\"",
                           "GROUP \"h.1\"",
                           "GROUP \"final\"",
                           "ATTRIBUTE \"segment_numel\"",
                           "ATTRIBUTE \"offset\"",
                           "ATTRIBUTE \"count\"",
                           "DATASET \"master\"",
                           "DATASET \"exp_avg\"",
                           "DATASET \"exp_avg_sq\"",
                           "DATASET \"params\"",
                           "ATTRIBUTE \"dtype\"",
                           "H5T_STD_U16LE",
                           "H5T_IEEE_F32LE",
                           "CHECKSUM FLETCHER32",
                           "DATASET \"master_crc32c\"",
                           "DATASET \"exp_avg_crc32c\"",
                           "DATASET \"exp_avg_sq_crc32c\"",
                           "DATASET \"params_crc32c\"",
                           "ATTRIBUTE \"chunk\""}) {
    EXPECT_NE(header.find(want), std::string::npos) << "h5dump -H lacks " << want;
  }

  // Values: the attributes and the layout's parameter names read as text.
  std::string step = run_command("h5dump -a /step '" + shard + "'", &rc);
  EXPECT_EQ(rc, 0) << step;
  EXPECT_NE(step.find("(0): 7"), std::string::npos) << step;
  std::string recipe = run_command("h5dump -a /recipe '" + shard + "'", &rc);
  EXPECT_NE(recipe.find("# a test recipe"), std::string::npos) << recipe;
  std::string names = run_command("h5dump -d /layout/name '" + shard + "'", &rc);
  EXPECT_EQ(rc, 0) << names;
  for (const testing::TestParam* p : model->parameters())
    EXPECT_NE(names.find("\"" + p->name + "\""), std::string::npos) << p->name;

  // A master range, element by element.
  ShardReader r = ShardReader::open(shard);
  const ShardReader::RangeInfo* fin = r.find_range("final");
  ASSERT_NE(fin, nullptr);
  Tensor master = Tensor::empty(Shape{fin->count}, DType::kF32);
  r.read("final", "master", fin->offset, fin->count, master);
  std::string dump =
      run_command("h5dump -m %.9g -w 1 -d /segments/final/master '" + shard + "'", &rc);
  EXPECT_EQ(rc, 0) << dump;
  size_t data = dump.find("DATA {");
  ASSERT_NE(data, std::string::npos) << dump;
  std::istringstream in(dump.substr(data + 6));
  std::string token;
  std::vector<float> seen;
  while (in >> token && token != "}") {
    if (token.back() == ':' || token.front() == '(') continue;  // "(0):" indices
    if (token.back() == ',') token.pop_back();
    seen.push_back(std::strtof(token.c_str(), nullptr));
  }
  ASSERT_EQ(int64_t(seen.size()), fin->count) << dump;
  for (int64_t i = 0; i < fin->count; ++i) EXPECT_EQ(seen[size_t(i)], master.f32()[i]) << i;
}

struct PyTensor {
  std::string dtype, shape;
  double sum;
  std::string fnv;
};

std::string fnv1a64(const void* data, size_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<const unsigned char*>(data)[i];
    h *= 0x100000001B3ull;
  }
  return fmt::format("{:016x}", h);
}

TEST(Interop, PythonReaderSeesTheExportedValues) {
  if (!have("python3")) GTEST_SKIP() << "no python3";
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    TempDir tmp;
    auto model = testing::make_model(testing::tiny_config(), 2);
    testing::write_test_checkpoint(tmp.path("ck"), *model, 2, 3);
    std::string out = tmp.path("model.safetensors");
    export_checkpoint(open_checkpoint(tmp.path("ck")), out, dtype, false, std::nullopt);
    int rc = 0;
    std::string text = run_command(
        "python3 '" + std::string(FD_SOURCE_DIR) + "/tests/ckpt/read_safetensors.py' '" + out + "'",
        &rc);
    ASSERT_EQ(rc, 0) << text;
    std::map<std::string, PyTensor> py;
    std::map<std::string, std::string> meta;
    for (const std::string& line : split(text, '\n')) {
      std::vector<std::string> f = split(line, '\t');
      if (f.size() == 3 && f[0] == "__metadata__") meta[f[1]] = f[2];
      if (f.size() == 5) py[f[0]] = {f[1], f[2], std::strtod(f[3].c_str(), nullptr), f[4]};
    }
    EXPECT_EQ(meta["format"], "pt");
    EXPECT_EQ(meta["n_layer"], "2");
    EXPECT_EQ(meta["dtype"], dtype == DType::kF32 ? "fp32" : "bf16");
    ASSERT_EQ(py.size(), model->parameters().size()) << text;
    for (const testing::TestParam* p : model->parameters()) {
      ASSERT_TRUE(py.count(p->name)) << p->name;
      const PyTensor& t = py[p->name];
      Tensor want = p->value.to(dtype);
      std::vector<float> values = want.to_vector();
      double sum = 0;
      for (float v : values) sum += double(v);
      std::string shape;
      for (int i = 0; i < want.shape().ndim(); ++i) {
        if (i) shape += ',';
        shape += std::to_string(want.shape()[i]);
      }
      EXPECT_EQ(t.dtype, dtype == DType::kF32 ? "F32" : "BF16") << p->name;
      EXPECT_EQ(t.shape, shape) << p->name;
      EXPECT_EQ(t.sum, sum) << p->name;  // same values, same order: exactly equal
      EXPECT_EQ(t.fnv, fnv1a64(want.raw(), want.nbytes())) << p->name;
    }
  }
}

TEST(Interop, FdtrainCkptCommands) {
  std::string bin = std::string(FD_BINARY_DIR) + "/bin/fdtrain";
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " not built";
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 2);
  testing::write_test_checkpoint(tmp.path("run/checkpoints/step_00000004"), *model, 2, 4);
  write_latest(tmp.path("run/checkpoints"), 4);
  int rc = 0;
  std::string out = run_command(bin + " ckpt inspect '" + tmp.path("run") + "'", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("checksums ok"), std::string::npos) << out;

  std::string file = tmp.path("m.safetensors");
  out = run_command(
      bin + " ckpt export '" + tmp.path("run/checkpoints") + "' --out '" + file + "' --dtype bf16",
      &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::exists(file)) << out;
  out = run_command(bin + " ckpt export '" + tmp.path("run") + "' --out '" + file + "'", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("already exists"), std::string::npos) << out;

  fs::resize_file(tmp.path("run/checkpoints/step_00000004/rank_00001.h5"), 1000);
  out = run_command(bin + " ckpt inspect '" + tmp.path("run") + "'", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("fdtrain: error: "), std::string::npos) << out;
  EXPECT_NE(out.find("rank_00001.h5"), std::string::npos) << out;
  EXPECT_EQ(out.find("HDF5-DIAG"), std::string::npos) << "raw HDF5 error stack:\n" << out;

  out = run_command(bin + " ckpt inspect '" + tmp.path("nowhere") + "'", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("does not exist"), std::string::npos) << out;
}

}  // namespace
}  // namespace fd::ckpt
