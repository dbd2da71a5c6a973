// Helpers shared by the sort_tokens test files (test_sort_tokens.cpp: the reference and the
// contract; test_sort_tokens_sm90.cpp / test_sort_tokens_avx512.cpp: the CUDA and CPU kernels).
#pragma once

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "moekit/ops/sorting.h"
#include "testing/harness.h"
#include "testing/oracle_sort_tokens.h"

namespace moekit::testing::sort_test {

constexpr const char* kRef = "sort_tokens_ref";

inline SortTokensInput make_input(int64_t T, int64_t k, int64_t E, int64_t block_m, SortEncoding enc,
                           std::vector<int32_t> ids, std::vector<float> weights = {}) {
  SortTokensInput in;
  in.T = T;
  in.k = k;
  in.E = E;
  in.block_m = block_m;
  in.encoding = enc;
  in.topk_ids = std::move(ids);
  if (weights.empty()) {
    for (size_t i = 0; i < in.topk_ids.size(); ++i) weights.push_back(float(i + 1) * 0.125f);
  }
  in.topk_weights = std::move(weights);
  return in;
}

// Runs the reference kernel (explicitly, whatever else is registered) on poisoned outputs.
inline SortTokensOutput run_ref(const SortTokensInput& in) {
  SortTokensBuffers b(in);
  b.poison(0xAB);
  RunOptions opts;
  opts.kernel = kRef;
  const Status s = sort_tokens(b.params(), opts);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return b.output();
}

}  // namespace moekit::testing::sort_test
