#include "lib/engine/progress.h"

#include "lib/base/log.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

namespace fd::engine {

Progress::Progress(bool enabled, int64_t total_steps, bool force)
    : enabled_(enabled && (force || isatty(fileno(stderr)))), total_(total_steps) {}

Progress::~Progress() { finish(); }

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  auto total = int64_t(s + 0.5);
  if (total >= 3600) return fmt::format("{}h{:02d}m", total / 3600, (total % 3600) / 60);
  if (total >= 60) return fmt::format("{}m{:02d}s", total / 60, total % 60);
  return fmt::format("{}s", total);
}

void Progress::update(int64_t step, double loss, double tokens_per_s, double eta_s) {
  if (!enabled_) return;
  // At most about 10 redraws a second (tiny models run thousands of steps a second).
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && step != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  std::string line = fmt::format("step {}/{} | loss {:.4f} | {:.0f} tok/s | ETA {}", step, total_,
                                 loss, tokens_per_s, format_duration(eta_s));
  log::set_status_line(line);
  last_line_ = line;
  drawn_ = true;
}

void Progress::finish() {
  if (enabled_ && drawn_) {
    // The final state stays on screen, as its own line.
    log::set_status_line("");
    std::fprintf(stderr, "%s\n", last_line_.c_str());
    std::fflush(stderr);
    drawn_ = false;
  }
}

}  // namespace fd::engine
