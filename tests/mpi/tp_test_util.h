// What the multi-rank tests of the tensor- and sequence-parallel ops share (tp_regions_test,
// vocab_parallel_test, ulysses_test): the world communicator, the groups each case runs in,
// and comparisons whose verdict and printed figure are the worst over the ranks. Each test
// binary is one translation unit; its main() hands g_comm to run_mpi_tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/dist/communicator.h"
#include "lib/dist/mesh.h"
#include "tests/ops/op_test_util.h"

namespace fd::mpi_testing {

using ops::testing::Vec;

inline dist::Communicator* g_comm = nullptr;  // the world, set by main() (run_mpi_tests)

// The groups each case runs in: the world, and at -n 4 the `axis` groups of {dp: 2, axis: 2}
// (axis "tp" or "sp": two groups of two ranks, {0, 1} and {2, 3}).
struct Groups {
  std::unique_ptr<dist::Communicator> sub;
  std::vector<dist::Communicator*> all;
};
inline Groups make_groups(const std::string& axis = "tp") {
  Groups g;
  g.all.push_back(g_comm);
  if (g_comm->size() == 4) {
    dist::Mesh mesh({{"dp", 2}, {axis, 2}});
    g.sub = mesh.group(*g_comm, {axis});
    g.all.push_back(g.sub.get());
  }
  return g;
}

// Every rank's largest `values` (a collective over the world).
inline std::vector<double> worst_over_ranks(std::vector<double> values) {
  g_comm->all_reduce_f64(values.data(), int64_t(values.size()), dist::ReduceOp::kMax);
  return values;
}

// ||got - ref|| / ||ref|| (the plain norm when ref is 0) and the largest elementwise
// difference, each the worst over the ranks (a collective over the world); printed on rank 0
// and expected <= tol.
inline void expect_close_all(const std::string& name, const Vec& got, const Vec& ref, double tol) {
  EXPECT_EQ(got.size(), ref.size()) << name;
  double diff2 = 0, ref2 = 0, max_diff = 0;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    const double d = got[i] - ref[i];
    diff2 += d * d;
    ref2 += ref[i] * ref[i];
    max_diff = std::max(max_diff, std::isnan(d) ? INFINITY : std::abs(d));
  }
  const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  const std::vector<double> worst = worst_over_ranks({rel, max_diff});
  if (g_comm->rank() == 0)
    std::printf("  %-40s rel err %.3e  max diff %.3e  (tol %.0e; worst rank)\n", name.c_str(),
                worst[0], worst[1], tol);
  EXPECT_LE(rel, tol) << name << " on rank " << g_comm->rank() << ", max diff " << max_diff;
}

// Exact: every element equal (for values exact in every dtype, or moved as raw bits).
inline void expect_exact(const std::string& name, const Vec& got, const Vec& ref) {
  ASSERT_EQ(got.size(), ref.size()) << name;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != ref[i]) {
      if (first < 0) first = int64_t(i);
      ++bad;
    }
  EXPECT_EQ(bad, 0) << name << " on rank " << g_comm->rank() << ": " << bad
                    << " elements differ, the first at " << first << " (got "
                    << (first >= 0 ? got[size_t(first)] : 0) << ", expected "
                    << (first >= 0 ? ref[size_t(first)] : 0) << ")";
}

// n values f(0), ..., f(n - 1).
inline Vec fill(int64_t n, const std::function<double(int64_t)>& f) {
  Vec v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = f(i);
  return v;
}

// Positions [t0, t0 + n) of every sequence of a row-major (B, T, C) tensor.
inline Vec seq_slice(const Vec& m, int64_t B, int64_t T, int64_t C, int64_t t0, int64_t n) {
  Vec out;
  for (int64_t b = 0; b < B; ++b)
    out.insert(out.end(), m.begin() + (b * T + t0) * C, m.begin() + (b * T + t0 + n) * C);
  return out;
}

}  // namespace fd::mpi_testing
