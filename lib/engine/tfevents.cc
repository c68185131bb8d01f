#include "lib/engine/tfevents.h"

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "lib/base/crc32c.h"
#include "lib/base/error.h"
#include "lib/base/host_name.h"

namespace fd::engine {
namespace {

namespace fs = std::filesystem;

// Protobuf wire types.
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(uint8_t(v)));
}

void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, uint64_t(field) << 3 | uint64_t(wire_type));
}

template <typename T>
void put_little_endian(std::string& out, T value) {
  // The hosts fdtrain runs on (x86-64, aarch64) are little-endian.
  static_assert(std::endian::native == std::endian::little);
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_header(std::string& out, double wall_time) {
  put_tag(out, 1, kFixed64);  // wall_time
  put_little_endian(out, wall_time);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The event file's host part: TensorBoard's (socket.gethostname()), "localhost" when unknown.
std::string event_host() {
  const std::string h = host_name();
  return h == "?" ? "localhost" : h;
}

}  // namespace

std::string encode_file_version_event(double wall_time) {
  std::string e;
  put_header(e, wall_time);
  put_bytes(e, 3, "brain.Event:2");  // file_version
  return e;
}

std::string encode_scalars_event(double wall_time, int64_t step,
                                 const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);     // Value.tag
    put_tag(v, 2, kFixed32);  // Value.simple_value
    put_little_endian(v, float(value));
    put_bytes(summary, 1, v);  // Summary.value
  }
  std::string e;
  put_header(e, wall_time);
  put_tag(e, 2, kVarint);  // step
  put_varint(e, uint64_t(step));
  put_bytes(e, 5, summary);  // summary
  return e;
}

std::string frame_tfrecord(const std::string& data) {
  std::string r;
  put_little_endian(r, uint64_t(data.size()));
  put_little_endian(r, mask_crc32c(crc32c(r.data(), 8)));
  r += data;
  put_little_endian(r, mask_crc32c(crc32c(data.data(), data.size())));
  return r;
}

EventFileWriter::EventFileWriter(const fs::path& dir) {
  const double t = now_seconds();
  const std::string base = "events.out.tfevents." + std::to_string(int64_t(t)) + "." + event_host();
  path_ = dir / base;
  std::error_code ec;
  for (int n = 1; fs::exists(path_, ec); ++n) path_ = dir / (base + "." + std::to_string(n));
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr)
    runtime_error("{}: cannot create the TensorBoard event file: {}", path_.string(),
                  std::strerror(errno));
  write_record(encode_file_version_event(t));
  flush();
}

EventFileWriter::~EventFileWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventFileWriter::add_scalars(int64_t step,
                                  const std::vector<std::pair<std::string, double>>& scalars,
                                  double wall_time) {
  write_record(encode_scalars_event(wall_time < 0 ? now_seconds() : wall_time, step, scalars));
}

void EventFileWriter::write_record(const std::string& data) {
  const std::string record = frame_tfrecord(data);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size())
    runtime_error("{}: cannot write the TensorBoard event file (disk full?)", path_.string());
}

void EventFileWriter::flush() {
  if (std::fflush(file_) != 0)
    runtime_error("{}: cannot write the TensorBoard event file: {}", path_.string(),
                  std::strerror(errno));
}

}  // namespace fd::engine
