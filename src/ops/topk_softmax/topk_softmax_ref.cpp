// topk_softmax reference kernel (SPEC 1.1): scalar, f32, single-threaded. Test:
// tests/test_topk_softmax.cpp (against the float64 oracle of src/testing/oracle_routing.cpp).
//
// p = softmax(gating[t]) in f32 with NaN treated as -inf; the k largest p, ties to the lower id,
// in descending order; renormalize divides by the sum of the k picks unless that sum is 0. A row
// with no logit above -inf (all NaN / -inf) has no defined softmax: every p is 0, so it gets ids
// 0..k-1 with weight 0 each. +inf logits share the whole probability mass equally.
#include <cmath>
#include <limits>
#include <vector>

#include "moekit/ops/routing.h"
#include "ref/ref_kernels.h"
#include "ref/ref_topk.h"

namespace moekit::ref {

namespace {

Status supports(const TopkSoftmaxParams& p) {
  return require_host({{"gating", &p.gating}, {"topk_weights", &p.topk_weights}, {"topk_ids", &p.topk_ids},
                       {"token_expert_indices", &p.token_expert_indices}});
}

Status run(const TopkSoftmaxParams& p, const RunContext&) {
  const int64_t T = p.gating.shape[0], Eg = p.gating.shape[1], k = p.k;
  std::vector<float> prob(static_cast<size_t>(Eg));
  std::vector<int> ids(static_cast<size_t>(k));
  float* w_out = p.topk_weights.ptr<float>();
  int32_t* id_out = p.topk_ids.ptr<int32_t>();
  int32_t* tei = p.token_expert_indices.present() ? p.token_expert_indices.ptr<int32_t>() : nullptr;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = t * p.gating.stride[0];
    softmax_row(p.gating.data, p.gating.dtype, row, Eg, prob.data());
    topk_desc(prob.data(), Eg, int(k), ids.data());
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += prob[size_t(ids[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      float w = prob[size_t(ids[size_t(j)])];
      if (p.renormalize && sum > 0.0f) w /= sum;
      w_out[t * k + j] = w;
      id_out[t * k + j] = ids[size_t(j)];
      if (tei) tei[t * k + j] = int32_t(j * T + t);
    }
  }
  return Status::Ok();
}

}  // namespace

void register_topk_softmax(Registry& r) {
  r.add({"topk_softmax_ref", OpKind::topk_softmax, MoeVariant::none, Backend::ref,
         "gating f32|bf16|f16 -> f32 weights, i32 ids; f32 math", 0,
         erase_supports<TopkSoftmaxParams, supports>, nullptr, erase_run<TopkSoftmaxParams, run>});
}

}  // namespace moekit::ref
