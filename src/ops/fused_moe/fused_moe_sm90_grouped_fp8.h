// fused_moe_sm90_grouped_fp8: the prefill (large T) fused_moe kernel for fp8 W8A8 with per-tensor or
// per-row weight scales (SPEC 3.2: variants fp8_row and fp8_row_tkw1) on sm_90a fp8 tensor cores
// (wgmma m64n256k32 e4m3 x e4m3 -> f32, QGMMA in SASS).
//
// Launches on ctx.stream, no host synchronisation, no allocation (CUDA-graph capturable):
//   1. route        the routing kernel of the bf16 path (fused_moe_sm90_grouped_common.cuh), BM 128.
//   2. quant x      one block per expert-ordered row: x[token] quantized exactly as the reference,
//                   s = max(amax, 1e-12) / 448 (or the static a1_scale), codes e4m3fn(x / s).
//   3. gemm1        persistent TMA + wgmma kernel (fused_moe_sm90_grouped_tma.cuh, 128-byte K slices =
//                   128 codes; items from a work counter the routing zeroes, an M tile of <= 64 rows
//                   as 64 x 256 at half the MMAs): h = acc * s_x[row] * w1_scale[e, n] (* w with the
//                   router weight on the input), a = act(g) * u in f32 -> workspace.
//   4. quant a      a re-quantized per row (the reference's per-(token, slot) scale).
//   5. gemm2        the same mainloop: y = acc * s_a[row] * w2_scale[e, c] in f32 (two K-range
//                   partials when the work list is short, as the bf16 path).
//   6. reduce       out[t] = round(sum_j w_tj * y[row(t, j)]) in slot order.
// Deterministic by construction (no float atomics: the work counters and the row amaxes' atomicMax
// on f32 bits change which SM computes a tile, not any value). Requirements: H % 128 == 0, I % 128 == 0,
// weights fp8_e4m3fn row_major. Tests: tests/test_fused_moe_sm90_grouped_fp8.cpp.
#pragma once

#include <cstddef>

#include "moekit/ops/fused_moe.h"
#include "moekit/registry.h"

namespace moekit {
struct Sm90Config;  // fused_moe_sm90_config.h
}

namespace moekit::cuda {

// ok, or why the kernel refuses p (host tensors, non-fp8 weights, block scales, H or I not multiples
// of kFp8RowMinMultiple, k > 32, E > 1024, misaligned rows). The TMA tiles take H, I multiples of
// 128 only (fp8_row_tma_takes): the config rules offer the 64 x 256 mma tiles alone elsewhere.
Status fused_moe_sm90_grouped_fp8_supports(const FusedMoeParams& p);
// The size limits of fused_moe_sm90_grouped_fp8_block: H, I multiples of 128, then
// fused_moe_sm90_grouped_limits.
Status fused_moe_sm90_grouped_fp8_shape_supports(const FusedMoeParams& p);
// Workspace bytes / run of p with config c, a resolved fp8_row grouped config
// (fused_moe_sm90_config.h): 64 x 256 ring or mma, 128 x 256 or 192 x 256 ws; p validated and
// supported, c legal for p, ctx.workspace on the device.
size_t fused_moe_sm90_grouped_fp8_config_workspace_bytes(const FusedMoeParams& p, const Sm90Config& c);
Status fused_moe_sm90_grouped_fp8_config_run(const FusedMoeParams& p, const Sm90Config& c, const RunContext& ctx);

}  // namespace moekit::cuda
