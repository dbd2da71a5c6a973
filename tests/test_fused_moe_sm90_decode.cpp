// The one-launch fp8_block decode (config small_m/persistent, src/ops/fused_moe/fused_moe_sm90_decode.cu)
// against fused_moe_ref_fp8_block with the kernel_vs_ref row of docs/tolerances.md: the harness edge
// cases (router weight on the output and on the input) and the presets at T = 1 and 8, H and I of
// several 128-blocks with experts cut between CTAs, g1u0 with gelu over an expert map, an expert
// with more than 8 slots (two column passes), rows of zeros and large values, f16 activations; run to
// run bit equality; and the refusals (T > 8, per-row scales, bf16). The config's name and legality on
// the host: tests/test_fused_moe_sm90_config.cpp. Device tests GTEST_SKIP without an sm_90 device.
// Run: ./build/tests/moekit_tests --gtest_filter='FusedMoeSm90Decode*'
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "fused_moe_fp8_test_util.h"
#include "fused_moe_test_util.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit::testing {
namespace {

using moe_test::make;
using moe_test::small_shape;

constexpr const char* kDecode = "fused_moe_sm90_fp8_block [small_m/persistent]";
constexpr const char* kDecodeRow = "fused_moe_sm90_small_m [small_m/persistent]";

#define SKIP_WITHOUT_KERNEL() MOE_SKIP_WITHOUT_CUDA_KERNEL(kDecode)

// The block kernels' refusals by design, and the config's: more than 8 tokens.
bool decode_may_skip(const std::string& name, const std::string& detail) {
  return moe_test::block_kernel_may_skip(name, detail) || detail.find("takes 1 to 8 tokens") != std::string::npos ||
         detail.find("T must be <= 8") != std::string::npos;
}

TEST(FusedMoeSm90Decode, EdgeCasesAndWeightOnInput) {
  SKIP_WITHOUT_KERNEL();
  for (bool on_input : {false, true}) {
    SCOPED_TRACE(on_input ? "weight_on_input" : "weight on the output");
    const std::vector<CaseResult> results = check_fused_moe(
        moe_test::with_configs(moe_test::fp8_cuda_request(Scheme::fp8_block, {1, 3, 8}, on_input), {kDecode}));
    moe_test::expect_fp8_kernels_ran(results, kDecode, kDecode, decode_may_skip);
  }
}

TEST(FusedMoeSm90Decode, Presets) {
  SKIP_WITHOUT_KERNEL();
  for (const char* model : {"deepseek-v3", "qwen3-moe", "mixtral"}) {
    SCOPED_TRACE(model);
    const std::vector<CaseResult> results = check_fused_moe(
        moe_test::with_configs(moe_test::fp8_cuda_request(Scheme::fp8_block, {1, 8}, false, model), {kDecode}));
    moe_test::expect_fp8_kernels_ran(results, kDecode, kDecode, decode_may_skip);
  }
}

// Several K slices and scale blocks in both gemms (H = 1152: 9 slices; I = 768: 6); the small_m row
// runs the config too.
TEST(FusedMoeSm90Decode, ScalesAlongKAndNAndBothRows) {
  SKIP_WITHOUT_KERNEL();
  for (int64_t T : {1, 5, 8}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    MoeProblem prob = make(small_shape(Scheme::fp8_block, T, 6, 2, 1152, 768));
    moe_test::expect_fp8_cuda_matches_ref(prob, kDecode, kDecode);
    moe_test::expect_fp8_cuda_matches_ref(prob, kDecodeRow, kDecodeRow);
  }
}

// g1u0 with gelu over a 4-of-10 expert map; the router weight on the input (k = 1).
TEST(FusedMoeSm90Decode, G1U0GeluExpertMapAndWeightOnInput) {
  SKIP_WITHOUT_KERNEL();
  MoeProblem prob = moe_test::make_g1u0_gelu_expert_map(Scheme::fp8_block, 7, 10, 3, 256, 256);
  moe_test::expect_fp8_cuda_matches_ref(prob, kDecode, kDecode);
  MoeShape s = small_shape(Scheme::fp8_block, 8, 5, 1, 384, 256);
  s.weight_on_input = true;
  MoeProblem tk = make(s);
  moe_test::expect_fp8_cuda_matches_ref(tk, kDecode, kDecode);
}

// 8 tokens x 4 slots over 2 experts: every expert gets 16 slots, two column passes of the down GEMM.
TEST(FusedMoeSm90Decode, ExpertsWithMoreThanEightSlots) {
  SKIP_WITHOUT_KERNEL();
  MoeProblem prob = make(small_shape(Scheme::fp8_block, 8, 2, 2, 256, 384));
  int32_t* ids = prob.params().topk_ids.ptr<int32_t>();
  for (int64_t i = 0; i < 16; ++i) ids[i] = int32_t(i % 2);  // each token: experts 0 and 1
  moe_test::expect_fp8_cuda_matches_ref(prob, kDecode, kDecode);
}

TEST(FusedMoeSm90Decode, ZeroRowsLargeValuesAndF16) {
  SKIP_WITHOUT_KERNEL();
  MoeProblem prob = make(small_shape(Scheme::fp8_block, 6, 5, 2, 256, 128));
  moe_test::set_zero_and_large_rows(&prob);
  moe_test::expect_fp8_cuda_matches_ref(prob, kDecode, kDecode);
  MoeProblem f16 = make(small_shape(Scheme::fp8_block, 4, 6, 2, 512, 256));
  moe_test::to_f16_activations(&f16);
  moe_test::expect_fp8_cuda_matches_ref(f16, kDecode, kDecode);
}

// Two runs on the same inputs give the same bytes (fixed order of every sum).
TEST(FusedMoeSm90Decode, RunToRunBitEqual) {
  SKIP_WITHOUT_KERNEL();
  MoeProblem prob = make(small_shape(Scheme::fp8_block, 8, 16, 4, 1024, 512));
  FusedMoeParams p = prob.params();
  DeviceMirror dev(Backend::cuda);
  ASSERT_TRUE(mirror_fused_moe(dev, &p).ok());
  std::string kernel, config;
  RunOptions o = moe_test::label_options(kDecode, &kernel, &config);
  size_t ws = 0;
  ASSERT_TRUE(fused_moe_workspace_size(p, o, &ws).ok());
  ASSERT_TRUE(dev.scratch(ws, &o.workspace).ok());
  o.workspace_bytes = ws;
  std::vector<std::vector<double>> outs;
  for (int rep = 0; rep < 2; ++rep) {
    const Status st = fused_moe(p, o);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(dev.copy_back().ok());
    outs.push_back(read_out(prob.params().out));
  }
  ASSERT_EQ(outs[0].size(), outs[1].size());
  EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(double)), 0);
}

TEST(FusedMoeSm90Decode, Refusals) {
  SKIP_WITHOUT_KERNEL();
  moe_test::expect_refuses(kDecode, small_shape(Scheme::fp8_block, 9, 4, 2, 256, 128));          // T > 8
  moe_test::expect_refuses("fused_moe_sm90_fp8_row [small_m/persistent]",                      // per-row scales
                           small_shape(Scheme::fp8_channel, 2, 4, 2, 256, 128));
  moe_test::expect_refuses("fused_moe_sm90_bf16 [small_m/persistent]", small_shape(Scheme::bf16, 2, 4, 2, 256, 128));
}

}  // namespace
}  // namespace moekit::testing
