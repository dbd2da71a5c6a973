// Independent oracles for the routing ops (SPEC 1) and the random-logit generator the routing
// tests and `moekit check` share (library target moekit_testing).
//
// The oracles are written differently from the reference kernels on purpose: float64 math, a
// std::stable_sort of (score, id) pairs for every top-k (ties keep the lower id because the pairs
// start in id order), an explicit per-group keep mask for grouped_topk. They read the same Params
// structs the ops take (outputs are ignored) and return ids and weights as plain vectors.
// Used by tests/test_{topk_softmax,grouped_topk,sigmoid_topk}.cpp and src/testing/check_routing.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/ops/routing.h"
#include "testing/harness.h"

namespace moekit::testing {

// What a routing op must produce for one problem, row-major [T, k].
struct RoutingExpect {
  int64_t T = 0, k = 0;
  std::vector<int64_t> ids;
  std::vector<double> weights;
  std::vector<int64_t> token_expert_indices;  // topk_softmax only: [t, j] = j*T + t
  // Per row: the smallest gap between two DIFFERENT scores whose order decides the result
  // (selection scores; group scores too for grouped_topk), |a - b| / max(|a|, |b|) for softmax
  // probabilities and |a - b| / max(|a|, |b|, 1) for O(1) sigmoid / biased scores; +inf when no two
  // differ. Rows below kNearTieGap have an order finer than f32 math resolves (see below).
  std::vector<double> min_rel_gap;
};

RoutingExpect oracle_topk_softmax(const TopkSoftmaxParams& p);
RoutingExpect oracle_grouped_topk(const GroupedTopkParams& p);
RoutingExpect oracle_sigmoid_topk(const SigmoidTopkParams& p);

// NOTE: the contract fixes the order of EXACTLY equal f32 scores (lower id first), but two scores
// that differ by a few ulp may come out equal, or swapped, in any f32 implementation (the ref's
// expf, a GPU's __expf, a different summation order). Exact id compares are only meaningful when
// no row holds such a near-tie, so random rows are redrawn until the oracle certifies them
// (min_rel_gap >= kNearTieGap); exact ties, which the contract does fix, are kept.
constexpr double kNearTieGap = 4e-6;

// Weights: the ops compute in f32, the oracle in float64; a few f32 ulps of the O(1) scores,
// plus renormalize's division and the rsf multiply.
constexpr double kWeightAtol = 1e-6;
constexpr double kWeightRtol = 1e-5;

// Random logits for routing tests: normal(0, stddev) rounded to multiples of `grid` (so equal
// values, i.e. exact ties, occur by construction and distinct values are >= grid apart), stored
// as `dtype`, rows `row_stride` >= E elements apart (row_stride 0 = E). `certify` (may be empty)
// returns the oracle's min_rel_gap for the generated matrix; rows whose gap is below
// kNearTieGap are redrawn (up to 64 times). Returns the buffer; its `view` is the [T, E] gating view
// (row-strided when row_stride > E).
using RowCertifier = std::function<std::vector<double>(const TensorView& gating)>;
Buffer random_logits(Rng& rng, int64_t T, int64_t E, DType dtype, float stddev, float grid,
                     int64_t row_stride = 0, const RowCertifier& certify = {});

// A [E] f32 correction bias: uniform in [-0.5, 0.5] rounded to multiples of 2^-10 (DeepSeek-V3's
// learned bias is of this order).
Buffer random_bias(Rng& rng, int64_t E);

// A [rows, E] gating buffer holding exactly these values (rounded to `dtype`); all rows the same
// length.
Buffer logits_from_rows(const std::vector<std::vector<float>>& rows, DType dtype = DType::f32);

}  // namespace moekit::testing
