// grouped_topk_avx512: the CPU backend's grouped_topk (SPEC 1.2, contract moekit/ops/routing.h).
//
// Per token row:
//   1. s = softmax or sigmoid of the logits (AVX-512 load converting f32 / bf16 / f16, NaN -> -inf);
//   2. b = s + bias (vector add; a NaN b -> -inf);
//   3. group scores (top-2 sum with a bias, max without), the topk_group best groups kept with a
//      small top-k (ties to the lower group id; a NaN score ranks like -inf);
//   4. a vector top-k scan (cpu/cpu_simd.h) over the experts of the kept groups only, walked in
//      ascending id order so the reference's tie rule (lower id first) holds; experts of dropped
//      groups are never looked at, which is the reference's "ineligible ranks last" since the kept
//      groups always hold at least k experts (k <= topk_group * G is validated);
//   5. weights = s of the picks, renormalized (unless their sum is 0), times rsf.
// Rows are split over the thread pool in fixed contiguous ranges: deterministic.
//
// NOTE: the scores use libm's scalar std::exp exactly as the reference does (softmax: element-order
// sum; sigmoid: ref::sigmoid_f32), so s and b are bit-identical to grouped_topk_ref. The biased
// selection is not monotone in the logits, so this is what makes the ids match the reference
// EXACTLY on every input; the vector work is the loads, the bias, the divide and the selections.
// Test: tests/test_grouped_topk.cpp (Cpu* cases) and every case of src/testing/check_routing.cpp
// (this kernel against grouped_topk_ref).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_simd.h"
#include "cpu/thread_pool.h"
#include "moekit/ops/routing.h"
#include "ref/ref_topk.h"

namespace moekit::cpu {

void register_grouped_topk_avx512(Registry& r);

namespace {

// Rows x experts below which the call stays on the calling thread (waking the pool costs more).
constexpr int64_t kSerialWork = int64_t(1) << 13;

Status supports(const GroupedTopkParams& p) {
  return require_host_tensors("grouped_topk_avx512", {{"gating", &p.gating},
                                                      {"correction_bias", &p.correction_bias},
                                                      {"topk_weights", &p.topk_weights},
                                                      {"topk_ids", &p.topk_ids}});
}

// Per-thread row scratch.
struct RowScratch {
  std::vector<float> s, b;             // [Eg] scores, biased selection scores
  std::vector<float> group_score;      // [n_group]
  std::vector<float> best;             // [max(k, topk_group)] selection values
  std::vector<int> ids, kept;          // [k] expert picks, [topk_group] kept groups
  explicit RowScratch(const GroupedTopkParams& p)
      : s(static_cast<size_t>(p.gating.shape[1])),
        b(static_cast<size_t>(p.gating.shape[1])),
        group_score(static_cast<size_t>(p.n_group)),
        best(static_cast<size_t>(std::max(p.k, p.topk_group))),
        ids(static_cast<size_t>(p.k)),
        kept(static_cast<size_t>(p.topk_group)) {}
};

// s = scoring(row), bit-identical to the reference.
MOEKIT_CPU_AVX512 void scores(const GroupedTopkParams& p, int64_t row, int64_t Eg, float* s) {
  const float mx = simd::load_clean_row(p.gating.data, p.gating.dtype, row, Eg, s);
  if (p.scoring == Scoring::sigmoid) {
    for (int64_t e = 0; e < Eg; ++e) s[e] = ref::sigmoid_f32(s[e]);  // sigmoid(-inf) = 0 = NaN's score
    return;
  }
  if (std::isinf(mx)) {
    ref::softmax_row(p.gating.data, p.gating.dtype, row, Eg, s);
    return;
  }
  float sum = 0.0f;
  for (int64_t e = 0; e < Eg; ++e) {
    s[e] = std::exp(s[e] - mx);
    sum += s[e];
  }
  const __m512 vs = _mm512_set1_ps(sum);
  for (int64_t e = 0; e < Eg; e += 16) {
    const __mmask16 m = simd::tail_mask(Eg - e);
    _mm512_mask_storeu_ps(s + e, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, s + e), vs));
  }
}

// Rows [t0, t1).
MOEKIT_CPU_AVX512 void rows(const GroupedTopkParams& p, int64_t t0, int64_t t1) {
  const int64_t Eg = p.gating.shape[1];
  const int64_t n_group = p.n_group, G = Eg / n_group;
  const int k = p.k;
  const float* bias = p.correction_bias.present() ? p.correction_bias.ptr<const float>() : nullptr;
  RowScratch sc(p);
  float* s = sc.s.data();
  float* b = sc.b.data();
  float* w_out = p.topk_weights.ptr<float>();
  int32_t* id_out = p.topk_ids.ptr<int32_t>();
  for (int64_t t = t0; t < t1; ++t) {
    scores(p, t * p.gating.stride[0], Eg, s);
    for (int64_t e = 0; e < Eg; e += 16) {
      const __mmask16 m = simd::tail_mask(Eg - e);
      __m512 v = _mm512_maskz_loadu_ps(m, s + e);
      if (bias) v = simd::nan_to_neg_inf(_mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + e)));
      _mm512_mask_storeu_ps(b + e, m, v);
    }
    for (int64_t g = 0; g < n_group; ++g) {
      const float* bg = b + g * G;
      float m1 = bg[0], m2 = ref::kNegInf;  // the two largest of the group (as a multiset)
      for (int64_t i = 1; i < G; ++i) {
        if (bg[i] > m1) {
          m2 = m1;
          m1 = bg[i];
        } else if (bg[i] > m2) {
          m2 = bg[i];
        }
      }
      // NOTE: with a bias and G >= 2 the score is the top-2 SUM, which is NaN for +inf + -inf (an
      // infinite bias); it then ranks like -inf, as in the reference.
      const float score = bias && G >= 2 ? m1 + m2 : m1;
      sc.group_score[size_t(g)] = std::isnan(score) ? ref::kNegInf : score;
    }
    simd::TopK groups(p.topk_group, sc.best.data(), sc.kept.data());
    for (int64_t g = 0; g < n_group; ++g) groups.offer(sc.group_score[size_t(g)], int(g));
    std::sort(sc.kept.begin(), sc.kept.end());  // ascending ids for the expert scan's tie rule
    simd::TopK sel(k, sc.best.data(), sc.ids.data());
    for (int g : sc.kept) simd::topk_scan(b + int64_t(g) * G, G, int(g * G), sel);

    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += s[sc.ids[size_t(j)]];
    for (int j = 0; j < k; ++j) {
      float w = s[sc.ids[size_t(j)]];
      if (p.renormalize && sum > 0.0f) w /= sum;
      w_out[t * k + j] = w * p.routed_scaling_factor;
      id_out[t * k + j] = sc.ids[size_t(j)];
    }
  }
}

Status run(const GroupedTopkParams& p, const RunContext&) {
  const int64_t T = p.gating.shape[0];
  if (T * p.gating.shape[1] < kSerialWork) {
    rows(p, 0, T);
  } else {
    parallel_for(T, [&](int64_t t0, int64_t t1) { rows(p, t0, t1); });
  }
  return Status::Ok();
}

}  // namespace

void register_grouped_topk_avx512(Registry& r) {
  r.add({"grouped_topk_avx512", OpKind::grouped_topk, MoeVariant::none, Backend::cpu,
         "gating f32|bf16|f16, bias f32 -> f32 weights, i32 ids; f32 math bit-identical to the ref", 50,
         erase_supports<GroupedTopkParams, supports>, nullptr, erase_run<GroupedTopkParams, run>});
}

}  // namespace moekit::cpu
