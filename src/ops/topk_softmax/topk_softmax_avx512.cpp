// topk_softmax_avx512: the CPU backend's topk_softmax (SPEC 1.1, contract moekit/ops/routing.h).
//
// Per token row: an AVX-512 load that converts f32 / bf16 / f16 logits, maps NaN to -inf and takes
// the maximum; a vector top-k scan (cpu/cpu_simd.h) that compares 16 values against the current
// k-th best at once and inserts only the few that beat it. Rows are split over the thread pool in
// fixed contiguous ranges (a row's result does not depend on the split): deterministic.
//
// Two paths per row, both giving the reference's ids EXACTLY:
//   - fast (almost every row): softmax is monotone, so the top k+1 LOGITS are selected and, when
//     logit_order_is_certain() proves that no two of them can round to equal p in the reference
//     (which would hand the order to the tie rule), they are the reference's ids in its order.
//     Weights: libm exp of the picks over a vector-exp softmax sum (within the check tolerance,
//     not bit-identical).
//   - exact (rows with +-inf / all-NaN logits, near-equal logits, logits 60 below the max among
//     the picks): the reference's own arithmetic (libm expf, element-order sum, IEEE division), so
//     p is bit-identical and the same selection on p reproduces its ids and weights.
// Test: tests/test_topk_softmax.cpp (Cpu* cases, incl. collapsed p) and every case of
// src/testing/check_routing.cpp (this kernel against topk_softmax_ref).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_simd.h"
#include "cpu/thread_pool.h"
#include "moekit/ops/routing.h"
#include "ref/ref_topk.h"

namespace moekit::cpu {

void register_topk_softmax_avx512(Registry& r);

namespace {

// Rows x experts below which the call stays on the calling thread (waking the pool costs more).
constexpr int64_t kSerialWork = int64_t(1) << 14;

Status supports(const TopkSoftmaxParams& p) {
  return require_host_tensors("topk_softmax_avx512", {{"gating", &p.gating},
                                                      {"topk_weights", &p.topk_weights},
                                                      {"topk_ids", &p.topk_ids},
                                                      {"token_expert_indices", &p.token_expert_indices}});
}

// Per-thread row scratch.
struct RowScratch {
  std::vector<float> x;     // [Eg] cleaned logits, then (exact path) probabilities
  std::vector<float> best;  // [k + 1] selection values
  std::vector<int> ids;     // [k + 1] selected ids
  RowScratch(int64_t Eg, int k)
      : x(static_cast<size_t>(Eg)), best(static_cast<size_t>(k) + 1), ids(static_cast<size_t>(k) + 1) {}
};

// Whether selecting on the logits is certain to give the reference's ids for this row: `sel` holds
// the top min(k + 1, Eg) logits (desc, ties by id). p = expf(x - max) / sum is non-decreasing in x,
// so the reference's order (p desc, ties by id) can differ from the logit order only where two
// DISTINCT logits give EQUAL p. For each adjacent pair of `sel` with distinct logits this requires
//   - their gap after the subtraction of the max at least 2^-16: the exact p ratio is then at least
//     1 + 1.5e-5, far above expf's error (< 1 ulp) and the two roundings of the division, and
//   - the smaller logit at most 60 below the max: its p is then a normal float (>= e^-60 / Eg),
//     with no underflow to 0 or to a subnormal that would merge values.
// Pairs of picks with EQUAL logits are ties in both orders and both put the lower id first. The
// boundary pair (k-th, (k+1)-th) must be certified DISTINCT: then every logit outside the picks has
// p <= p[(k+1)-th] < p[k-th], so none of them (not even a lower id whose p collapses onto the
// (k+1)-th's) can enter the reference's top k.
bool logit_order_is_certain(const simd::TopK& sel, int k, float mx) {
  for (int j = 0; j + 1 < sel.n; ++j) {
    const float a = sel.val[j], b = sel.val[j + 1];
    if (a == b && j + 1 < k) continue;
    const float da = a - mx, db = b - mx;
    if (!(db >= -60.0f) || double(da) - double(db) < 1.0 / 65536.0) return false;
  }
  return true;
}

// Rows [t0, t1).
MOEKIT_CPU_AVX512 void rows(const TopkSoftmaxParams& p, int64_t t0, int64_t t1) {
  const int64_t T = p.gating.shape[0], Eg = p.gating.shape[1];
  const int k = p.k;
  const int n_sel = int(std::min<int64_t>(k + 1, Eg));
  RowScratch sc(Eg, k);
  float* x = sc.x.data();
  float* best = sc.best.data();
  float* w_out = p.topk_weights.ptr<float>();
  int32_t* id_out = p.topk_ids.ptr<int32_t>();
  int32_t* tei = p.token_expert_indices.present() ? p.token_expert_indices.ptr<int32_t>() : nullptr;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = t * p.gating.stride[0];
    const float mx = simd::load_clean_row(p.gating.data, p.gating.dtype, row, Eg, x);
    bool fast = !std::isinf(mx);
    simd::TopK sel(n_sel, best, sc.ids.data());
    if (fast) {
      simd::topk_scan(x, Eg, 0, sel);
      fast = logit_order_is_certain(sel, k, mx);
    }
    if (fast) {
      // Fast path: the vector exp only feeds the softmax sum; the picks' own exps are libm's.
      __m512 acc = _mm512_setzero_ps();
      const __m512 vmx = _mm512_set1_ps(mx);
      for (int64_t e = 0; e < Eg; e += 16) {
        const __mmask16 m = simd::tail_mask(Eg - e);
        acc = _mm512_mask_add_ps(acc, m, acc, simd::exp_approx(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + e), vmx)));
      }
      const float sum = simd::reduce_add(acc);
      for (int j = 0; j < k; ++j) best[j] = std::exp(best[j] - mx) / sum;
    } else {
      // Exact path: the reference's arithmetic (bit-identical p), then the same selection on p.
      if (std::isinf(mx)) {
        ref::softmax_row(p.gating.data, p.gating.dtype, row, Eg, x);
      } else {
        float sum = 0.0f;
        for (int64_t e = 0; e < Eg; ++e) {
          x[e] = std::exp(x[e] - mx);
          sum += x[e];
        }
        const __m512 vs = _mm512_set1_ps(sum);
        for (int64_t e = 0; e < Eg; e += 16) {
          const __mmask16 m = simd::tail_mask(Eg - e);
          _mm512_mask_storeu_ps(x + e, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + e), vs));
        }
      }
      simd::TopK exact(k, best, sc.ids.data());
      simd::topk_scan(x, Eg, 0, exact);
    }
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += best[j];
    for (int j = 0; j < k; ++j) {
      float w = best[j];
      if (p.renormalize && sum > 0.0f) w /= sum;
      w_out[t * k + j] = w;
      id_out[t * k + j] = sc.ids[size_t(j)];
      if (tei) tei[t * k + j] = int32_t(j * T + t);
    }
  }
}

Status run(const TopkSoftmaxParams& p, const RunContext&) {
  const int64_t T = p.gating.shape[0];
  parallel_for_if(T * p.gating.shape[1] >= kSerialWork, T, [&](int64_t t0, int64_t t1) { rows(p, t0, t1); });
  return Status::Ok();
}

}  // namespace

void register_topk_softmax_avx512(Registry& r) {
  r.add({"topk_softmax_avx512", OpKind::topk_softmax, MoeVariant::none, Backend::cpu,
         "gating f32|bf16|f16 -> f32 weights, i32 ids; f32 math bit-identical to the ref", 50,
         erase_supports<TopkSoftmaxParams, supports>, nullptr, erase_run<TopkSoftmaxParams, run>});
}

}  // namespace moekit::cpu
