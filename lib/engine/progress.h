// Progress: the one-line status rank 0 shows on a terminal while training
// ("step 120/500 | loss 2.3141 | 5,210 tok/s | ETA 1m12s"), redrawn in place.
// Disabled when stderr is not a TTY or the user passed --no-progress.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace fd::engine {

class Progress {
 public:
  // enabled: draw when stderr is a terminal; force: draw even when it is not
  // (under mpirun, whose output forwarding hides the terminal from ranks).
  Progress(bool enabled, int64_t total_steps, bool force = false);
  ~Progress();
  bool enabled() const { return enabled_; }
  // Redraws the line after `step` (1-based count of finished steps).
  void update(int64_t step, double loss, double tokens_per_s, double eta_s);
  // Ends the line so that later output starts on a fresh one.
  void finish();

 private:
  bool enabled_;
  int64_t total_;
  bool drawn_ = false;
  std::string last_line_;
  std::chrono::steady_clock::time_point last_draw_{};
};

// "1h02m", "3m05s", "42s"
std::string format_duration(double seconds);

}  // namespace fd::engine
