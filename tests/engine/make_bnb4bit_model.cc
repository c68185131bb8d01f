// make_bnb4bit_model DIR [--twin TWIN_DIR] [--type nf4|fp4] [--block-size N]
//                        [--double-quant 0|1] [--seed N] [--max-shard-bytes N]
//
// Writes the tiny Llama 4-bit directory of tests/engine/bnb4bit_model_fixture.h
// into DIR (and its dequantized fp32 twin into TWIN_DIR; --max-shard-bytes
// splits DIR's weights into shards of at most N bytes), for shell tests
// (tests/cli/*.sh find it beside fdtrain: $(dirname "$FDTRAIN")/make_bnb4bit_model).
// Exit 0 on success, 2 with a message on a bad argument.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "lib/base/error.h"
#include "tests/engine/bnb4bit_model_fixture.h"

int main(int argc, char** argv) {
  using namespace fd;
  auto usage = [] {
    std::fprintf(stderr,
                 "usage: make_bnb4bit_model DIR [--twin TWIN_DIR] [--type nf4|fp4] "
                 "[--block-size N] [--double-quant 0|1] [--seed N] [--max-shard-bytes N]\n");
    return 2;
  };
  std::string dir, twin;
  quant::QuantOptions o;
  uint32_t seed = 0;
  int64_t max_shard_bytes = int64_t(1) << 30;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) == 0 && i + 1 >= argc) return usage();
    if (a == "--twin") {
      twin = argv[++i];
    } else if (a == "--type") {
      const std::string t = argv[++i];
      if (t != "nf4" && t != "fp4") return usage();
      o.type = t == "nf4" ? quant::QuantType::kNF4 : quant::QuantType::kFP4;
    } else if (a == "--block-size") {
      o.block_size = std::atoll(argv[++i]);
    } else if (a == "--double-quant") {
      o.double_quant = std::string(argv[++i]) != "0";
    } else if (a == "--max-shard-bytes") {
      max_shard_bytes = std::atoll(argv[++i]);
      if (max_shard_bytes <= 0) return usage();
    } else if (a == "--seed") {
      seed = uint32_t(std::strtoul(argv[++i], nullptr, 10));
    } else if (dir.empty() && a.rfind("--", 0) != 0) {
      dir = a;
    } else {
      return usage();
    }
  }
  if (dir.empty()) return usage();
  try {
    engine::testing::make_bnb4bit_model(dir, twin, o, seed, max_shard_bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_bnb4bit_model: %s\n", e.what());
    return 2;
  }
  return 0;
}
