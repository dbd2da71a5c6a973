// sigmoid_topk front door (SPEC 1.3): validate -> T == 0 early return -> select -> run.
// Test: tests/test_sigmoid_topk.cpp.
#include <sstream>

#include "moekit/ops/routing.h"
#include "ops/routing_checks.h"

namespace moekit {

Status validate_sigmoid_topk(const SigmoidTopkParams& p) {
  MOEKIT_RETURN_IF_ERROR(check::routing_gating(p.gating));
  const int64_t Eg = p.gating.shape[1];
  if (p.k < 1 || p.k > Eg) return InvalidArgument("k: must be in [1, Eg=", Eg, "], got ", p.k);
  MOEKIT_RETURN_IF_ERROR(check::routing_outputs(p.gating, p.topk_weights, p.topk_ids, p.k));
  return Status::Ok();
}

Status sigmoid_topk(const SigmoidTopkParams& p, const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(validate_sigmoid_topk(p));
  if (p.gating.shape[0] == 0) return Status::Ok();  // T = 0: nothing to launch
  std::ostringstream key;
  key << "T=" << p.gating.shape[0] << " Eg=" << p.gating.shape[1] << " k=" << p.k << ' '
      << dtype_name(p.gating.dtype);
  return dispatch(OpKind::sigmoid_topk, MoeVariant::none, &p, opts, key.str());
}

}  // namespace moekit
