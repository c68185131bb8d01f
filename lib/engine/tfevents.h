// EventFileWriter: scalar summaries as a TensorBoard event file,
// RUN/events.out.tfevents.<unix time>.<host>, so `tensorboard --logdir RUN`
// (or a parent of several runs) plots a run's metrics.
//
// The file is a sequence of TFRecords, each
//   uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
// (little-endian; masking: crc32c.h), whose data is one serialized
// tensorflow.Event protobuf. Only the fields TensorBoard needs for scalars are
// written, encoded by hand (no protobuf dependency):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//             Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2"; each later one the
// scalars of one step.
//
// Records are buffered by stdio; flush() puts them on disk (the trainer
// flushes at every log interval). Not thread-safe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace fd::engine {

class EventFileWriter {
 public:
  // Creates DIR/events.out.tfevents.<unix seconds>.<host name> (".N" appended
  // if that name is taken) and writes the file_version record. Throws
  // fd::Error (runtime) if the file cannot be created.
  explicit EventFileWriter(const std::filesystem::path& dir);
  // Flushes and closes the file.
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  const std::filesystem::path& path() const { return path_; }

  // One event at `step` with one simple_value per (tag, value); values are
  // stored as float32, as TensorBoard's simple_value is. wall_time: seconds
  // since the Unix epoch; < 0 means now.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
                   double wall_time = -1.0);
  // Puts every record written so far on disk. Throws fd::Error (runtime) when
  // a write failed (disk full).
  void flush();

 private:
  void write_record(const std::string& data);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

// The serialized Event protobufs, exposed for tests.
std::string encode_file_version_event(double wall_time);
std::string encode_scalars_event(double wall_time, int64_t step,
                                 const std::vector<std::pair<std::string, double>>& scalars);
// One TFRecord around `data` (length, masked CRCs).
std::string frame_tfrecord(const std::string& data);

}  // namespace fd::engine
