// Fuzz target: a transformers bitsandbytes 4-bit model directory
// (lib/ckpt/bnb4bit.h: Bnb4bitDir over config.json and model.safetensors).
//
// Input: config.json, a NUL byte, then the bytes of model.safetensors:
//   <config json> \0 <model.safetensors>
// (no NUL: the model.safetensors written at start-up, two NF4 weights with
// double quantization, one of an odd element count, and an F32 norm). Seeds:
// tests/fuzz/make_json_seeds.py. Checked: Bnb4bitDir::open() either succeeds
// or throws fd::Error; what it opens keeps its promises: quantized() sorted
// and apart from plain(), every read() succeeds or throws fd::Error, and what
// was read, written again by write_bnb4bit_weights + bnb4bit_config_json,
// opens and reads back the same, field for field.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/ckpt/bnb4bit.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using fd::ckpt::Bnb4bitDir;
using fd::ckpt::Bnb4bitWeight;

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "bnb4bit_fuzz: %s\n", what.c_str());
  std::abort();
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Bnb4bitWeight weight(std::vector<int64_t> shape, uint8_t seed) {
  Bnb4bitWeight w;
  w.quant_type = "nf4";
  w.block_size = 32;
  w.shape = std::move(shape);
  w.dtype = "bfloat16";
  w.packed.resize(size_t((w.numel() + 1) / 2));
  for (size_t i = 0; i < w.packed.size(); ++i) w.packed[i] = uint8_t(seed + 37 * i);
  w.absmax_codes.assign(size_t(w.num_blocks()), uint8_t(200 + seed));
  for (int i = 0; i < 16; ++i) w.quant_map[size_t(i)] = -1.0f + float(i) / 7.5f;
  fd::ckpt::Bnb4bitNested n;
  n.absmax = {0.5f};
  n.offset = 0.25f;
  for (int i = 0; i < 256; ++i) n.map[size_t(i)] = -1.0f + float(i) / 127.5f;
  w.nested = n;
  return w;
}

// Writes the start-up directory; returns its model.safetensors.
std::string make_model(const std::string& dir) {
  const Bnb4bitWeight q = weight({4, 8}, 1), d = weight({3, 5}, 2);
  std::vector<float> ones = {1.0f, 1.0f, 1.0f, 1.0f};
  const fd::Tensor norm =
      fd::Tensor::from_vector(ones, fd::Shape{4}, fd::DType::kF32, fd::MemCategory::kOther);
  fd::ckpt::write_bnb4bit_weights(dir,
                                  {{"model.layers.0.self_attn.q_proj.weight", &q},
                                   {"model.layers.0.mlp.down_proj.weight", &d},
                                   {"model.norm.weight", norm}},
                                  {{"format", "pt"}}, int64_t(1) << 20);
  return read_all(dir + "/model.safetensors");
}

// memcmp, but defined for empty vectors (whose data() may be null).
bool same_bytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

void same(const Bnb4bitWeight& a, const Bnb4bitWeight& b, const std::string& name) {
  const bool eq = a.quant_type == b.quant_type && a.block_size == b.block_size &&
                  a.shape == b.shape && a.dtype == b.dtype && a.packed == b.packed &&
                  a.absmax_codes == b.absmax_codes && a.absmax.size() == b.absmax.size() &&
                  same_bytes(a.absmax.data(), b.absmax.data(), 4 * a.absmax.size()) &&
                  same_bytes(a.quant_map.data(), b.quant_map.data(), 4 * 16) &&
                  a.nested.has_value() == b.nested.has_value() &&
                  (!a.nested || (a.nested->absmax.size() == b.nested->absmax.size() &&
                                 same_bytes(a.nested->absmax.data(), b.nested->absmax.data(),
                                            4 * a.nested->absmax.size()) &&
                                 same_bytes(&a.nested->offset, &b.nested->offset, 4) &&
                                 same_bytes(a.nested->map.data(), b.nested->map.data(), 4 * 256)));
  if (!eq) broken("4-bit weight \"" + name + "\" reads back differently after a rewrite");
}

void check(const Bnb4bitDir& d, const std::string& again) {
  const std::vector<std::string> q = d.quantized();
  for (size_t i = 1; i < q.size(); ++i)
    if (!(q[i - 1] < q[i])) broken("quantized() not sorted and unique");
  const std::vector<std::string> plain = d.plain();
  for (const std::string& p : plain)
    if (d.is_quantized(p)) broken("\"" + p + "\" is both plain and quantized");

  std::map<std::string, Bnb4bitWeight> read;
  for (const std::string& name : q) {
    bool ok = false;
    fd::fuzz::expect_clean([&] {
      read[name] = d.read(name);
      ok = true;
    });
    if (!ok) return;  // (a NaN in an absmax: refused, nothing to rewrite)
  }
  std::vector<fd::ckpt::Bnb4bitEntry> entries;
  for (const std::string& name : plain) {
    fd::fuzz::expect_clean([&] {
      const fd::ckpt::TensorInfo info = d.weights().info(name);
      if (info.shape.numel() > (int64_t(1) << 20)) return;
      fd::Tensor t =
          fd::Tensor::empty(info.shape, info.dtype, fd::MemCategory::kOther, fd::Device::cpu());
      d.weights().read(name, t);
      entries.emplace_back(name, t);
    });
  }
  for (const auto& [name, w] : read) entries.emplace_back(name, &w);
  // Anything open() and read() accepted must be writable and read back the same.
  try {
    std::error_code ec;
    std::filesystem::remove_all(again, ec);
    fd::ckpt::write_bnb4bit_weights(again, entries, d.weights().metadata(), int64_t(1) << 30);
    fd::fuzz::write_file(again + "/config.json",
                         fd::ckpt::bnb4bit_config_json(d.model_config_json(), d.config()));
    const Bnb4bitDir back = Bnb4bitDir::open(again);
    if (back.quantized() != q) broken("a rewrite lists other 4-bit weights");
    for (const auto& [name, w] : read) same(back.read(name), w, name);
  } catch (const fd::Error& e) {
    broken(std::string("an accepted directory, written again, was refused: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = fd::fuzz::scratch_dir() + "/model";
  static const std::string again = fd::fuzz::scratch_dir() + "/again";
  static const std::string model = make_model(dir);
  const std::string_view in = fd::fuzz::as_view(data, size);
  const size_t nul = in.find('\0');
  fd::fuzz::write_file(dir + "/config.json", in.substr(0, nul));
  fd::fuzz::write_file(dir + "/model.safetensors", nul == std::string_view::npos
                                                       ? std::string_view(model)
                                                       : in.substr(nul + 1));
  try {
    const Bnb4bitDir d = Bnb4bitDir::open(dir);
    check(d, again);
  } catch (const fd::Error& e) {
    if (std::getenv("FDFUZZ_VERBOSE")) std::fprintf(stderr, "fd::Error: %s\n", e.what());
  }
  return 0;
}
