// Shared by the PyTorch parity tests: relative error and largest elementwise
// difference of a tensor against its golden reference, and metadata access.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lib/tensor/safetensors.h"

namespace fd::golden {

struct Diff {
  double rel;      // ||ours - ref|| / ||ref||
  double max_abs;  // max |ours - ref|
};

inline Diff compare(const std::vector<float>& ours, const std::vector<float>& ref) {
  EXPECT_EQ(ours.size(), ref.size());
  double num = 0, den = 0, mx = 0;
  for (size_t i = 0; i < ours.size() && i < ref.size(); ++i) {
    double d = double(ours[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
    mx = std::max(mx, std::fabs(d));
  }
  return {std::sqrt(num) / std::max(std::sqrt(den), 1e-30), mx};
}

inline int meta_int(const SafetensorsFile& f, const char* key) {
  return std::stoi(f.metadata().at(key));
}

}  // namespace fd::golden
