// fused_moe_sm90_grouped_fp8_block: fp8 128 x 128 block-scaled fused_moe (SPEC 3.3, DeepSeek-V3; also
// with the router weight on the input) on sm_90a fp8 tensor cores; see the .cu for the launches.
// Tests: tests/test_fused_moe_sm90_grouped_fp8_block.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device_facts.h"
#include "moekit/ops/fused_moe.h"
#include "moekit/registry.h"

namespace moekit::cuda {

// ok, or why the kernel refuses p (host tensors, non-fp8 weights, blocks other than 128 x 128, H or
// I not multiples of 128, k > 32, E > 1024, misaligned rows).
Status fused_moe_sm90_grouped_fp8_block_supports(const FusedMoeParams& p);
// Workspace bytes for p (routing lists, x and a codes + group scales, a in f32, y in f32).
size_t fused_moe_sm90_grouped_fp8_block_workspace_bytes(const FusedMoeParams& p);
// Runs the kernel (p validated and supported, ctx.workspace on the device).
Status fused_moe_sm90_grouped_fp8_block_run(const FusedMoeParams& p, const RunContext& ctx);

// Shared memory of the 64-row mma.sync tiles (fused_moe_sm90_grouped_fp8_block_bm64): the
// mainloop's cp.async stages (4 or 5) of (64 + 256) rows x 128 codes (40 KiB each) and behind them
// 64 + 2 f32 scales per 128-wide K slice, within one CTA's 227 KiB. The largest K = max(H, I) they
// take: 33152 with 4 stages, 13312 with 5. Mixtral's I = 14336 is the largest of the presets (4
// stages).
constexpr int64_t kFp8BlockBm64StageBytes = (64 + 256) * 128;
constexpr int64_t kFp8BlockBm64MaxSmem = kSm90SmemOptinBytes;
constexpr int64_t fused_moe_sm90_grouped_fp8_block_bm64_max_k(int stages = 4) {
  return (kFp8BlockBm64MaxSmem - stages * kFp8BlockBm64StageBytes) / ((64 + 2) * 4) * 128;
}

// The kernel with its M tile rows chosen by fused_moe_sm90_grouped_fp8_block_tile_m
// (fused_moe_heuristic.h): 64 (mma.sync, when max(H, I) <= fused_moe_sm90_grouped_fp8_block_bm64_max_k())
// or 128 (QGMMA); what fused_moe_sm90_fp8_block runs for its grouped strategy.
size_t fused_moe_sm90_grouped_fp8_block_tiled_workspace_bytes(const FusedMoeParams& p);
Status fused_moe_sm90_grouped_fp8_block_tiled_run(const FusedMoeParams& p, const RunContext& ctx);

// Adds the registry rows fused_moe_sm90_grouped_fp8_block (128-row tiles, priority 100) and
// fused_moe_sm90_grouped_fp8_block_bm64 (64-row tiles, priority 90), variant fp8_block.
void register_fused_moe_sm90_grouped_fp8_block(Registry& r);

}  // namespace moekit::cuda
