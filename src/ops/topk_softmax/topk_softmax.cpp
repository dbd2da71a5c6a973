// topk_softmax front door (SPEC 1.1): validate -> T == 0 early return -> select -> run.
// Test: tests/test_topk_softmax.cpp.
#include <cstdint>
#include <sstream>

#include "core/check.h"
#include "moekit/ops/routing.h"
#include "ops/routing_checks.h"

namespace moekit {

Status validate_topk_softmax(const TopkSoftmaxParams& p) {
  MOEKIT_RETURN_IF_ERROR(check::routing_gating(p.gating));
  const int64_t T = p.gating.shape[0], Eg = p.gating.shape[1];
  if (p.k < 1 || p.k > Eg) return InvalidArgument("k: must be in [1, Eg=", Eg, "], got ", p.k);
  MOEKIT_RETURN_IF_ERROR(check::routing_outputs(p.gating, p.topk_weights, p.topk_ids, p.k));
  if (p.token_expert_indices.present()) {
    MOEKIT_RETURN_IF_ERROR(check::well_formed(p.token_expert_indices, "token_expert_indices"));
    MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.token_expert_indices, "token_expert_indices", {DType::i32}));
    MOEKIT_RETURN_IF_ERROR(check::shape_is(p.token_expert_indices, "token_expert_indices", {T, p.k}));
    MOEKIT_RETURN_IF_ERROR(check::contiguous(p.token_expert_indices, "token_expert_indices"));
    MOEKIT_RETURN_IF_ERROR(check::same_device(p.gating, "gating", p.token_expert_indices, "token_expert_indices"));
    // NOTE: the largest index written is (k-1)*T + T-1 = T*k - 1, which must fit in i32.
    if (T * p.k > int64_t(INT32_MAX) + 1) {
      return InvalidArgument("token_expert_indices: T*k = ", T, "*", p.k, " = ", T * p.k,
                             " exceeds the i32 index range");
    }
  }
  return Status::Ok();
}

Status topk_softmax(const TopkSoftmaxParams& p, const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(validate_topk_softmax(p));
  if (p.gating.shape[0] == 0) return Status::Ok();  // T = 0: nothing to launch
  std::ostringstream key;
  key << "T=" << p.gating.shape[0] << " Eg=" << p.gating.shape[1] << " k=" << p.k << ' '
      << dtype_name(p.gating.dtype);
  return dispatch(OpKind::topk_softmax, MoeVariant::none, &p, opts, key.str());
}

}  // namespace moekit
