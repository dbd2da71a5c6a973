// moekit/ops/routing.h: router ops (SPEC 1). topk_softmax (Mixtral, Qwen3), grouped_topk
// (DeepSeek-V2/V3, with or without correction bias), sigmoid_topk (Llama-4).
//
// All three read gating logits [T, Eg] (f32, bf16 or f16, computed in f32; row stride may exceed
// Eg, last dim contiguous) and write caller-allocated outputs. Ties always go to the LOWER expert
// id; ids come out in descending weight order (descending selection score for grouped_topk).
#pragma once

#include "moekit/core/tensor_view.h"
#include "moekit/registry.h"

namespace moekit {

struct TopkSoftmaxParams {
  TensorView gating;                // [T, Eg] f32|bf16|f16
  int k = 1;                        // 1 <= k <= Eg
  bool renormalize = false;         // w /= sum(w) over the k picks (skipped when the sum is 0)
  TensorView topk_weights;          // [T, k] f32 out
  TensorView topk_ids;              // [T, k] i32 out
  TensorView token_expert_indices;  // [T, k] i32 out, optional: [t, j] = j*T + t
};
// NaN logits count as -inf. A row with no finite or +inf logit (all NaN / -inf) has no softmax: it
// gets ids 0..k-1 with weight 0 each (renormalize skips a zero sum). +inf logits share the mass
// equally. See docs/ops.md, "non-finite logits".
Status topk_softmax(const TopkSoftmaxParams& p, const RunOptions& opts = {});
Status validate_topk_softmax(const TopkSoftmaxParams& p);

enum class Scoring : uint8_t { softmax, sigmoid };
const char* scoring_name(Scoring s);

struct GroupedTopkParams {
  TensorView gating;               // [T, Eg] f32|bf16|f16
  TensorView correction_bias;      // [Eg] f32, optional: added to scores for SELECTION only
  int k = 1;                       // k <= topk_group * (Eg / n_group)
  int n_group = 1;                 // Eg % n_group == 0
  int topk_group = 1;              // 1 <= topk_group <= n_group
  Scoring scoring = Scoring::softmax;
  bool renormalize = false;
  float routed_scaling_factor = 1.0f;  // applied exactly once, here (w *= rsf after renormalize)
  TensorView topk_weights;         // [T, k] f32 out (unbiased scores of the picks)
  TensorView topk_ids;             // [T, k] i32 out
};
Status grouped_topk(const GroupedTopkParams& p, const RunOptions& opts = {});
Status validate_grouped_topk(const GroupedTopkParams& p);

struct SigmoidTopkParams {
  TensorView gating;               // [T, Eg] f32|bf16|f16
  int k = 1;                       // 1 <= k <= Eg (Llama-4: 1)
  TensorView topk_weights;         // [T, k] f32 out: sigmoid(selected raw logit), no renormalize
  TensorView topk_ids;             // [T, k] i32 out: top-k of the RAW logits
};
Status sigmoid_topk(const SigmoidTopkParams& p, const RunOptions& opts = {});
Status validate_sigmoid_topk(const SigmoidTopkParams& p);

}  // namespace moekit
