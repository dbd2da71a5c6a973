// Test helpers shared by the fused_moe tests (SPEC 3): tests/test_fused_moe.cpp (unquantized
// variant and validation) and tests/test_fused_moe_fp8.cpp (fp8 variants). Header-only.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit::testing::moe_test {

// A small problem shape: T 7, E 6, k 2, H 96, I 64 unless given.
inline MoeShape small_shape(Scheme scheme = Scheme::bf16, int64_t T = 7, int64_t E = 6, int64_t k = 2,
                            int64_t H = 96, int64_t I = 64) {
  MoeShape s;
  s.label = "test";
  s.scheme = scheme;
  s.T = T;
  s.E = E;
  s.k = k;
  s.H = H;
  s.I = I;
  return s;
}

// The random problem of shape s (make_moe_problem); a failure to build it fails the test.
inline MoeProblem make(const MoeShape& s, const MoeProblemOptions& o = {}, uint64_t seed = 1) {
  MoeProblem p;
  const Status st = make_moe_problem(s, o, seed, &p);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return p;
}

// Runs on prob and expects agreement with the oracle.
inline void expect_matches_oracle(MoeProblem& prob, const RunOptions& opts = {}) {
  std::string detail;
  EXPECT_TRUE(run_against_oracle(prob, opts, &detail)) << detail;
}

// Routes consecutive (token, slot) entries of prob to experts 0, 1, ... with counts[e] entries each
// (the counts must cover every entry), then refreshes the touched-expert weights.
inline void assign_expert_rows(MoeProblem* prob, const std::vector<int>& counts) {
  int32_t* ids = prob->topk_ids.data<int32_t>();
  int64_t t = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    for (int n = 0; n < counts[e]; ++n) ids[t++] = int32_t(e);
  }
  ASSERT_EQ(t, prob->topk_ids.numel());
  update_touched(prob);
}

// Every case of a harness hook's answer passed (and there is at least one).
inline void expect_all_ok(const std::vector<CaseResult>& results) {
  EXPECT_FALSE(results.empty());
  for (const CaseResult& r : results) EXPECT_TRUE(r.ok) << r.kernel << " | " << r.name << " | " << r.detail;
}

}  // namespace moekit::testing::moe_test
