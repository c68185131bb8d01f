// assemble() and assemble_for_inference(): the recipe's model.quantize reaches the Assembly
// as lib/quant's options (Assembly::quantize), and its absence as none.
#include "lib/engine/assemble.h"

#include <gtest/gtest.h>

#include "lib/base/error.h"

namespace fd::engine {
namespace {

config::Recipe lora_recipe() {
  config::Recipe r;
  r.lora = config::LoraOptions{};
  r.steps = 1;
  return r;
}

TEST(Assemble, WithoutModelQuantizeTheBaseIsNotQuantized) {
  const config::Recipe r = lora_recipe();
  EXPECT_FALSE(assemble(r, 1).quantize.has_value());
  EXPECT_FALSE(assemble_for_inference(r).quantize.has_value());
}

// Both assemblies' quantize equals {type, block_size, double_quant}.
void expect_quantize(const config::Recipe& r, quant::QuantType type, int64_t block_size,
                     bool double_quant) {
  const std::optional<quant::QuantOptions> got[] = {assemble(r, 2).quantize,
                                                    assemble_for_inference(r).quantize};
  for (const std::optional<quant::QuantOptions>& q : got) {
    ASSERT_TRUE(q.has_value());
    EXPECT_EQ(q->type, type);
    EXPECT_EQ(q->block_size, block_size);
    EXPECT_EQ(q->double_quant, double_quant);
  }
}

TEST(Assemble, ModelQuantizeBecomesQuantOptions) {
  config::Recipe r = lora_recipe();
  r.model.quantize = config::QuantizeOptions{};  // bitsandbytes' defaults: nf4, 64, double quant
  expect_quantize(r, quant::QuantType::kNF4, 64, true);
  r.model.quantize = config::QuantizeOptions{config::QuantTypeName::kFp4, 4096, false};
  expect_quantize(r, quant::QuantType::kFP4, 4096, false);
  // A size the loader would refuse, in a Recipe built in code, is refused here too.
  r.model.quantize->block_size = 100;
  EXPECT_THROW(assemble(r, 1), Error);
}

}  // namespace
}  // namespace fd::engine
