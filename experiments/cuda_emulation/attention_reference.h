// One attention call's inputs, rounded to the kernels' type T, and every output computed
// in float64 from the rounded values: out, lse (scaled-score units), dq, dk, dv for
// q, dO (BH, Tq, D) and k, v (BH, Tk, D), a causal mask (query i sees keys j <= i) and
// the dropout mask of ops/kernels/attention.h's attention_dropout_bits. For the harnesses
// of the cuBLAS path (attention_gemm_emulated.cpp), the flash backward, the cuDNN graphs
// and the whole op (attention_op_emulated.cpp).
#pragma once
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>
#include "emu_convert.h"
#include "ops/kernels/attention.h"

template <class T>
struct AttentionCase {
  std::vector<T> q, k, v, dO;                // what the kernels read
  std::vector<double> out, lse, dq, dk, dv;  // the reference
};

template <class T>
AttentionCase<T> attention_case(int64_t BH, int64_t Tq, int64_t Tk, int D, bool causal, double p, double scale,
                                uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  AttentionCase<T> c;
  // Draws n values as T and returns them read back as double.
  auto gen = [&](int64_t n, std::vector<T>& t) {
    std::vector<double> d(static_cast<size_t>(n));
    t.resize(size_t(n));
    for (size_t i = 0; i < d.size(); ++i) t[i] = from_d<T>(nd(rng)), d[i] = to_d(t[i]);
    return d;
  };
  const std::vector<double> q = gen(BH * Tq * D, c.q), k = gen(BH * Tk * D, c.k), v = gen(BH * Tk * D, c.v),
                            dO = gen(BH * Tq * D, c.dO);
  const uint64_t key = mu::kernels::attention_dropout_key(seed), thr = mu::kernels::attention_dropout_threshold(p);
  const double keep = p < 1 ? 1 / (1 - p) : 0;
  std::vector<double>&out = c.out, &lse = c.lse, &dq = c.dq, &dk = c.dk, &dv = c.dv;
  out.assign(size_t(BH * Tq * D), 0), lse.assign(size_t(BH * Tq), 0), dq.assign(size_t(BH * Tq * D), 0);
  dk.assign(size_t(BH * Tk * D), 0), dv.assign(size_t(BH * Tk * D), 0);
  for (int64_t bh = 0; bh < BH; ++bh) {
    std::vector<double> P(static_cast<size_t>(Tq * Tk)), M(static_cast<size_t>(Tq * Tk));
    for (int64_t i = 0; i < Tq; ++i) {
      double mx = -INFINITY;
      std::vector<double> s(static_cast<size_t>(Tk));
      for (int64_t j = 0; j < Tk; ++j) {
        double d = 0;
        for (int e = 0; e < D; ++e) d += q[(bh * Tq + i) * D + e] * k[(bh * Tk + j) * D + e];
        s[j] = (causal && j > i) ? -INFINITY : scale * d;
        mx = std::max(mx, s[j]);
        M[i * Tk + j] =
            p > 0 ? (mu::kernels::attention_dropout_bits(key, uint64_t((bh * Tq + i) * Tk + j)) >= thr ? keep : 0) : 1;
      }
      double l = 0;
      for (int64_t j = 0; j < Tk; ++j) l += std::exp(s[j] - mx);
      lse[bh * Tq + i] = Tk ? mx + std::log(l) : -INFINITY;
      for (int64_t j = 0; j < Tk; ++j) P[i * Tk + j] = std::exp(s[j] - lse[bh * Tq + i]);
      for (int64_t j = 0; j < Tk; ++j)
        for (int e = 0; e < D; ++e) out[(bh * Tq + i) * D + e] += P[i * Tk + j] * M[i * Tk + j] * v[(bh * Tk + j) * D + e];
    }
    for (int64_t i = 0; i < Tq; ++i) {
      double Di = 0;
      for (int e = 0; e < D; ++e) Di += dO[(bh * Tq + i) * D + e] * out[(bh * Tq + i) * D + e];
      for (int64_t j = 0; j < Tk; ++j) {
        double dp = 0;
        for (int e = 0; e < D; ++e) dp += dO[(bh * Tq + i) * D + e] * v[(bh * Tk + j) * D + e];
        const double pm = P[i * Tk + j] * M[i * Tk + j];
        const double ds = P[i * Tk + j] * (dp * M[i * Tk + j] - Di);
        for (int e = 0; e < D; ++e) {
          dv[(bh * Tk + j) * D + e] += pm * dO[(bh * Tq + i) * D + e];
          dq[(bh * Tq + i) * D + e] += scale * ds * k[(bh * Tk + j) * D + e];
          dk[(bh * Tk + j) * D + e] += scale * ds * q[(bh * Tq + i) * D + e];
        }
      }
    }
  }
  return c;
}

// The largest |a - b| relative to the largest |b|; NaN when an entry of a is NaN where b
// has a number, or the reverse (an output never written, or a lost value), since std::max
// would pass over it.
template <class V>
double attention_error(const V& a, const std::vector<double>& b) {
  double m = 0, s = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double x = to_d(a[i]);
    const double d = x == b[i] ? 0.0 : std::abs(x - b[i]);  // equal infinities agree
    if (std::isnan(d)) return NAN;
    m = std::max(m, d), s = std::max(s, std::abs(b[i]));
  }
  return m / (s > 0 ? s : 1);
}
