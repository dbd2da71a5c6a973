// Scalar helpers shared by the reference routing kernels: NaN-safe softmax and a stable top-k.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "moekit/core/dtype.h"

namespace moekit::ref {

// Logit as f32 with NaN mapped to -inf (SPEC 1.1: NaN counts as -inf).
inline float clean_logit(const void* data, DType dtype, int64_t i) {
  const float v = load_as_f32(data, dtype, i);
  return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
}

// out[e] = softmax of the row at element offset `row` (n entries), NaN as -inf. With no finite or
// +inf logit at all (all -inf/NaN) every entry gets 1/n... callers special-case that row.
// +inf logits split the mass equally among themselves.
inline void softmax_row(const void* data, DType dtype, int64_t row, int64_t n, float* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t e = 0; e < n; ++e) mx = std::fmax(mx, clean_logit(data, dtype, row + e));
  if (std::isinf(mx)) {
    // All -inf: uniform zero mass (no defined softmax) -> weights 0; or +inf present -> split.
    int64_t n_pos_inf = 0;
    for (int64_t e = 0; e < n; ++e) n_pos_inf += clean_logit(data, dtype, row + e) == mx && mx > 0;
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
  for (int64_t e = 0; e < n; ++e) out[e] /= sum;
}

// Writes the ids of the k largest score[] values in descending order, ties to the lower id;
// -inf and NaN scores rank below every finite score, and among themselves by id.
inline void topk_desc(const float* score, int64_t n, int k, int* ids) {
  auto better = [&](int64_t a, int64_t b) {  // does a rank before b?
    const float sa = std::isnan(score[a]) ? -std::numeric_limits<float>::infinity() : score[a];
    const float sb = std::isnan(score[b]) ? -std::numeric_limits<float>::infinity() : score[b];
    if (sa != sb) return sa > sb;
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
