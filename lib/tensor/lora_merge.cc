#include "lib/tensor/lora_merge.h"

#include <algorithm>
#include <vector>

#include "lib/base/check.h"

namespace fd {

void merge_lora_into(std::span<float> w, std::span<const float> a, std::span<const float> b,
                     int64_t r, int64_t in, int64_t out, double scaling, WeightLayout layout) {
  FD_CHECK(r >= 1 && in >= 0 && out >= 0 && int64_t(w.size()) == in * out &&
               int64_t(a.size()) == r * in && int64_t(b.size()) == out * r,
           "merge_lora_into: W of {} elements, A of {}, B of {} do not fit r {}, in {}, out {}",
           w.size(), a.size(), b.size(), r, in, out);
  // One row of W at a time, so the float64 delta costs a row, not a second copy of W.
  if (layout == WeightLayout::kOutIn) {  // row o of W [out, in]: sum_q B[o][q] A[q][:]
    std::vector<double> row(static_cast<size_t>(in));
    for (int64_t o = 0; o < out; ++o) {
      std::fill(row.begin(), row.end(), 0.0);
      for (int64_t q = 0; q < r; ++q) {
        const double boq = b[size_t(o * r + q)];
        const float* __restrict aq = a.data() + q * in;
        double* __restrict d = row.data();
        for (int64_t i = 0; i < in; ++i) d[i] += boq * aq[i];
      }
      float* wo = w.data() + o * in;
      for (int64_t i = 0; i < in; ++i) wo[i] = float(double(wo[i]) + scaling * row[size_t(i)]);
    }
    return;
  }
  // row k of W (in, out): sum_q A[q][k] B^T[q][:]
  std::vector<double> bt(size_t(r * out));  // B^T (r, out)
  for (int64_t j = 0; j < out; ++j)
    for (int64_t q = 0; q < r; ++q) bt[size_t(q * out + j)] = b[size_t(j * r + q)];
  std::vector<double> row(static_cast<size_t>(out));
  for (int64_t k = 0; k < in; ++k) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t q = 0; q < r; ++q) {
      const double aqk = a[size_t(q * in + k)];
      const double* __restrict bq = bt.data() + q * out;
      double* __restrict d = row.data();
      for (int64_t j = 0; j < out; ++j) d[j] += aqk * bq[j];
    }
    float* wk = w.data() + k * out;
    for (int64_t j = 0; j < out; ++j) wk[j] = float(double(wk[j]) + scaling * row[size_t(j)]);
  }
}

}  // namespace fd
