// sort_tokens_sm90 (src/ops/sort_tokens/sort_tokens_sm90.cu): the CUDA kernel against sort_tokens_ref,
// every output bit-exact (suite SortTokens, the Cuda* cases; skipped without a CUDA device).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moekit/core/config.h"
#include "moekit/ops/sorting.h"
#include "sort_tokens_test_util.h"
#include "testing/harness.h"
#include "testing/oracle_sort_tokens.h"

namespace moekit::testing {
namespace {

using sort_test::kRef;
using sort_test::make_input;
using sort_test::run_ref;

// ---------------------------------------------------------------- CUDA kernel (sort_tokens_sm90)
// Skipped without a CUDA device. Every output compared bit-exactly with sort_tokens_ref (through
// run_sort_tokens_kernel: mirrored inputs, poisoned mirrored outputs, device workspace).
std::string cuda_unavailable() {
  const Status s = registry().backend_available(Backend::cuda);
  return s.ok() ? "" : "CUDA backend unavailable: " + s.to_string();
}

const Kernel& cuda_kernel() { return *registry().find("sort_tokens_sm90"); }

void expect_cuda_matches_ref(const SortTokensInput& in, const std::string& what) {
  SCOPED_TRACE(what);
  const SortTokensOutput want = run_ref(in);
  SortTokensOutput got;
  int32_t errors = -1;
  const Status s = run_sort_tokens_kernel(in, cuda_kernel(), &got, &errors);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const Metrics m = compare_sort_outputs(got, want);
  EXPECT_EQ(m.mismatches, 0) << m.worst;
  EXPECT_EQ(errors, 0);
}

TEST(SortTokens, CudaKernelIsRegisteredAndRefusesHostTensors) {
  const Kernel* k = registry().find("sort_tokens_sm90");
  if (k == nullptr) GTEST_SKIP() << "built without CUDA";
  EXPECT_EQ(k->backend, Backend::cuda);
  EXPECT_GE(k->priority, 100);
  SortTokensBuffers b(make_input(2, 2, 4, 2, SortEncoding::flat, {0, 1, 2, 3}));
  const SortTokensParams p = b.params();
  const Status s = k->supports(&p);
  EXPECT_EQ(s.code(), StatusCode::unsupported);
  EXPECT_NE(s.message().find("topk_ids"), std::string::npos) << s.message();
  ASSERT_NE(k->workspace_bytes, nullptr);
  EXPECT_GT(k->workspace_bytes(&p), 0u);
}

TEST(SortTokens, CudaCheckHarnessAllPresets) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  for (const char* model : {"mixtral", "deepseek-v3", "llama4", "qwen3-moe"}) {
    CheckRequest req;
    req.shape.model = model;
    req.has_backend = true;
    req.backend = Backend::cuda;
    req.tokens = {1, 7, 64, 4096};
    const std::vector<CaseResult> results = check_sort_tokens(req);
    EXPECT_GE(results.size(), 40u) << model;
    bool saw_bad_ids = false;
    for (const CaseResult& r : results) {
      EXPECT_TRUE(r.ok) << model << " " << r.kernel << " " << r.name << ": " << r.detail;
      EXPECT_EQ(r.detail.rfind("skipped", 0), std::string::npos) << r.name << ": " << r.detail;
      saw_bad_ids = saw_bad_ids || r.name.find("error_count") != std::string::npos;
    }
    EXPECT_TRUE(saw_bad_ids) << model;
  }
}

TEST(SortTokens, CudaHandWorkedAndTZero) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  for (SortEncoding enc : {SortEncoding::packed, SortEncoding::flat}) {
    expect_cuda_matches_ref(make_input(3, 2, 4, 2, enc, {1, 0, 1, 3, 2, 1}), "hand-worked");
    expect_cuda_matches_ref(make_input(0, 2, 4, 4, enc, {}), "T=0");
    expect_cuda_matches_ref(make_input(4, 2, 3, 4, enc, {-1, -1, -1, -1, -1, -1, -1, -1}), "all -1");
    expect_cuda_matches_ref(make_input(2, 3, 2, 3, enc, {1, 1, 1, 0, 1, 0}), "duplicate ids, E < k");
  }
}

TEST(SortTokens, CudaRandomMatchesRef) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  struct Shape {
    int64_t T, k, Eg, bm;
  };
  // Up to T*k = 65536 entries (8192 x 8) and E = 512; E not a power of two; E > T.
  const Shape shapes[] = {{1, 1, 1, 1},       {7, 2, 8, 16},    {4096, 8, 256, 64}, {8192, 8, 512, 128},
                          {4096, 1, 128, 1},  {100, 6, 60, 64}, {17, 3, 257, 5},    {1, 8, 512, 16},
                          {2048, 32, 512, 64}, {65536, 1, 8, 128}};
  int n = 0;
  for (const Shape& s : shapes) {
    for (SortEp ep : {SortEp::none, SortEp::mask, SortEp::map}) {
      for (SortEncoding enc : {SortEncoding::packed, SortEncoding::flat}) {
        SortTokensGen g;
        g.T = s.T;
        g.k = s.k;
        g.Eg = s.Eg;
        g.block_m = s.bm;
        g.ep = ep;
        g.encoding = enc;
        g.skip_prob = (n % 3 == 0) ? 0.2 : 0.0;
        g.distinct = n % 5 != 0;
        g.hot_expert = n % 7 == 3 ? s.Eg / 2 : -1;
        Rng rng(uint64_t(500 + n));
        ++n;
        expect_cuda_matches_ref(random_sort_input(g, rng), "case " + std::to_string(n) + " T=" + std::to_string(s.T) +
                                                               " k=" + std::to_string(s.k) + " Eg=" + std::to_string(s.Eg));
      }
    }
  }
}

TEST(SortTokens, CudaInvalidIdsAreSkippedAndCounted) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  for (SortEncoding enc : {SortEncoding::packed, SortEncoding::flat}) {
    // ids 4 (= Eg), -2 and 1000 are invalid: the result is the ref's with them as -1.
    SortTokensInput bad = make_input(4, 2, 4, 2, enc, {0, 4, -2, 1, 3, 1000, 2, -1});
    SortTokensInput clean = make_input(4, 2, 4, 2, enc, {0, -1, -1, 1, 3, -1, 2, -1});
    const SortTokensOutput want = run_ref(clean);
    SortTokensOutput got;
    int32_t errors = -1;
    const Status s = run_sort_tokens_kernel(bad, cuda_kernel(), &got, &errors);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(compare_sort_outputs(got, want).mismatches, 0) << compare_sort_outputs(got, want).worst;
    EXPECT_EQ(errors, 3);
  }
}

TEST(SortTokens, CudaBenchProblemRuns) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  BenchRequest req;
  req.shape.model = "deepseek-v3";
  std::unique_ptr<BenchProblem> b;
  const Status s = bench_sort_tokens(req, 256, cuda_kernel(), &b);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const Status r = b->run();
  EXPECT_TRUE(r.ok()) << r.to_string();
}


}  // namespace
}  // namespace moekit::testing
