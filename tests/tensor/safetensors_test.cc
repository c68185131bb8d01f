#include "lib/tensor/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "lib/base/error.h"

namespace fd {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::path(testing::TempDir()) / ("fd_safetensors_" + name)).string();
}

// Writes a file by hand: u64 header length, header text, data bytes.
std::string write_raw(const std::string& name, const std::string& header, const std::string& data) {
  std::string path = temp_path(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
  return path;
}

// Expects open(path) to throw a usage error whose message has `fragment`.
void expect_open_fails(const std::string& path, const std::string& fragment) {
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "open(" << path << ") did not throw; expected: " << fragment;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message: " << e.what() << "\nexpected fragment: " << fragment;
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  Tensor a = Tensor::from_vector({1.5f, -2.0f, 3.25f, 0.0f, 1e-20f, -7.0f}, Shape{2, 3});
  Tensor b = Tensor::from_vector({1.0f, 0.5f, -3.0f}, Shape{3}, DType::kBF16);
  Tensor c = Tensor::from_vector({65504.0f, -0.25f}, Shape{1, 2, 1}, DType::kF16);
  Tensor d = Tensor::from_vector({7, -8, 2147483520}, Shape{3}, DType::kI32);
  Tensor scalar = Tensor::from_vector({42.0f}, Shape{});
  Tensor empty = Tensor::zeros(Shape{0, 4});
  std::string path = temp_path("roundtrip.safetensors");
  write_safetensors(
      path, {{"w.a", a}, {"b", b}, {"c", c}, {"d", d}, {"scalar", scalar}, {"empty", empty}},
      {{"format", "pt"}, {"step", "12"}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"b", "c", "d", "empty", "scalar", "w.a"}));
  EXPECT_TRUE(f.contains("w.a"));
  EXPECT_FALSE(f.contains("__metadata__"));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("step"), "12");
  EXPECT_EQ(f.shape("w.a"), (Shape{2, 3}));
  EXPECT_EQ(f.shape("c"), (Shape{1, 2, 1}));
  EXPECT_EQ(f.shape("scalar"), Shape{});
  EXPECT_EQ(f.dtype("b"), DType::kBF16);
  EXPECT_EQ(f.entry("b").dtype, "BF16");

  for (const auto& [name, t] : std::vector<std::pair<std::string, Tensor>>{
           {"w.a", a}, {"b", b}, {"c", c}, {"d", d}, {"scalar", scalar}, {"empty", empty}}) {
    Tensor got = f.load(name);
    EXPECT_EQ(got.dtype(), t.dtype()) << name;
    EXPECT_EQ(got.shape(), t.shape()) << name;
    ASSERT_EQ(got.nbytes(), t.nbytes()) << name;
    if (t.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(got.raw(), t.raw(), t.nbytes()), 0) << name;
    }
  }
  EXPECT_EQ(f.load("d").i32()[2], 2147483520);

  // The header is 8-byte aligned like the reference writer's.
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, WriteRejectsDuplicateNames) {
  Tensor a = Tensor::zeros(Shape{2});
  EXPECT_THROW(write_safetensors(temp_path("dup.safetensors"), {{"x", a}, {"x", a}}), Error);
  EXPECT_THROW(write_safetensors(temp_path("meta.safetensors"), {{"__metadata__", a}}), Error);
}

TEST(Safetensors, ReadsFileWithoutMetadataAndOutOfOrderOffsets) {
  std::string data(12, '\0');
  float v[3] = {1.0f, 2.0f, 3.0f};
  std::memcpy(data.data(), v, 12);
  std::string path = write_raw("order.safetensors",
                               R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                               R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}   )",
                               data);
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.load("y").to_vector(), std::vector<float>{3.0f});
  EXPECT_EQ(f.load("x").to_vector(), (std::vector<float>{1.0f, 2.0f}));
}

TEST(Safetensors, MissingFileAndMissingTensor) {
  expect_open_fails(temp_path("does_not_exist.safetensors"), "no such file");
  std::string path = temp_path("one.safetensors");
  write_safetensors(path, {{"x", Tensor::zeros(Shape{1})}});
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_THROW(f.load("y"), Error);
  EXPECT_THROW(f.shape("y"), Error);
}

TEST(Safetensors, RejectsMalformedFiles) {
  const std::string f32x2 = R"("dtype":"F32","shape":[2])";
  std::string eight(8, '\0');
  {
    std::string path = temp_path("short.safetensors");
    std::ofstream(path, std::ios::binary) << "abc";
    expect_open_fails(path, "too short");
  }
  {
    std::string path = temp_path("empty.safetensors");
    std::ofstream(path, std::ios::binary).flush();
    expect_open_fails(path, "too short");
  }
  {
    // Header length far beyond the file.
    std::string path = temp_path("hugelen.safetensors");
    std::ofstream out(path, std::ios::binary);
    uint64_t n = 1ull << 40;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
    out.close();
    expect_open_fails(path, "runs past the end of the file");
  }
  expect_open_fails(write_raw("badjson.safetensors", R"({"x": {"dtype": "F32",)", eight),
                    "not valid JSON");
  expect_open_fails(write_raw("array.safetensors", "[1, 2]", ""), "not a JSON object");
  expect_open_fails(write_raw("dtype.safetensors",
                              R"({"x":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", eight),
                    "unknown dtype \"F33\"");
  expect_open_fails(
      write_raw("nodtype.safetensors", R"({"x":{"shape":[2],"data_offsets":[0,8]}})", eight),
      "\"dtype\"");
  expect_open_fails(write_raw("range.safetensors", "{\"x\":{" + f32x2 + ",\"data_offsets\":[0,8]}}",
                              std::string(4, 0)),
                    "run past the data section of 4 bytes");
  expect_open_fails(
      write_raw("size.safetensors", "{\"x\":{" + f32x2 + ",\"data_offsets\":[0,4]}}", eight),
      "does not match data_offsets");
  expect_open_fails(
      write_raw("reversed.safetensors", "{\"x\":{" + f32x2 + ",\"data_offsets\":[8,0]}}", eight),
      "end before begin");
  expect_open_fails(
      write_raw("negative.safetensors", "{\"x\":{" + f32x2 + ",\"data_offsets\":[-8,0]}}", eight),
      "data_offsets");
  expect_open_fails(write_raw("negshape.safetensors",
                              R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
                    "non-negative integer");
  expect_open_fails(write_raw("overflow.safetensors",
                              R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,16],)"
                              R"("data_offsets":[0,8]}})",
                              eight),
                    "does not match data_offsets");
  expect_open_fails(write_raw("ndim.safetensors",
                              R"({"x":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],)"
                              R"("data_offsets":[0,1]}})",
                              eight),
                    "dimensions");
  expect_open_fails(write_raw("overlap.safetensors",
                              "{\"x\":{" + f32x2 + ",\"data_offsets\":[0,8]},\"y\":{" + f32x2 +
                                  ",\"data_offsets\":[4,12]}}",
                              std::string(12, 0)),
                    "overlap");
  expect_open_fails(write_raw("meta.safetensors", R"({"__metadata__":{"a":1}})", ""),
                    "not a string");
  expect_open_fails(write_raw("entry.safetensors", R"({"x":[1,2]})", ""), "not a JSON object");
}

// nlohmann::json keeps the last of two equal keys; a header naming a tensor
// twice must be refused, not read as whichever copy came last.
TEST(Safetensors, RejectsDuplicateTensorNames) {
  const std::string x = R"("dtype":"F32","shape":[1],"data_offsets":)";
  const std::string path =
      write_raw("dupname.safetensors",
                "{\"w\":{" + x + "[0,4]},\"v\":{" + x + "[4,8]},\"w\":{" + x + "[8,12]}}",
                std::string(12, '\0'));
  expect_open_fails(path, "names tensor \"w\" twice");
  // The same name inside two entries' fields is no duplicate tensor.
  const std::string ok =
      write_raw("samefields.safetensors", "{\"w\":{" + x + "[0,4]},\"v\":{" + x + "[4,8]}}",
                std::string(8, '\0'));
  EXPECT_EQ(SafetensorsFile::open(ok).names(), (std::vector<std::string>{"v", "w"}));
}

TEST(Safetensors, RejectsDeepNestingAndHugeNumbers) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expect_open_fails(write_raw("deep.safetensors", deep, ""), "deeper than 8 levels");
  const std::string huge =
      write_raw("huge.safetensors", R"({"w":{"dtype":"F32","shape":[1e999],"data_offsets":[0,4]}})",
                std::string(4, '\0'));
  expect_open_fails(huge, "not valid JSON");
}

// A FIFO is refused by what it is, without blocking on the open (a reader would wait forever).
TEST(Safetensors, RejectsFifoAndDirectory) {
  const std::string fifo = temp_path("fifo.safetensors");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_open_fails(fifo, "is a FIFO, not a regular file");
  std::filesystem::remove(fifo);
  const std::string dir = temp_path("dir.safetensors");
  std::filesystem::create_directories(dir);
  expect_open_fails(dir, "is a directory");
}

// The writer's temporary file has a fresh name: a user's own `path.tmp` is never touched.
TEST(Safetensors, WriteLeavesAnExistingTmpAlone) {
  const std::string path = temp_path("tmpalone.safetensors");
  std::ofstream(path + ".tmp") << "mine";
  write_safetensors(path, {{"x", Tensor::zeros(Shape{2})}});
  std::ifstream in(path + ".tmp");
  std::string content;
  in >> content;
  EXPECT_EQ(content, "mine");
  EXPECT_EQ(SafetensorsFile::open(path).names(), std::vector<std::string>{"x"});
  for (const auto& e : std::filesystem::directory_iterator(testing::TempDir()))
    EXPECT_EQ(e.path().filename().string().find("fd_safetensors_tmpalone.safetensors.tmp-"),
              std::string::npos)
        << "left behind: " << e.path();
}

TEST(Safetensors, KnownButUnsupportedDtypeOpensButDoesNotLoad) {
  std::string path =
      write_raw("f64.safetensors", R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
                std::string(8, '\0'));
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.entry("x").dtype, "F64");
  try {
    f.load("x");
    ADD_FAILURE() << "load of F64 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("F64"), std::string::npos) << e.what();
  }
}

// The committed PyTorch golden data (tests/golden/make_golden.py) is readable
// and holds what the parity tests expect.
TEST(Safetensors, ReadsGoldenGptTiny) {
  std::string path = std::string(FD_SOURCE_DIR) + "/tests/golden/gpt_tiny.safetensors";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not present";
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.names().size(), 90u);
  ASSERT_TRUE(f.contains("grad.h.1.mlp.c_fc.weight"));
  EXPECT_EQ(f.shape("grad.h.1.mlp.c_fc.weight"), (Shape{24, 96}));
  EXPECT_EQ(f.shape("h.0.attn.c_attn.weight"), (Shape{24, 72}));
  EXPECT_EQ(f.shape("wte.weight"), (Shape{67, 24}));
  EXPECT_EQ(f.shape("final.wpe.weight"), (Shape{16, 24}));
  EXPECT_EQ(f.shape("out.logits"), (Shape{3, 11, 67}));
  EXPECT_EQ(f.dtype("batch.tokens"), DType::kI32);
  EXPECT_EQ(f.metadata().at("n_layer"), "2");
  EXPECT_EQ(f.metadata().at("vocab_size"), "67");

  Tensor tokens = f.load("batch.tokens");
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    EXPECT_GE(tokens.i32()[i], 0);
    EXPECT_LT(tokens.i32()[i], 67);
  }
  Tensor targets = f.load("batch.targets");
  int ignored = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) ignored += targets.i32()[i] == -1;
  EXPECT_EQ(ignored, 2);
  // At init the loss is close to ln(V); the first AdamW loss is the same forward.
  float loss = f.load("out.loss").f32()[0];
  EXPECT_NEAR(loss, std::log(67.0f), 0.05f);
  EXPECT_EQ(f.load("adamw.losses").f32()[0], loss);
  std::vector<float> losses = f.load("adamw.losses").to_vector();
  EXPECT_LT(losses.back(), losses.front());
}

}  // namespace
}  // namespace fd
