#include "lib/base/log.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <system_error>

#include "lib/base/error.h"

namespace fd::log {
namespace {

std::atomic<int> g_level{static_cast<int>(Level::kInfo)};
std::atomic<int> g_rank{-1};

// The log file and what was logged before it opened. Guarded by g_mu.
std::mutex g_mu;
std::FILE* g_file = nullptr;
bool g_buffering = true;  // until the first open_file or close_file
std::string g_early;
std::string g_status;  // the status line on the terminal, "" when none
constexpr size_t kEarlyLimit = 64 * 1024;

std::string line_of(Level l, std::string_view message) {
  const char* tag = l == Level::kWarn ? "warning: " : l == Level::kError ? "error: " : "";
  const int rank = g_rank.load();
  std::string prefix = rank > 0 ? fmt::format("fdtrain[rank {}]: ", rank) : "fdtrain: ";
  return prefix + tag + std::string(message) + "\n";
}

// "2024-05-01T12:34:56.789Z "
std::string utc_stamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z ", buf, int(ms));
}

void to_file_locked(const std::string& line) {
  std::string stamped = utc_stamp() + line;
  if (g_file != nullptr) {
    std::fputs(stamped.c_str(), g_file);
    std::fflush(g_file);
  } else if (g_buffering && g_early.size() + stamped.size() <= kEarlyLimit) {
    g_early += stamped;
  }
}

}  // namespace

void set_level(Level l) { g_level = static_cast<int>(l); }
Level level() { return static_cast<Level>(g_level.load()); }
void set_rank(int rank) { g_rank = rank; }
int rank() { return g_rank.load(); }

void write(Level l, std::string_view message) {
  const std::string line = line_of(l, message);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_rank.load() <= 0 || l >= Level::kWarn) {
    if (!g_status.empty()) std::fputs("\r\033[2K", stderr);  // erase the status line
    std::fputs(line.c_str(), stderr);
    if (!g_status.empty()) std::fputs(g_status.c_str(), stderr);
    std::fflush(stderr);
  }
  to_file_locked(line);
}

void set_status_line(std::string_view line) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (line.empty() && g_status.empty()) return;
  std::fputs("\r\033[2K", stderr);
  g_status = std::string(line);
  std::fputs(g_status.c_str(), stderr);
  std::fflush(stderr);
}

void write_file_only(Level l, std::string_view message) {
  const std::string line = line_of(l, message);
  std::lock_guard<std::mutex> lock(g_mu);
  to_file_locked(line);
}

void open_file(const std::filesystem::path& path, bool append) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::FILE* f = std::fopen(path.c_str(), append ? "a" : "w");
  if (f == nullptr)
    runtime_error("{}: cannot open the log file: {}", path.string(), std::strerror(errno));
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_file != nullptr) std::fclose(g_file);
  g_file = f;
  if (g_buffering) {
    std::fputs(g_early.c_str(), g_file);
    g_early.clear();
    g_early.shrink_to_fit();
    g_buffering = false;
  }
  std::fflush(g_file);
}

void close_file() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_file != nullptr) std::fclose(g_file);
  g_file = nullptr;
  g_buffering = false;
  g_early.clear();
}

}  // namespace fd::log
