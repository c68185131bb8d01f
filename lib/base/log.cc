#include "lib/base/log.h"

#include <atomic>
#include <cstdio>

namespace fd::log {
namespace {
std::atomic<int> g_level{static_cast<int>(Level::kInfo)};
std::atomic<int> g_rank{-1};
}  // namespace

void set_level(Level l) { g_level = static_cast<int>(l); }
Level level() { return static_cast<Level>(g_level.load()); }
void set_rank(int rank) { g_rank = rank; }

void write(Level l, std::string_view message) {
  const char* tag = l == Level::kWarn ? "warning: " : l == Level::kError ? "error: " : "";
  int rank = g_rank.load();
  if (rank >= 0) {
    std::fprintf(stderr, "fdtrain[rank %d]: %s%.*s\n", rank, tag, static_cast<int>(message.size()),
                 message.data());
  } else {
    std::fprintf(stderr, "fdtrain: %s%.*s\n", tag, static_cast<int>(message.size()),
                 message.data());
  }
}

}  // namespace fd::log
