#include "lib/data/line_reader.h"

#include <cerrno>
#include <cstring>

#include "lib/base/error.h"
#include "lib/base/input_file.h"

namespace fd::data {

namespace {
constexpr size_t kBufferBytes = size_t{1} << 20;
}

LineReader::LineReader(const std::string& path, size_t max_line_bytes)
    : path_(path), max_line_bytes_(max_line_bytes), buf_(kBufferBytes) {
  if (const std::string kind = non_regular_kind(path); !kind.empty())
    usage_error("{}: is {}, not a regular file (give the path of a .jsonl file)", path, kind);
  file_ = std::fopen(path.c_str(), "rb");
  if (file_ == nullptr) usage_error("{}: cannot open ({})", path, std::strerror(errno));
}

LineReader::~LineReader() {
  if (file_ != nullptr) std::fclose(file_);
}

bool LineReader::fill() {
  pos_ = 0;
  end_ = std::fread(buf_.data(), 1, buf_.size(), file_);
  if (end_ == 0 && std::ferror(file_))
    runtime_error("{}: read error ({})", path_, std::strerror(errno));
  return end_ > 0;
}

LineReader::Result LineReader::next(std::string& line) {
  line.clear();
  bool any = false, too_long = false;
  while (true) {
    if (pos_ == end_ && !fill()) break;  // the end: a last line without "\n"
    any = true;
    const char* begin = buf_.data() + pos_;
    const auto* nl = static_cast<const char*>(std::memchr(begin, '\n', end_ - pos_));
    const size_t n = nl != nullptr ? size_t(nl - begin) : end_ - pos_;
    if (!too_long && line.size() + n > max_line_bytes_) {
      too_long = true;
      line.clear();
      line.shrink_to_fit();
    }
    if (!too_long) line.append(begin, n);
    bytes_read_ += int64_t(n);
    pos_ += n;
    if (nl != nullptr) {
      ++pos_;
      ++bytes_read_;
      break;
    }
  }
  if (!any) return Result::kEnd;
  ++line_number_;
  return too_long ? Result::kTooLong : Result::kLine;
}

}  // namespace fd::data
