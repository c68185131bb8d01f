// EventFileWriter: byte-exact records against an independent encoding
// (tests/cli/tensorboard.sh decodes a real run's file the other way round),
// and a written file read back record by record with its CRCs checked.
#include "lib/engine/tfevents.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "lib/base/crc32c.h"

namespace fd::engine {
namespace {

namespace fs = std::filesystem;

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// Expected bytes computed with a separate Python implementation of CRC-32C,
// varints and the Event/Summary/Value wire format.
TEST(TfEvents, RecordsAreByteExact) {
  EXPECT_EQ(hex(frame_tfrecord(encode_scalars_event(1.5, 300, {{"train/loss", 2.5}}))),
            "2100000000000000017becf6"                    // length, masked CRC
            "09000000000000f83f"                          // wall_time 1.5
            "10ac02"                                      // step 300
            "2a130a110a0a747261696e2f6c6f73731500002040"  // summary{value{tag, 2.5f}}
            "b4ca3a3b");                                  // masked CRC of the data
  EXPECT_EQ(hex(frame_tfrecord(encode_file_version_event(1.5))),
            "1800000000000000a37f4b22"
            "09000000000000f83f1a0d627261696e2e4576656e743a32"  // file_version "brain.Event:2"
            "2a28646c");
}

// Reads the TFRecords of `path`, checking both CRCs of each.
std::vector<std::string> read_records(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  const std::string b = s.str();
  std::vector<std::string> out;
  size_t at = 0;
  while (at < b.size()) {
    EXPECT_LE(at + 12, b.size());
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, b.data() + at, 8);
    std::memcpy(&len_crc, b.data() + at + 8, 4);
    EXPECT_EQ(len_crc, mask_crc32c(crc32c(b.data() + at, 8)));
    EXPECT_LE(at + 12 + len + 4, b.size());
    std::string data = b.substr(at + 12, len);
    std::memcpy(&data_crc, b.data() + at + 12 + len, 4);
    EXPECT_EQ(data_crc, mask_crc32c(crc32c(data.data(), data.size())));
    out.push_back(data);
    at += 12 + len + 4;
  }
  return out;
}

TEST(TfEvents, WriterFramesEveryRecord) {
  const fs::path dir = fs::temp_directory_path() / ("fd_tfevents_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::path first, second;
  {
    EventFileWriter w(dir);
    first = w.path();
    EXPECT_EQ(first.filename().string().rfind("events.out.tfevents.", 0), 0u) << first;
    w.add_scalars(1, {{"train/loss", 5.5}, {"train/lr", 1e-3}}, 100.0);
    w.add_scalars(2, {{"train/loss", 5.25}}, 101.0);
    w.flush();
    // A second writer in the same second does not clobber the first file.
    EventFileWriter again(dir);
    second = again.path();
  }
  EXPECT_NE(first, second);
  const std::vector<std::string> records = read_records(first);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  EXPECT_EQ(records[1], encode_scalars_event(100.0, 1, {{"train/loss", 5.5}, {"train/lr", 1e-3}}));
  EXPECT_EQ(records[2], encode_scalars_event(101.0, 2, {{"train/loss", 5.25}}));
  EXPECT_EQ(read_records(second).size(), 1u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fd::engine
