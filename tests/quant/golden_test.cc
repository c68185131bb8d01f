// lib/quant against committed golden data from an independent NumPy re-derivation of
// bitsandbytes' CUDA 4-bit quantization (scripts/make_quant_golden.py): the tables, and for
// NF4 and FP4, block sizes 64 and 128, with and without double quantization, on ties at every
// threshold, zeros and an all-zero block, subnormals, negative values with a partial last
// block, normal weights, and (double quantization over two nested blocks) a long stream. Codes,
// absmax, nested statistics and dequantized values are compared bit for bit, both ways: our
// quantize against the golden codes, and our dequantize of the golden codes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "lib/base/sha256.h"
#include "lib/quant/quantize.h"
#include "lib/quant/tables.h"

namespace fd::quant {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kGolden = fs::path(FD_SOURCE_DIR) / "tests/quant/golden";

json load(const fs::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << p;
  return json::parse(in);
}

std::vector<uint8_t> unhex(const std::string& s) {
  std::vector<uint8_t> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = uint8_t(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return out;
}

template <typename T>
std::vector<T> unhex_as(const std::string& s) {
  std::vector<uint8_t> b = unhex(s);
  std::vector<T> out(b.size() / sizeof(T));
  std::memcpy(out.data(), b.data(), out.size() * sizeof(T));
  return out;
}

template <typename T>
std::string sha256_of(const std::vector<T>& v) {
  Sha256 h;
  h.update(v.data(), v.size() * sizeof(T));
  return h.hex_digest();
}

// Bit-for-bit equality of float arrays; reports the first difference.
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    ASSERT_EQ(a, b) << what << " [" << i << "]: got " << got[i] << " want " << want[i];
  }
}

template <typename T>
void expect_same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << what << " [" << i << "]";
  }
}

// xorshift32 inputs, as make_quant_golden.py's hash_input builds them.
std::vector<float> hash_input(const json& spec) {
  const int64_t n = spec["n"];
  uint32_t h = spec["seed"];
  const int scale_exp = spec["scale_exp"];
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    h ^= h << 13;
    h ^= h >> 17;
    h ^= h << 5;
    out[i] = float(std::ldexp(double(int64_t(h >> 8) - (int64_t(1) << 23)), scale_exp - 23));
  }
  const int64_t tail = spec["scale_tail_from"];
  const float by = float(spec["scale_tail_by"].get<double>());
  for (int64_t i = tail; i < n; ++i) out[i] = out[i] * by;
  return out;
}

TEST(QuantTables, MatchGolden) {
  const json t = load(kGolden / "tables.json");
  auto as_vec = [](const auto& a) { return std::vector<float>(a.begin(), a.end()); };
  expect_same_bits(as_vec(code_values(QuantType::kNF4)), unhex_as<float>(t["nf4_lut"]), "nf4");
  // The FP4 lookup is by the 3 low bits, the sign from bit 3.
  std::vector<float> fp4 = unhex_as<float>(t["fp4_lut"]);
  std::vector<float> fp4_signed(16);
  for (int c = 0; c < 16; ++c) fp4_signed[c] = c & 8 ? -fp4[c & 7] : fp4[c & 7];
  expect_same_bits(as_vec(code_values(QuantType::kFP4)), fp4_signed, "fp4");
  expect_same_bits(as_vec(quant_map(QuantType::kNF4)), unhex_as<float>(t["nf4_quant_map"]),
                   "nf4 quant_map");
  expect_same_bits(as_vec(quant_map(QuantType::kFP4)), unhex_as<float>(t["fp4_quant_map"]),
                   "fp4 quant_map");
  expect_same_bits(as_vec(dynamic_map()), unhex_as<float>(t["dynamic_map"]), "dynamic map");
  // The saved quant_map and the kernels' lookup agree, -0.0 included.
  expect_same_bits(as_vec(quant_map(QuantType::kFP4)), as_vec(code_values(QuantType::kFP4)),
                   "fp4 quant_map vs lookup");
}

// Each threshold decides between its two codes exactly at the float32 literal: x == t takes
// the lower code, the next float up the higher.
TEST(QuantTables, ThresholdsSplitAtTheirLiterals) {
  const json t = load(kGolden / "tables.json");
  int splits = 0;
  for (float th : unhex_as<float>(t["nf4_thresholds"])) {
    EXPECT_LT(quantize_nf4(th), quantize_nf4(std::nextafter(th, 2.0f))) << th;
    EXPECT_EQ(quantize_nf4(th), quantize_nf4(std::nextafter(th, -2.0f))) << th;
    ++splits;
  }
  for (float th : unhex_as<float>(t["fp4_thresholds"])) {
    EXPECT_NE(quantize_fp4(th), quantize_fp4(std::nextafter(th, 2.0f))) << th;
    EXPECT_EQ(quantize_fp4(th), quantize_fp4(std::nextafter(th, -2.0f))) << th;
    ++splits;
  }
  EXPECT_EQ(splits, 15 + 7);
  EXPECT_EQ(quantize_nf4(std::nanf("")), 0);
  EXPECT_EQ(quantize_fp4(std::nanf("")), 0);
  EXPECT_EQ(quantize_fp4(-0.0f), 0);  // the sign comes from x < 0
  EXPECT_EQ(quantize_nf4(0.0f), 7);
}

// The trees read as counts: the NF4 code is the number of thresholds below x; the FP4 code is
// the sign bit and the bit pattern of the magnitude with as many thresholds below |x|. Checked on
// every threshold and its neighbours and on random values, so a transcription slip in a tree
// (here or in the golden script, both written from dQuantizeNF4 / dQuantizeFP4) shows.
TEST(QuantTables, TreesAreThresholdCounts) {
  const json t = load(kGolden / "tables.json");
  std::vector<float> nf4 = unhex_as<float>(t["nf4_thresholds"]);
  std::vector<float> fp4 = unhex_as<float>(t["fp4_thresholds"]);
  std::sort(nf4.begin(), nf4.end());
  std::sort(fp4.begin(), fp4.end());
  // FP4 magnitudes in ascending order: 0, 0.0625, 2, 3, 4, 6, 8, 12 (/12) by their low bits.
  const uint8_t fp4_bits[8] = {0b000, 0b001, 0b110, 0b111, 0b100, 0b101, 0b010, 0b011};
  std::vector<float> xs;
  for (float th : nf4)
    xs.insert(xs.end(), {th, std::nextafter(th, 2.0f), std::nextafter(th, -2.0f)});
  for (float th : fp4) {
    for (float v : {th, std::nextafter(th, 2.0f), std::nextafter(th, -2.0f)}) {
      xs.push_back(v);
      xs.push_back(-v);
    }
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.1f, 1.1f);
  for (int i = 0; i < 100000; ++i) xs.push_back(u(rng));
  for (float x : xs) {
    const auto below = [&](const std::vector<float>& ts, float v) {
      return int(std::count_if(ts.begin(), ts.end(), [&](float th) { return v > th; }));
    };
    ASSERT_EQ(quantize_nf4(x), below(nf4, x)) << x;
    ASSERT_EQ(quantize_fp4(x), (x < 0 ? 8 : 0) + fp4_bits[below(fp4, std::fabs(x))]) << x;
  }
}

struct Case {
  fs::path path;
  json doc;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& e : fs::directory_iterator(kGolden)) {
    if (e.path().filename() == "tables.json" || e.path().extension() != ".json") continue;
    out.push_back({e.path(), load(e.path())});
  }
  std::sort(out.begin(), out.end(), [](const Case& a, const Case& b) { return a.path < b.path; });
  return out;
}

TEST(QuantGolden, AllCasesPresent) {
  // 2 types x 2 block sizes x 2 (plain, double) x 5 inputs, and a long stream per type.
  EXPECT_EQ(cases().size(), 2u * 2 * 2 * 5 + 2);
}

TEST(QuantGolden, QuantizeMatchesBitForBit) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.path.filename().string());
    const json& d = c.doc;
    const std::vector<float> input =
        d.contains("input") ? unhex_as<float>(d["input"]) : hash_input(d["input_hash"]);
    QuantOptions o;
    o.type = d["quant_type"] == "nf4" ? QuantType::kNF4 : QuantType::kFP4;
    o.block_size = d["block_size"];
    o.double_quant = d["double_quant"];
    const std::vector<int64_t> shape = d["shape"];
    const Quantized4bit q = quantize(input, shape, o, "golden");

    if (d.contains("packed")) {
      expect_same(q.packed, unhex(d["packed"]), "packed");
    } else {
      EXPECT_EQ(sha256_of(q.packed), d["packed_sha256"]);
    }
    // The block absmax before double quantization.
    QuantOptions plain = o;
    plain.double_quant = false;
    expect_same_bits(quantize(input, shape, plain, "golden").absmax, unhex_as<float>(d["absmax"]),
                     "absmax");
    if (o.double_quant) {
      ASSERT_TRUE(q.nested.has_value());
      EXPECT_TRUE(q.absmax.empty());
      const json& n = d["nested"];
      expect_same_bits({q.nested->offset}, unhex_as<float>(n["offset"]), "offset");
      expect_same(q.nested->codes, unhex(n["codes"]), "nested codes");
      expect_same_bits(q.nested->absmax, unhex_as<float>(n["absmax"]), "nested absmax");
      expect_same_bits(block_absmax(q), unhex_as<float>(n["dequantized_absmax"]),
                       "dequantized absmax");
    } else {
      EXPECT_FALSE(q.nested.has_value());
    }

    const std::vector<float> deq = dequantize(q);
    const Tensor bf16 = dequantize(q, DType::kBF16);
    std::vector<uint16_t> deq_bf16(bf16.data<uint16_t>(), bf16.data<uint16_t>() + bf16.numel());
    if (d.contains("dequant_f32")) {
      expect_same_bits(deq, unhex_as<float>(d["dequant_f32"]), "dequantized f32");
      expect_same(deq_bf16, unhex_as<uint16_t>(d["dequant_bf16"]), "dequantized bf16");
    } else {
      EXPECT_EQ(sha256_of(deq), d["dequant_f32_sha256"]);
      EXPECT_EQ(sha256_of(deq_bf16), d["dequant_bf16_sha256"]);
    }
  }
}

// Dequantization of the golden codes and statistics as they would be read from a file, without
// our quantizer in the loop.
TEST(QuantGolden, DequantizeGoldenCodes) {
  int checked = 0;
  for (const Case& c : cases()) {
    const json& d = c.doc;
    if (!d.contains("packed")) continue;
    SCOPED_TRACE(c.path.filename().string());
    Quantized4bit q;
    q.type = d["quant_type"] == "nf4" ? QuantType::kNF4 : QuantType::kFP4;
    q.block_size = d["block_size"];
    q.shape = d["shape"].get<std::vector<int64_t>>();
    q.packed = unhex(d["packed"]);
    if (d["double_quant"]) {
      NestedAbsmax n;
      n.codes = unhex(d["nested"]["codes"]);
      n.absmax = unhex_as<float>(d["nested"]["absmax"]);
      n.offset = unhex_as<float>(d["nested"]["offset"])[0];
      n.map = dynamic_map();
      q.nested = n;
    } else {
      q.absmax = unhex_as<float>(d["absmax"]);
    }
    expect_same_bits(dequantize(q), unhex_as<float>(d["dequant_f32"]), "dequantized f32");
    // Any range, starting at odd and even elements, gives the same values.
    const std::vector<float> all = unhex_as<float>(d["dequant_f32"]);
    const std::vector<float> absmax = block_absmax(q);
    for (int64_t begin : {int64_t(1), int64_t(63), int64_t(64), int64_t(129)}) {
      if (begin >= q.numel()) continue;
      const int64_t count = std::min<int64_t>(q.numel() - begin, 77);
      std::vector<float> part(static_cast<size_t>(count));
      dequantize_range(q, absmax, begin, count, part.data());
      expect_same_bits(part, std::vector<float>(all.begin() + begin, all.begin() + begin + count),
                       "range");
    }
    ++checked;
  }
  EXPECT_EQ(checked, 40);
}

}  // namespace
}  // namespace fd::quant
