// AITER-named adapters over moekit's front doors (moekit/aiter.h). Test: tests/test_aiter.cpp.
#include "moekit/aiter.h"

#include "moekit/core/dtype.h"
#include "moekit/ops/layout.h"
#include "moekit/ops/routing.h"

namespace moekit::aiter {

Status topk_softmax(const TensorView& topk_weights, const TensorView& topk_indices,
                    const TensorView& token_expert_indices, const TensorView& gating_output,
                    bool need_renorm, const RunOptions& opts) {
  TopkSoftmaxParams p;
  p.gating = gating_output;
  p.k = topk_weights.ndim == 2 ? int(topk_weights.shape[1]) : 0;
  p.renormalize = need_renorm;
  p.topk_weights = topk_weights;
  p.topk_ids = topk_indices;
  p.token_expert_indices = token_expert_indices;
  return moekit::topk_softmax(p, opts);
}

Status shuffle_weight(const TensorView& in, const TensorView& out, const RunOptions& opts) {
  ShuffleWeightParams p;
  p.in = in;
  p.out = out;
  p.out.layout = Layout::shuffled_16x16;
  return moekit::shuffle_weight(p, opts);
}

namespace {

FusedMoeParams base(const TensorView& x, const TensorView& w1, const TensorView& w2,
                    const TensorView& topk_weights, const TensorView& topk_ids, const TensorView& out,
                    const TensorView& expert_mask, Activation activation) {
  FusedMoeParams p;
  p.x = x;
  p.w1 = w1;
  p.w2 = w2;
  p.topk_weights = topk_weights;
  p.topk_ids = topk_ids;
  p.out = out;
  p.expert_mask = expert_mask;
  p.activation = activation;
  return p;
}

Status require_fp8(const TensorView& w1, const char* op) {
  if (!is_fp8(w1.dtype)) {
    return InvalidArgument(op, ": w1: dtype must be fp8_e4m3fn, got ", dtype_name(w1.dtype),
                           " (use ck_moe for unquantized weights)");
  }
  return Status::Ok();
}

}  // namespace

Status ck_moe(const TensorView& hidden_states, const TensorView& w1, const TensorView& w2,
              const TensorView& topk_weights, const TensorView& topk_ids, const TensorView& out,
              Activation activation, const TensorView& expert_mask, const RunOptions& opts) {
  if (is_fp8(w1.dtype)) {
    return InvalidArgument("ck_moe: w1: fp8 weights need scales; use asm_moe or fmoe_fp8_blockscale_g1u1");
  }
  return fused_moe(base(hidden_states, w1, w2, topk_weights, topk_ids, out, expert_mask, activation), opts);
}

Status asm_moe(const TensorView& hidden_states, const TensorView& w1, const TensorView& w2,
               const TensorView& topk_weights, const TensorView& topk_ids, const TensorView& fc1_scale,
               const TensorView& fc2_scale, const TensorView& out, const TensorView& a1_scale,
               const TensorView& expert_mask, Activation activation, const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(require_fp8(w1, "asm_moe"));
  FusedMoeParams p = base(hidden_states, w1, w2, topk_weights, topk_ids, out, expert_mask, activation);
  p.w1_scale = fc1_scale;
  p.w2_scale = fc2_scale;
  p.a1_scale = a1_scale;
  return fused_moe(p, opts);
}

Status asm_moe_tkw1(const TensorView& hidden_states, const TensorView& w1, const TensorView& w2,
                    const TensorView& topk_weights, const TensorView& topk_ids,
                    const TensorView& fc1_scale, const TensorView& fc2_scale, const TensorView& out,
                    const TensorView& a1_scale, const TensorView& expert_mask, Activation activation,
                    const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(require_fp8(w1, "asm_moe_tkw1"));
  FusedMoeParams p = base(hidden_states, w1, w2, topk_weights, topk_ids, out, expert_mask, activation);
  p.w1_scale = fc1_scale;
  p.w2_scale = fc2_scale;
  p.a1_scale = a1_scale;
  p.weight_on_input = true;
  return fused_moe(p, opts);
}

Status fmoe_fp8_blockscale_g1u1(const TensorView& hidden_states, const TensorView& w1,
                                const TensorView& w2, const TensorView& topk_weights,
                                const TensorView& topk_ids, const TensorView& fc1_scale,
                                const TensorView& fc2_scale, const TensorView& out, int block_n,
                                int block_k, const TensorView& expert_mask, Activation activation,
                                const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(require_fp8(w1, "fmoe_fp8_blockscale_g1u1"));
  if (block_n < 1 || block_k < 1) {
    return InvalidArgument("fmoe_fp8_blockscale_g1u1: block_n and block_k must be >= 1, got ", block_n, ", ",
                           block_k);
  }
  FusedMoeParams p = base(hidden_states, w1, w2, topk_weights, topk_ids, out, expert_mask, activation);
  p.w1_scale = fc1_scale;
  p.w2_scale = fc2_scale;
  p.scale_block_n = block_n;
  p.scale_block_k = block_k;
  return fused_moe(p, opts);
}

}  // namespace moekit::aiter
