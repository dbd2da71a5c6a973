// Helpers shared by the grouped_topk test files (test_grouped_topk.cpp: the reference, the CUDA
// kernel and the contract; test_grouped_topk_avx512.cpp: the CPU kernel).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "moekit/ops/routing.h"
#include "routing_test_util.h"
#include "testing/harness.h"
#include "testing/oracle_routing.h"

namespace moekit::grouped_test {

using testing::Buffer;
using testing::Rng;

inline Buffer bias_of(const std::vector<float>& v) {
  Buffer b(DType::f32, {int64_t(v.size())});
  for (size_t i = 0; i < v.size(); ++i) b.set(int64_t(i), v[i]);
  return b;
}

// Outputs poisoned with 0xAB, and the params pointing at them.
struct Call : routing_test::RoutingCall<GroupedTopkParams, grouped_topk> {
  Call(const Buffer& gating, int k, int n_group, int topk_group, Scoring scoring, const Buffer* bias = nullptr,
       bool renormalize = false, float rsf = 1.0f)
      : RoutingCall(gating, k) {
    if (bias) p.correction_bias = bias->view;
    p.n_group = n_group;
    p.topk_group = topk_group;
    p.scoring = scoring;
    p.renormalize = renormalize;
    p.routed_scaling_factor = rsf;
  }
};

inline void expect_matches_oracle(Call& c, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(c.run().ok());
  c.expect_outputs_match(testing::oracle_grouped_topk(c.p));
}

// Random logits for a given configuration, rows redrawn until the oracle certifies them.
inline Buffer certified_logits(uint64_t seed, int64_t T, int64_t E, const GroupedTopkParams& cfg, DType dt,
                        float grid = 1.0f / 256, int64_t stride = 0) {
  Rng rng(seed);
  return testing::random_logits(rng, T, E, dt, 2.0f, grid, stride, [cfg](const TensorView& g) {
    GroupedTopkParams p = cfg;
    p.gating = g;
    return testing::oracle_grouped_topk(p).min_rel_gap;
  });
}

inline GroupedTopkParams config(int k, int n_group, int topk_group, Scoring scoring, const Buffer* bias = nullptr) {
  GroupedTopkParams p;
  p.k = k;
  p.n_group = n_group;
  p.topk_group = topk_group;
  p.scoring = scoring;
  if (bias) p.correction_bias = bias->view;
  return p;
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace moekit::grouped_test
