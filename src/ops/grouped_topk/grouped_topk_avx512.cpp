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
// Two paths per row, both giving the reference's ids EXACTLY (the biased selection is not monotone
// in the logits, so the scores themselves decide):
//   - fast (sigmoid scoring, finite bias; almost every row): a vector sigmoid with a known error
//     bound, and every selection decision certified to exceed that bound (fast_row()); the picks'
//     weights then use the reference's scalar sigmoid, so the row is bit-identical to the ref;
//   - exact (softmax scoring, infinite bias, and rows whose decisions are too close to call):
//     libm expf exactly as the reference (softmax: element-order sum), so s and b are
//     bit-identical and the same selection reproduces its ids and weights.
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
  std::vector<float> x, s, b;          // [Eg] cleaned logits, scores, biased selection scores
  std::vector<float> group_score;      // [n_group]
  std::vector<float> m1, m2;           // [n_group] running top-2 of each group
  std::vector<float> best;             // [max(k, topk_group) + 1] selection values
  std::vector<int> ids, kept;          // [k + 1] expert picks, [topk_group + 1] kept groups
  explicit RowScratch(const GroupedTopkParams& p)
      : x(static_cast<size_t>(p.gating.shape[1])),
        s(static_cast<size_t>(p.gating.shape[1])),
        b(static_cast<size_t>(p.gating.shape[1])),
        group_score(static_cast<size_t>(p.n_group)),
        m1(static_cast<size_t>(p.n_group)),
        m2(static_cast<size_t>(p.n_group)),
        best(static_cast<size_t>(std::max(p.k, p.topk_group)) + 1),
        ids(static_cast<size_t>(p.k) + 1),
        kept(static_cast<size_t>(p.topk_group) + 1) {}
};

// Group scores of b: the top-2 sum with a bias (G >= 2), else the maximum; a NaN score (+inf + -inf
// from an infinite bias) ranks like -inf, as in the reference. m1 / m2 (n_group each) are scratch.
// NOTE: the loop runs over the groups innermost, so the n_group running top-2 chains are independent
// (the per-group loop was bound by one max/min dependency chain).
void group_scores(const float* b, int64_t n_group, int64_t G, bool top2, float* m1, float* m2, float* out) {
  for (int64_t g = 0; g < n_group; ++g) {
    m1[g] = b[g * G];
    m2[g] = ref::kNegInf;
  }
  for (int64_t i = 1; i < G; ++i) {
    for (int64_t g = 0; g < n_group; ++g) {  // the two largest of each group (as a multiset)
      const float v = b[g * G + i];
      m2[g] = std::max(m2[g], std::min(m1[g], v));
      m1[g] = std::max(m1[g], v);
    }
  }
  for (int64_t g = 0; g < n_group; ++g) {
    const float score = top2 && G >= 2 ? m1[g] + m2[g] : m1[g];
    out[g] = std::isnan(score) ? ref::kNegInf : score;
  }
}

// Keeps the best `n` groups (ties to the lower id) in sc.kept[0..n), best first, values in sc.best.
void rank_groups(RowScratch& sc, int64_t n_group, int n) {
  simd::TopK groups(n, sc.best.data(), sc.kept.data());
  for (int64_t g = 0; g < n_group; ++g) groups.offer(sc.group_score[size_t(g)], int(g));
}

// Picks the top `n` experts of the kept groups sc.kept[0..topk_group) by b into sc.ids / sc.best.
// One floor (simd::kth_lane) over all kept groups, so every group's scan skips most elements.
MOEKIT_CPU_AVX512 void pick_experts(RowScratch& sc, int topk_group, int64_t G, int n) {
  std::sort(sc.kept.begin(), sc.kept.begin() + topk_group);  // ascending ids for the scan's tie rule
  float floor = -__builtin_inff();
  if (n <= 16 && topk_group * G >= 32) {
    __m512 lm = _mm512_set1_ps(-__builtin_inff());
    for (int j = 0; j < topk_group; ++j) simd::fold_lane_max(sc.b.data() + int64_t(sc.kept[size_t(j)]) * G, G, lm);
    floor = simd::kth_lane(lm, n);
  }
  simd::TopK sel(n, sc.best.data(), sc.ids.data());
  for (int j = 0; j < topk_group; ++j) {
    const int g = sc.kept[size_t(j)];
    simd::scan_from(sc.b.data() + int64_t(g) * G, G, int(g * G), floor, sel);
  }
}

// Exact path: s and b bit-identical to the reference (libm expf), then its selection rules.
MOEKIT_CPU_AVX512 void exact_row(const GroupedTopkParams& p, int64_t row, RowScratch& sc) {
  const int64_t Eg = p.gating.shape[1], G = Eg / p.n_group;
  const float* bias = p.correction_bias.present() ? p.correction_bias.ptr<const float>() : nullptr;
  float* s = sc.s.data();
  float* b = sc.b.data();
  const float mx = simd::load_clean_row(p.gating.data, p.gating.dtype, row, Eg, s);
  if (p.scoring == Scoring::sigmoid) {
    for (int64_t e = 0; e < Eg; ++e) s[e] = ref::sigmoid_f32(s[e]);  // sigmoid(-inf) = 0 = NaN's score
  } else if (std::isinf(mx)) {
    ref::softmax_row(p.gating.data, p.gating.dtype, row, Eg, s);
  } else {
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
  for (int64_t e = 0; e < Eg; e += 16) {
    const __mmask16 m = simd::tail_mask(Eg - e);
    __m512 v = _mm512_maskz_loadu_ps(m, s + e);
    if (bias) v = simd::nan_to_neg_inf(_mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + e)));
    _mm512_mask_storeu_ps(b + e, m, v);
  }
  group_scores(b, p.n_group, G, bias != nullptr, sc.m1.data(), sc.m2.data(), sc.group_score.data());
  rank_groups(sc, p.n_group, p.topk_group);
  pick_experts(sc, p.topk_group, G, p.k);
  for (int j = 0; j < p.k; ++j) sc.best[size_t(j)] = s[sc.ids[size_t(j)]];
}

// Fast path (sigmoid scoring): s' = vector sigmoid (relative error <= 2 * kExpRelErr), b' = s' + bias.
// With eps bounding |b' - b| (the score error plus one rounding of each sum), a decision taken on
// b' is the reference's when every gap it depends on exceeds the combined error: the kept / dropped
// group boundary (group scores off by <= 3 eps for a top-2 sum) and every adjacent pair of the top
// k+1 experts (off by <= eps each). Equal values are never accepted here (equal b' need not mean
// equal b). Returns false, leaving the row to exact_row(), otherwise; on success the picks'
// weights are the reference's exact sigmoid, so the row's output is bit-identical to the ref.
MOEKIT_CPU_AVX512 bool fast_row(const GroupedTopkParams& p, int64_t row, RowScratch& sc) {
  const int64_t Eg = p.gating.shape[1], n_group = p.n_group, G = Eg / n_group;
  const float* bias = p.correction_bias.present() ? p.correction_bias.ptr<const float>() : nullptr;
  float* x = sc.x.data();
  float* b = sc.b.data();
  simd::load_clean_row(p.gating.data, p.gating.dtype, row, Eg, x);
  __m512 amax = _mm512_setzero_ps();
  __mmask16 nonfinite = 0;
  const __m512 inf = _mm512_set1_ps(__builtin_inff());
  for (int64_t e = 0; e < Eg; e += 16) {
    const __mmask16 m = simd::tail_mask(Eg - e);
    __m512 v = simd::sigmoid_approx(_mm512_maskz_loadu_ps(m, x + e));
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + e));
    _mm512_mask_storeu_ps(b + e, m, v);
    const __m512 a = _mm512_abs_ps(v);
    nonfinite |= _mm512_mask_cmp_ps_mask(m, a, inf, _CMP_NLT_UQ);  // inf or NaN
    amax = _mm512_mask_max_ps(amax, m, amax, a);
  }
  if (nonfinite) return false;  // an infinite / NaN bias: the exact path's -inf / NaN rules
  // |b' - b| <= |s' - s| + the rounding of both sums: 2 * kExpRelErr * s + 2^-23 * |b|, s <= 1;
  // doubled for margin.
  const double eps = 2.0 * (2.0 * simd::kExpRelErr + 1.2e-7 * (double(simd::reduce_max(amax)) + 1.0));
  group_scores(b, n_group, G, bias != nullptr, sc.m1.data(), sc.m2.data(), sc.group_score.data());
  const int tg = p.topk_group;
  const int n_groups_ranked = int(std::min<int64_t>(tg + 1, n_group));
  rank_groups(sc, n_group, n_groups_ranked);
  if (n_groups_ranked > tg) {
    const double eps_g = (bias && G >= 2 ? 3.0 : 1.0) * eps;
    if (!(double(sc.best[size_t(tg - 1)]) - double(sc.best[size_t(tg)]) > 2.0 * eps_g)) return false;
  }
  const int n_sel = int(std::min<int64_t>(p.k + 1, int64_t(tg) * G));
  pick_experts(sc, tg, G, n_sel);
  for (int j = 0; j + 1 < n_sel; ++j) {
    if (!(double(sc.best[size_t(j)]) - double(sc.best[size_t(j + 1)]) > 2.0 * eps)) return false;
  }
  for (int j = 0; j < p.k; ++j) sc.best[size_t(j)] = ref::sigmoid_f32(x[sc.ids[size_t(j)]]);
  return true;
}

// Rows [t0, t1).
MOEKIT_CPU_AVX512 void rows(const GroupedTopkParams& p, int64_t t0, int64_t t1) {
  const int k = p.k;
  RowScratch sc(p);
  float* w_out = p.topk_weights.ptr<float>();
  int32_t* id_out = p.topk_ids.ptr<int32_t>();
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = t * p.gating.stride[0];
    if (!(p.scoring == Scoring::sigmoid && fast_row(p, row, sc))) exact_row(p, row, sc);
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += sc.best[size_t(j)];
    for (int j = 0; j < k; ++j) {
      float w = sc.best[size_t(j)];
      if (p.renormalize && sum > 0.0f) w /= sum;
      w_out[t * k + j] = w * p.routed_scaling_factor;
      id_out[t * k + j] = sc.ids[size_t(j)];
    }
  }
}

Status run(const GroupedTopkParams& p, const RunContext&) {
  const int64_t T = p.gating.shape[0];
  parallel_for_if(T * p.gating.shape[1] >= kSerialWork, T, [&](int64_t t0, int64_t t1) { rows(p, t0, t1); });
  return Status::Ok();
}

}  // namespace

void register_grouped_topk_avx512(Registry& r) {
  r.add({"grouped_topk_avx512", OpKind::grouped_topk, MoeVariant::none, Backend::cpu,
         "gating f32|bf16|f16, bias f32 -> f32 weights, i32 ids; f32 math bit-identical to the ref", 50,
         erase_supports<GroupedTopkParams, supports>, nullptr, erase_run<GroupedTopkParams, run>});
}

}  // namespace moekit::cpu
