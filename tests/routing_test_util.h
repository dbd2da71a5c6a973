// Test helpers shared by the routing op tests (SPEC 1.1-1.3): tests/test_topk_softmax.cpp,
// tests/test_grouped_topk.cpp, tests/test_sigmoid_topk.cpp. Header-only.
//
// RoutingCall owns the poisoned [T, k] topk_weights / topk_ids outputs of one call and the params
// pointing at them; each test file derives its Call from it and sets the op's own parameters.
#pragma once

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "moekit/ops/routing.h"
#include "testing/harness.h"
#include "testing/oracle_routing.h"

namespace moekit::routing_test {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Outputs poisoned with 0xAB, and the params pointing at them: gating, k, topk_weights, topk_ids.
// Op is the front door that run() calls.
template <class Params, Status (*Op)(const Params&, const RunOptions&)>
struct RoutingCall {
  testing::Buffer w, ids;
  Params p;
  RoutingCall(const testing::Buffer& gating, int k)
      : w(DType::f32, {gating.view.shape[0], k}), ids(DType::i32, {gating.view.shape[0], k}) {
    w.fill_bytes(0xAB);
    ids.fill_bytes(0xAB);
    p.gating = gating.view;
    p.k = k;
    p.topk_weights = w.view;
    p.topk_ids = ids.view;
  }
  Status run() { return Op(p, RunOptions{}); }
  std::vector<int> row_ids(int64_t t) const {
    std::vector<int> v;
    for (int j = 0; j < p.k; ++j) v.push_back(ids.data<int32_t>()[t * p.k + j]);
    return v;
  }
  std::vector<float> row_w(int64_t t) const {
    std::vector<float> v;
    for (int j = 0; j < p.k; ++j) v.push_back(w.data<float>()[t * p.k + j]);
    return v;
  }
  // Compares the outputs with the oracle's: ids exactly, weights within kWeightAtol / kWeightRtol
  // and finite.
  void expect_outputs_match(const testing::RoutingExpect& e) const {
    const std::vector<int64_t> dims = {e.T, e.k};
    const testing::Metrics mi = testing::compare_exact(testing::to_ints(ids.view), e.ids, dims);
    EXPECT_EQ(mi.mismatches, 0) << mi.worst;
    const testing::Metrics mw = testing::compare_close(testing::to_doubles(w.view), e.weights, testing::kWeightAtol,
                                                       testing::kWeightRtol, dims);
    EXPECT_EQ(mw.mismatches, 0) << mw.worst;
    EXPECT_TRUE(mw.finite);
  }
};

inline void expect_error(const Status& s, const std::string& needle) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos) << "message: " << s.message();
}

}  // namespace moekit::routing_test
