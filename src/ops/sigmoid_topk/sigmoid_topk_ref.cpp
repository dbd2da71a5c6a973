// sigmoid_topk reference kernel (SPEC 1.3): scalar, f32, single-threaded. Test:
// tests/test_sigmoid_topk.cpp (against the float64 oracle of src/testing/oracle_routing.cpp).
//
// ids = the k largest RAW logits (NaN = -inf, ties to the lower id), descending; weight =
// sigmoid(logit) of each pick in f32 (NaN / -inf -> 0, +inf -> 1); no renormalization.
#include <vector>

#include "moekit/ops/routing.h"
#include "ref/ref_kernels.h"
#include "ref/ref_topk.h"

namespace moekit::ref {

namespace {

Status supports(const SigmoidTopkParams& p) {
  return require_host({{"gating", &p.gating}, {"topk_weights", &p.topk_weights}, {"topk_ids", &p.topk_ids}});
}

Status run(const SigmoidTopkParams& p, const RunContext&) {
  const int64_t T = p.gating.shape[0], Eg = p.gating.shape[1], k = p.k;
  std::vector<float> logit(static_cast<size_t>(Eg));
  std::vector<int> ids(static_cast<size_t>(k));
  float* w_out = p.topk_weights.ptr<float>();
  int32_t* id_out = p.topk_ids.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = t * p.gating.stride[0];
    for (int64_t e = 0; e < Eg; ++e) logit[size_t(e)] = clean_logit(p.gating.data, p.gating.dtype, row + e);
    topk_desc(logit.data(), Eg, int(k), ids.data());
    for (int64_t j = 0; j < k; ++j) {
      w_out[t * k + j] = sigmoid_f32(logit[size_t(ids[size_t(j)])]);
      id_out[t * k + j] = ids[size_t(j)];
    }
  }
  return Status::Ok();
}

}  // namespace

void register_sigmoid_topk(Registry& r) {
  r.add({"sigmoid_topk_ref", OpKind::sigmoid_topk, MoeVariant::none, Backend::ref,
         "gating f32|bf16|f16 -> f32 weights, i32 ids; f32 math", 0,
         erase_supports<SigmoidTopkParams, supports>, nullptr, erase_run<SigmoidTopkParams, run>});
}

}  // namespace moekit::ref
