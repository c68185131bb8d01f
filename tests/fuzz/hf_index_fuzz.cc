// Fuzz target: the sharded weights of a Hugging Face model directory
// (lib/ckpt/hf_dir.h: HfWeights over model.safetensors.index.json).
//
// Input: model.safetensors.index.json, a NUL byte, then the bytes of its
// second shard:
//   <index json> \0 <model-00002-of-00002.safetensors>
// (no NUL: the second shard is the one written at start-up). The scratch
// model directory holds two shards written once by write_hf_weights (four
// small F32, BF16 and F16 tensors, named as a Llama's); the seeds are that
// index and its variants (tests/fuzz/make_json_seeds.py). Checked:
// HfWeights::open() either succeeds or throws fd::Error, and what it opens
// keeps its promises: names sorted and unique, every name's info() and reads
// (whole, by rows, by range, into F32 and into its own dtype) succeed or
// throw fd::Error, and a read into the file's dtype gives the same values as
// one into F32.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/ckpt/hf_dir.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "hf_index_fuzz: %s\n", what.c_str());
  std::abort();
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Writes the model once: two shards and the index (kept as the default
// second shard's bytes).
std::string make_model(const std::string& dir) {
  using fd::DType;
  using fd::Shape;
  auto t = [](Shape s, DType d, float base) {
    std::vector<float> v(static_cast<size_t>(s.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = base + 0.25f * static_cast<float>(i);
    return fd::Tensor::from_vector(v, s, DType::kF32, fd::MemCategory::kOther).to(d);
  };
  // 48 + 18 bytes in the first shard, 6 + 48 in the second (max 70 bytes a shard).
  fd::ckpt::write_hf_weights(
      dir,
      {{"model.embed_tokens.weight", t(Shape{4, 3}, DType::kF32, 1)},
       {"model.layers.0.self_attn.q_proj.weight", t(Shape{3, 3}, DType::kBF16, -2)},
       {"model.norm.weight", t(Shape{3}, DType::kF16, 0.5)},
       {"lm_head.weight", t(Shape{4, 3}, DType::kF32, 3)}},
      {{"format", "pt"}}, 70);
  if (!std::filesystem::exists(dir + "/model-00002-of-00002.safetensors"))
    broken("the start-up model has no second shard");
  return read_all(dir + "/model-00002-of-00002.safetensors");
}

void check_equal(const fd::Tensor& a, const fd::Tensor& b, const std::string& name) {
  const fd::Tensor fa = a.to(fd::DType::kF32, fd::MemCategory::kOther);
  const fd::Tensor fb = b.to(fd::DType::kF32, fd::MemCategory::kOther);
  if (fa.numel() != fb.numel() ||
      std::memcmp(fa.raw(), fb.raw(), static_cast<size_t>(fa.numel()) * sizeof(float)) != 0)
    broken("tensor \"" + name + "\" reads differently into F32 and into its own dtype");
}

void check(const fd::ckpt::HfWeights& w) {
  const std::vector<std::string> names = w.names();
  for (size_t i = 1; i < names.size(); ++i)
    if (!(names[i - 1] < names[i])) broken("names() not sorted and unique");
  (void)w.metadata();
  for (const std::string& name : names) {
    if (!w.contains(name)) broken("names() lists \"" + name + "\", contains() does not");
    fd::fuzz::expect_clean([&] {
      const fd::ckpt::TensorInfo info = w.info(name);
      const int64_t n = info.shape.numel();
      if (n < 0 || n > (int64_t(1) << 20)) return;  // real but large: not read here
      const fd::Tensor f32 = fd::Tensor::empty(info.shape, fd::DType::kF32, fd::MemCategory::kOther,
                                               fd::Device::cpu());
      w.read(name, f32);
      const fd::Tensor own =
          fd::Tensor::empty(info.shape, info.dtype, fd::MemCategory::kOther, fd::Device::cpu());
      w.read(name, own);
      check_equal(f32, own, name);
      if (info.shape.ndim() == 2 && info.shape[0] > 0) {
        const int64_t rows = (info.shape[0] + 1) / 2, row0 = info.shape[0] - rows;
        const fd::Tensor part = fd::Tensor::empty(fd::Shape{rows, info.shape[1]}, fd::DType::kF32,
                                                  fd::MemCategory::kOther, fd::Device::cpu());
        w.read_rows(name, row0, rows, part);
      }
      const int64_t count = n / 2;
      const fd::Tensor range = fd::Tensor::empty(fd::Shape{count}, fd::DType::kF32,
                                                 fd::MemCategory::kOther, fd::Device::cpu());
      w.read_range(name, n - count, count, range);
    });
    // Out-of-range requests are refused, never read.
    fd::fuzz::expect_clean([&] {
      const fd::Tensor one = fd::Tensor::empty(fd::Shape{1}, fd::DType::kF32,
                                               fd::MemCategory::kOther, fd::Device::cpu());
      w.read_range(name, INT64_MAX, 1, one);
      broken("read_range at INT64_MAX of \"" + name + "\" succeeded");
    });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = fd::fuzz::scratch_dir() + "/model";
  static const std::string shard2 = make_model(dir);
  const std::string_view in = fd::fuzz::as_view(data, size);
  const size_t nul = in.find('\0');
  fd::fuzz::write_file(dir + "/" + fd::ckpt::kHfIndexFile, in.substr(0, nul));
  fd::fuzz::write_file(dir + "/model-00002-of-00002.safetensors", nul == std::string_view::npos
                                                                      ? std::string_view(shard2)
                                                                      : in.substr(nul + 1));
  fd::fuzz::expect_clean([&] { check(fd::ckpt::HfWeights::open(dir)); });
  return 0;
}
