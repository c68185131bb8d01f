// MemoryAccountant: the bytes a process holds, by category, current and peak.
//
// Every Storage reports its allocation here under one category, so the
// per-category peaks in summary.json can be compared with the analytic
// estimate (ZeRO paper: params, grads, master weights, optimizer moments).
// Counters are atomic; reading them while other threads allocate is safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

namespace fd {

enum class MemCategory : uint8_t {
  kParams,       // trainable parameters in the compute dtype
  kFrozen,       // frozen parameters (a LoRA base): no gradients, no optimizer state
  kQuantized,    // a 4-bit base (QLoRA): its segments' codes, statistics and norms, and the
                 // dequantization scratch of the matmul over it
  kGrads,        // parameter gradients
  kMaster,       // fp32 master weights (mixed precision)
  kOptimizer,    // optimizer state (Adam m and v)
  kActivations,  // activations, their gradients and op scratch
  kComm,         // communication buffers
  kCheckpoint,   // an asynchronous save's staging: the rank's saved state, copied at the step
                 // boundary for the writer thread (engine/checkpointing.h)
  kOther,
  kCount
};
constexpr int kNumMemCategories = static_cast<int>(MemCategory::kCount);
std::string_view mem_category_name(MemCategory c);  // "params", "grads", ...

class MemoryAccountant {
 public:
  // The process-wide accountant (one per rank).
  static MemoryAccountant& global();

  void add(MemCategory c, int64_t bytes);
  void sub(MemCategory c, int64_t bytes);
  int64_t current(MemCategory c) const { return current_[idx(c)].load(); }
  int64_t peak(MemCategory c) const { return peak_[idx(c)].load(); }
  int64_t current_total() const { return total_.load(); }
  int64_t peak_total() const { return peak_total_.load(); }
  // Sets every peak to the current value (e.g. after model construction).
  void reset_peaks();

 private:
  static int idx(MemCategory c) { return static_cast<int>(c); }
  std::array<std::atomic<int64_t>, kNumMemCategories> current_{};
  std::array<std::atomic<int64_t>, kNumMemCategories> peak_{};
  std::atomic<int64_t> total_{0};
  std::atomic<int64_t> peak_total_{0};
};

}  // namespace fd
