#include "lib/tensor/memory.h"

namespace fd {

std::string_view mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::kParams:
      return "params";
    case MemCategory::kFrozen:
      return "frozen";
    case MemCategory::kQuantized:
      return "quantized";
    case MemCategory::kGrads:
      return "grads";
    case MemCategory::kMaster:
      return "master";
    case MemCategory::kOptimizer:
      return "optimizer";
    case MemCategory::kActivations:
      return "activations";
    case MemCategory::kComm:
      return "comm";
    case MemCategory::kCheckpoint:
      return "checkpoint";
    case MemCategory::kOther:
      return "other";
    case MemCategory::kCount:
      break;
  }
  return "?";
}

MemoryAccountant& MemoryAccountant::global() {
  static MemoryAccountant instance;
  return instance;
}

namespace {
void raise_peak(std::atomic<int64_t>& peak, int64_t value) {
  int64_t p = peak.load();
  while (value > p && !peak.compare_exchange_weak(p, value)) {
  }
}
}  // namespace

void MemoryAccountant::add(MemCategory c, int64_t bytes) {
  raise_peak(peak_[idx(c)], current_[idx(c)] += bytes);
  raise_peak(peak_total_, total_ += bytes);
}

void MemoryAccountant::sub(MemCategory c, int64_t bytes) {
  current_[idx(c)] -= bytes;
  total_ -= bytes;
}

void MemoryAccountant::reset_peaks() {
  for (int i = 0; i < kNumMemCategories; ++i) peak_[i] = current_[i].load();
  peak_total_ = total_.load();
}

}  // namespace fd
