// moekit/ops/routing.h: router ops (SPEC 1). topk_softmax (Mixtral, Qwen3), grouped_topk
// (DeepSeek-V2/V3, with or without correction bias), sigmoid_topk (Llama-4).
//
// Common to all three:
//   - gating logits [T, Eg] f32, bf16 or f16, converted to f32 on load; all math in f32. The row
//     stride may exceed Eg (a slice of a wider buffer); the last dim must be contiguous.
//   - outputs are caller-allocated, contiguous, on the same device as gating.
//   - ties always go to the LOWER expert id (and the lower group id for groups); ids come out in
//     descending order of the selection score (p, b or the raw logit, see each op).
//   - ids are always k DISTINCT ids in [0, Eg), whatever the logits hold.
//   - a NaN logit counts as -inf; every selection treats a NaN score like -inf (below every finite
//     score). Exactly what that gives is stated per op below.
//   - every argument is validated before anything is written; T = 0 returns after validation with
//     nothing written.
// Tests: tests/test_topk_softmax.cpp, tests/test_grouped_topk.cpp, tests/test_sigmoid_topk.cpp;
// `moekit check --op <op>` runs the same cases (src/testing/check_routing.cpp).
#pragma once

#include "moekit/core/tensor_view.h"
#include "moekit/registry.h"

namespace moekit {

// ------------------------------------------------------------------ topk_softmax (SPEC 1.1)
// p = softmax(gating[t]); ids = the k largest p; weights = p[ids], divided by their sum when
// `renormalize` (skipped when that sum is 0).
// Non-finite logits:
//   - NaN = -inf: its p is 0 (exactly).
//   - -inf: p = 0 exactly.
//   - +inf: the +inf logits of the row share the mass equally (each 1/count), every other p is 0.
//   - a row with no logit above -inf (all NaN / -inf): every p is 0, so ids are 0..k-1 and every
//     weight is 0 (also with renormalize, whose zero sum is skipped).
struct TopkSoftmaxParams {
  TensorView gating;                // [T, Eg] f32|bf16|f16, row stride >= Eg
  int k = 1;                        // experts per token, 1 <= k <= Eg
  bool renormalize = false;         // w /= sum(w) over the k picks (skipped when the sum is 0)
  TensorView topk_weights;          // [T, k] f32 out: p of each pick, descending
  TensorView topk_ids;              // [T, k] i32 out: expert ids in [0, Eg), distinct per row
  TensorView token_expert_indices;  // [T, k] i32 out, optional: [t, j] = j*T + t (T*k <= 2^31)
};
Status topk_softmax(const TopkSoftmaxParams& p, const RunOptions& opts = {});
Status validate_topk_softmax(const TopkSoftmaxParams& p);

// ------------------------------------------------------------------ grouped_topk (SPEC 1.2)
enum class Scoring : uint8_t {
  softmax,  // s = softmax over the whole row (same rules as topk_softmax)
  sigmoid,  // s = sigmoid(logit) per element
};
const char* scoring_name(Scoring s);  // "softmax" | "sigmoid"

// s = scoring(gating[t]) in f32; b = s + correction_bias (SELECTION only; b = s without a bias).
// The Eg experts form n_group groups of G = Eg / n_group consecutive ids. Group score = sum of the
// two largest b of the group when a bias is given (G = 1: that one b), the largest b otherwise.
// The topk_group best groups are kept (ties to the lower group id); the experts of the other groups
// get b = -inf and rank below every expert of a kept group (never 0: with negative biased scores a
// masked expert must still lose). ids = top-k of b, descending b; weights = s[ids] (unbiased),
// divided by their sum when `renormalize` (skipped when it is 0), then multiplied by
// routed_scaling_factor. rsf is applied here exactly once; the model must not apply it again.
// Non-finite values:
//   - NaN logit = -inf: softmax scoring gives s = 0 (a row with no logit above -inf: all s = 0;
//     +inf logits share the mass), sigmoid scoring gives s = 0; b = bias there (its selection
//     score is the bias alone) and the weight of such an expert, if picked, is 0.
//   - +inf logit: sigmoid s = 1.
//   - a NaN b (only possible from a NaN bias) ranks like -inf; a NaN group score (e.g. +inf + -inf
//     from an infinite bias) ranks like -inf. ids still come from the kept groups only.
struct GroupedTopkParams {
  TensorView gating;               // [T, Eg] f32|bf16|f16, row stride >= Eg
  TensorView correction_bias;      // [Eg] f32, optional: added to s for SELECTION only
  int k = 1;                       // experts per token, 1 <= k <= topk_group * (Eg / n_group)
  int n_group = 1;                 // number of expert groups, >= 1, Eg % n_group == 0
  int topk_group = 1;              // groups kept per token, 1 <= topk_group <= n_group
  Scoring scoring = Scoring::softmax;  // how s is computed from the logits
  bool renormalize = false;        // w /= sum(w) over the k picks (skipped when the sum is 0)
  float routed_scaling_factor = 1.0f;  // finite, > 0: w *= rsf after renormalize
  TensorView topk_weights;         // [T, k] f32 out: rsf * (renormalized) unbiased s of the picks
  TensorView topk_ids;             // [T, k] i32 out: ids in [0, Eg), distinct, descending b
};
Status grouped_topk(const GroupedTopkParams& p, const RunOptions& opts = {});
Status validate_grouped_topk(const GroupedTopkParams& p);

// ------------------------------------------------------------------ sigmoid_topk (SPEC 1.3)
// ids = top-k of the RAW logits (descending); weights = sigmoid(logit of the pick); no
// renormalization. Llama-4 uses k = 1 and applies the weight on the expert input (SPEC 3.4).
// Non-finite logits: NaN = -inf, ranking below every finite logit; a picked -inf / NaN logit has
// weight 0, a picked +inf logit weight 1. A row of all NaN / -inf gives ids 0..k-1, weights 0.
struct SigmoidTopkParams {
  TensorView gating;               // [T, Eg] f32|bf16|f16, row stride >= Eg
  int k = 1;                       // experts per token, 1 <= k <= Eg (Llama-4: 1)
  TensorView topk_weights;         // [T, k] f32 out: sigmoid(selected raw logit), no renormalize
  TensorView topk_ids;             // [T, k] i32 out: top-k of the RAW logits, distinct
};
Status sigmoid_topk(const SigmoidTopkParams& p, const RunOptions& opts = {});
Status validate_sigmoid_topk(const SigmoidTopkParams& p);

}  // namespace moekit
