// moekit/aiter.h: the same entry points under the names they have in AMD's AITER library (as
// registered in vLLM), so a user coming from there finds their op. Each is a thin adapter that
// fills the op's Params and calls the moekit front door; the arguments keep AITER's order where
// it has one, with moekit's explicit output tensors added (moekit never allocates).
//
//   aiter name                  moekit op / variant
//   topk_softmax                topk_softmax
//   shuffle_weight              shuffle_weight (layout (16, 16))
//   ck_moe                      fused_moe, unquantized (bf16 / f16)
//   asm_moe                     fused_moe, fp8 W8A8: per-row or per-tensor weight scales, dynamic
//                               per-token activations (or a static a1_scale)
//   asm_moe_tkw1                fused_moe, fp8 W8A8 with the router weight on the input (k == 1)
//   fmoe_fp8_blockscale_g1u1    fused_moe, fp8 128x128 block scales with 1x128 activation groups
// NOTE: AITER's fmoe_fp8_blockscale_g1u1 takes the outputs of moe_sorting; moekit's takes the
// routing (topk_ids / topk_weights) and sorts internally, like ck_moe and asm_moe.
#pragma once

#include "moekit/core/status.h"
#include "moekit/core/tensor_view.h"
#include "moekit/ops/fused_moe.h"
#include "moekit/registry.h"

namespace moekit::aiter {

// topk_weights [T, k] f32 out, topk_indices [T, k] i32 out, token_expert_indices [T, k] i32 out
// (optional), gating_output [T, Eg]; k is taken from topk_weights.
Status topk_softmax(const TensorView& topk_weights, const TensorView& topk_indices,
                    const TensorView& token_expert_indices, const TensorView& gating_output,
                    bool need_renorm, const RunOptions& opts = {});

// in [..., N, K] row-major -> out, same shape, layout shuffled_16x16 (out's tag is set here on a
// copy of the view; the caller's buffer must be sized like `in`).
Status shuffle_weight(const TensorView& in, const TensorView& out, const RunOptions& opts = {});

Status ck_moe(const TensorView& hidden_states, const TensorView& w1, const TensorView& w2,
              const TensorView& topk_weights, const TensorView& topk_ids, const TensorView& out,
              Activation activation = Activation::silu, const TensorView& expert_mask = {},
              const RunOptions& opts = {});

// fc1_scale / fc2_scale: [E] per-tensor or [E, N, 1] per-row f32; a1_scale: optional [1] static.
Status asm_moe(const TensorView& hidden_states, const TensorView& w1, const TensorView& w2,
               const TensorView& topk_weights, const TensorView& topk_ids, const TensorView& fc1_scale,
               const TensorView& fc2_scale, const TensorView& out, const TensorView& a1_scale = {},
               const TensorView& expert_mask = {}, Activation activation = Activation::silu,
               const RunOptions& opts = {});

Status asm_moe_tkw1(const TensorView& hidden_states, const TensorView& w1, const TensorView& w2,
                    const TensorView& topk_weights, const TensorView& topk_ids,
                    const TensorView& fc1_scale, const TensorView& fc2_scale, const TensorView& out,
                    const TensorView& a1_scale = {}, const TensorView& expert_mask = {},
                    Activation activation = Activation::silu, const RunOptions& opts = {});

// fc1_scale [E, ceil(2I/block_n), ceil(H/block_k)], fc2_scale [E, ceil(H/block_n), ceil(I/block_k)].
Status fmoe_fp8_blockscale_g1u1(const TensorView& hidden_states, const TensorView& w1,
                                const TensorView& w2, const TensorView& topk_weights,
                                const TensorView& topk_ids, const TensorView& fc1_scale,
                                const TensorView& fc2_scale, const TensorView& out, int block_n = 128,
                                int block_k = 128, const TensorView& expert_mask = {},
                                Activation activation = Activation::silu, const RunOptions& opts = {});

}  // namespace moekit::aiter
