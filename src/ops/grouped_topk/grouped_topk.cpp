// grouped_topk front door (SPEC 1.2): validate -> T == 0 early return -> select -> run.
// Test: tests/test_grouped_topk.cpp.
#include <cmath>
#include <sstream>

#include "core/check.h"
#include "moekit/ops/routing.h"
#include "ops/routing_checks.h"

namespace moekit {

const char* scoring_name(Scoring s) {
  switch (s) {
    case Scoring::softmax: return "softmax";
    case Scoring::sigmoid: return "sigmoid";
  }
  return "?";
}

Status validate_grouped_topk(const GroupedTopkParams& p) {
  MOEKIT_RETURN_IF_ERROR(check::routing_gating(p.gating));
  const int64_t Eg = p.gating.shape[1];
  if (p.n_group < 1) return InvalidArgument("n_group: must be >= 1, got ", p.n_group);
  if (Eg % p.n_group != 0) {
    return InvalidArgument("n_group: Eg=", Eg, " is not divisible by n_group=", p.n_group);
  }
  if (p.topk_group < 1 || p.topk_group > p.n_group) {
    return InvalidArgument("topk_group: must be in [1, n_group=", p.n_group, "], got ", p.topk_group);
  }
  const int64_t max_k = int64_t(p.topk_group) * (Eg / p.n_group);
  if (p.k < 1 || p.k > max_k) {
    return InvalidArgument("k: must be in [1, topk_group*(Eg/n_group)=", p.topk_group, "*", Eg / p.n_group,
                           "=", max_k, "], got ", p.k);
  }
  if (p.scoring != Scoring::softmax && p.scoring != Scoring::sigmoid) {
    return InvalidArgument("scoring: must be softmax or sigmoid, got ", int(p.scoring));
  }
  if (!std::isfinite(p.routed_scaling_factor) || !(p.routed_scaling_factor > 0.0f)) {
    return InvalidArgument("routed_scaling_factor: must be finite and > 0, got ", p.routed_scaling_factor);
  }
  if (p.correction_bias.present()) {
    MOEKIT_RETURN_IF_ERROR(check::well_formed(p.correction_bias, "correction_bias"));
    MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.correction_bias, "correction_bias", {DType::f32}));
    MOEKIT_RETURN_IF_ERROR(check::shape_is(p.correction_bias, "correction_bias", {Eg}));
    MOEKIT_RETURN_IF_ERROR(check::contiguous(p.correction_bias, "correction_bias"));
    MOEKIT_RETURN_IF_ERROR(check::same_device(p.gating, "gating", p.correction_bias, "correction_bias"));
  }
  MOEKIT_RETURN_IF_ERROR(check::routing_outputs(p.gating, p.topk_weights, p.topk_ids, p.k));
  return check::outputs_disjoint({{&p.topk_weights, "topk_weights"}, {&p.topk_ids, "topk_ids"}},
                                 {{&p.correction_bias, "correction_bias"}});
}

Status grouped_topk(const GroupedTopkParams& p, const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(validate_grouped_topk(p));
  if (p.gating.shape[0] == 0) return Status::Ok();  // T = 0: nothing to launch
  std::ostringstream key;
  key << "T=" << p.gating.shape[0] << " Eg=" << p.gating.shape[1] << " k=" << p.k << " groups=" << p.topk_group
      << '/' << p.n_group << ' ' << scoring_name(p.scoring) << (p.correction_bias.present() ? "+bias " : " ")
      << dtype_name(p.gating.dtype);
  return dispatch(OpKind::grouped_topk, MoeVariant::none, &p, opts, key.str());
}

}  // namespace moekit
