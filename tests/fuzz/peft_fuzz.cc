// Fuzz target: the PEFT adapter reader (lib/ckpt/peft: read_peft_adapter).
//
// Input: adapter_config.json, a NUL byte, then adapter_model.safetensors:
//   <json> \0 <safetensors bytes>
// (JSON text holds no NUL, so the first one splits the two; with no NUL the
// whole input is the config and the model file is empty). Both are written
// into a scratch adapter directory. Checked: read_peft_adapter() either
// succeeds or throws fd::Error, and what it returns keeps its promises
// (complete A/B pairs with shapes (r, in) and (out, r), names that peft_key
// accepts); merging it into a zero base of the implied width works.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/ckpt/peft.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "peft_fuzz: read_peft_adapter returned %s\n", what.c_str());
  std::abort();
}

void check_adapter(const fd::ckpt::PeftAdapter& a) {
  if (a.tensors.empty() || a.tensors.size() % 2 != 0) broken("an odd or empty tensor list");
  for (size_t i = 0; i < a.tensors.size(); i += 2) {
    const auto& [an, at] = a.tensors[i];
    const auto& [bn, bt] = a.tensors[i + 1];
    (void)fd::ckpt::peft_key(an);  // throws fd::Error for a non-LoRA name
    (void)fd::ckpt::peft_key(bn);
    if (at.shape().ndim() != 2 || bt.shape().ndim() != 2 || at.shape()[0] != a.spec.r ||
        bt.shape()[1] != a.spec.r)
      broken("a pair with the wrong shapes: " + an + " " + at.shape().str() + ", " + bn + " " +
             bt.shape().str());
  }
  // Merge into a zero base of matching shapes when it is small.
  std::vector<std::pair<std::string, fd::Tensor>> base;
  int64_t total = 0;
  for (size_t i = 0; i < a.tensors.size(); i += 2) {
    const std::string& an = a.tensors[i].first;
    std::string weight = an.substr(0, an.find(".lora_A.")) + ".weight";
    int64_t in = a.tensors[i].second.shape()[1], out = a.tensors[i + 1].second.shape()[0];
    total += in * out;
    if (total > (int64_t(1) << 20) || total * a.spec.r > (int64_t(1) << 22)) return;
    base.emplace_back(weight, fd::Tensor::zeros(fd::Shape{in, out}, fd::DType::kF32,
                                                 fd::MemCategory::kOther));
  }
  (void)fd::ckpt::merge_lora(base, a.tensors, a.spec.alpha / a.spec.r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    std::string d = fd::fuzz::scratch_dir() + "/adapter";
    std::filesystem::create_directories(d);
    return d;
  }();
  std::string_view in = fd::fuzz::as_view(data, size);
  size_t nul = in.find('\0');
  fd::fuzz::write_file(dir + "/adapter_config.json", in.substr(0, nul));
  fd::fuzz::write_file(dir + "/adapter_model.safetensors",
                       nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1));
  fd::fuzz::expect_clean([&] { check_adapter(fd::ckpt::read_peft_adapter(dir)); });
  return 0;
}
