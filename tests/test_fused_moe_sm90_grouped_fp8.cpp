// The fp8 W8A8 prefill CUDA tiles (src/ops/fused_moe/fused_moe_sm90_grouped_fp8.cu), run as configs of
// fused_moe_sm90_fp8_row (docs/fused_moe_configs.md), and that kernel's own choice, against the fp8
// reference kernels with the kernel_vs_ref rows of docs/tolerances.md: the harness edge cases and
// presets (per-tensor, per-row, router weight on the input), several 128-row M tiles per expert,
// tails around the warpgroup cut, tail tiles of both gemms, gemm2 in two K ranges, a static
// activation scale, g1u0 with gelu and an expert map, rows of all zeros, large values, f16 x and out
// (F16Activations), and supports()' refusals. Suite FusedMoeSm90GroupedFp8: grouped/128x256.ws4;
// ...Bm64: grouped/64x256.mma4 (mma.sync e4m3) at decode-sized T; ...Tma64: grouped/64x256.ring5
// (TMA + QGMMA; H % 256 == 0); ...M192: grouped/192x256.ws3 (three consumer warpgroups).
// Device tests GTEST_SKIP when the kernel is not compiled in or no sm_90 device is present.
// Run: ./build/tests/moekit_tests --gtest_filter='FusedMoeSm90GroupedFp8*'  (Bm64 included)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/device_facts.h"
#include "fused_moe_fp8_test_util.h"
#include "fused_moe_test_util.h"
#include "ops/fused_moe/fused_moe_sm90_grouped.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit::testing {
namespace {

using moe_test::make;
using moe_test::small_shape;

// The tiles under test are configs of the fp8_row kernel (docs/fused_moe_configs.md); it serves the
// router weight on the output and on the input alike, so each pair below names one label twice.
constexpr const char* kRow = "fused_moe_sm90_fp8_row [grouped/128x256.ws4]";
constexpr const char* kTkw1 = kRow;
constexpr const char* kAutoRow = "fused_moe_sm90_fp8_row";
constexpr const char* kAutoTkw1 = kAutoRow;

#define SKIP_WITHOUT_KERNEL() MOE_SKIP_WITHOUT_CUDA_KERNEL(kRow)

// A per-row kernel and its router-weight-on-input twin.
struct RowPair {
  std::string row, tkw1;
};
const RowPair kRow128{kRow, kTkw1};

void expect_matches_ref(MoeProblem& prob, RowPair k = kRow128, MoeCompare c = MoeCompare::kernel_vs_ref) {
  moe_test::expect_fp8_cuda_matches_ref(prob, k.row, k.tkw1, c);
}

// Refused by design: shuffled and CPU-packed weights; H or I not multiples of 32 (every tile) or of 128
// (the TMA tiles; the tma64 kernels: H not a multiple of 256); rows not 16-byte aligned (H = 96 with a
// row stride of 101 reaches that check now that the mma tiles take H = 96).
bool may_skip(const std::string& name, const std::string& detail) {
  for (const char* why : {"multiple of 32", "multiple of 128", "multiples of 128", "multiple of 16", "multiple of 256",
                          "16-byte aligned"}) {
    if (detail.find(why) != std::string::npos) return true;
  }
  return name.find("shuffled") != std::string::npos || name.find("(packed)") != std::string::npos;
}

// The harness edge cases at T = 1, 8, 64, 300, per tensor and per row, each with the router weight on
// the input too: every listed (kernel, tkw1 twin) pair ran and matched (refusals only by design).
void expect_edge_cases_ran(const std::vector<RowPair>& kernels) {
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    for (bool on_input : {false, true}) {
      SCOPED_TRACE(std::string(scheme_name(sc)) + (on_input ? " weight_on_input" : ""));
      std::vector<std::string> labels;
      for (const RowPair& k : kernels) labels.push_back(k.row);
      const std::vector<CaseResult> results =
          check_fused_moe(moe_test::with_configs(moe_test::fp8_cuda_request(sc, {1, 8, 64, 300}, on_input), labels));
      for (const RowPair& k : kernels) moe_test::expect_fp8_kernels_ran(results, k.row, k.tkw1, may_skip);
    }
  }
}

TEST(FusedMoeSm90GroupedFp8, EdgeCasesPerTensorPerRowAndWeightOnInput) {
  SKIP_WITHOUT_KERNEL();
  expect_edge_cases_ran({kRow128, {kAutoRow, kAutoTkw1}});
}

TEST(FusedMoeSm90GroupedFp8, Presets) {
  SKIP_WITHOUT_KERNEL();
  // NOTE: the host fp8 reference dominates the run time (its cost grows with T): T = 48 gives
  // the scaled presets several rows per touched expert while the test stays in seconds.
  for (const char* model : {"deepseek-v3", "qwen3-moe", "mixtral", "llama4"}) {
    SCOPED_TRACE(model);
    CheckRequest req = moe_test::fp8_cuda_request(Scheme::fp8_channel, {48}, std::string(model) == "llama4", model);
    moe_test::expect_fp8_kernels_ran(check_fused_moe(moe_test::with_configs(req, {kRow})), kRow, kTkw1, may_skip);
  }
}

// 800 rows over 6 experts: several 128-row M tiles per expert, partial last tiles, H = 256 (2 K
// slices), I = 384 (gemm1: 3 N tiles of 128 gate + 128 up; gemm2: one K range of 3 slices).
TEST(FusedMoeSm90GroupedFp8, ManyMTilesPerExpert) {
  SKIP_WITHOUT_KERNEL();
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    MoeProblem prob = make(small_shape(sc, 400, 6, 2, 256, 384));
    expect_matches_ref(prob);
  }
}

// Cases shared by the 128- and 192-row suites (k: the kernel pair under test).
// Tails around the warpgroup cut (experts with 64, 65, 1, 192 and 129 rows, expert 5 empty) and
// gemm2 in two K ranges (I = 1024: 8 slices of 128 codes, fused_moe_sm90_grouped_gemm2_splits).
void expect_tail_tiles_and_split_k_gemm2(RowPair k) {
  MoeProblem prob = make(small_shape(Scheme::fp8_channel, 451, 6, 1, 384, 1024));
  moe_test::assign_expert_rows(&prob, {64, 65, 1, 192, 129});
  expect_matches_ref(prob, k);
}
// Long K loops: gemm1 over H = 4096 (32 slices), gemm2 over I = 4096 (with k = 2 and 3 experts, one
// or two K ranges), per tensor and per row. These kernels sum all of K in the tensor cores' e4m3
// accumulators: compared under MoeCompare::kernel_tc_vs_ref (docs/tolerances.md).
void expect_long_k(RowPair k) {
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    SCOPED_TRACE(scheme_name(sc));
    MoeProblem gate_up = make(small_shape(sc, 200, 3, 2, 4096, 256));
    expect_matches_ref(gate_up, k, MoeCompare::kernel_tc_vs_ref);
    MoeProblem down = make(small_shape(sc, 200, 3, 2, 256, 4096));
    expect_matches_ref(down, k, MoeCompare::kernel_tc_vs_ref);
  }
}
void expect_static_activation_scale(RowPair k) {
  MoeProblemOptions o;
  o.static_a1_scale = true;
  MoeProblem prob = make(small_shape(Scheme::fp8_channel, 90, 6, 2, 128, 256), o);
  expect_matches_ref(prob, k);
}
void expect_g1u0_gelu_and_expert_map(RowPair k) {
  MoeProblem prob = moe_test::make_g1u0_gelu_expert_map(Scheme::fp8_channel, 130, 10, 3, 256, 384);
  expect_matches_ref(prob, k);
}
// T k = 120 and 160 rows: a quantized by its own amax pass, and (above kQuantFewRows rows) from the
// row amaxes gemm1 found (Fp8GemmArgs::amax), also for rows of zeros (amax 0: the floor).
void expect_zero_rows_and_large_values(RowPair k) {
  for (int64_t T : {60, 80}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    MoeProblem prob = make(small_shape(Scheme::fp8_tensor, T, 5, 2, 128, 128));
    moe_test::set_zero_and_large_rows(&prob);
    expect_matches_ref(prob, k);
  }
}

TEST(FusedMoeSm90GroupedFp8, TailTilesAndSplitKGemm2) {
  SKIP_WITHOUT_KERNEL();
  static_assert(cuda::fused_moe_sm90_grouped_gemm2_splits(4 + 6, 1, 1024 / 128, kH200Facts.sm_count) == 2,
                "two K ranges");
  expect_tail_tiles_and_split_k_gemm2(kRow128);
}

// Tail tiles (M tiles of <= 64 real rows, multiplied as 64 x 256 by both warpgroups: ws_consume_tail)
// next to full ones: experts of 1, 64, 65, 128, 129, 192, 193 and 255 rows (tails: 1, 64, 129, 192),
// k = 1 so that the router weight on the input runs too, per tensor and per row; I = 512 (gemm1: two
// N tiles of gate/up pairs), H = 384 (gemm2: a last N tile of 128 columns, only warpgroup 0's half).
TEST(FusedMoeSm90GroupedFp8, TailTilesOfBothGemms) {
  SKIP_WITHOUT_KERNEL();
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    for (bool on_input : {false, true}) {
      SCOPED_TRACE(std::string(scheme_name(sc)) + (on_input ? " weight_on_input" : ""));
      MoeShape s = small_shape(sc, 1027, 8, 1, 384, 512);
      s.weight_on_input = on_input;
      MoeProblem prob = make(s);
      moe_test::assign_expert_rows(&prob, {1, 64, 65, 128, 129, 192, 193, 255});
      expect_matches_ref(prob);
    }
  }
}

TEST(FusedMoeSm90GroupedFp8, LongK) {
  SKIP_WITHOUT_KERNEL();
  expect_long_k(kRow128);
}

TEST(FusedMoeSm90GroupedFp8, WeightOnInputManyRows) {
  SKIP_WITHOUT_KERNEL();
  MoeShape s = small_shape(Scheme::fp8_channel, 300, 4, 1, 256, 256);
  s.weight_on_input = true;
  MoeProblem prob = make(s);
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90GroupedFp8, StaticActivationScale) {
  SKIP_WITHOUT_KERNEL();
  expect_static_activation_scale(kRow128);
}

TEST(FusedMoeSm90GroupedFp8, G1U0GeluAndExpertMap) {
  SKIP_WITHOUT_KERNEL();
  expect_g1u0_gelu_and_expert_map(kRow128);
}

TEST(FusedMoeSm90GroupedFp8, ZeroRowsAndLargeValues) {
  SKIP_WITHOUT_KERNEL();
  expect_zero_rows_and_large_values(kRow128);
}

// An inf and a NaN in x (160 rows: the per-token quantizer): all-NaN output rows as the reference's.
TEST(FusedMoeSm90GroupedFp8, NonFiniteActivations) {
  SKIP_WITHOUT_KERNEL();
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    SCOPED_TRACE(scheme_name(sc));
    MoeProblem prob = make(small_shape(sc, 80, 5, 2, 256, 256));
    moe_test::expect_fp8_cuda_nonfinite_rows(prob, kRow);
  }
}

TEST(FusedMoeSm90GroupedFp8, RefusesBlockScalesUnquantizedAndOddSizes) {
  if (registry().find(kAutoRow) == nullptr) GTEST_SKIP() << "not compiled in";
  moe_test::expect_refuses(kRow, small_shape(Scheme::fp8_block, 3, 4, 2, 128, 128));
  moe_test::expect_refuses(kRow, small_shape(Scheme::bf16, 3, 4, 2, 128, 128));
}

// ---- 64-row tiles on mma.sync (config grouped/64x256.mma4)

constexpr const char* kRow64 = "fused_moe_sm90_fp8_row [grouped/64x256.mma4]";
constexpr const char* kTkw164 = kRow64;

#define SKIP_WITHOUT_BM64() MOE_SKIP_WITHOUT_CUDA_KERNEL(kRow64)

void expect_bm64_matches_ref(MoeProblem& prob) { moe_test::expect_fp8_cuda_matches_ref(prob, kRow64, kTkw164); }

TEST(FusedMoeSm90GroupedFp8Bm64, EdgeCasesPerTensorPerRowAndWeightOnInput) {
  SKIP_WITHOUT_BM64();
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    for (bool on_input : {false, true}) {
      SCOPED_TRACE(std::string(scheme_name(sc)) + (on_input ? " weight_on_input" : ""));
      moe_test::expect_fp8_kernels_ran(
          check_fused_moe(moe_test::with_configs(moe_test::fp8_cuda_request(sc, {1, 8, 64, 300}, on_input), {kRow64})),
          kRow64, kTkw164, may_skip);
    }
  }
}

TEST(FusedMoeSm90GroupedFp8Bm64, Presets) {
  SKIP_WITHOUT_BM64();
  for (const char* model : {"deepseek-v3", "qwen3-moe", "mixtral", "llama4"}) {
    SCOPED_TRACE(model);
    CheckRequest req = moe_test::fp8_cuda_request(Scheme::fp8_channel, {8, 48}, std::string(model) == "llama4", model);
    moe_test::expect_fp8_kernels_ran(check_fused_moe(moe_test::with_configs(req, {kRow64})), kRow64, kTkw164, may_skip);
  }
}

// Experts with 64, 65, 1, 130 and 129 rows (one to three 64-row tiles, partial last tiles, expert 5
// empty), H = 384 (3 K slices of 128 codes), I = 256.
TEST(FusedMoeSm90GroupedFp8Bm64, TailTilesAndManyTilesPerExpert) {
  SKIP_WITHOUT_BM64();
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    MoeProblem prob = make(small_shape(sc, 389, 6, 1, 384, 256));
    moe_test::assign_expert_rows(&prob, {64, 65, 1, 130, 129});
    expect_bm64_matches_ref(prob);
  }
}

// I = 384: three gemm1 N tiles of 128 gate + 128 up columns, gemm2 K = 3 slices of 128 codes; the
// router weight on the input (k = 1).
TEST(FusedMoeSm90GroupedFp8Bm64, WeightOnInputAndIntermediateTiles) {
  SKIP_WITHOUT_BM64();
  MoeShape s = small_shape(Scheme::fp8_channel, 100, 4, 1, 256, 384);
  s.weight_on_input = true;
  MoeProblem prob = make(s);
  expect_bm64_matches_ref(prob);
}

TEST(FusedMoeSm90GroupedFp8Bm64, StaticActivationScale) {
  SKIP_WITHOUT_BM64();
  MoeProblemOptions o;
  o.static_a1_scale = true;
  MoeProblem prob = make(small_shape(Scheme::fp8_channel, 20, 6, 2, 128, 256), o);
  expect_bm64_matches_ref(prob);
}

TEST(FusedMoeSm90GroupedFp8Bm64, G1U0GeluAndExpertMap) {
  SKIP_WITHOUT_BM64();
  MoeProblem prob = moe_test::make_g1u0_gelu_expert_map(Scheme::fp8_channel, 40, 10, 3, 256, 384);
  expect_bm64_matches_ref(prob);
}

TEST(FusedMoeSm90GroupedFp8Bm64, ZeroRowsAndLargeValues) {
  SKIP_WITHOUT_BM64();
  MoeProblem prob = make(small_shape(Scheme::fp8_tensor, 12, 5, 2, 128, 128));
  moe_test::set_zero_and_large_rows(&prob);
  expect_bm64_matches_ref(prob);
}

// H and I off the 128 grid (gpt-oss: H = I = 2880), which only these tiles take (E133): H = 160 (a
// last K slice of 32 codes, one gemm2 N tile with 96 columns past H), I = 224 (the second gate/up N
// tile 96 columns wide, gemm2 K one slice and 96 codes); experts of 1 to 130 rows; g1u0 with
// I = 96 and H = 288. The auto kernel takes these tiles there.
TEST(FusedMoeSm90GroupedFp8Bm64, SizesOffThe128Grid) {
  SKIP_WITHOUT_BM64();
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    SCOPED_TRACE(scheme_name(sc));
    MoeProblem prob = make(small_shape(sc, 389, 6, 1, 160, 224));
    moe_test::assign_expert_rows(&prob, {64, 65, 1, 130, 129});
    expect_bm64_matches_ref(prob);
    moe_test::expect_fp8_cuda_matches_ref(prob, kAutoRow, kAutoTkw1);
    MoeProblem g1u0 = moe_test::make_g1u0_gelu_expert_map(sc, 40, 10, 3, 288, 96);
    expect_bm64_matches_ref(g1u0);
  }
  MoeShape on_input = small_shape(Scheme::fp8_channel, 100, 4, 1, 96, 160);
  on_input.weight_on_input = true;
  MoeProblem prob = make(on_input);
  expect_bm64_matches_ref(prob);
  // Off the 32 grid these tiles refuse; off the 128 grid the TMA tiles do.
  moe_test::expect_refuses(kRow64, small_shape(Scheme::fp8_channel, 3, 4, 2, 144, 128));
  moe_test::expect_refuses(kRow, small_shape(Scheme::fp8_channel, 3, 4, 2, 160, 224));
}

constexpr const char* kRowT64 = "fused_moe_sm90_fp8_row [grouped/64x256.ring5]";
constexpr const char* kTkw1T64 = kRowT64;

#define SKIP_WITHOUT_TMA64() MOE_SKIP_WITHOUT_CUDA_KERNEL(kRowT64)

void expect_tma64_matches_ref(MoeProblem& prob) { moe_test::expect_fp8_cuda_matches_ref(prob, kRowT64, kTkw1T64); }

TEST(FusedMoeSm90GroupedFp8Tma64, EdgeCasesPerTensorPerRowAndWeightOnInput) {
  SKIP_WITHOUT_TMA64();
  expect_edge_cases_ran({{kRowT64, kTkw1T64}});
}

// The scaled presets whose H is a multiple of 256 (qwen3-moe 256, mixtral 512); deepseek-v3 (896) and
// llama4 (640) are refused by design there: every case of theirs is a refusal by design, one for H.
TEST(FusedMoeSm90GroupedFp8Tma64, Presets) {
  SKIP_WITHOUT_TMA64();
  for (const char* model : {"qwen3-moe", "mixtral"}) {
    SCOPED_TRACE(model);
    CheckRequest req = moe_test::fp8_cuda_request(Scheme::fp8_channel, {8, 48}, false, model);
    moe_test::expect_fp8_kernels_ran(check_fused_moe(moe_test::with_configs(req, {kRowT64})), kRowT64, kTkw1T64,
                                     may_skip);
  }
  for (const char* model : {"deepseek-v3", "llama4"}) {
    SCOPED_TRACE(model);
    CheckRequest req = moe_test::fp8_cuda_request(Scheme::fp8_channel, {8}, std::string(model) == "llama4", model);
    int for_h = 0;
    for (const CaseResult& r : check_fused_moe(moe_test::with_configs(req, {kRowT64}))) {
      if (r.kernel != kRowT64 && r.kernel != kTkw1T64) continue;
      EXPECT_TRUE(r.detail.rfind("skipped", 0) == 0 && may_skip(r.name, r.detail)) << r.name << " | " << r.detail;
      for_h += r.detail.find("multiple of 256") != std::string::npos ? 1 : 0;
    }
    EXPECT_GT(for_h, 0);
  }
}

// Experts with 16, 17, 32, 33, 64, 65 rows (the warp rows, one and two 64-row tiles per expert) and
// 64, 65, 1, 130, 129 (up to three tiles, partial last tiles, an empty expert); H = 512 (4 K slices,
// gemm2: two N tiles of 256), I = 256 (gemm1: two N tiles of 128 gate + 128 up columns).
TEST(FusedMoeSm90GroupedFp8Tma64, RowCountsAndTailTiles) {
  SKIP_WITHOUT_TMA64();
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    SCOPED_TRACE(scheme_name(sc));
    MoeProblem widths = make(small_shape(sc, 227, 6, 1, 512, 256));
    moe_test::assign_expert_rows(&widths, {16, 17, 32, 33, 64, 65});
    expect_tma64_matches_ref(widths);
    MoeProblem tails = make(small_shape(sc, 389, 6, 1, 512, 256));
    moe_test::assign_expert_rows(&tails, {64, 65, 1, 130, 129});
    expect_tma64_matches_ref(tails);
  }
}

// The router weight on the input (k = 1) with I = 384 (three gemm1 N tiles), a static activation
// scale, g1u0 gelu with an expert map (I = 512: two N tiles of 256), rows of zeros and large values,
// and supports() on device tensors (H % 256).
TEST(FusedMoeSm90GroupedFp8Tma64, ShapesAndEdges) {
  SKIP_WITHOUT_TMA64();
  MoeShape on_input = small_shape(Scheme::fp8_channel, 100, 4, 1, 256, 384);
  on_input.weight_on_input = true;
  MoeProblem tkw1 = make(on_input);
  expect_tma64_matches_ref(tkw1);
  MoeProblemOptions o;
  o.static_a1_scale = true;
  MoeProblem fixed = make(small_shape(Scheme::fp8_channel, 20, 6, 2, 256, 256), o);
  expect_tma64_matches_ref(fixed);
  MoeProblem g1u0 = moe_test::make_g1u0_gelu_expert_map(Scheme::fp8_channel, 40, 10, 3, 256, 512);
  expect_tma64_matches_ref(g1u0);
  for (int64_t T : {12, 80}) {  // 24 and 160 rows (gemm1's row amaxes, Fp8GemmArgs::amax)
    MoeProblem zl = make(small_shape(Scheme::fp8_tensor, T, 5, 2, 256, 128));
    moe_test::set_zero_and_large_rows(&zl);
    expect_tma64_matches_ref(zl);
  }
  // gemm2 in K ranges (fused_moe_sm90_tma64_gemm2_splits): few rows, I = 4096 (32 K slices: 4 ranges
  // of 8) and 3328 (26: 3 ranges of 8, 9, 9), per tensor and per row, and with the weight on the input.
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    MoeProblem four = make(small_shape(sc, 3, 8, 2, 256, 4096));
    expect_tma64_matches_ref(four);
    MoeProblem three = make(small_shape(sc, 5, 6, 2, 512, 3328));
    expect_tma64_matches_ref(three);
  }
  MoeShape split_on_input = small_shape(Scheme::fp8_channel, 2, 4, 1, 256, 4096);
  split_on_input.weight_on_input = true;
  MoeProblem split_tkw1 = make(split_on_input);
  expect_tma64_matches_ref(split_tkw1);
}

// Long gate/up K loops (H = 4096: 32 K slices, 3328: 26, 2048: 16) on several 64-row tiles with k = 2,
// one K range each; the Mixtral-like widths of the one-token cells, at small I. Compared under
// MoeCompare::kernel_tc_vs_ref (e4m3 wgmma accumulation, docs/tolerances.md): the kernel promotes
// every slice into f32; before it did, H = 4096 put 14% (per tensor) and 21% (per row) of the
// outputs out of the elementwise bound (H200, 2026-12-01).
TEST(FusedMoeSm90GroupedFp8Tma64, LongGateUpK) {
  SKIP_WITHOUT_TMA64();
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    SCOPED_TRACE(scheme_name(sc));
    for (MoeShape shape : {small_shape(sc, 3, 8, 2, 4096, 256), small_shape(sc, 5, 6, 2, 3328, 384),
                           small_shape(sc, 2, 4, 2, 2048, 2048)}) {
      MoeProblem prob = make(shape);
      moe_test::expect_fp8_cuda_matches_ref(prob, kRowT64, kTkw1T64, MoeCompare::kernel_tc_vs_ref);
    }
  }
  moe_test::expect_device_supports(kRowT64, small_shape(Scheme::fp8_channel, 3, 4, 2, 512, 384), true);
  moe_test::expect_device_supports(kRowT64, small_shape(Scheme::fp8_channel, 3, 4, 2, 384, 256), false);  // H % 256
}

// ---- 192 x 256 tiles (config grouped/192x256.ws3: three consumer warpgroups)
constexpr const char* kRowM192 = "fused_moe_sm90_fp8_row [grouped/192x256.ws3]";
const RowPair kM192{kRowM192, kRowM192};

#define SKIP_WITHOUT_M192() MOE_SKIP_WITHOUT_CUDA_KERNEL(kRowM192)

TEST(FusedMoeSm90GroupedFp8M192, EdgeCasesPerTensorPerRowAndWeightOnInput) {
  SKIP_WITHOUT_M192();
  expect_edge_cases_ran({kM192});
}

// Experts with 64, 65, 128, 129, 192 and 193 rows (the warpgroup cuts, one and two 192-row tiles;
// H = 512: 4 K slices, I = 384: 3 gemm1 N tiles), then 1 and 385 rows and an empty expert (three
// tiles, the last with one row).
TEST(FusedMoeSm90GroupedFp8M192, RowCountsAndTailTiles) {
  SKIP_WITHOUT_M192();
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    SCOPED_TRACE(scheme_name(sc));
    MoeProblem widths = make(small_shape(sc, 771, 6, 1, 512, 384));
    moe_test::assign_expert_rows(&widths, {64, 65, 128, 129, 192, 193});
    expect_matches_ref(widths, kM192);
    MoeProblem tails = make(small_shape(sc, 386, 3, 1, 256, 256));
    moe_test::assign_expert_rows(&tails, {1, 385});
    expect_matches_ref(tails, kM192);
  }
}

// The 128-row suite's long K loops, tails with gemm2 in two K ranges, static activation scale, g1u0
// gelu with an expert map, and zero / large rows (gemm1's row amaxes above kQuantFewRows rows); and
// the router weight on the input at I = 384 (three gemm1 N tiles).
TEST(FusedMoeSm90GroupedFp8M192, ShapesAndEdges) {
  SKIP_WITHOUT_M192();
  expect_long_k(kM192);
  expect_tail_tiles_and_split_k_gemm2(kM192);
  MoeShape on_input = small_shape(Scheme::fp8_channel, 300, 4, 1, 256, 384);
  on_input.weight_on_input = true;
  MoeProblem tkw1 = make(on_input);
  expect_matches_ref(tkw1, kM192);
  expect_static_activation_scale(kM192);
  expect_g1u0_gelu_and_expert_map(kM192);
  expect_zero_rows_and_large_values(kM192);
}

// f16 x and out (every other test uses bf16): the 128- and 192-row tiles (T = 300 over 4 experts), the 64-row
// mma.sync and 64 x 256 TMA tiles (T = 8, gemm2 in K ranges at I = 2048), the auto kernel at both ends,
// per tensor and per row, and the router weight on the input.
TEST(FusedMoeSm90GroupedFp8, F16Activations) {
  SKIP_WITHOUT_KERNEL();
  const std::vector<RowPair> tiles128 = {kRow128, kM192, {kAutoRow, kAutoTkw1}};
  const std::vector<RowPair> tiles64 = {{kRow64, kTkw164}, {kRowT64, kTkw1T64}, {kAutoRow, kAutoTkw1}};
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    for (bool on_input : {false, true}) {
      SCOPED_TRACE(std::string(scheme_name(sc)) + (on_input ? " weight_on_input" : ""));
      for (int64_t T : {300, 8, 1}) {
        MoeShape shape = small_shape(sc, T, 4, on_input ? 1 : 2, 256, T == 8 ? 2048 : 256);
        shape.weight_on_input = on_input;
        MoeProblem prob = make(shape);
        moe_test::to_f16_activations(&prob);
        for (const RowPair& k : T == 300 ? tiles128 : tiles64) {
          SCOPED_TRACE(k.row + " T=" + std::to_string(T));
          moe_test::expect_fp8_cuda_matches_ref(prob, k.row, k.tkw1);
        }
      }
    }
  }
}

}  // namespace
}  // namespace moekit::testing
