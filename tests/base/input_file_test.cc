// lib/base/input_file.h: what a reader of user files refuses, and how.
#include "lib/base/input_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>

#include "lib/base/error.h"

namespace fd {
namespace {

namespace fs = std::filesystem;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

class InputFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fd_input_file_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  fs::path dir_;
};

TEST_F(InputFile, ReadsARegularFile) {
  EXPECT_EQ(read_input_file(write("a.json", "{\"a\": 1}"), "config"), "{\"a\": 1}");
  EXPECT_EQ(read_input_file(write("empty", ""), "config"), "");
}

TEST_F(InputFile, RefusesWhatIsNotARegularFile) {
  const std::string d = message_of([&] { read_input_file(dir_.string(), "--messages"); });
  EXPECT_NE(d.find("is a directory, not a regular file"), std::string::npos) << d;
  EXPECT_NE(d.find("--messages"), std::string::npos) << d;
  const std::string z = message_of([&] { read_input_file("/dev/zero", "--messages"); });
  EXPECT_NE(z.find("is a character device"), std::string::npos) << z;
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Never opened: opening a FIFO with no writer would block.
  const std::string f = message_of([&] { read_input_file(fifo, "model.safetensors"); });
  EXPECT_NE(f.find("is a FIFO"), std::string::npos) << f;
  const std::string m = message_of([&] { read_input_file((dir_ / "nope").string(), "config"); });
  EXPECT_NE(m.find("no such file"), std::string::npos) << m;
}

TEST_F(InputFile, RefusesAFileOverTheCap) {
  const std::string p = write("big", std::string(1000, 'x'));
  EXPECT_EQ(read_input_file(p, "x", 1000).size(), 1000u);
  const std::string m = message_of([&] { read_input_file(p, "config.json", 999); });
  EXPECT_NE(m.find("more than the 999 bytes"), std::string::npos) << m;
}

TEST(JsonInput, DepthIsCountedOutsideStrings) {
  EXPECT_EQ(json_nesting_depth("{\"a\": [1, {\"b\": []}]}", 100), 4);
  EXPECT_EQ(json_nesting_depth("\"[[[[\\\"[[[\"", 100), 0);
  EXPECT_EQ(json_nesting_depth(std::string(100000, '['), 10), 11);  // stops past the limit
}

TEST(JsonInput, RefusesDeepNestingBeforeParsing) {
  std::string deep = std::string(50000, '[') + std::string(50000, ']');
  const std::string m = message_of([&] { parse_json_input(deep, "tokenizer.json"); });
  EXPECT_NE(m.find("tokenizer.json: arrays and objects nested deeper than 128"),
            std::string::npos)
      << m;
  std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_NO_THROW(parse_json_input(ok, "x"));
}

TEST(JsonInput, SyntaxErrorsNameLineAndColumn) {
  const std::string m = message_of([&] { parse_json_input("{\n  \"a\": 1,\n  }", "c.json"); });
  EXPECT_NE(m.find("c.json: line 3, column 3: not valid JSON"), std::string::npos) << m;
  const std::string big = message_of([&] { parse_json_input("{\"rope_theta\": 1e999}", "c.json"); });
  EXPECT_NE(big.find("c.json: not valid JSON"), std::string::npos) << big;
  EXPECT_EQ(big.find("json.exception"), std::string::npos) << big;
}

}  // namespace
}  // namespace fd
