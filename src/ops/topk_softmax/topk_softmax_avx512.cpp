// topk_softmax_avx512: the CPU backend's topk_softmax (SPEC 1.1, contract moekit/ops/routing.h).
//
// Per token row: an AVX-512 load that converts f32 / bf16 / f16 logits, maps NaN to -inf and takes
// the maximum; p = exp(x - max) / sum; a vector top-k scan (cpu/cpu_simd.h) that compares 16
// probabilities against the current k-th best at once and inserts only the few that beat it.
// Rows are split over the thread pool in fixed contiguous ranges (each row is computed by one
// thread the same way whatever the split), so results are deterministic.
//
// NOTE: exp is libm's scalar std::exp and the softmax sum runs in element order, exactly as in the
// reference (ref/ref_topk.h): that makes p bit-identical to the reference, so the ids match it
// EXACTLY even where distinct logits round to equal p (underflow to 0, adjacent floats) and the
// tie rule then decides, and the weights are bit-identical too. The vector part (load, clean, max,
// divide, selection) is where the reference spends its time (its top-k is O(k^2 * Eg)).
// Rows whose maximum is +-inf (+inf logits share the mass; all NaN / -inf) take the reference's
// own scalar softmax.
// Test: tests/test_topk_softmax.cpp (Cpu* cases) and every case of src/testing/check_routing.cpp
// (this kernel against topk_softmax_ref).
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

// Rows [t0, t1).
MOEKIT_CPU_AVX512 void rows(const TopkSoftmaxParams& p, int64_t t0, int64_t t1) {
  const int64_t T = p.gating.shape[0], Eg = p.gating.shape[1];
  const int k = p.k;
  std::vector<float> prob(static_cast<size_t>(Eg));
  std::vector<float> best(static_cast<size_t>(k));
  std::vector<int> ids(static_cast<size_t>(k));
  float* w_out = p.topk_weights.ptr<float>();
  int32_t* id_out = p.topk_ids.ptr<int32_t>();
  int32_t* tei = p.token_expert_indices.present() ? p.token_expert_indices.ptr<int32_t>() : nullptr;
  float* pr = prob.data();
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = t * p.gating.stride[0];
    const float mx = simd::load_clean_row(p.gating.data, p.gating.dtype, row, Eg, pr);
    if (std::isinf(mx)) {
      ref::softmax_row(p.gating.data, p.gating.dtype, row, Eg, pr);
    } else {
      float sum = 0.0f;
      for (int64_t e = 0; e < Eg; ++e) {
        pr[e] = std::exp(pr[e] - mx);
        sum += pr[e];
      }
      const __m512 vs = _mm512_set1_ps(sum);
      for (int64_t e = 0; e < Eg; e += 16) {
        const __mmask16 m = simd::tail_mask(Eg - e);
        _mm512_mask_storeu_ps(pr + e, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, pr + e), vs));
      }
    }
    simd::TopK sel(k, best.data(), ids.data());
    simd::topk_scan(pr, Eg, 0, sel);
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += best[size_t(j)];
    for (int j = 0; j < k; ++j) {
      float w = best[size_t(j)];
      if (p.renormalize && sum > 0.0f) w /= sum;
      w_out[t * k + j] = w;
      id_out[t * k + j] = ids[size_t(j)];
      if (tei) tei[t * k + j] = int32_t(j * T + t);
    }
  }
}

Status run(const TopkSoftmaxParams& p, const RunContext&) {
  const int64_t T = p.gating.shape[0];
  if (T * p.gating.shape[1] < kSerialWork) {
    rows(p, 0, T);
  } else {
    parallel_for(T, [&](int64_t t0, int64_t t1) { rows(p, t0, t1); });
  }
  return Status::Ok();
}

}  // namespace

void register_topk_softmax_avx512(Registry& r) {
  r.add({"topk_softmax_avx512", OpKind::topk_softmax, MoeVariant::none, Backend::cpu,
         "gating f32|bf16|f16 -> f32 weights, i32 ids; f32 math bit-identical to the ref", 50,
         erase_supports<TopkSoftmaxParams, supports>, nullptr, erase_run<TopkSoftmaxParams, run>});
}

}  // namespace moekit::cpu
