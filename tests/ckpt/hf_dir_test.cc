// lib/ckpt/hf_dir: Hugging Face model directories (model.safetensors, or
// shards and model.safetensors.index.json) written and read back bitwise,
// row ranges, a transformers-style index written by hand, and every way a
// directory can be broken.
#include "lib/ckpt/hf_dir.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "lib/base/error.h"
#include "lib/tensor/safetensors.h"
#include "tests/ckpt/ckpt_test_util.h"

namespace fd::ckpt {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using Named = std::vector<std::pair<std::string, Tensor>>;

// A CPU tensor of random bits (finite values: the exponent is kept off all-ones).
Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype, MemCategory::kOther, Device::cpu());
  std::mt19937 rng(seed);
  if (dtype == DType::kF32) {
    std::normal_distribution<float> d;
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = d(rng);
  } else {
    uint16_t* p = t.data<uint16_t>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = uint16_t(rng() & 0xbfff);
  }
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Six tensors of 64 bytes each in `dtype`, plus a 1-D and a 3-D one.
Named model_tensors(DType dtype) {
  Named out;
  int64_t cols = int64_t(64 / dtype_size(dtype)) / 4;
  for (int i = 0; i < 6; ++i)
    out.emplace_back("model.layers." + std::to_string(i) + ".weight",
                     random_tensor(Shape{4, cols}, dtype, 100 + i));
  return out;
}

void expect_round_trip(const std::string& dir, const Named& tensors) {
  HfWeights w = HfWeights::open(dir);
  ASSERT_EQ(w.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    TensorInfo i = w.info(name);
    EXPECT_EQ(i.dtype, t.dtype()) << name;
    EXPECT_EQ(i.shape, t.shape()) << name;
    Tensor back = Tensor::empty(i.shape, i.dtype, MemCategory::kOther, Device::cpu());
    w.read(name, back);
    EXPECT_TRUE(same_bits(back, t)) << name;
  }
}

// Runs f, expects fd::Error kUsage whose message holds every one of `parts`.
template <typename F>
void expect_usage(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << parts[0];
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "\"" << p << "\" not in: " << e.what();
  }
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

class HfDirDtypes : public ::testing::TestWithParam<DType> {};

TEST_P(HfDirDtypes, SingleFileRoundTripsBitwise) {
  TempDir tmp;
  Named tensors = model_tensors(GetParam());
  tensors.emplace_back("model.norm.weight", random_tensor(Shape{7}, GetParam(), 7));
  tensors.emplace_back("model.conv", random_tensor(Shape{2, 3, 2}, GetParam(), 8));
  write_hf_weights(tmp.path("m"), tensors, {{"format", "pt"}}, 1 << 20);
  EXPECT_TRUE(fs::exists(tmp.path("m/model.safetensors")));
  EXPECT_FALSE(fs::exists(tmp.path("m/model.safetensors.index.json")));
  expect_round_trip(tmp.path("m"), tensors);
  EXPECT_EQ(HfWeights::open(tmp.path("m")).metadata().at("format"), "pt");
}

TEST_P(HfDirDtypes, ShardedRoundTripsBitwise) {
  TempDir tmp;
  Named tensors = model_tensors(GetParam());
  write_hf_weights(tmp.path("m"), tensors, {{"format", "pt"}}, 128);  // two tensors a shard
  for (int i = 1; i <= 3; ++i)
    EXPECT_TRUE(fs::exists(tmp.path("m/model-0000" + std::to_string(i) + "-of-00003.safetensors")));
  EXPECT_FALSE(fs::exists(tmp.path("m/model.safetensors")));
  std::ifstream in(tmp.path("m/model.safetensors.index.json"));
  nlohmann::json index = nlohmann::json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), 6 * 64);
  EXPECT_EQ(index["weight_map"]["model.layers.5.weight"], "model-00003-of-00003.safetensors");
  expect_round_trip(tmp.path("m"), tensors);
}

INSTANTIATE_TEST_SUITE_P(AllFloat, HfDirDtypes,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(HfDir, RewriteRemovesStaleWeightFilesOnly) {
  TempDir tmp;
  Named tensors = model_tensors(DType::kF32);
  write_hf_weights(tmp.path("m"), tensors, {}, 128);
  write_text(tmp.path("m/config.json"), "{}");
  write_hf_weights(tmp.path("m"), tensors, {}, 1 << 20);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(tmp.path("m")))
    files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"config.json", "model.safetensors"}));
  expect_round_trip(tmp.path("m"), tensors);
}

TEST(HfDir, ReadRowsEqualsTheSliceOfAFullRead) {
  TempDir tmp;
  Named tensors = {{"w", random_tensor(Shape{9, 5}, DType::kF32, 1)},
                   {"v", random_tensor(Shape{9, 5}, DType::kBF16, 2)}};
  write_hf_weights(tmp.path("m"), tensors, {}, 200);  // one tensor a shard
  HfWeights w = HfWeights::open(tmp.path("m"));
  for (const auto& [name, t] : tensors) {
    Tensor full = Tensor::empty(Shape{9, 5}, t.dtype(), MemCategory::kOther, Device::cpu());
    w.read(name, full);
    for (int64_t row0 : {0, 3, 8})
      for (int64_t rows : {int64_t(0), int64_t(1), 9 - row0}) {
        Tensor part = Tensor::empty(Shape{rows, 5}, t.dtype(), MemCategory::kOther, Device::cpu());
        w.read_rows(name, row0, rows, part);
        if (rows == 0) continue;  // an empty tensor has no bytes (and no pointer) to compare
        EXPECT_EQ(std::memcmp(part.raw(), full.flat_slice(row0 * 5, rows * 5).raw(), part.nbytes()),
                  0)
            << name << " rows " << row0 << "+" << rows;
      }
  }
  // Converting: F32 rows read into an F16 tensor, as Tensor::to(kF16) rounds them.
  Tensor part = Tensor::empty(Shape{2, 5}, DType::kF16, MemCategory::kOther, Device::cpu());
  w.read_rows("w", 4, 2, part);
  Tensor expect = tensors[0].second.flat_slice(20, 10).to(DType::kF16).reshape(Shape{2, 5});
  EXPECT_TRUE(same_bits(part, expect));

  expect_usage([&] { w.read_rows("w", 8, 2, part); }, {"2 rows from row 8", "outside its 9 rows"});
  expect_usage([&] { w.read_rows("w", 0, 3, part); }, {"shape (2, 5)"});
  write_hf_weights(tmp.path("n"), {{"b", random_tensor(Shape{3}, DType::kF32, 3)}}, {}, 1 << 20);
  expect_usage([&] { HfWeights::open(tmp.path("n")).read_rows("b", 0, 1, part); }, {"not 2-D"});
}

// A ZeRO-3 rank's shard starts and ends anywhere in a tensor: element ranges.
TEST(HfDir, ReadRangeEqualsTheSliceOfAFullRead) {
  TempDir tmp;
  Named tensors = {{"w", random_tensor(Shape{7, 3}, DType::kBF16, 4)},
                   {"b", random_tensor(Shape{5}, DType::kF32, 5)}};
  write_hf_weights(tmp.path("m"), tensors, {}, 1 << 20);
  HfWeights w = HfWeights::open(tmp.path("m"));
  for (const auto& [name, t] : tensors) {
    const int64_t n = t.numel();
    for (int64_t begin : {int64_t(0), int64_t(1), n - 2})
      for (int64_t count : {int64_t(1), n - begin}) {
        Tensor part = Tensor::empty(Shape{count}, DType::kF32, MemCategory::kOther, Device::cpu());
        w.read_range(name, begin, count, part);
        EXPECT_TRUE(same_bits(part, t.reshape(Shape{n}).flat_slice(begin, count).to(DType::kF32)))
            << name << " [" << begin << ", +" << count << ")";
      }
  }
  Tensor part = Tensor::empty(Shape{3}, DType::kF32, MemCategory::kOther, Device::cpu());
  expect_usage([&] { w.read_range("w", 19, 3, part); },
               {"3 elements from element 19", "outside its 21"});
  expect_usage([&] { w.read_range("w", 0, 2, part); }, {"shape (3,)"});
}

TEST(HfDir, ReadsATransformersStyleIndex) {
  TempDir tmp;
  fs::create_directories(tmp.path("m"));
  Tensor a = random_tensor(Shape{4, 4}, DType::kBF16, 1);
  Tensor b = random_tensor(Shape{4}, DType::kBF16, 2);
  Tensor c = random_tensor(Shape{2, 4}, DType::kBF16, 3);
  write_safetensors(tmp.path("m/model-00001-of-00002.safetensors"),
                    {{"model.embed_tokens.weight", a}, {"model.norm.weight", b}},
                    {{"format", "pt"}});
  write_safetensors(tmp.path("m/model-00002-of-00002.safetensors"), {{"lm_head.weight", c}},
                    {{"format", "pt"}});
  write_text(tmp.path("m/model.safetensors.index.json"), R"({
  "metadata": {
    "total_size": 56
  },
  "weight_map": {
    "lm_head.weight": "model-00002-of-00002.safetensors",
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00001-of-00002.safetensors"
  }
}
)");
  expect_round_trip(
      tmp.path("m"),
      {{"model.embed_tokens.weight", a}, {"model.norm.weight", b}, {"lm_head.weight", c}});
}

TEST(HfDir, RefusesADirectoryWithoutWeights) {
  TempDir tmp;
  expect_usage([&] { HfWeights::open(tmp.path()); },
               {tmp.path(), "neither model.safetensors nor model.safetensors.index.json"});
  expect_usage([&] { HfWeights::open(tmp.path("nope")); }, {"nope", "no such directory"});
}

TEST(HfDir, RefusesAnIndexNamingAMissingShard) {
  TempDir tmp;
  write_hf_weights(tmp.path("m"), model_tensors(DType::kF32), {}, 128);
  fs::remove(tmp.path("m/model-00002-of-00003.safetensors"));
  expect_usage([&] { HfWeights::open(tmp.path("m")); },
               {"model.layers.2.weight", "model-00002-of-00003.safetensors", "missing"});
}

TEST(HfDir, RefusesAnIndexAndShardsThatDisagree) {
  TempDir tmp;
  fs::create_directories(tmp.path("m"));
  write_safetensors(tmp.path("m/s1.safetensors"), {{"a", random_tensor(Shape{2}, DType::kF32, 1)},
                                                   {"b", random_tensor(Shape{2}, DType::kF32, 2)}});
  // Listed, but not in its shard.
  write_text(
      tmp.path("m/model.safetensors.index.json"),
      R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "ghost": "s1.safetensors"}})");
  expect_usage([&] { HfWeights::open(tmp.path("m")); },
               {"s1.safetensors", "\"ghost\"", "absent from that shard"});
  // In the shard, but not listed.
  write_text(tmp.path("m/model.safetensors.index.json"),
             R"({"metadata": {}, "weight_map": {"a": "s1.safetensors"}})");
  expect_usage([&] { HfWeights::open(tmp.path("m")); },
               {"s1.safetensors", "\"b\"", "does not list", "inconsistent"});
  // A shard name that leaves the directory.
  write_text(tmp.path("m/model.safetensors.index.json"),
             R"({"weight_map": {"a": "../s1.safetensors"}})");
  expect_usage([&] { HfWeights::open(tmp.path("m")); }, {"../s1.safetensors", "not a file in"});
}

TEST(HfDir, RefusesMalformedIndexJsonWithItsPosition) {
  TempDir tmp;
  fs::create_directories(tmp.path("m"));
  write_text(tmp.path("m/model.safetensors.index.json"),
             R"({"weight_map": {"a": "s", }})");  // '}' at byte 27
  expect_usage([&] { HfWeights::open(tmp.path("m")); },
               {"model.safetensors.index.json", "line 1, column 27", "not valid JSON"});
  write_text(tmp.path("m/model.safetensors.index.json"), R"({"metadata": {}})");
  expect_usage([&] { HfWeights::open(tmp.path("m")); }, {"no \"weight_map\""});
}

// The index is read as a configuration file: a regular file, nested no deeper than an index is.
TEST(HfDir, RefusesAnIndexThatIsNoFileOrNestsTooDeep) {
  TempDir tmp;
  fs::create_directories(tmp.path("m/model.safetensors.index.json"));
  expect_usage([&] { HfWeights::open(tmp.path("m")); },
               {"model.safetensors.index.json", "is a directory, not a regular file"});
  fs::remove(tmp.path("m/model.safetensors.index.json"));
  write_text(tmp.path("m/model.safetensors.index.json"),
             "{\"weight_map\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  expect_usage([&] { HfWeights::open(tmp.path("m")); },
               {"model.safetensors.index.json", "nested deeper than 8 levels"});
}

// Weights are checked to be finite as they are read, naming the file, the
// tensor and the element; a range read checks the elements it reads.
TEST(HfDir, RefusesNonFiniteWeightsNamingTheTensor) {
  TempDir tmp;
  Tensor f32 = random_tensor(Shape{2, 4}, DType::kF32, 1);
  f32.f32()[5] = std::numeric_limits<float>::quiet_NaN();
  Tensor bf16 = random_tensor(Shape{8}, DType::kBF16, 2);
  bf16.data<uint16_t>()[7] = 0xFF80;  // -inf
  Tensor f16 = random_tensor(Shape{8}, DType::kF16, 3);
  f16.data<uint16_t>()[0] = 0x7C00;  // +inf
  write_hf_weights(tmp.path("m"), {{"a", f32}, {"b", bf16}, {"c", f16}}, {}, 1 << 20);
  HfWeights w = HfWeights::open(tmp.path("m"));
  Tensor out = Tensor::empty(Shape{2, 4}, DType::kF32, MemCategory::kOther, Device::cpu());
  expect_usage([&] { w.read("a", out); },
               {"model.safetensors", "tensor 'a' holds NaN at element 5 (of 8)"});
  Tensor four = Tensor::empty(Shape{4}, DType::kF32, MemCategory::kOther, Device::cpu());
  w.read_range("a", 0, 4, four);  // elements 0..3 are finite
  expect_usage([&] { w.read_range("a", 4, 4, four); }, {"tensor 'a' holds NaN at element 5"});
  Tensor eight = Tensor::empty(Shape{8}, DType::kBF16, MemCategory::kOther, Device::cpu());
  expect_usage([&] { w.read("b", eight); }, {"tensor 'b' holds -inf at element 7"});
  expect_usage(
      [&] {
        w.read("c", Tensor::empty(Shape{8}, DType::kF32, MemCategory::kOther, Device::cpu()));
      },
      {"tensor 'c' holds +inf at element 0"});
}

TEST(HfDir, NamesAnUnsupportedDtype) {
  TempDir tmp;
  fs::create_directories(tmp.path("m"));
  // An F64 tensor, written by hand (fdtrain has no F64 tensors).
  std::string header = R"({"x":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})";
  uint64_t n = header.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  write_text(tmp.path("m/model.safetensors"), bytes + header + std::string(16, '\0'));
  HfWeights w = HfWeights::open(tmp.path("m"));
  expect_usage([&] { w.info("x"); }, {"\"x\"", "dtype F64", "F32, BF16 and F16"});
  Tensor out = Tensor::empty(Shape{2}, DType::kF32, MemCategory::kOther, Device::cpu());
  expect_usage([&] { w.read("x", out); }, {"dtype F64"});
  // I32 is an fdtrain dtype but not a weight's.
  write_hf_weights(
      tmp.path("n"),
      {{"i", Tensor::zeros(Shape{2}, DType::kI32, MemCategory::kOther, Device::cpu())}}, {},
      1 << 20);
  expect_usage([&] { HfWeights::open(tmp.path("n")).info("i"); }, {"dtype I32"});
}

TEST(HfDir, RefusesATruncatedShard) {
  TempDir tmp;
  write_hf_weights(tmp.path("m"), model_tensors(DType::kF32), {}, 128);
  std::string shard = tmp.path("m/model-00003-of-00003.safetensors");
  fs::resize_file(shard, fs::file_size(shard) - 10);
  expect_usage([&] { HfWeights::open(tmp.path("m")); },
               {"model-00003-of-00003.safetensors", "past the data section"});
}

}  // namespace
}  // namespace fd::ckpt
