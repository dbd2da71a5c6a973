// fused_moe_sm90_small_m: the decode (small T, memory-bound) CUDA kernel of the unquantized
// variant (SPEC 3.1, 3.4, 3.5) for bf16 and f16 on Hopper. Host-callable entry points so that an
// auto-dispatching fused_moe kernel can call it; the registry row (priority 100) is added by
// register_fused_moe_sm90_small_m (src/cuda/cuda_kernels.h).
//
// Design (fused_moe_sm90_small_m.cu): every touched expert's weights are streamed from HBM once,
// spread over all SMs; experts no token uses are never read. Deterministic by construction (fixed
// reduction orders, no float atomics), with or without RunContext::deterministic.
// Tests: tests/test_fused_moe_sm90_small_m.cpp (FusedMoeSm90SmallM.*), moekit check --backend cuda.
#pragma once

#include <cstddef>

#include "moekit/ops/fused_moe.h"
#include "moekit/registry.h"

namespace moekit::cuda {

// Ok, or unsupported with the reason (host tensors, f32 / fp8, shuffled weights, H or I not a
// multiple of 8, unaligned weights, E > 1024, rows too long for shared memory).
Status fused_moe_small_m_supports(const FusedMoeParams& p);
// Device workspace bytes for p (routing tables, the intermediate a and the per-slot outputs).
size_t fused_moe_small_m_workspace_bytes(const FusedMoeParams& p);
// Launches the kernels on ctx.stream; ctx.workspace must hold workspace_bytes(p) device bytes.
// No allocation, no host synchronisation (CUDA-graph capturable); T = 0 launches nothing.
Status fused_moe_small_m_run(const FusedMoeParams& p, const RunContext& ctx);

// The operand checks every CUDA fp8 fused_moe kernel shares: all tensors on the device (a1_scale
// too), x bf16 or f16, w1 / w2 fp8_e4m3fn row_major; unsupported naming the operand otherwise.
Status check_fp8_operands(const FusedMoeParams& p);

// Ok when s is a device f32 contiguous weight scale of the per-tensor [E] (*per_row = false) or per-row
// [E, N] / [E, N, 1] (*per_row = true) shape, else unsupported naming `name` (fp8 kernels' supports()).
Status check_fp8_weight_scale(const TensorView& s, const char* name, int64_t E, int64_t N, bool* per_row);

// Ok when s is a device f32 contiguous 128 x 128 block scale [E, N / 128, K / 128] of an [E, N, K]
// weight (N and K multiples of 128), else unsupported naming `name` (fp8 block kernels' supports()).
Status check_fp8_block_scale(const TensorView& s, const char* name, int64_t E, int64_t N, int64_t K);

// The same for the fp8 per-tensor / per-row W8A8 variants (fp8_row, fp8_row_tkw1).
Status fused_moe_small_m_fp8_supports(const FusedMoeParams& p);
size_t fused_moe_small_m_fp8_workspace_bytes(const FusedMoeParams& p);
Status fused_moe_small_m_fp8_run(const FusedMoeParams& p, const RunContext& ctx);

// The same for the fp8 128 x 128 block variant (fp8_block; H and I multiples of 128); the workspace
// is fused_moe_small_m_fp8_workspace_bytes(p).
Status fused_moe_small_m_fp8_block_supports(const FusedMoeParams& p);
Status fused_moe_small_m_fp8_block_run(const FusedMoeParams& p, const RunContext& ctx);

}  // namespace moekit::cuda
