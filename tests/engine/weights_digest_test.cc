// weights_sha256 against SHA-256 of a buffer built here: every parameter's
// fp32 values, little-endian, in Hugging Face state_dict order.
#include "lib/engine/weights_digest.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "lib/base/sha256.h"

namespace fd::engine {
namespace {

nn::GptConfig tiny() {
  nn::GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 24;  // 1-D parameters of 24 elements leave padding in the flat buffers
  c.vocab_size = 40;
  c.max_seq_len = 8;
  return c;
}

std::vector<std::string> canonical_names(int n_layer) {
  std::vector<std::string> names = {"wte.weight", "wpe.weight"};
  for (int l = 0; l < n_layer; ++l) {
    for (const char* s :
         {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
          "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"})
      names.push_back("h." + std::to_string(l) + "." + s);
  }
  names.push_back("ln_f.weight");
  names.push_back("ln_f.bias");
  return names;
}

// The reference: bytes written explicitly least significant first.
std::string reference_digest(const nn::Decoder& m) {
  std::vector<uint8_t> bytes;
  for (const std::string& name : canonical_names(m.config().num_layers)) {
    const nn::Parameter* p = m.find(name);
    EXPECT_NE(p, nullptr) << name;
    if (p == nullptr) return "";
    for (float x : p->value.to_vector()) {
      const uint32_t u = f32_bits(x);
      for (int k = 0; k < 4; ++k) bytes.push_back(uint8_t(u >> (8 * k)));
    }
  }
  EXPECT_EQ(bytes.size(), size_t(4 * m.config().num_params()));
  Sha256 sha;
  sha.update(bytes.data(), bytes.size());
  return sha.hex_digest();
}

TEST(WeightsDigest, Sha256KnownAnswer) {  // the reference's own hash: FIPS 180-4 "abc"
  Sha256 sha;
  sha.update("abc", 3);
  EXPECT_EQ(sha.hex_digest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(WeightsDigest, EqualsSha256OfConcatenatedParameters) {
  nn::Decoder m(tiny());
  m.init_weights(11);
  const std::string d = weights_sha256(m);
  EXPECT_EQ(d.size(), 64u);
  EXPECT_EQ(d, reference_digest(m));
}

TEST(WeightsDigest, ChangesWithAnyElementAndComesBack) {
  nn::Decoder m(tiny());
  m.init_weights(11);
  const std::string d0 = weights_sha256(m);
  for (const char* name : {"wte.weight", "h.1.attn.c_attn.bias", "ln_f.bias"}) {
    const nn::Parameter* p = m.find(name);
    float* last = p->value.f32() + p->value.numel() - 1;
    const float saved = *last;
    *last = std::nextafter(saved, 1.0f);  // one ulp
    const std::string d1 = weights_sha256(m);
    EXPECT_NE(d1, d0) << name;
    EXPECT_EQ(d1, reference_digest(m)) << name;
    *last = saved;
    EXPECT_EQ(weights_sha256(m), d0) << name;
  }
}

// Padding in the flat buffers and which segment a parameter lives in do not enter it.
TEST(WeightsDigest, IgnoresPadding) {
  nn::Decoder m(tiny());
  m.init_weights(11);
  const std::string d0 = weights_sha256(m);
  int64_t poked = 0;
  for (const auto& s : m.segments()) {
    std::vector<bool> owned(size_t(s->numel()), false);
    for (const nn::Parameter& p : s->params())
      for (int64_t i = 0; i < p.value.numel(); ++i) owned[size_t(p.offset + i)] = true;
    for (size_t j = 0; j < owned.size(); ++j) {
      if (!owned[j]) {
        s->flat_params().f32()[j] = 123.0f;
        ++poked;
      }
    }
  }
  ASSERT_GT(poked, 0);
  EXPECT_EQ(weights_sha256(m), d0);
}

TEST(WeightsDigest, SameSeedSameDigestOtherSeedOther) {
  nn::Decoder a(tiny()), b(tiny()), c(tiny());
  a.init_weights(5);
  b.init_weights(5);
  c.init_weights(6);
  EXPECT_EQ(weights_sha256(a), weights_sha256(b));
  EXPECT_NE(weights_sha256(a), weights_sha256(c));
}

}  // namespace
}  // namespace fd::engine
