// Argument checks shared by the routing front doors (src/ops/routing_checks.h, SPEC 1).
#include "ops/routing_checks.h"

#include <cstdint>

#include "core/check.h"

namespace moekit::check {

Status routing_gating(const TensorView& gating) {
  MOEKIT_RETURN_IF_ERROR(present(gating, "gating"));
  MOEKIT_RETURN_IF_ERROR(dtype_in(gating, "gating", {DType::f32, DType::bf16, DType::f16}));
  MOEKIT_RETURN_IF_ERROR(shape_is(gating, "gating", {-1, -1}));
  MOEKIT_RETURN_IF_ERROR(row_strided(gating, "gating"));
  const int64_t Eg = gating.shape[1];
  if (Eg < 1) return InvalidArgument("gating: number of experts (dim 1) must be >= 1, got ", Eg);
  return Status::Ok();
}

Status routing_outputs(const TensorView& gating, const TensorView& topk_weights, const TensorView& topk_ids,
                       int k) {
  const int64_t T = gating.shape[0];
  MOEKIT_RETURN_IF_ERROR(present(topk_weights, "topk_weights"));
  MOEKIT_RETURN_IF_ERROR(dtype_in(topk_weights, "topk_weights", {DType::f32}));
  MOEKIT_RETURN_IF_ERROR(shape_is(topk_weights, "topk_weights", {T, k}));
  MOEKIT_RETURN_IF_ERROR(contiguous(topk_weights, "topk_weights"));
  MOEKIT_RETURN_IF_ERROR(present(topk_ids, "topk_ids"));
  MOEKIT_RETURN_IF_ERROR(dtype_in(topk_ids, "topk_ids", {DType::i32}));
  MOEKIT_RETURN_IF_ERROR(shape_is(topk_ids, "topk_ids", {T, k}));
  MOEKIT_RETURN_IF_ERROR(contiguous(topk_ids, "topk_ids"));
  MOEKIT_RETURN_IF_ERROR(same_device(gating, "gating", topk_weights, "topk_weights"));
  MOEKIT_RETURN_IF_ERROR(same_device(gating, "gating", topk_ids, "topk_ids"));
  return outputs_disjoint({{&topk_weights, "topk_weights"}, {&topk_ids, "topk_ids"}}, {{&gating, "gating"}});
}

}  // namespace moekit::check
