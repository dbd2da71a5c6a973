// fused_moe_sm90_small_m on the fp8 variants (per-tensor / per-row, router weight on the output or
// the input, and 128 x 128 blocks; src/ops/fused_moe/fused_moe_sm90_small_m_fp8.cuh): the fp8 decode CUDA kernels against the fp8
// reference kernels with the kernel_vs_ref rows of docs/tolerances.md: the harness edge cases and
// presets for per-tensor, per-row and 128 x 128 block schemes (and the router weight on the input),
// a static activation scale, g1u0 with gelu, an expert map, rows of all zeros (amax floor), very
// large values, and supports()' refusals; the block variant's auto kernel fused_moe_sm90_fp8_block
// on both sides of its small_m / grouped choice; f16 x and out (F16Activations).
// Device tests GTEST_SKIP when the kernel is not compiled in or no sm_90 device is present.
// Run: ./build/tests/moekit_tests --gtest_filter='FusedMoeSm90SmallMFp8*:FusedMoeSm90Fp8BlockAuto*'
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "fused_moe_fp8_test_util.h"
#include "fused_moe_test_util.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit::testing {
namespace {

using moe_test::expect_all_ok;
using moe_test::make;
using moe_test::small_shape;

// One row serves every variant; the names stay apart for what each test means.
constexpr const char* kRow = "fused_moe_sm90_small_m";
constexpr const char* kTkw1 = kRow;
constexpr const char* kBlock = kRow;
constexpr const char* kBlockAuto = "fused_moe_sm90_fp8_block";
constexpr const char* kRowAuto = "fused_moe_sm90_fp8_row";
constexpr const char* kTkw1Auto = kRowAuto;

#define SKIP_WITHOUT_KERNEL() MOE_SKIP_WITHOUT_CUDA_KERNEL(kRow)

void expect_matches_ref(MoeProblem& prob) { moe_test::expect_fp8_cuda_matches_ref(prob, kRow, kTkw1); }

// Every case ok and the fp8 CUDA kernel really ran. Refused by design: shuffled and CPU-packed
// (cpu_vnni2_n32) weights, and H or I not multiples of 16 (the "H=200 I=72" case).
void expect_ran(const std::vector<CaseResult>& results) {
  moe_test::expect_fp8_kernels_ran(results, kRow, kTkw1, [](const std::string& name, const std::string&) {
    return name.find("shuffled") != std::string::npos || name.find("(packed)") != std::string::npos ||
           name.find("H=200") != std::string::npos;
  });
}

TEST(FusedMoeSm90SmallMFp8, EdgeCasesPerTensorPerRowAndWeightOnInput) {
  SKIP_WITHOUT_KERNEL();
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    for (bool on_input : {false, true}) {
      SCOPED_TRACE(std::string(scheme_name(sc)) + (on_input ? " weight_on_input" : ""));
      expect_ran(check_fused_moe(moe_test::fp8_cuda_request(sc, {1, 8, 64}, on_input)));
    }
  }
}

TEST(FusedMoeSm90SmallMFp8, Presets) {
  SKIP_WITHOUT_KERNEL();
  for (const char* model : {"deepseek-v3", "qwen3-moe", "mixtral"}) {
    SCOPED_TRACE(model);
    expect_ran(check_fused_moe(moe_test::fp8_cuda_request(Scheme::fp8_channel, {1, 8, 64}, false, model)));
  }
}

TEST(FusedMoeSm90SmallMFp8, StaticActivationScale) {
  SKIP_WITHOUT_KERNEL();
  MoeProblemOptions o;
  o.static_a1_scale = true;
  MoeProblem prob = make(small_shape(Scheme::fp8_channel, 9, 6, 2, 128, 96), o);
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90SmallMFp8, G1U0GeluAndExpertMap) {
  SKIP_WITHOUT_KERNEL();
  MoeProblem prob = moe_test::make_g1u0_gelu_expert_map(Scheme::fp8_channel, 13, 10, 3, 160, 64);
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90SmallMFp8, ZeroRowsAndLargeValues) {
  SKIP_WITHOUT_KERNEL();
  MoeProblem prob = make(small_shape(Scheme::fp8_tensor, 6, 5, 2, 64, 64));
  moe_test::set_zero_and_large_rows(&prob);
  expect_matches_ref(prob);
}

// f16 x and out (every other test uses bf16): per tensor, per row (and the router weight on the
// input) and block scales, at T = 1 and 3.
TEST(FusedMoeSm90SmallMFp8, F16Activations) {
  SKIP_WITHOUT_KERNEL();
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel, Scheme::fp8_block}) {
    for (bool on_input : {false, true}) {
      for (int64_t T : {1, 3}) {
        SCOPED_TRACE(std::string(scheme_name(sc)) + (on_input ? " weight_on_input" : "") + " T=" + std::to_string(T));
        MoeShape shape = small_shape(sc, T, 6, on_input ? 1 : 2, 256, 384);
        shape.weight_on_input = on_input;
        MoeProblem prob = make(shape);
        moe_test::to_f16_activations(&prob);
        if (sc == Scheme::fp8_block) {
          moe_test::expect_fp8_cuda_matches_ref(prob, kBlock, kBlock);
        } else {
          moe_test::expect_fp8_cuda_matches_ref(prob, kRow, kTkw1);
        }
      }
    }
  }
}

// Sizes the fp8 dots cannot take (H or I not a multiple of 16), and grouped configs.
TEST(FusedMoeSm90SmallMFp8, RefusesOddSizesAndGroupedConfigs) {
  if (registry().find(kRow) == nullptr) GTEST_SKIP() << "not compiled in";
  moe_test::expect_refuses(kRow, small_shape(Scheme::fp8_channel, 3, 4, 2, 120, 128));
  moe_test::expect_refuses(std::string(kRow) + " [grouped/64x256.mma4]", small_shape(Scheme::fp8_channel, 3, 4, 2, 128, 128));
}

// ---- 128 x 128 block scales (fused_moe_sm90_small_m_fp8_block)

#define SKIP_WITHOUT_BLOCK_KERNEL() MOE_SKIP_WITHOUT_CUDA_KERNEL(kBlock)

TEST(FusedMoeSm90SmallMFp8, BlockEdgeCasesAndWeightOnInput) {
  SKIP_WITHOUT_BLOCK_KERNEL();
  for (bool on_input : {false, true}) {
    SCOPED_TRACE(on_input ? "weight_on_input" : "weight on the output");
    moe_test::expect_fp8_kernels_ran(check_fused_moe(moe_test::fp8_cuda_request(Scheme::fp8_block, {1, 8, 64}, on_input)),
                                     kBlock, kBlockAuto, moe_test::block_kernel_may_skip);
  }
}

TEST(FusedMoeSm90SmallMFp8, BlockPresets) {
  SKIP_WITHOUT_BLOCK_KERNEL();
  for (const char* model : {"deepseek-v3", "qwen3-moe", "mixtral"}) {
    SCOPED_TRACE(model);
    moe_test::expect_fp8_kernels_ran(check_fused_moe(moe_test::fp8_cuda_request(Scheme::fp8_block, {1, 8}, false, model)),
                                     kBlock, kBlockAuto, moe_test::block_kernel_may_skip);
  }
}

// 3 K groups for gemm1 (H = 384), 2 for gemm2 (I = 256); gate and up rows in different scale blocks;
// experts with several staging passes (9 tokens x 2 slots over 4 experts).
TEST(FusedMoeSm90SmallMFp8, BlockScalesAlongKAndN) {
  SKIP_WITHOUT_BLOCK_KERNEL();
  MoeProblem prob = make(small_shape(Scheme::fp8_block, 9, 4, 2, 384, 256));
  moe_test::expect_fp8_cuda_matches_ref(prob, kBlock, kBlock);
}

TEST(FusedMoeSm90SmallMFp8, BlockG1U0GeluExpertMapAndWeightOnInput) {
  SKIP_WITHOUT_BLOCK_KERNEL();
  MoeProblem prob = moe_test::make_g1u0_gelu_expert_map(Scheme::fp8_block, 13, 10, 3, 256, 128);
  moe_test::expect_fp8_cuda_matches_ref(prob, kBlock, kBlock);
  MoeShape s = small_shape(Scheme::fp8_block, 7, 5, 1, 128, 256);
  s.weight_on_input = true;
  MoeProblem tk = make(s);
  moe_test::expect_fp8_cuda_matches_ref(tk, kBlock, kBlock);
}

TEST(FusedMoeSm90SmallMFp8, BlockZeroRowsAndLargeValues) {
  SKIP_WITHOUT_BLOCK_KERNEL();
  MoeProblem prob = make(small_shape(Scheme::fp8_block, 6, 5, 2, 256, 128));
  moe_test::set_zero_and_large_rows(&prob);
  moe_test::expect_fp8_cuda_matches_ref(prob, kBlock, kBlock);
}

TEST(FusedMoeSm90SmallMFp8, BlockRefusesOddSizes) {
  if (registry().find(kBlock) == nullptr) GTEST_SKIP() << "not compiled in";
  moe_test::expect_refuses(kBlock, small_shape(Scheme::fp8_block, 3, 4, 2, 192, 128));
}

// The auto kernel on every path of choose_moe_strategy_fp8_tma64 and of
// fp8_block_tiles: H = 256 takes the 64 x 256 TMA tiles at T = 1, 24, 200 and 384 (1, 8, 67 and 128
// rows per expert, where 128-row tiles would pad more) and the 128 x 256 tiles at T = 288 and 600 (96
// and 200 rows: both tiles pad to about as many); H = 384 (not a multiple of 256) takes small_m at
// T = 1, the 64-row mma.sync tiles at T = 24 and the 128 x 128 tiles from T = 200.
TEST(FusedMoeSm90Fp8BlockAuto, MatchesTheReferenceOnEveryPath) {
  const std::string why = moe_test::cuda_kernel_unavailable(kBlockAuto);
  if (!why.empty()) GTEST_SKIP() << why;
  for (int64_t H : {256, 384}) {
    for (int64_t T : {1, 24, 200, 288, 384, 600}) {
      SCOPED_TRACE("H = " + std::to_string(H) + ", T = " + std::to_string(T));
      MoeProblem prob = make(small_shape(Scheme::fp8_block, T, 6, 2, H, 256));
      moe_test::expect_fp8_cuda_matches_ref(prob, kBlockAuto, kBlockAuto);
    }
  }
}

// The per-row auto kernel on every path of choose_moe_strategy_fp8_tma64 and of
// fused_moe_sm90_grouped_fp8_tile_m: H = 256 takes the 64 x 256 TMA tiles at T = 1 and 24 (1 and 8
// rows per expert) and 128 x 256 at T = 200 (67 rows); H = 384 (not a multiple of 256) takes small_m
// at T = 1, the 64-row mma.sync tiles at T = 6 (2 rows) and 128 x 256 at T = 200. Then the 64 x 256
// tiles with gemm2 in 4 K ranges (I = 4096 at T = 1), and the router weight on the input.
TEST(FusedMoeSm90Fp8RowAuto, MatchesTheReferenceOnEveryPath) {
  const std::string why = moe_test::cuda_kernel_unavailable(kRowAuto);
  if (!why.empty()) GTEST_SKIP() << why;
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    for (int64_t H : {256, 384}) {
      for (int64_t T : {int64_t(1), H == 256 ? int64_t(24) : int64_t(6), int64_t(200)}) {
        SCOPED_TRACE(std::string(scheme_name(sc)) + " H = " + std::to_string(H) + ", T = " + std::to_string(T));
        MoeProblem prob = make(small_shape(sc, T, 6, 2, H, 256));
        moe_test::expect_fp8_cuda_matches_ref(prob, kRowAuto, kTkw1Auto);
      }
    }
  }
  MoeProblem split = make(small_shape(Scheme::fp8_channel, 1, 6, 2, 256, 4096));
  moe_test::expect_fp8_cuda_matches_ref(split, kRowAuto, kTkw1Auto);
  MoeShape on_input = small_shape(Scheme::fp8_channel, 1, 8, 1, 256, 512);
  on_input.weight_on_input = true;
  MoeProblem tkw1 = make(on_input);
  moe_test::expect_fp8_cuda_matches_ref(tkw1, kRowAuto, kTkw1Auto);
}

}  // namespace
}  // namespace moekit::testing
