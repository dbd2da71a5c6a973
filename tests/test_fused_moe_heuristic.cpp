// The fused_moe strategy heuristic (src/ops/fused_moe/fused_moe_heuristic.h) on the shapes of
// ANCHORS.md: decode shapes go to small_m, prefill shapes to the grouped GEMM.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/fused_moe/fused_moe_heuristic.h"
#include "ops/fused_moe/fused_moe_sm90_grouped.h"
#include "ops/fused_moe/fused_moe_sm90_tiles.h"

namespace moekit {
namespace {

MoeStrategy pick(int64_t T, int64_t k, int64_t E) { return choose_moe_strategy(T, k, E).strategy; }

TEST(FusedMoeHeuristic, ExpectedRowsPerTouchedExpert) {
  EXPECT_DOUBLE_EQ(choose_moe_strategy(1, 2, 8).rows_per_expert, 1.0);  // one token: k distinct experts
  EXPECT_DOUBLE_EQ(choose_moe_strategy(1, 8, 256).rows_per_expert, 1.0);
  EXPECT_DOUBLE_EQ(choose_moe_strategy(0, 8, 256).rows_per_expert, 0.0);
  // T k / Eg over 1 - (1 - k / Eg)^T: Mixtral T = 8 is 2 / (1 - 0.75^8) = 2.2225.
  EXPECT_NEAR(expected_rows_per_touched_expert(8, 2, 8), 2.0 / (1 - std::pow(0.75, 8)), 1e-12);
  // Kimi-K2 (Eg 384, k 8) T = 64: 512 slots on ~284 touched experts, not 512 / 384.
  EXPECT_NEAR(expected_rows_per_touched_expert(64, 8, 384), 1.80, 0.01);
  EXPECT_DOUBLE_EQ(expected_rows_per_touched_expert(5, 4, 4), 5.0);  // k == Eg: every expert, T rows
  EXPECT_NEAR(expected_rows_per_touched_expert(4096, 8, 256), 128.0, 1e-9);  // every expert touched
}

TEST(FusedMoeHeuristic, AnchorShapes) {
  // small_m up to 1.5 expected rows per touched expert (E107): Mixtral (E 8, k 2) at T = 4 (1.46), not
  // T = 5 (1.64) or 8 (2.2).
  EXPECT_EQ(pick(1, 2, 8), MoeStrategy::small_m);
  EXPECT_EQ(pick(4, 2, 8), MoeStrategy::small_m);
  EXPECT_EQ(pick(5, 2, 8), MoeStrategy::grouped_gemm);
  EXPECT_EQ(pick(8, 2, 8), MoeStrategy::grouped_gemm);
  EXPECT_EQ(pick(4096, 2, 8), MoeStrategy::grouped_gemm);
  // DeepSeek-V3 (E 256, k 8): small_m to T = 16 (1.26), grouped from T = 32 (1.57).
  EXPECT_EQ(pick(1, 8, 256), MoeStrategy::small_m);
  EXPECT_EQ(pick(16, 8, 256), MoeStrategy::small_m);
  EXPECT_EQ(pick(32, 8, 256), MoeStrategy::grouped_gemm);
  EXPECT_EQ(pick(512, 8, 256), MoeStrategy::grouped_gemm);
  // Qwen3-30B-A3B (E 128, k 8): T = 8 (1.24) small_m, T = 16 (1.55) grouped.
  EXPECT_EQ(pick(8, 8, 128), MoeStrategy::small_m);
  EXPECT_EQ(pick(16, 8, 128), MoeStrategy::grouped_gemm);
  // Shapes nobody tuned for (E107): Phi-3.5-MoE (16, 2) T = 8 (1.52) and Kimi-K2 (384, 8) T = 64
  // (1.80) grouped; Kimi-K2 T = 32 (1.36) small_m.
  EXPECT_EQ(pick(8, 2, 16), MoeStrategy::grouped_gemm);
  EXPECT_EQ(pick(64, 8, 384), MoeStrategy::grouped_gemm);
  EXPECT_EQ(pick(32, 8, 384), MoeStrategy::small_m);
}

MoeStrategy pick_fp8(int64_t T, int64_t k, int64_t E, int64_t H) {
  return choose_moe_strategy_fp8(T, k, E, H, kH200Facts).strategy;
}

TEST(FusedMoeHeuristic, Fp8AnchorShapes) {
  // T = 1: small_m while the grouped down GEMM (touched x H / 256 CTAs) cannot fill 132 SMs:
  // Mixtral (2 x 16) and Qwen3 (8 x 8) small_m, DeepSeek-V3 (8 x 28) grouped (all measured).
  EXPECT_EQ(pick_fp8(1, 2, 8, 4096), MoeStrategy::small_m);
  EXPECT_EQ(pick_fp8(1, 8, 128, 2048), MoeStrategy::small_m);
  EXPECT_EQ(pick_fp8(1, 8, 256, 7168), MoeStrategy::grouped_gemm);
  EXPECT_EQ(pick_fp8(4, 2, 8, 4096), MoeStrategy::small_m);    // 8 touched x 16 = 128 CTAs, 1 row each
  EXPECT_EQ(pick_fp8(1, 1, 16, 5120), MoeStrategy::small_m);   // Llama-4 (k = 1): 1 x 20
  EXPECT_EQ(pick_fp8(1, 8, 256, 4224), MoeStrategy::grouped_gemm);  // 8 x 17 = 136 >= 132
  EXPECT_EQ(pick_fp8(1, 8, 256, 4096), MoeStrategy::small_m);       // 8 x 16 = 128
  // T = 8: 64 touched experts with one row each, or 2 rows each -> grouped (measured faster).
  EXPECT_EQ(pick_fp8(8, 8, 256, 7168), MoeStrategy::grouped_gemm);
  EXPECT_EQ(pick_fp8(8, 8, 128, 2048), MoeStrategy::grouped_gemm);
  EXPECT_EQ(pick_fp8(8, 2, 8, 4096), MoeStrategy::grouped_gemm);
  EXPECT_EQ(pick_fp8(2, 8, 256, 7168), MoeStrategy::grouped_gemm);  // 16 touched
  EXPECT_EQ(pick_fp8(4096, 8, 256, 7168), MoeStrategy::grouped_gemm);
  // Past 8 touched experts the grouped GEMM whatever H (Qwen3 T = 2: 16 touched x 8 = 128 CTAs).
  EXPECT_EQ(pick_fp8(2, 8, 128, 2048), MoeStrategy::grouped_gemm);
  EXPECT_EQ(pick_fp8(0, 8, 256, 7168), MoeStrategy::small_m);  // T = 0: nothing to stream
}

TEST(FusedMoeHeuristic, Fp8GroupedTileRows) {
  // 64-row tiles up to 2 rows per touched expert (Mixtral T = 8: 16 entries over 8 experts; Qwen3
  // and DeepSeek-V3 T = 8: one row on each of 64 experts; DeepSeek-V3 T = 64: 2 rows on 256).
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(8 * 2, 8), 64);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(8 * 8, 128), 64);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(64 * 8, 256), 64);
  // 128-row tiles above (Qwen3 T = 64: 4 rows; Mixtral T = 64: 16; every T = 4096).
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(64 * 8, 128), 128);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(64 * 2, 8), 128);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(17, 8), 128);  // 2.125 rows
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(4096 * 8, 256), 128);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(0, 8), 128);  // no entries
}

// 192 x 256 tiles: fewer padded rows (160 per expert: one tile of 192 against two of 128), or as
// many over >= 64 experts (128 rows: DeepSeek-V3 and Qwen3 yes, Mixtral no); not at 96, 192, 256 rows.
TEST(FusedMoeHeuristic, Fp8GroupedM192) {
  EXPECT_TRUE(fused_moe_sm90_grouped_fp8_m192(4096 * 8, 256));   // DeepSeek-V3 T=4096: 128 rows
  EXPECT_TRUE(fused_moe_sm90_grouped_fp8_m192(5120 * 8, 256));   // 160 rows
  EXPECT_TRUE(fused_moe_sm90_grouped_fp8_m192(2048 * 8, 128));   // Qwen3 T=2048: 128 rows
  EXPECT_TRUE(fused_moe_sm90_grouped_fp8_m192(640 * 2, 8));      // Mixtral T=640: 160 rows
  EXPECT_FALSE(fused_moe_sm90_grouped_fp8_m192(512 * 2, 8));     // Mixtral T=512: 128 rows, 8 experts
  EXPECT_FALSE(fused_moe_sm90_grouped_fp8_m192(3072 * 8, 256));  // 96 rows
  EXPECT_FALSE(fused_moe_sm90_grouped_fp8_m192(768 * 2, 8));     // 192 rows
  EXPECT_FALSE(fused_moe_sm90_grouped_fp8_m192(1024 * 2, 8));    // 256 rows
  EXPECT_FALSE(fused_moe_sm90_grouped_fp8_m192(4096 * 8, 128));  // Qwen3 T=4096: 256 rows
  EXPECT_FALSE(fused_moe_sm90_grouped_fp8_m192(4096 * 2, 8));    // Mixtral T=4096: 1024 rows
  EXPECT_FALSE(fused_moe_sm90_grouped_fp8_m192(64 * 2, 8));      // 16 rows (64-row tiles)
  EXPECT_FALSE(fused_moe_sm90_grouped_fp8_m192(0, 8));
  // The padding model: one tile while the rows stay far below bm, about 1.5 at r = bm (half the
  // experts spill into a second tile), two well above.
  EXPECT_NEAR(expected_padded_rows(32, 128), 128.0, 1e-6);
  EXPECT_NEAR(expected_padded_rows(128, 128), 192.0, 1.0);
  EXPECT_NEAR(expected_padded_rows(200, 128), 256.0, 1.0);
  EXPECT_NEAR(expected_padded_rows(160, 192), 192.0 * (1 + 0.5 * std::erfc(32 / (std::sqrt(160.0) * std::sqrt(2.0)))), 1e-9);
}

TEST(FusedMoeHeuristic, Fp8BlockGroupedTileRows) {
  // Where the 256-column tiles do not take the shape: 64-row mma.sync tiles up to 16 rows per
  // touched expert (Mixtral T = 8 / 64: 2 / 16 rows; DeepSeek-V3 T = 8 / 64 / 512: 1 / 2 / 16).
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_block_tile_m(8 * 2, 8), 64);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_block_tile_m(64 * 2, 8), 64);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_block_tile_m(8 * 8, 256), 64);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_block_tile_m(64 * 8, 256), 64);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_block_tile_m(512 * 8, 256), 64);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_block_tile_m(64 * 8, 128), 64);
  // 128-row tiles above: 32 rows (Mixtral T = 128, Qwen3 T = 512, DeepSeek-V3 T = 1024), every T = 4096.
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_block_tile_m(65 * 2, 8), 128);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_block_tile_m(128 * 2, 8), 128);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_block_tile_m(512 * 8, 128), 128);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_block_tile_m(4096 * 8, 256), 128);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_block_tile_m(0, 8), 128);  // no entries
  EXPECT_DOUBLE_EQ(rows_per_touched_expert(17, 8), 2.125);
  EXPECT_DOUBLE_EQ(rows_per_touched_expert(0, 8), 0.0);
}

TEST(FusedMoeHeuristic, Fp8BlockN256TilesByPadding) {
  // 128 x 256 where 128-row tiles pad to at most 1.12x the rows of 64-row tiles (E108).
  auto rows128 = [](int64_t tk, int64_t E) { return fused_moe_sm90_fp8_block_n256_128rows(tk, E); };
  EXPECT_FALSE(rows128(8 * 2, 8));       // 2 rows: 64 against 128
  EXPECT_FALSE(rows128(2048 * 8, 384));  // Kimi-K2 T = 2048: 43 rows
  EXPECT_FALSE(rows128(2048 * 8, 256));  // DeepSeek-V3 T = 2048: 64 rows, 1.33x
  EXPECT_TRUE(rows128(4096 * 8, 384));   // Kimi-K2 T = 4096: 85 rows, both pad to 128 (measured 17% faster)
  EXPECT_TRUE(rows128(320 * 2, 8));      // Mixtral T = 320: 80 rows
  EXPECT_FALSE(rows128(512 * 2, 8));     // Mixtral T = 512: 128 rows, 1.2x
  EXPECT_FALSE(rows128(4096 * 8, 256));  // DeepSeek-V3 T = 4096: 128 rows
  EXPECT_TRUE(rows128(4096 * 8, 128));   // Qwen3 T = 4096: 256 rows, 1.11x
  EXPECT_FALSE(rows128(6144 * 8, 256));  // DeepSeek-V3 T = 6144: 192 rows, 1.14x
  EXPECT_TRUE(rows128(6144 * 8, 128));   // Qwen3-235B T = 6144: 384 rows, 1.08x
  EXPECT_TRUE(rows128(4096 * 2, 8));     // Mixtral T = 4096: 1024 rows
  EXPECT_TRUE(rows128(0, 8));            // no entries: either
  EXPECT_EQ(fp8_block_tiles(4096 * 8, 384, true, true), Fp8BlockTiles::tma128n256);
  EXPECT_EQ(fp8_block_tiles(512 * 2, 8, true, true), Fp8BlockTiles::tma64);
  EXPECT_EQ(fp8_block_tiles(24 * 2, 6, false, true), Fp8BlockTiles::mma64);
  EXPECT_EQ(fp8_block_tiles(200 * 2, 6, false, true), Fp8BlockTiles::tma128);
  EXPECT_EQ(fp8_block_tiles(24 * 2, 6, false, false), Fp8BlockTiles::tma128);
}

TEST(FusedMoeHeuristic, Fp8BlockStrategy) {
  // The block strategy: grouped wherever H % 256 == 0 (even one token), else the fp8 rule.
  EXPECT_EQ(choose_moe_strategy_fp8_tma64(1, 2, 8, 4096, kH200Facts).strategy, MoeStrategy::grouped_gemm);
  EXPECT_EQ(choose_moe_strategy_fp8_tma64(1, 8, 128, 2048, kH200Facts).strategy, MoeStrategy::grouped_gemm);
  EXPECT_EQ(choose_moe_strategy_fp8_tma64(1, 2, 8, 384, kH200Facts).strategy,
            choose_moe_strategy_fp8(1, 2, 8, 384, kH200Facts).strategy);
  EXPECT_EQ(choose_moe_strategy_fp8(1, 2, 8, 384, kH200Facts).strategy, MoeStrategy::small_m);
}

TEST(FusedMoeHeuristic, Fp8RowTma64TileRows) {
  // With the 64 x 256 QGMMA tiles: 64-row tiles up to 48 rows per touched expert, 128 above.
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(1 * 2, 8, true), 64);
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(64 * 2, 8, true), 64);   // 16 rows
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(192 * 2, 8, true), 64);   // 48 rows
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(193 * 2, 8, true), 128);  // 48.25 rows
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(256 * 2, 8, true), 128);  // 64 rows
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(4096 * 8, 256, true), 128);  // 128 rows
  EXPECT_EQ(fused_moe_sm90_grouped_fp8_tile_m(0, 8, true), 128);
}

TEST(FusedMoeHeuristic, NamesAndReasons) {
  EXPECT_STREQ(moe_strategy_name(MoeStrategy::small_m), "small_m");
  EXPECT_STREQ(moe_strategy_name(MoeStrategy::grouped_gemm), "grouped_gemm");
  EXPECT_NE(choose_moe_strategy(1, 1, 1).reason, nullptr);
}

TEST(FusedMoeHeuristic, Tma64Gemm2Splits) {
  // Mixtral T = 1: 2 tiles x 16 N tiles = 32 CTAs, 112 K slices: 4 ranges.
  EXPECT_EQ(fused_moe_sm90_tma64_gemm2_splits(1 * 2, 8, 4096 / 256, 14336 / 128, kH200Facts.sm_count), 4);
  // Llama-4 T = 1: 1 tile x 20.
  EXPECT_EQ(fused_moe_sm90_tma64_gemm2_splits(1, 128, 5120 / 256, 8192 / 128, kH200Facts.sm_count), 4);
  // Qwen3 T = 1: 8 tiles x 8 = 64 CTAs would take 2, but its 6 K slices make one range.
  EXPECT_EQ(fused_moe_sm90_tma64_gemm2_splits(1 * 8, 128, 2048 / 256, 768 / 128, kH200Facts.sm_count), 1);
  // DeepSeek-V3 T = 1: 8 x 28 = 224 CTAs; Mixtral T = 8: 8 tiles (16 entries on 8 experts) x 16 = 128.
  EXPECT_EQ(fused_moe_sm90_tma64_gemm2_splits(1 * 8, 256, 7168 / 256, 2048 / 128, kH200Facts.sm_count), 1);
  EXPECT_EQ(fused_moe_sm90_tma64_gemm2_splits(8 * 2, 8, 4096 / 256, 14336 / 128, kH200Facts.sm_count), 1);
  // Short K: each range at least 8 slices (15 slices: 1 range; 16: 2; 26: 3; 32: 4).
  EXPECT_EQ(fused_moe_sm90_tma64_gemm2_splits(2, 8, 1, 15, kH200Facts.sm_count), 1);
  EXPECT_EQ(fused_moe_sm90_tma64_gemm2_splits(2, 8, 1, 16, kH200Facts.sm_count), 2);
  EXPECT_EQ(fused_moe_sm90_tma64_gemm2_splits(2, 8, 1, 26, kH200Facts.sm_count), 3);
  EXPECT_EQ(fused_moe_sm90_tma64_gemm2_splits(2, 8, 1, 32, kH200Facts.sm_count), 4);
  // The tile bound: 130 entries on 2 experts -> at most (130 + 126) / 64 = 4 tiles (65 + 65 rows: 4).
  EXPECT_EQ(fused_moe_sm90_tma64_gemm2_splits(130, 2, 11, 100, kH200Facts.sm_count), 3);
  EXPECT_EQ(fused_moe_sm90_tma64_gemm2_splits(0, 8, 16, 112, kH200Facts.sm_count), 1);  // no entries
}

// The SM-count rules read the device's facts: a GPU with fewer SMs fills its grid with less work.
TEST(FusedMoeHeuristic, RulesReadTheDeviceFacts) {
  DeviceFacts small = kH200Facts;
  small.sm_count = 64;
  // fp8, T = 1 on 8 of 128 experts, H = 2048: a down GEMM of 8 x 8 = 64 CTAs.
  EXPECT_EQ(choose_moe_strategy_fp8(1, 8, 128, 2048, kH200Facts).strategy, MoeStrategy::small_m);
  EXPECT_EQ(choose_moe_strategy_fp8(1, 8, 128, 2048, small).strategy, MoeStrategy::grouped_gemm);
  // Mixtral T = 1 (32 CTAs): 4 ranges on 132 SMs, 2 on 64; none where the SM count is unknown (0).
  EXPECT_EQ(fused_moe_sm90_tma64_gemm2_splits(2, 8, 16, 112, small.sm_count), 2);
  EXPECT_EQ(fused_moe_sm90_tma64_gemm2_splits(2, 8, 16, 112, 0), 1);
  // bf16 gemm2: 200 work items fit two waves of 132 SMs, not of 64.
  EXPECT_EQ(cuda::fused_moe_sm90_grouped_gemm2_splits(25, 8, 8, kH200Facts.sm_count), 2);
  EXPECT_EQ(cuda::fused_moe_sm90_grouped_gemm2_splits(25, 8, 8, small.sm_count), 1);
}

TEST(FusedMoeHeuristic, GroupedWsDynamic) {
  // gemm1 N (2 I) / gemm2 N (H) of the presets: DeepSeek-V3 4096 / 7168, Mixtral 28672 / 4096,
  // Llama-4 16384 / 5120 dynamic; Qwen3 1536 / 2048 static.
  for (int64_t n : {4096, 7168, 28672, 16384, 5120}) EXPECT_TRUE(fused_moe_sm90_grouped_ws_dynamic(n)) << n;
  for (int64_t n : {1536, 2048, 4095, 256}) EXPECT_FALSE(fused_moe_sm90_grouped_ws_dynamic(n)) << n;
}

}  // namespace
}  // namespace moekit
