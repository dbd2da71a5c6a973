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

// The rows a touched expert gets on average when each of T tokens picks k distinct experts of Eg
// uniformly: T k / Eg slots per expert over the chance 1 - (1 - k / Eg)^T that it is touched at all.
// With expert parallelism it is the same on every rank (local slots and local touched experts scale
// alike). Unlike tk / min(tk, E), it counts the experts a random routing leaves untouched (Kimi-K2
// T = 64: 1.80 rows, not 1.33).
inline double expected_rows_per_touched_expert(int64_t T, int64_t k, int64_t Eg) {
  if (T <= 0 || k <= 0 || Eg <= 0) return 0.0;
  const double p = double(k) / double(Eg);  // chance that one token picks a given expert
  const double touched = p >= 1.0 ? 1.0 : -std::expm1(double(T) * std::log1p(-p));
  return double(T) * p / touched;
}

// small_m's CUDA-core dots beat the tensor cores only while almost every expert sees one row: 1.5
// expected rows per touched expert sits between the measured wins (up to 1.46) and losses (from
// 1.52) over eight shapes, E from 8 to 384 (docs/experiments.md E5, E107).
constexpr double kSmallMMaxRowsPerExpert = 1.5;

// T tokens, k slots each, Eg global experts.
inline MoeStrategyChoice choose_moe_strategy(int64_t T, int64_t k, int64_t Eg) {
  const double rows = expected_rows_per_touched_expert(T, k, Eg);
  if (rows <= kSmallMMaxRowsPerExpert) {
    return {MoeStrategy::small_m, rows, "<= 1.5 expected rows per touched expert: memory-bound, stream weights once"};
  }
  return {MoeStrategy::grouped_gemm, rows, "> 1.5 expected rows per touched expert: tensor-core grouped GEMM"};
}

// The choice for the fp8 variants (fp8_row, fp8_row_tkw1, fp8_block; hidden size H): small_m
// only while at most kSmallMFp8MaxTouched experts are touched with <= 1.5 rows each AND the grouped
// kernel's down GEMM, touched * ceil(H / 256) tiles of 64 rows x 256 columns (one CTA each), cannot
// fill the device's SMs; else the grouped GEMM. small_m decodes every fp8 weight on CUDA cores at a
// fixed ~2.2 TB/s, the grouped kernels stream faster once their grids cover the SMs (E6).
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
// tk / min(tk, E), are at most kGroupedFp8Bm64MaxRows, else 128 (QGMMA): the 64-row tiles pad less
// but mma.sync loses to QGMMA past a few rows (E8).
// tma64: the 64-row tiles run on TMA + QGMMA (fused_moe_sm90_grouped_fp8_row_tma64, 64 x 256 tiles,
// where H % 256 == 0 and the N tiles are whole) up to kGroupedFp8Tma64MaxRows, between the last win
// and the first clear loss (E9). Those tiles promote every K slice into f32, the 128 x 256 ones do
// not; promoting above the limit too would cost 11-40% (E42, E43).
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
// Thresholds fitted in E49; the model still counts a half-empty 128-row tile as full although those
// run at half the MMAs since E50, re-checked where it matters (E12), not re-fitted.
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

// H and I the fp8 per-row grouped kernels take: multiples of kFp8RowMinMultiple on the 64 x 256 mma
// tiles (16-byte cp.async chunks with the last K slice zero-padded, a warp's 32 output columns all
// valid or all past the end), multiples of 128 on the TMA tiles (whole 128-code K slices).
// NOTE: before, shapes off the 128 grid (gpt-oss: H = I = 2880) fell back to small_m, 57x slower
// than bf16 at T = 4096 (E133).
constexpr int kFp8RowMinMultiple = 32;
constexpr bool fp8_row_tma_takes(int64_t H, int64_t I) { return H % 128 == 0 && I % 128 == 0; }

// The down GEMM (gemm2) of the 64 x 256 TMA tiles (fp8 per-row and block variants) in `splits` K
// ranges, each written as an f32 partial of y that the reduce step adds in a fixed order (so the
// result stays deterministic), where its tiles would fill too few SMs: as many ranges as fit the
// device's SMs, at most kTma64Gemm2MaxSplits, each of at least kTma64Gemm2MinSlices K slices. The M tiles
// of tk routed entries are bounded by (tk + 63 touched) / 64 (each touched expert's last tile may
// hold one row).
// A one-range down GEMM of few M tiles leaves most SMs idle (E39); two-wave ranges measured slower
// (E41); a range needs 8 K slices.
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

// The same for the 128 x 128 block variant (fp8_block) where the 256-column tiles do not take the
// shape: 64 while the rows per touched expert are at most kGroupedFp8BlockBm64MaxRows, else 128. Its
// 128-row QGMMA kernel waits on every K slice's promotion, so the 64-row tiles (mma.sync, promoted
// from shared-memory scales) win up to more rows per expert than for the per-row variant (E10).
constexpr double kGroupedFp8BlockBm64MaxRows = 16.0;
constexpr int fused_moe_sm90_grouped_fp8_block_tile_m(int64_t tk, int64_t E) {
  return tk > 0 && rows_per_touched_expert(tk, E) <= kGroupedFp8BlockBm64MaxRows ? 64 : 128;
}

// fp8_block where the 256-column tiles take the shape: 128 x 256 where an expert's rows, padded to
// 128-row tiles, come to at most kGroupedFp8BlockN256PadRatio times their padding to 64-row tiles
// (expected_padded_rows), else 64 x 256 (E70). The 128-row tiles halve the passes over an expert's
// weights but pad more; the measured crossover follows the padding (Kimi-K2 at 85 rows per expert:
// both pad to 128, 128 x 256 17% faster; at 128 and 192 rows 64 x 256 2-11% faster) over 35
// problems of eight shapes. At 256 rows (ratio 1.11) the shapes disagree (Qwen3 1-2% for 128 rows,
// Llama-4-Scout 5.6% for 64): the ratio keeps the presets' choice there (E108).
constexpr double kGroupedFp8BlockN256PadRatio = 1.12;
inline bool fused_moe_sm90_fp8_block_n256_128rows(int64_t tk, int64_t E) {
  const double r = rows_per_touched_expert(tk, E);
  return expected_padded_rows(r, 128) <= kGroupedFp8BlockN256PadRatio * expected_padded_rows(r, 64);
}

// The bf16 / f16 128 x 256 TMA gemms (fused_moe_sm90_grouped): the dynamic schedule of ws_run (each
// CTA claims its next item from a work counter) for a gemm with N >= kGroupedWsDynamicMinN output
// columns (>= 16 N tiles of 256), else the static order (CTA b: items b + i * grid); fitted on the
// three presets, where short N lost with the dynamic order (E13).
constexpr int64_t kGroupedWsDynamicMinN = 4096;
constexpr bool fused_moe_sm90_grouped_ws_dynamic(int64_t N) { return N >= kGroupedWsDynamicMinN; }

// The strategy of the fp8 variants with 64 x 256 QGMMA tiles: the grouped GEMM wherever those tiles
// take H (H % 256 == 0; the auto kernels then pick them for experts with few rows), else
// choose_moe_strategy_fp8: those tiles beat small_m's CUDA-core dots even at one token (E11).
inline MoeStrategyChoice choose_moe_strategy_fp8_tma64(int64_t T, int64_t k, int64_t E, int64_t H,
                                                       const DeviceFacts& dev) {
  if (H % 256 == 0) {
    return {MoeStrategy::grouped_gemm, rows_per_touched_expert(T * k, E),
            "fp8, H % 256 == 0: grouped GEMM (64 x 256 QGMMA tiles for experts with few rows)"};
  }
  return choose_moe_strategy_fp8(T, k, E, H, dev);
}

}  // namespace moekit
