// Which fused_moe strategy a device backend runs for a problem: a pure function of the shape and
// the device, unit-tested in tests/test_fused_moe_heuristic.cpp and printed under
// MOEKIT_PRINT_DISPATCH=1 by the auto kernel (fused_moe_sm90_bf16).
//
// The two strategies of the CUDA backend:
//   small_m       decode: stream each touched expert's weights once over all SMs, CUDA-core dots
//                 against the few rows routed to it (memory-bound; fused_moe_sm90_small_m).
//   grouped_gemm  prefill: rows sorted by expert, tensor-core GEMMs on M tiles
//                 (compute-bound; fused_moe_sm90_grouped).
// Header-only so host code, tests and .cu files share one definition.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/device_facts.h"

namespace moekit {

enum class MoeStrategy : uint8_t { small_m, grouped_gemm };

inline const char* moe_strategy_name(MoeStrategy s) {
  return s == MoeStrategy::small_m ? "small_m" : "grouped_gemm";
}

struct MoeStrategyChoice {
  MoeStrategy strategy;
  double rows_per_expert;  // average (token, slot) rows per touched expert
  const char* reason;
};

// Experts touched by tk = T*k routed entries over E experts under uniform routing, min(tk, E), and
// the average rows each gets (0 when none is touched).
constexpr int64_t touched_experts(int64_t tk, int64_t E) { return tk < E ? tk : E; }
constexpr double rows_per_touched_expert(int64_t tk, int64_t E) {
  return touched_experts(tk, E) > 0 ? double(tk) / double(touched_experts(tk, E)) : 0.0;
}

// NOTE: the threshold, measured on the H200 (docs/PERF.md, 2026-11-29, full-size presets, bf16,
// CUDA-graph replay, L2 flushed) with the BM 64 / BM 128 x 256 grouped GEMM: at 1 row per touched
// expert small_m wins (DeepSeek-V3 T=8: 1177 vs 1264 us; Qwen3 T=8: 148 vs 159 us; every T=1), at 2
// rows the grouped GEMM already wins (Mixtral T=8: 667 vs 744 us; DeepSeek-V3 T=64: 4466 vs 5068 us).
// small_m does its dots on CUDA cores and re-reads the staged rows per output row, so it only beats
// the tensor cores while almost every expert sees a single row. 1.5 sits between the measured
// points. Rows per touched expert: T*k spread over min(E, T*k) experts (uniform routing).
constexpr double kSmallMMaxRowsPerExpert = 1.5;

inline MoeStrategyChoice choose_moe_strategy(int64_t T, int64_t k, int64_t E) {
  const double rows = rows_per_touched_expert(T * k, E);
  if (rows <= kSmallMMaxRowsPerExpert) {
    return {MoeStrategy::small_m, rows, "<= 1.5 rows per touched expert: memory-bound, stream weights once"};
  }
  return {MoeStrategy::grouped_gemm, rows, "> 1.5 rows per touched expert: tensor-core grouped GEMM"};
}

// The choice for the fp8 variants (fp8_row, fp8_row_tkw1, fp8_block; hidden size H): small_m
// only while at most kSmallMFp8MaxTouched experts are touched with <= 1.5 rows each AND the grouped
// kernel's down GEMM, touched * ceil(H / 256) tiles of 64 rows x 256 columns (one CTA each), cannot
// fill the GPU's kFp8GroupedMinDownCtas SMs; else the grouped GEMM.
// NOTE: measured on the H200 (docs/PERF.md, 2026-11-29, full-size presets, fp8 per-row, CUDA-graph
// replay, L2 flushed): at T = 8 the grouped kernel wins even with one row per expert (DeepSeek-V3,
// 64 touched: 916 vs 1302 us; Qwen3, 64 touched: 163 vs 197; Mixtral, 2 rows: 522 vs 1218):
// small_m's fp8 dots decode every weight on CUDA cores, which costs more than the grouped kernel's
// fixed launches once more than a few experts are streamed.
// At T = 1 (2026-12-01, one row on each touched expert), fp8 per-tensor: Mixtral (2 touched x 16
// tiles = 32) small_m 160 us vs 64-row grouped 189; Qwen3 (8 x 8 = 64) 38.2 vs 42.1; DeepSeek-V3
// (8 x 28 = 224) 160 vs 134 (128-row grouped 152); fp8 block: Mixtral small_m 178 vs 64-row
// grouped 235, DeepSeek-V3 186 vs 146. small_m streams the weights at ~2.2 TB/s whatever the shape,
// while the grouped kernels stream them faster once their grids cover the SMs (the H200's 132 then;
// the device's SM count here).
constexpr int64_t kSmallMFp8MaxTouched = 8;

inline MoeStrategyChoice choose_moe_strategy_fp8(int64_t T, int64_t k, int64_t E, int64_t H, const DeviceFacts& dev) {
  const int64_t touched = touched_experts(T * k, E);
  const double rows = rows_per_touched_expert(T * k, E);
  if (rows > kSmallMMaxRowsPerExpert || touched > kSmallMFp8MaxTouched) {
    return {MoeStrategy::grouped_gemm, rows, "fp8: more than 8 touched experts or 1.5 rows each: grouped GEMM"};
  }
  if (touched * ((H + 255) / 256) >= dev.sm_count) {
    return {MoeStrategy::grouped_gemm, rows,
            "fp8: few rows, but the grouped down GEMM fills the SMs (touched x H / 256)"};
  }
  return {MoeStrategy::small_m, rows,
          "fp8: <= 8 touched experts with <= 1.5 rows each, down GEMM below the SM count: small_m"};
}

// Within the grouped strategy of the fp8 W8A8 variants, the kernel's M tile rows for T*k = tk routed
// entries over E experts: 64 (mma.sync m16n8k32 tiles) while the rows per touched expert,
// tk / min(tk, E), are at most kGroupedFp8Bm64MaxRows, else 128 (QGMMA).
// NOTE: measured on the H200 (docs/PERF.md, 2026-12-01, fp8 per-tensor, CUDA-graph replay, L2
// flushed): 2 rows per expert, Mixtral T=8: 377 us with 64-row tiles vs 471 with 128; 1 row, Qwen3
// T=8: 114 vs 117; 4 rows, Qwen3 T=64: 208 vs 210 (a tie); 16 rows, Mixtral T=64: 417 vs 401; 8
// rows, Qwen3 T=512: 333 vs 264. The 64-row tiles waste less padding but run on mma.sync, which
// loses to QGMMA once an expert has more than a few rows.
// tma64: the 64-row tiles run on TMA + QGMMA (fused_moe_sm90_grouped_fp8_row_tma64, 64 x 256 tiles,
// where H % 256 == 0 and the N tiles are whole): 64 while the rows per touched expert are at most
// kGroupedFp8Tma64MaxRows. NOTE: measured on the H200 (docs/PERF.md, 2026-12-01 fifth section), 64 x
// 256 vs 128 x 256 tiles: 16 rows, Mixtral T=64: 368 vs 402 us, DeepSeek-V3 T=512: 2817 vs 3175;
// 32 rows, Mixtral T=128: 386 vs 413, DeepSeek-V3 T=1024: 2981 vs 3402, Qwen3 T=512: 226 vs 254;
// 64 rows, Mixtral T=256: 472 vs 434, DeepSeek-V3 T=2048: 4424 vs 3688, Qwen3 T=1024: 300 vs 307;
// 128 rows, Mixtral T=512: 687 vs 559. So 48, between the last win and the first clear loss.
// Since 55029a2 the 64 x 256 per-row tiles promote every K slice into f32 and the 128 x 256 ones do
// not (the tensor cores' e4m3 accumulation; docs/tolerances.md, kernel_tc_vs_ref). Promoted tiles
// everywhere would cost 11-40% above the limit (seventh section: Mixtral T=4096 4251 vs 3040 us,
// Qwen3 T=4096 775 vs 679), so the limit stays.
constexpr double kGroupedFp8Bm64MaxRows = 2.0;
constexpr double kGroupedFp8Tma64MaxRows = 48.0;
constexpr int fused_moe_sm90_grouped_fp8_tile_m(int64_t tk, int64_t E, bool tma64 = false) {
  return tk > 0 && rows_per_touched_expert(tk, E) <= (tma64 ? kGroupedFp8Tma64MaxRows : kGroupedFp8Bm64MaxRows)
             ? 64
             : 128;
}

// The 192 x 256 tiles of the fp8 per-row variants (fused_moe_sm90_grouped_fp8_row_m192) in place of
// 128 x 256, above the 64-row tiles: where they pad at most kGroupedFp8M192Win of the rows the 128-row
// tiles pad, or about as many (kGroupedFp8M192Tie) over at least kGroupedFp8M192TieExperts touched
// experts. Expected padded rows of an expert with M tiles of bm rows: bm * E[ceil(n / bm)], n the
// expert's rows taken as normal with mean and variance r = rows per touched expert (random routing).
// NOTE: measured on the H200 (docs/PERF.md, eleventh session), 192 x 256 against 128 x 256 tiles,
// fp8_tensor: 128 rows per expert, DeepSeek-V3 T=4096 0.92 (fp8_channel 0.92), Mixtral T=512
// 1.00-1.03, Qwen3 T=2048 1.00 (equal padding: the win needs DeepSeek-V3's 256 experts); 160 rows,
// DeepSeek-V3 T=5120 0.66 (one tile of 192 against two of 128); 96 rows, DeepSeek-V3 T=3072 1.14;
// 192 rows, Mixtral T=768 1.23; 256 rows, Mixtral T=1024 1.09, Qwen3 T=4096 1.18.
// NOTE: the model counts a 128-row tile of <= 64 rows as a full one; since the twelfth session those
// run at half the MMAs (ws_consume_tail). Re-measured at the point that matters most (docs/PERF.md,
// twelfth session, DeepSeek-V3 fp8_tensor T=4096): 192 x 256 4577-4599 us, 128 x 256 with tail tiles
// 4719-4758 us, so the choice stands there; the thresholds were not re-fitted.
constexpr double kGroupedFp8M192Win = 0.9;
constexpr double kGroupedFp8M192Tie = 1.02;
constexpr int64_t kGroupedFp8M192TieExperts = 64;
inline double expected_padded_rows(double r, int bm) {
  if (r <= 0) return 0.0;
  const double sd = std::sqrt(r);
  double tiles = 1.0;  // a touched expert has at least one row
  for (int j = 1; j * double(bm) < r + 8.0 * sd; ++j) tiles += 0.5 * std::erfc((j * double(bm) - r) / (sd * std::sqrt(2.0)));
  return tiles * bm;
}
inline bool fused_moe_sm90_grouped_fp8_m192(int64_t tk, int64_t E) {
  const double r = rows_per_touched_expert(tk, E);
  if (r <= kGroupedFp8Tma64MaxRows) return false;
  const double p128 = expected_padded_rows(r, 128), p192 = expected_padded_rows(r, 192);
  return p192 <= kGroupedFp8M192Win * p128 ||
         (touched_experts(tk, E) >= kGroupedFp8M192TieExperts && p192 <= kGroupedFp8M192Tie * p128);
}

// The down GEMM (gemm2) of the 64 x 256 TMA tiles (fp8 per-row and block variants) in `splits` K
// ranges, each written as an f32 partial of y that the reduce step adds in a fixed order (so the
// result stays deterministic), where its tiles would fill too few SMs: as many ranges as fit the
// device's SMs, at most kTma64Gemm2MaxSplits, each of at least kTma64Gemm2MinSlices K slices. The M tiles
// of tk routed entries are bounded by (tk + 63 touched) / 64 (each touched expert's last tile may
// hold one row).
// NOTE: measured with Nsight Compute on the H200 (2026-12-01, Mixtral fp8_tensor T=1): the one-range
// down GEMM ran 2 experts x 16 N tiles = 32 CTAs for 51.7 us at 48% of the DRAM bandwidth, each SM
// multiplying a 64-row tile (one row real) over K = 14336; the gate/up GEMM (224 CTAs) reached 80%.
// With 4 ranges (`moekit bench`, CUDA-graph replay): Mixtral fp8_tensor T=1 136.4 -> 122.8 us,
// fp8_block 144.0 -> 128.2, Llama-4 fp8_channel 76.7 -> 67.9, fp8_block 84.5 -> 71.8; but Qwen3 T=1
// (64 CTAs, K = 6 slices) in 2 ranges of 3 slices: 36.1 -> 37.7, so a range needs 8 slices.
// NOTE: ranges that fill two waves instead of one (s = ceil(264 / work), branch gpu-pending16) measured
// slower on the H200 (tenth session of docs/PERF.md): DeepSeek-V3 fp8_tensor / fp8_block T=1 (2 ranges
// of 224 tiles) 1.035 / 1.038, Mixtral fp8_tensor T=8 / 64 1.006 / 1.008.
constexpr int kTma64Gemm2MaxSplits = 4;
constexpr int kTma64Gemm2MinSlices = 8;
constexpr int fused_moe_sm90_tma64_gemm2_splits(int64_t tk, int64_t E, int64_t n_tiles, int64_t k_slices,
                                                int sm_count) {
  const int64_t touched = touched_experts(tk, E);
  if (touched <= 0 || n_tiles <= 0) return 1;
  const int64_t work = (tk + 63 * touched) / 64 * n_tiles;
  int64_t s = sm_count / work;
  if (s > kTma64Gemm2MaxSplits) s = kTma64Gemm2MaxSplits;
  if (s > k_slices / kTma64Gemm2MinSlices) s = k_slices / kTma64Gemm2MinSlices;
  return s < 1 ? 1 : int(s);
}

// The same for the 128 x 128 block variant (fp8_block): 64 while the rows per touched expert are at
// most kGroupedFp8BlockBm64MaxRows, else 128. Its 128-row QGMMA kernel waits on every K slice's
// promotion, so the 64-row tiles (mma.sync, promoted from shared-memory scales) win up to more rows
// per expert than for the per-row variant.
// NOTE: measured on the H200 (docs/PERF.md, 2026-12-01, CUDA-graph replay, L2 flushed), 64 vs
// 128-row tiles: 2 rows, Mixtral T=8: 402 vs 743 us; 16 rows, Mixtral T=64: 459 vs 570,
// DeepSeek-V3 T=512: 3273 vs 3671; 32 rows, Mixtral T=128: 684 vs 439, Qwen3 T=512: 344 vs 251,
// DeepSeek-V3 T=1024: 4760 vs 3798; 128 rows, Mixtral T=512: 1832 vs 580.
// tma64: the 64-row tiles run on TMA + QGMMA (fused_moe_sm90_grouped_fp8_block_tma64, 64 x 256 tiles,
// where H % 256 == 0 and the N tiles are whole): 64 while the rows per touched expert are at most
// kGroupedFp8BlockTma64MaxRows. Measured on the H200 (docs/PERF.md, 2026-12-01 fourth section), 64 x
// 256 vs 128 x 128 tiles: 2 rows, Mixtral T=8: 369 vs 642 us; 16 rows, Mixtral T=64: 377 vs 548,
// DeepSeek-V3 T=512: 2802 vs 3504; 32 rows, Qwen3 T=512: 217 vs 236; 128 rows, DeepSeek-V3 T=4096:
// 5178 vs 5628, Mixtral T=512: 550 vs 550; 256 rows, Qwen3 T=4096: 711 vs 709; 1024 rows, Mixtral
// T=4096: 3560 vs 3524.
constexpr double kGroupedFp8BlockBm64MaxRows = 16.0;
constexpr double kGroupedFp8BlockTma64MaxRows = 128.0;
constexpr int fused_moe_sm90_grouped_fp8_block_tile_m(int64_t tk, int64_t E, bool tma64 = false) {
  return tk > 0 && rows_per_touched_expert(tk, E) <=
                       (tma64 ? kGroupedFp8BlockTma64MaxRows : kGroupedFp8BlockBm64MaxRows)
             ? 64
             : 128;
}

// The bf16 / f16 128 x 256 TMA gemms (fused_moe_sm90_grouped): the dynamic schedule of ws_run (each
// CTA claims its next item from a work counter) for a gemm with N >= kGroupedWsDynamicMinN output
// columns (>= 16 N tiles of 256), else the static order (CTA b: items b + i * grid).
// NOTE: fitted on the three presets, H200 (docs/PERF.md, 2026-12-02 thirteenth section, bf16, median
// of 2 rounds against the static order): both gemms dynamic, DeepSeek-V3 (N 4096 / 7168) T=4096
// 0.89-0.90, T=2048 0.97; Mixtral (28672 / 4096) T=512 0.985, T=4096 1.00; Qwen3 (1536 / 2048) T=2048
// 1.02, T=4096 1.02 (its gemm1 alone dynamic: 1.025 at T=2048), so Qwen3's short N keeps the static order.
constexpr int64_t kGroupedWsDynamicMinN = 4096;
constexpr bool fused_moe_sm90_grouped_ws_dynamic(int64_t N) { return N >= kGroupedWsDynamicMinN; }

// The strategy of the fp8 variants with 64 x 256 QGMMA tiles: the grouped GEMM wherever those tiles
// take H (H % 256 == 0; the auto kernels then pick them for experts with few rows), else
// choose_moe_strategy_fp8. NOTE: on the H200 (2026-12-01) the 64 x 256 tiles beat small_m's
// CUDA-core dots at one token: block variant, Mixtral T=1 144 vs 178 us, Qwen3 T=1 38.4 vs 41.0;
// per-tensor, Mixtral T=1 137 vs 160, DeepSeek-V3 T=1 115 vs 120; per-row, Qwen3 T=1 35.9 vs 38.4.
inline MoeStrategyChoice choose_moe_strategy_fp8_tma64(int64_t T, int64_t k, int64_t E, int64_t H,
                                                       const DeviceFacts& dev) {
  if (H % 256 == 0) {
    return {MoeStrategy::grouped_gemm, rows_per_touched_expert(T * k, E),
            "fp8, H % 256 == 0: grouped GEMM (64 x 256 QGMMA tiles for experts with few rows)"};
  }
  return choose_moe_strategy_fp8(T, k, E, H, dev);
}

}  // namespace moekit
