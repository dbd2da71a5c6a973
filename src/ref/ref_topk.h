// Scalar helpers shared by the reference routing kernels (SPEC 1): NaN-safe logit loads, softmax,
// sigmoid and a stable top-k. Used by src/ops/{topk_softmax,grouped_topk,sigmoid_topk}/*_ref.cpp;
// covered by tests/test_topk_softmax.cpp, test_grouped_topk.cpp and test_sigmoid_topk.cpp.
//
// Non-finite rules (the same in every routing op):
//   - a NaN logit counts as -inf;
//   - softmax: +inf logits share the whole mass equally (every other entry 0); a row with no
//     logit above -inf (all NaN / -inf) has no softmax and every entry is 0;
//   - sigmoid(-inf) = 0, sigmoid(+inf) = 1;
//   - in top-k, NaN scores rank like -inf, below every finite score; equal scores go to the lower id.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "moekit/core/dtype.h"

namespace moekit::ref {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Logit as f32 with NaN mapped to -inf (SPEC 1.1: NaN counts as -inf).
inline float clean_logit(const void* data, DType dtype, int64_t i) {
  const float v = load_as_f32(data, dtype, i);
  return std::isnan(v) ? kNegInf : v;
}

// out[e] = softmax of the n logits starting at element offset `row`, NaN as -inf, in f32:
// exp(x - max) / sum. +inf logits split the mass equally among themselves; a row whose max is -inf
// (all NaN / -inf) gets 0 everywhere.
inline void softmax_row(const void* data, DType dtype, int64_t row, int64_t n, float* out) {
  float mx = kNegInf;
  for (int64_t e = 0; e < n; ++e) mx = std::fmax(mx, clean_logit(data, dtype, row + e));
  if (std::isinf(mx)) {
    // NOTE: x - max is NaN for x = max = +-inf, so both cases are spelled out instead.
    int64_t n_pos_inf = 0;
    for (int64_t e = 0; e < n; ++e) n_pos_inf += (mx > 0 && clean_logit(data, dtype, row + e) == mx) ? 1 : 0;
    for (int64_t e = 0; e < n; ++e) {
      const bool is_max = mx > 0 && clean_logit(data, dtype, row + e) == mx;
      out[e] = is_max ? 1.0f / float(n_pos_inf) : 0.0f;
    }
    return;
  }
  float sum = 0.0f;
  for (int64_t e = 0; e < n; ++e) {
    out[e] = std::exp(clean_logit(data, dtype, row + e) - mx);
    sum += out[e];
  }
  for (int64_t e = 0; e < n; ++e) out[e] /= sum;  // sum >= 1: the max entry contributes exp(0)
}

// sigmoid(x) in f32 without overflow (exp is only taken of a non-positive argument); NaN -> 0,
// the value of sigmoid(-inf).
inline float sigmoid_f32(float x) {
  if (std::isnan(x)) return 0.0f;
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

// Writes the ids of the k largest score[] values (k <= n) in descending order, ties to the lower
// id; NaN scores rank like -inf. With `eligible` given, every eligible entry ranks above every
// ineligible one whatever their scores (grouped_topk: experts of dropped groups).
inline void topk_desc(const float* score, int64_t n, int k, int* ids, const bool* eligible = nullptr) {
  auto key = [&](int64_t e) { return std::isnan(score[e]) ? kNegInf : score[e]; };
  auto better = [&](int64_t a, int64_t b) {  // does a rank before b?
    if (eligible && eligible[a] != eligible[b]) return eligible[a];
    if (key(a) != key(b)) return key(a) > key(b);
    return a < b;
  };
  for (int j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < n; ++e) {
      bool taken = false;
      for (int q = 0; q < j; ++q) taken = taken || ids[q] == e;
      if (taken) continue;
      if (best < 0 || better(e, best)) best = e;
    }
    ids[j] = int(best);
  }
}

}  // namespace moekit::ref
