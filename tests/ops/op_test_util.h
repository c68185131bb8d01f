// Helpers for the op tests: float64 reference values, central finite
// differences of sum(R * f(inputs)), and comparisons that print the relative
// error and the largest elementwise difference of every checked tensor.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/tensor/tensor.h"

namespace fd::ops::testing {

using Vec = std::vector<double>;
// A float64 reference forward: the op's inputs (flattened) -> its output (flattened).
using RefFn = std::function<Vec(const std::vector<Vec>&)>;

inline Vec randn(int64_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<double> dist(0.0, scale);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return v;
}

// A tensor holding `v` rounded to `dtype`.
inline Tensor make_tensor(const Vec& v, const Shape& shape, DType dtype) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_vector(f, shape, dtype);
}

// The tensor's stored values, exactly, as doubles.
inline Vec values(const Tensor& t) {
  std::vector<float> f = t.to_vector();
  return Vec(f.begin(), f.end());
}

// `v` rounded to `dtype` (what the op actually sees as input).
inline Vec rounded(const Vec& v, DType dtype) {
  return values(make_tensor(v, Shape{int64_t(v.size())}, dtype));
}

// float64 references of a linear head on inputs {h (R, C), w (V, C)} with per-row targets
// (`ignore`: a row without one). token_logps_reference: each row's log softmax(h_r @ w^T)[t_r],
// 0 for ignored rows (R values); linear_cross_entropy_reference: the mean of -log p over the
// rows with a target, 0 if none (one value).
inline RefFn token_logps_reference(int64_t R, int64_t C, int64_t V,
                                   const std::vector<float>& targets, int ignore) {
  return [=](const std::vector<Vec>& in) {
    Vec out(size_t(R), 0.0);
    for (int64_t r = 0; r < R; ++r) {
      if (int(targets[size_t(r)]) == ignore) continue;
      Vec x(size_t(V), 0.0);
      for (int64_t v = 0; v < V; ++v)
        for (int64_t c = 0; c < C; ++c)
          x[size_t(v)] += in[0][size_t(r * C + c)] * in[1][size_t(v * C + c)];
      double m = -INFINITY, z = 0;
      for (double xv : x) m = std::max(m, xv);
      for (double xv : x) z += std::exp(xv - m);
      out[size_t(r)] = x[size_t(targets[size_t(r)])] - m - std::log(z);
    }
    return out;
  };
}
inline RefFn linear_cross_entropy_reference(int64_t R, int64_t C, int64_t V,
                                            const std::vector<float>& targets, int ignore) {
  const RefFn logps = token_logps_reference(R, C, V, targets, ignore);
  return [=](const std::vector<Vec>& in) {
    const Vec lp = logps(in);
    double total = 0;
    int count = 0;
    for (int64_t r = 0; r < R; ++r) {
      if (int(targets[size_t(r)]) == ignore) continue;
      total -= lp[size_t(r)];
      ++count;
    }
    return Vec{count ? total / count : 0.0};
  };
}

// Central differences, in float64, of L = sum(R * f(inputs)) with respect to inputs[k].
inline Vec fd_grad(const RefFn& f, std::vector<Vec> inputs, size_t k, const Vec& R,
                   double h = 1e-6) {
  auto loss = [&] {
    Vec y = f(inputs);
    double s = 0.0;
    for (size_t i = 0; i < y.size(); ++i) s += R[i] * y[i];
    return s;
  };
  Vec g(inputs[k].size());
  for (size_t i = 0; i < g.size(); ++i) {
    const double x0 = inputs[k][i];
    inputs[k][i] = x0 + h;
    const double lp = loss();
    inputs[k][i] = x0 - h;
    const double lm = loss();
    inputs[k][i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// ||got - ref|| / ||ref|| (or the plain norm when ref is 0); prints it with the largest
// elementwise difference and expects it to be at most `tol`.
inline double expect_close(const std::string& name, const Vec& got, const Vec& ref, double tol) {
  EXPECT_EQ(got.size(), ref.size()) << name;
  double diff2 = 0, ref2 = 0, max_diff = 0;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    const double d = got[i] - ref[i];
    diff2 += d * d;
    ref2 += ref[i] * ref[i];
    max_diff = std::max(max_diff, std::isnan(d) ? INFINITY : std::abs(d));
  }
  const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  std::printf("  %-40s rel err %.3e  max diff %.3e  (tol %.0e)\n", name.c_str(), rel, max_diff,
              tol);
  EXPECT_LE(rel, tol) << name << " max diff " << max_diff;
  return rel;
}

// Puts R (in the output's dtype) into y's gradient and runs the tape backward.
inline void backward_with(autograd::Tape& tape, const autograd::Variable& y, const Vec& R) {
  y.slot()->ensure_grad().copy_from(make_tensor(R, y.shape(), y.dtype()));
  tape.run_backward();
}

inline double tol_for(DType dt) {
  switch (dt) {
    case DType::kF32:
      return 1e-4;
    case DType::kF16:
      return 1e-2;
    default:
      return 2e-2;
  }
}

inline const char* name_of(DType dt) {
  return dt == DType::kF32 ? "f32" : dt == DType::kBF16 ? "bf16" : "f16";
}

}  // namespace fd::ops::testing
