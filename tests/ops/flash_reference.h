// A causal attention problem and its float64 answer, from the definitions
// (grouped-query heads, packed rows): the reference of the tensor-core
// attention's CPU tests (flash_layout_test.cc: the algorithm at tile level;
// flash_emu_test.cc: the kernels' own code, emulated).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/flash_layout.h"
#include "lib/base/rng.h"
#include "lib/tensor/dtype.h"

namespace fd::kernels::flash_ref {

using namespace flash;

// An attention problem: q, k, v, dout in bf16-exact values, row (b, t) of head h
// at ((b * T + t) * heads + h) * hs (out and dout: heads = H; k and v: KV).
struct Problem {
  int B = 2, T = 130, H = 4, KV = 2, hs = 40;
  std::vector<int> starts;           // (B, T) document starts, or empty
  std::vector<float> q, k, v, dout;  // (B, T, heads, hs), values exact in bf16
};

inline float bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Values in [-1, 1) from a hash of `seed`; with `packed`, three documents per
// row starting at 0, about 0.38 T and 0.75 T (50 and 97 at T = 130).
inline Problem make_problem(bool packed, int B = 2, int T = 130, int H = 4, int KV = 2, int hs = 40,
                            uint64_t seed = 7) {
  Problem p;
  p.B = B;
  p.T = T;
  p.H = H;
  p.KV = KV;
  p.hs = hs;
  auto fill = [&](std::vector<float>& x, int heads, uint64_t stream) {
    x.resize(size_t(p.B) * p.T * heads * p.hs);
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = bf16(float(uniform01(hash_words(seed, stream, i))) * 2.0f - 1.0f);
  };
  fill(p.q, p.H, 1);
  fill(p.k, p.KV, 2);
  fill(p.v, p.KV, 3);
  fill(p.dout, p.H, 4);
  if (packed) {
    p.starts.resize(size_t(p.B) * p.T);
    const int s1 = T * 50 / 130, s2 = T * 97 / 130;
    for (int b = 0; b < p.B; ++b)
      for (int t = 0; t < p.T; ++t) p.starts[size_t(b * p.T + t)] = t < s1 ? 0 : t < s2 ? s1 : s2;
  }
  return p;
}

inline int start_of(const Problem& p, int b, int t) {
  return p.starts.empty() ? 0 : p.starts[size_t(b * p.T + t)];
}
inline bool visible(const Problem& p, int b, int r, int c) {
  return c <= r && c >= start_of(p, b, r);
}
inline float elem(const std::vector<float>& x, const Problem& p, int heads, int b, int t, int h,
                  int d) {
  return x[((size_t(b) * p.T + t) * heads + h) * p.hs + d];
}

struct Grads {
  std::vector<double> out, dq, dk, dv;
};

// float64 attention and its gradients, directly from the definitions.
inline Grads reference(const Problem& p) {
  Grads g;
  const size_t nq = size_t(p.B) * p.T * p.H * p.hs, nk = size_t(p.B) * p.T * p.KV * p.hs;
  g.out.assign(nq, 0);
  g.dq.assign(nq, 0);
  g.dk.assign(nk, 0);
  g.dv.assign(nk, 0);
  const double scale = 1.0 / std::sqrt(double(p.hs));
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h) {
      const int kvh = h / (p.H / p.KV);
      for (int r = 0; r < p.T; ++r) {
        std::vector<double> s(size_t(p.T), -INFINITY), pr(size_t(p.T), 0), dp(size_t(p.T), 0);
        double mx = -INFINITY;
        for (int c = 0; c < p.T; ++c) {
          if (!visible(p, b, r, c)) continue;
          double dot = 0;
          for (int d = 0; d < p.hs; ++d)
            dot += double(elem(p.q, p, p.H, b, r, h, d)) * elem(p.k, p, p.KV, b, c, kvh, d);
          s[size_t(c)] = dot * scale;
          mx = std::max(mx, s[size_t(c)]);
        }
        double sum = 0;
        for (int c = 0; c < p.T; ++c) sum += pr[size_t(c)] = std::exp(s[size_t(c)] - mx);
        double Dr = 0;
        for (int c = 0; c < p.T; ++c) {
          pr[size_t(c)] /= sum;
          for (int d = 0; d < p.hs; ++d) {
            const double o = pr[size_t(c)] * elem(p.v, p, p.KV, b, c, kvh, d);
            g.out[((size_t(b) * p.T + r) * p.H + h) * p.hs + d] += o;
          }
        }
        for (int d = 0; d < p.hs; ++d)
          Dr += g.out[((size_t(b) * p.T + r) * p.H + h) * p.hs + d] *
                elem(p.dout, p, p.H, b, r, h, d);
        for (int c = 0; c < p.T; ++c) {
          if (pr[size_t(c)] == 0) continue;
          double dpc = 0;
          for (int d = 0; d < p.hs; ++d)
            dpc += double(elem(p.dout, p, p.H, b, r, h, d)) * elem(p.v, p, p.KV, b, c, kvh, d);
          const double ds = pr[size_t(c)] * (dpc - Dr) * scale;
          for (int d = 0; d < p.hs; ++d) {
            g.dq[((size_t(b) * p.T + r) * p.H + h) * p.hs + d] +=
                ds * elem(p.k, p, p.KV, b, c, kvh, d);
            g.dk[((size_t(b) * p.T + c) * p.KV + kvh) * p.hs + d] +=
                ds * elem(p.q, p, p.H, b, r, h, d);
            g.dv[((size_t(b) * p.T + c) * p.KV + kvh) * p.hs + d] +=
                pr[size_t(c)] * elem(p.dout, p, p.H, b, r, h, d);
          }
        }
      }
    }
  return g;
}

// The kernels' algorithm in fp32 at tile level, walking tiles with the flash:: plan:
// forward with the online softmax (base 2) over the visited key tiles, P rounded to
// bf16 for P V; backward with dK, dV summed as the backward kernel's blocks sum
// them (query tiles from the diagonal, the group's heads in order) and dQ over
// the key tiles up to the diagonal in order (its ordered accumulation), P and
// dS rounded to bf16 before their products, lse and D as the kernels take them.
// round16: how the kernels round to 16 bits (bf16 by default, as P, dS and out are
// rounded in a bf16 call); q, k, v and dout must already be exact in it.
inline Grads tiled(const Problem& p, float (*round16)(float) = bf16) {
  Grads g = reference(p);  // sizes only
  std::fill(g.out.begin(), g.out.end(), 0);
  std::fill(g.dq.begin(), g.dq.end(), 0);
  std::fill(g.dk.begin(), g.dk.end(), 0);
  std::fill(g.dv.begin(), g.dv.end(), 0);
  const float scale = 1.0f / std::sqrt(float(p.hs)), scale_log2 = scale * 1.4426950408889634f;
  std::vector<float> lse(size_t(p.B) * p.H * p.T), D(lse.size());
  auto dot = [&](const std::vector<float>& x, int xh, int xr, const std::vector<float>& y, int yh,
                 int yr, int hx, int hy, int b) {
    float acc = 0;
    for (int d = 0; d < p.hs; ++d)
      acc += elem(x, p, xh, b, xr, hx, d) * elem(y, p, yh, b, yr, hy, d);
    return acc;
  };
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h) {
      const int kvh = h / (p.H / p.KV);
      for (int qt = 0; qt < tiles(p.T); ++qt) {
        const int q0 = qt * kTile;
        for (int r = q0; r < std::min(q0 + kTile, p.T); ++r) {
          float m = -INFINITY, l = 0;
          std::vector<float> o(size_t(p.hs), 0);
          for (int kt = first_key_tile(start_of(p, b, q0)); kt <= last_key_tile(q0, p.T); ++kt) {
            std::vector<float> s(kTile);
            float mx = -INFINITY;
            for (int j = 0; j < kTile; ++j) {
              const int c = kt * kTile + j;
              s[size_t(j)] = c < p.T && visible(p, b, r, c)
                                 ? dot(p.q, p.H, r, p.k, p.KV, c, h, kvh, b) * scale_log2
                                 : -INFINITY;
              mx = std::max(mx, s[size_t(j)]);
            }
            const float m_new = std::max(m, mx), m_use = m_new == -INFINITY ? 0.0f : m_new;
            const float corr = std::exp2(m - m_use);
            l *= corr;
            for (float& x : o) x *= corr;
            for (int j = 0; j < kTile; ++j) {
              const float e = std::exp2(s[size_t(j)] - m_use);
              l += e;
              const int c = kt * kTile + j;
              if (c >= p.T) continue;
              for (int d = 0; d < p.hs; ++d)
                o[size_t(d)] += round16(e) * elem(p.v, p, p.KV, b, c, kvh, d);
            }
            m = m_new;
          }
          const size_t row = (size_t(b) * p.H + h) * p.T + r;
          lse[row] = (m + std::log2(l)) * 0.6931471805599453f;
          float Dr = 0;
          for (int d = 0; d < p.hs; ++d) {
            const float out = round16(o[size_t(d)] / l);  // out is stored in 16 bits
            g.out[((size_t(b) * p.T + r) * p.H + h) * p.hs + d] = out;
            Dr += elem(p.dout, p, p.H, b, r, h, d) * out;
          }
          D[row] = Dr;
        }
      }
    }
  // P and dS of one (query, key) pair as the backward kernels recompute them.
  auto p_ds = [&](int b, int h, int r, int c, float* pr, float* ds) {
    const int kvh = h / (p.H / p.KV);
    const size_t row = (size_t(b) * p.H + h) * p.T + r;
    *pr = 0;
    *ds = 0;
    if (r >= p.T || c >= p.T || !visible(p, b, r, c)) return;
    *pr = std::exp2(dot(p.q, p.H, r, p.k, p.KV, c, h, kvh, b) * scale_log2 -
                    lse[row] * 1.4426950408889634f);
    *ds = *pr * (dot(p.dout, p.H, r, p.v, p.KV, c, h, kvh, b) - D[row]);
  };
  for (int b = 0; b < p.B; ++b)
    for (int kvh = 0; kvh < p.KV; ++kvh)
      for (int kt = 0; kt < tiles(p.T); ++kt)
        for (int c = kt * kTile; c < std::min((kt + 1) * kTile, p.T); ++c)
          for (int h = kvh * (p.H / p.KV); h < (kvh + 1) * (p.H / p.KV); ++h)
            for (int qt = first_query_tile(kt * kTile); qt < tiles(p.T); ++qt)
              for (int r = qt * kTile; r < std::min((qt + 1) * kTile, p.T); ++r) {
                float pr, ds;
                p_ds(b, h, r, c, &pr, &ds);
                for (int d = 0; d < p.hs; ++d) {
                  const size_t at = ((size_t(b) * p.T + c) * p.KV + kvh) * p.hs + d;
                  g.dv[at] += round16(pr) * elem(p.dout, p, p.H, b, r, h, d);
                  g.dk[at] += double(round16(ds) * elem(p.q, p, p.H, b, r, h, d)) * scale;
                }
              }
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int qt = 0; qt < tiles(p.T); ++qt) {
        const int q0 = qt * kTile;
        for (int r = q0; r < std::min(q0 + kTile, p.T); ++r)
          for (int kt = first_key_tile(start_of(p, b, q0)); kt <= last_key_tile(q0, p.T); ++kt)
            for (int c = kt * kTile; c < std::min((kt + 1) * kTile, p.T); ++c) {
              float pr, ds;
              p_ds(b, h, r, c, &pr, &ds);
              for (int d = 0; d < p.hs; ++d)
                g.dq[((size_t(b) * p.T + r) * p.H + h) * p.hs + d] +=
                    double(round16(ds) * elem(p.k, p, p.KV, b, c, h / (p.H / p.KV), d)) * scale;
            }
      }
  return g;
}

// max |got - want| / max |want|: the GPU parity test's relative measure.
inline double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(got[i] - want[i]));
    mag = std::max(mag, std::fabs(want[i]));
  }
  return err / mag;
}

}  // namespace fd::kernels::flash_ref
