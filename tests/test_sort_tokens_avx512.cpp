// sort_tokens_avx512 (src/ops/sort_tokens/sort_tokens_avx512.cpp): the CPU kernel against
// sort_tokens_ref, every output bit-exact (suite SortTokens, the Cpu* cases).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu_test_util.h"
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

// ---------------------------------------------------------------- CPU kernel (sort_tokens_avx512)
// Every output compared bit-exactly with sort_tokens_ref; skipped where the CPU lacks AVX-512 F/BW/VL
// (cpu_test::avx512_unavailable()), where the kernel is not registered.
const Kernel& cpu_kernel() { return *registry().find("sort_tokens_avx512"); }

// Where the CPU lacks AVX-512: not registered, and the default dispatch picks sort_tokens_ref.
TEST(SortTokens, CpuKernelIsRegisteredAndRefusesDeviceTensors) {
  SortTokensBuffers b(make_input(2, 2, 4, 2, SortEncoding::flat, {0, 1, 2, 3}));
  SortTokensParams p = b.params();
  if (!cpu_test::avx512_unavailable().empty()) {
    cpu_test::expect_not_registered_and_falls_back(OpKind::sort_tokens, "sort_tokens_avx512", kRef, p);
    return;
  }
  ASSERT_NE(registry().find("sort_tokens_avx512"), nullptr);
  EXPECT_EQ(cpu_kernel().backend, Backend::cpu);
  EXPECT_GT(cpu_kernel().priority, registry().find(kRef)->priority);
  EXPECT_TRUE(cpu_kernel().supports(&p).ok());
  const Kernel* chosen = nullptr;  // the default dispatch picks it on this CPU
  ASSERT_TRUE(registry().select_with(Config{}, OpKind::sort_tokens, MoeVariant::none, &p, RunOptions{}, "t", &chosen).ok());
  EXPECT_STREQ(chosen->name, "sort_tokens_avx512");
  p.num_valid.device = Device::cuda;
  const Status s = cpu_kernel().supports(&p);
  EXPECT_EQ(s.code(), StatusCode::unsupported);
  EXPECT_NE(s.message().find("num_valid"), std::string::npos) << s.message();
}

TEST(SortTokens, CpuCheckHarnessAllPresets) {
  CPU_SKIP_IF(cpu_test::avx512_unavailable());
  for (const char* model : {"mixtral", "deepseek-v3", "llama4", "qwen3-moe"}) {
    CheckRequest req;
    req.shape.model = model;
    req.has_backend = true;
    req.backend = Backend::cpu;
    req.tokens = {1, 7, 64, 4096};
    const std::vector<CaseResult> results = check_sort_tokens(req);
    EXPECT_GE(results.size(), 40u) << model;
    for (const CaseResult& r : results) {
      EXPECT_TRUE(r.ok) << model << " " << r.kernel << " " << r.name << ": " << r.detail;
      EXPECT_EQ(r.detail.rfind("skipped", 0), std::string::npos) << r.name << ": " << r.detail;
    }
  }
}

// T not a multiple of the chunk count, problems above and below the threaded size (T*k >= 2^18),
// E not a power of two, E > T, hot experts, -1 ids, mask and map, both encodings.
TEST(SortTokens, CpuRandomMatchesRefAcrossTheThreadSplit) {
  CPU_SKIP_IF(cpu_test::avx512_unavailable());
  struct Shape {
    int64_t T, k, Eg, bm;
  };
  const Shape shapes[] = {{1, 1, 1, 1},       {7, 2, 8, 16},      {4097, 8, 256, 64}, {262147, 1, 8, 128},
                          {32771, 8, 257, 16}, {3001, 6, 60, 1}, {17, 3, 257, 5},    {2048, 8, 3, 32}};
  int n = 0;
  for (const Shape& s : shapes) {
    for (SortEp ep : {SortEp::none, SortEp::mask, SortEp::map}) {
      for (SortEncoding enc : {SortEncoding::packed, SortEncoding::flat}) {
        SortTokensGen g;
        g.T = s.T, g.k = s.k, g.Eg = s.Eg, g.block_m = s.bm, g.ep = ep, g.encoding = enc;
        g.skip_prob = (n % 3 == 0) ? 0.2 : 0.0;
        g.distinct = n % 5 != 0 && s.k <= s.Eg;
        g.hot_expert = n % 7 == 3 ? s.Eg / 2 : -1;
        Rng rng(uint64_t(900 + n));
        const SortTokensInput in = random_sort_input(g, rng);
        SCOPED_TRACE("case " + std::to_string(n++) + " T=" + std::to_string(s.T) + " Eg=" + std::to_string(s.Eg));
        const SortTokensOutput want = run_ref(in);
        SortTokensOutput got;
        int32_t errors = -1;
        ASSERT_TRUE(run_sort_tokens_kernel(in, cpu_kernel(), &got, &errors).ok());
        const Metrics m = compare_sort_outputs(got, want);
        EXPECT_EQ(m.mismatches, 0) << m.worst;
        EXPECT_EQ(errors, 0);
      }
    }
  }
}

// The kernel's own scan (reached through Kernel::run, past the front door's validation) reports the
// FIRST bad id in (token, slot) order, also when a later thread chunk holds another, and writes nothing.
TEST(SortTokens, CpuKernelRejectsTheFirstBadIdBeforeWriting) {
  CPU_SKIP_IF(cpu_test::avx512_unavailable());
  std::vector<int32_t> ids(size_t(70000 * 4));  // above the threaded size
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i % 7);
  ids[size_t(69000 * 4 + 1)] = -5;  // in the second half (another thread's chunk)
  ids[size_t(2450 * 4 + 0)] = 9;    // later in the first half
  ids[size_t(2400 * 4 + 3)] = 7;    // the first bad id
  SortTokensBuffers b(make_input(70000, 4, 7, 16, SortEncoding::packed, ids));
  b.poison(0xAB);
  const SortTokensParams p = b.params();
  const Status s = cpu_kernel().run(&p, RunContext{});
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("topk_ids: token 2400 slot 3 has expert id 7"), std::string::npos) << s.message();
  for (const Buffer* out : {&b.sorted_token_ids, &b.sorted_weights, &b.sorted_expert_ids, &b.num_valid}) {
    for (unsigned char byte : out->bytes) ASSERT_EQ(byte, 0xAB);
  }
}


}  // namespace
}  // namespace moekit::testing
