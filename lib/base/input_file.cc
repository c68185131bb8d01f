#include "lib/base/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lib/base/error.h"
#include "lib/base/file_type.h"

namespace fd {

std::string non_regular_kind(const std::string& path) {
  const std::string kind = describe_file_type(path);
  return kind == "a regular file" ? std::string() : kind;
}

std::string read_input_file(const std::string& path, std::string_view what, int64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    usage_error("{} {}: {} (check the path)", what, path,
                errno == ENOENT ? "no such file" : std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    usage_error("{} {}: is {}, not a regular file (give the path of the file itself)", what, path,
                describe_file_type(path));
  if (st.st_size > max_bytes)
    usage_error("{} {}: {} bytes, more than the {} bytes such a file may have", what, path,
                int64_t(st.st_size), max_bytes);
  // O_NONBLOCK: a file swapped for a FIFO after the stat must not block the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) usage_error("{} {}: cannot open ({})", what, path, std::strerror(errno));
  std::string out;
  out.resize(size_t(st.st_size));
  size_t got = 0;
  // Read one byte past the size seen: a file that grew (or a special file)
  // is refused at the cap, not read without end.
  for (;;) {
    if (got == out.size()) {
      if (int64_t(out.size()) > max_bytes) break;
      out.resize(std::min<size_t>(out.size() * 2 + 4096, size_t(max_bytes) + 1));
    }
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      usage_error("{} {}: cannot read ({})", what, path, std::strerror(e));
    }
    if (n == 0) break;
    got += size_t(n);
  }
  ::close(fd);
  if (int64_t(got) > max_bytes)
    usage_error("{} {}: more than the {} bytes such a file may have", what, path, max_bytes);
  out.resize(got);
  return out;
}

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
  return deepest;
}

namespace {

// 1-based line and column (in characters) of byte `at`.
std::pair<size_t, size_t> line_column(std::string_view text, size_t at) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < at && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      ++col;
    }
  }
  return {line, col};
}

std::string too_deep(int max_depth) {
  return fmt::format(
      "arrays and objects nested deeper than {} levels (no real file nests so deep; the file "
      "is damaged or not what it should be)",
      max_depth);
}

template <class Json>
std::string try_parse(std::string_view text, Json& out, int max_depth) {
  if (json_nesting_depth(text, max_depth) > max_depth) return too_deep(max_depth);
  try {
    out = Json::parse(text);
    return "";
  } catch (const nlohmann::json::parse_error& e) {
    const size_t at = e.byte == 0 ? 0 : std::min<size_t>(e.byte - 1, text.size());
    const auto [line, col] = line_column(text, at);
    std::string what = e.what();
    if (const size_t p = what.find("syntax error"); p != std::string::npos) what = what.substr(p);
    return fmt::format("line {}, column {}: not valid JSON: {}", line, col, what);
  } catch (const nlohmann::json::exception& e) {
    // Numbers out of double's range (1e999) and invalid UTF-8 escapes.
    std::string what = e.what();
    if (const size_t p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    return fmt::format("not valid JSON: {}", what);
  }
}

}  // namespace

std::string try_parse_json(std::string_view text, nlohmann::json& out, int max_depth) {
  return try_parse(text, out, max_depth);
}

std::string try_parse_json(std::string_view text, nlohmann::ordered_json& out, int max_depth) {
  return try_parse(text, out, max_depth);
}

nlohmann::json parse_json_input(std::string_view text, const std::string& where, int max_depth) {
  nlohmann::json j;
  const std::string err = try_parse_json(text, j, max_depth);
  if (!err.empty()) usage_error("{}: {}", where, err);
  return j;
}

nlohmann::json read_json_file(const std::string& path, std::string_view what, int64_t max_bytes,
                              int max_depth) {
  const std::string text = read_input_file(path, what, max_bytes);
  nlohmann::json j;
  const std::string err = try_parse_json(text, j, max_depth);
  if (!err.empty()) usage_error("{} {}: {}", what, path, err);
  return j;
}

}  // namespace fd
