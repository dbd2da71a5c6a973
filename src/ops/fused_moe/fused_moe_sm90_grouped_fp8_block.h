// fused_moe_sm90_grouped_fp8_block: fp8 128 x 128 block-scaled fused_moe (SPEC 3.3, DeepSeek-V3; also
// with the router weight on the input) on sm_90a fp8 tensor cores; see the .cu for the launches.
// Tests: tests/test_fused_moe_sm90_grouped_fp8_block.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device_facts.h"
#include "moekit/ops/fused_moe.h"
#include "moekit/registry.h"

namespace moekit {
struct Sm90Config;  // fused_moe_sm90_config.h
}

namespace moekit::cuda {

// ok, or why the kernel refuses p (host tensors, non-fp8 weights, blocks other than 128 x 128, H or
// I not multiples of 128, k > 32, E > 1024, misaligned rows).
Status fused_moe_sm90_grouped_fp8_block_supports(const FusedMoeParams& p);
// Workspace bytes / run of p with config c, a resolved fp8_block grouped config
// (fused_moe_sm90_config.h): 64 x 256 ring or mma, 128 x 256 or 128 x 128 ring (routing lists, x
// and a codes + group scales, a in f32 unless gemm1 quantizes it, y in f32); p validated and
// supported, c legal for p, ctx.workspace on the device.
size_t fused_moe_sm90_grouped_fp8_block_config_workspace_bytes(const FusedMoeParams& p, const Sm90Config& c);
Status fused_moe_sm90_grouped_fp8_block_config_run(const FusedMoeParams& p, const Sm90Config& c,
                                                   const RunContext& ctx);

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

}  // namespace moekit::cuda
