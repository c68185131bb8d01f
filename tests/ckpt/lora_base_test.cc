// lib/ckpt/lora_base.h: the file digest against the FIPS 180-4 examples and
// a file longer than the 1 MiB read buffer (Python's hashlib), the one-line message of a
// digest mismatch, and find_lora_base()'s three refusals: no such file
// (absolute, relative), another file.
#include "lib/ckpt/lora_base.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/ckpt/ckpt_test_util.h"

namespace fd::ckpt {
namespace {

using testing::error_of;
using testing::TempDir;

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(LoraBase, FileSha256) {
  TempDir tmp;
  write_file(tmp.path("abc"), "abc");
  EXPECT_EQ(file_sha256(tmp.path("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  write_file(tmp.path("empty"), "");
  EXPECT_EQ(file_sha256(tmp.path("empty")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  write_file(tmp.path("million"), std::string(1000000, 'a'));
  EXPECT_EQ(file_sha256(tmp.path("million")),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  write_file(tmp.path("big"), std::string((1 << 20) + 7, 'a'));  // crosses the read buffer
  EXPECT_EQ(file_sha256(tmp.path("big")),  // hashlib.sha256(b"a" * (2**20 + 7))
            "d068b86fa9718c9ef56229139facc172e9698d68c6248bd86a04857a262ae79e");
  EXPECT_NE(error_of([&] { file_sha256(tmp.path("nope")); }).find("cannot read"),
            std::string::npos);
}

TEST(LoraBase, DigestMismatchIsOneLine) {
  check_lora_base_digest("ck", "aa", "base.safetensors", "aa", "resume with the same base file");
  std::string msg = error_of([] {
    check_lora_base_digest("ck", "aa", "base.safetensors", "bb", "resume with the same base file");
  });
  EXPECT_EQ(msg,
            "ck: the checkpoint's LoRA adapters were trained on a base with SHA-256 aa, but "
            "model.init_from (base.safetensors) has bb; resume with the same base file");
  msg = error_of([] { check_lora_base_digest("ck", "aa", "", "", "do X"); });
  EXPECT_NE(msg.find("SHA-256 aa, but model.init_from (none) has (none); do X"), std::string::npos)
      << msg;
}

TEST(LoraBase, FindRefusesAMissingOrAnotherFile) {
  TempDir tmp;
  const std::string base = tmp.path("base.bin");
  write_file(base, "the base");
  const std::string sha = file_sha256(base);
  EXPECT_EQ(find_lora_base("ck", base, sha), base);
  std::string msg = error_of([&] { find_lora_base("ck", tmp.path("gone.bin"), sha); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  msg = error_of([&] { find_lora_base("ck", "no/such/relative.bin", sha); });
  EXPECT_NE(msg.find("'no/such/relative.bin'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("relative path, resolved against the directory the run was started in"),
            std::string::npos)
      << msg;
  EXPECT_NE(error_of([&] { find_lora_base("ck", "", sha); }).find("no model.init_from"),
            std::string::npos);
  write_file(base, "another base");
  msg = error_of([&] { find_lora_base("ck", base, sha); });
  EXPECT_NE(msg.find("trained on a base with SHA-256 " + sha + ", but model.init_from (" + base +
                     ") has " + file_sha256(base)),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace fd::ckpt
