// sigmoid_topk_avx512: the CPU backend's sigmoid_topk (SPEC 1.3, contract moekit/ops/routing.h).
//
// Per token row: an AVX-512 load that converts f32 / bf16 / f16 logits and maps NaN to -inf, a
// vector top-k scan over the RAW logits (cpu/cpu_simd.h: value descending, ties to the lower id,
// the reference's order), then weight = sigmoid(logit) of each pick with the reference's scalar
// sigmoid_f32, so ids and weights are bit-identical to sigmoid_topk_ref. Rows are split over the
// thread pool in fixed contiguous ranges: deterministic.
// Test: tests/test_sigmoid_topk.cpp (Cpu* cases) and every case of src/testing/check_routing.cpp
// (this kernel against sigmoid_topk_ref).
#include <vector>

#include "cpu/cpu_simd.h"
#include "cpu/thread_pool.h"
#include "moekit/ops/routing.h"
#include "ref/ref_topk.h"

namespace moekit::cpu {

void register_sigmoid_topk_avx512(Registry& r);

namespace {

// Rows x experts below which the call stays on the calling thread (waking the pool costs more).
constexpr int64_t kSerialWork = int64_t(1) << 15;

Status supports(const SigmoidTopkParams& p) {
  return require_host_tensors("sigmoid_topk_avx512",
                              {{"gating", &p.gating}, {"topk_weights", &p.topk_weights}, {"topk_ids", &p.topk_ids}});
}

// Rows [t0, t1).
MOEKIT_CPU_AVX512 void rows(const SigmoidTopkParams& p, int64_t t0, int64_t t1) {
  const int64_t Eg = p.gating.shape[1];
  const int k = p.k;
  std::vector<float> logit(static_cast<size_t>(Eg));
  std::vector<float> best(static_cast<size_t>(k));
  std::vector<int> ids(static_cast<size_t>(k));
  float* w_out = p.topk_weights.ptr<float>();
  int32_t* id_out = p.topk_ids.ptr<int32_t>();
  for (int64_t t = t0; t < t1; ++t) {
    simd::load_clean_row(p.gating.data, p.gating.dtype, t * p.gating.stride[0], Eg, logit.data());
    simd::TopK sel(k, best.data(), ids.data());
    simd::topk_scan(logit.data(), Eg, 0, sel);
    for (int j = 0; j < k; ++j) {
      w_out[t * k + j] = ref::sigmoid_f32(best[size_t(j)]);
      id_out[t * k + j] = ids[size_t(j)];
    }
  }
}

Status run(const SigmoidTopkParams& p, const RunContext&) {
  const int64_t T = p.gating.shape[0];
  parallel_for_if(T * p.gating.shape[1] >= kSerialWork, T, [&](int64_t t0, int64_t t1) { rows(p, t0, t1); });
  return Status::Ok();
}

}  // namespace

void register_sigmoid_topk_avx512(Registry& r) {
  r.add({"sigmoid_topk_avx512", OpKind::sigmoid_topk, MoeVariant::none, Backend::cpu,
         "gating f32|bf16|f16 -> f32 weights, i32 ids; f32 math bit-identical to the ref", 50,
         erase_supports<SigmoidTopkParams, supports>, nullptr, erase_run<SigmoidTopkParams, run>});
}

}  // namespace moekit::cpu
