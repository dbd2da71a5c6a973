// fused_moe_sm90_decode: the fp8 128 x 128 block-scaled fused_moe of at most 8 tokens in one
// cooperative launch (config `small_m/persistent` of fused_moe_sm90_fp8_block and
// fused_moe_sm90_small_m; docs/design/fused_moe_decode.md, 6.1). Not picked by the rules: it runs
// when a call names the config. Tests: tests/test_fused_moe_sm90_decode.cpp.
#pragma once

#include <cstddef>

#include "moekit/ops/fused_moe.h"
#include "moekit/registry.h"

namespace moekit::cuda {

// The most tokens the kernel takes (the tokens are the N = 8 columns of its wgmma), and the most
// slots T k (one thread each while the routing tables are built).
constexpr int64_t kDecodeMaxTokens = 8;
constexpr int64_t kDecodeMaxSlots = 256;

// ok, or why the kernel refuses p: the fp8_block kernels' conditions
// (fused_moe_sm90_grouped_fp8_block_supports), then T <= 8, T k <= 256, E and the global experts
// <= 1024, and a device that launches it cooperatively with one CTA on every SM.
Status fused_moe_sm90_decode_supports(const FusedMoeParams& p);
// Workspace bytes of p (x and a codes and scales, the partial sums of both gemms; sized from the
// shape and the device's SM count, never from the routing); run p (validated, supported).
size_t fused_moe_sm90_decode_workspace_bytes(const FusedMoeParams& p);
Status fused_moe_sm90_decode_run(const FusedMoeParams& p, const RunContext& ctx);

}  // namespace moekit::cuda
