// fused_moe_sm90_grouped: the prefill (large T, compute-bound) fused_moe kernel for the unquantized
// variant (SPEC 3.1, 3.4, 3.5) on sm_90a tensor cores, bf16 and f16.
//
// Four launches on ctx.stream, no host synchronisation, no allocation (CUDA-graph capturable):
//   1. route   (1 block): global -> local expert table, per-expert counts of the (token, slot)
//      entries, exclusive scans, a row -> entry list (rows grouped by expert) and a fixed-size
//      tile -> (expert, first row) list. Bad ids (outside [-1, Eg)) and remote experts are skipped.
//   2. gemm1   (tiles x I/128 for g1u1, I/256 for g1u0): gathers x rows, h = x . w1[e]^T for
//      matching gate/up columns, a = act(w*g) * (w*u) (w = 1 unless weight_on_input), rounded to
//      x's dtype -> workspace.
//   3. gemm2   (tiles x H/256): y_row = a_row . w2[e]^T in f32 -> workspace (TMA path: possibly
//      as two K-range partials, fused_moe_sm90_grouped_gemm2_splits).
// M tiles are BM = 64 or 128 rows of one expert (fused_moe_sm90_grouped_tile_m), N tiles 256; a
// 64-row tile with <= 16 / <= 32 valid rows skips the MMAs of its empty 16-row slices. 64-row
// tiles run on mma.sync (HMMA m16n8k16, cp.async pipeline, one CTA per tile). 128-row tiles run
// on persistent warp-specialised kernels (fused_moe_sm90_grouped_tma.cuh: one TMA producer warp,
// two wgmma consumer warpgroups, mbarrier stage ring, one CTA per SM walking the tile list); for
// them gemm1 reads x rows first gathered into expert order (2'. gather, T*k x H in the workspace).
// See fused_moe_sm90_grouped_uses_tma.
//   4. reduce  (T blocks): out[t] = round(sum_j w_tj * y[row(t, j)]) in slot order.
// Deterministic by default (by construction): every row is computed independently with a fixed K
// order and the sum over k is done per token in slot order; no float atomics anywhere.
// Tests: tests/test_fused_moe_sm90_grouped.cpp (suite FusedMoeSm90Grouped).
#pragma once

#include <cstddef>
#include <cstdint>

#include "moekit/ops/fused_moe.h"
#include "moekit/registry.h"

namespace moekit {
struct Sm90Config;  // fused_moe_sm90_config.h
}

namespace moekit::cuda {

// ok, or why the kernel refuses p (host tensors, f32, shuffled weights, H or I not multiples of 64,
// k > 32, E > 1024, round_intermediate off, misaligned x rows).
Status fused_moe_sm90_grouped_supports(const FusedMoeParams& p);
// The limits every grouped kernel (bf16 / f16 and fp8) shares: k <= 32, E <= 1024, 16-byte aligned x
// rows and weights, 32-bit row indices and TMA coordinates; unsupported naming the value otherwise.
Status fused_moe_sm90_grouped_limits(const FusedMoeParams& p);
// Workspace bytes for p run with config c (routing lists, the intermediate a [T*k, I] and y
// [splits, T*k, H] f32); c: a resolved bf16 grouped config (fused_moe_sm90_config.h).
size_t fused_moe_sm90_grouped_config_workspace_bytes(const FusedMoeParams& p, const Sm90Config& c);
// Runs c's gemms (p validated and supported, c legal for p, ctx.workspace on the device).
Status fused_moe_sm90_grouped_config_run(const FusedMoeParams& p, const Sm90Config& c, const RunContext& ctx);

// M tile rows the kernel uses for T*k = tk routed entries over num_global_experts (Eg) experts:
// 128 when the expected rows per expert tk / Eg >= 64, else 64. Pure (host and tests).
// NOTE: model behind the threshold (mma.sync is shared-memory bound on Hopper): the 64 x 64 warp
// tile of BM 128 issues ~1.5x the HMMA per ldmatrix byte of the 64 x 32 warp tile of BM 64, while
// an expert with r rows pads to ceil(r / BM) * BM; at r = 64 BM 128 wastes 2x and BM 64 ~1.3x
// (the spread of random routing), so the two break even there.
constexpr int fused_moe_sm90_grouped_tile_m(int64_t tk, int64_t num_global_experts) {
  return tk >= 64 * (num_global_experts > 1 ? num_global_experts : 1) ? 128 : 64;
}

// Whether the M tiles of BM rows run the persistent warp-specialised TMA + wgmma kernels
// (fused_moe_sm90_grouped_tma.cuh; gemm1 then reads x rows gathered into expert order) instead of
// the cp.async + mma.sync mainloop: BM = 128 (two warpgroups of 64 rows). Pure (host and tests).
constexpr bool fused_moe_sm90_grouped_uses_tma(int tile_m) { return tile_m == 128; }

// The most M tiles of bm rows that tk routed rows over E experts can need, the routing lists' length:
// sum_e ceil(c_e / bm) <= floor(tk / bm) + (non-empty experts), bounded as (tk + bm - 1) / bm + min(E, tk).
// Pure (host and tests).
constexpr int64_t fused_moe_sm90_grouped_tiles_max(int64_t tk, int64_t E, int64_t bm) {
  return (tk + bm - 1) / bm + (E < tk ? E : tk);
}

// K ranges of the TMA path's gemm2 (split K; each range writes its own f32 partial y, the reduce
// adds them in range order, so results stay deterministic): 2 when the work list (at most tiles_max
// M tiles x n_tiles N tiles of 128 x 256) fits in two waves of the device's SMs and K has >= 8
// slices of 64, else 1. NOTE: unsplit, a list like Mixtral T=512's runs a wave and a half of long K
// loops, the last wave part-empty (docs/experiments.md E21). Pure (host and tests).
constexpr int fused_moe_sm90_grouped_gemm2_splits(int64_t tiles_max, int64_t n_tiles, int64_t k_slices,
                                                  int sm_count) {
  return tiles_max * n_tiles <= 2 * int64_t(sm_count) && k_slices >= 8 ? 2 : 1;
}


}  // namespace moekit::cuda
