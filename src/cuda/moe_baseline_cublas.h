// The unfused cuBLAS baseline of fused_moe (bf16 / f16, row-major weights): what a framework
// without a fused kernel does, timed by `moekit bench` next to every CUDA fused_moe row
// (docs/cli.md, "The cuBLAS baseline"). Not a registered kernel. Declarations without CUDA types;
// implementation in moe_baseline_cublas.cu; test: tests/test_moe_baseline_cublas.cpp.
// fp8 weights (w1 fp8: SPEC 3.2 - 3.4) take the cuBLASLt fp8 path of moe_baseline_cublas_fp8.h
// (same entry points below, same routing lists; steps there). What follows is the bf16 / f16 path.
//
//   1. gather: the x rows of every (token, slot) routed to a local expert, grouped by expert, into
//      one contiguous buffer (one kernel);
//   2. per expert, cublasGemmEx: h = xg_e . w1[e]^T   ([rows_e, H] x [N1, H]^T, f32 accumulate,
//      output in x's dtype);
//   3. activation: a = act(g) * u (g1u1) or act(h) (g1u0), f32 math, stored in x's dtype;
//   4. per expert, cublasGemmEx: y = a_e . w2[e]^T   ([rows_e, I] x [H, I]^T, output in x's dtype);
//   5. weighted sum: out[t] = sum_j w_tj * y[row(t, j)] in slot order j (f32, deterministic, no
//      atomics), one rounding to out's dtype; a token with no local expert gets a zero row.
// weight_on_input scales g and u by the router weight in step 3 and sums with weight 1.
//
// NOTE: the per-expert row lists are computed ON THE HOST from a host copy of topk_ids (and of the
// expert mask / map) when the problem is prepared. A fused kernel may not do that (its routing is
// device data); the baseline is allowed it, which only makes it faster (no sorting on the device).
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/ops/fused_moe.h"
#include "moekit/registry.h"  // L2Flush

namespace moekit::cuda {

// Routing of one problem as host lists. Rows of the gathered buffer are grouped by local expert;
// within an expert they are in ascending slot order (slot = t * k + j).
struct MoeBaselineRouting {
  int64_t T = 0, k = 0, E = 0;          // tokens, slots per token, local experts
  std::vector<int64_t> expert_begin;    // [E + 1]: expert e owns rows [expert_begin[e], expert_begin[e + 1])
  std::vector<int32_t> row_slot;        // [M]: the slot each gathered row comes from
  std::vector<int32_t> slot_row;        // [T * k]: the gathered row of each slot; -1 = skipped (-1 id,
                                        //   remote expert, id outside [-1, Eg))
  int64_t rows() const { return int64_t(row_slot.size()); }
};

// Builds the lists from params whose topk_ids and expert_mask / expert_map are HOST tensors (the
// other tensors are not read; they may live anywhere).
Status moe_baseline_routing(const FusedMoeParams& host_params, MoeBaselineRouting* out);

// Runs the baseline once on the legacy default stream and synchronises. device_params: x, w1, w2,
// topk_weights and out on the device (topk_ids / mask / map are not read: the routing says it all).
Status run_moe_baseline_cublas(const FusedMoeParams& device_params, const MoeBaselineRouting& routing);

// Times the baseline the way `moekit bench` times kernels (time_graph: one CUDA graph per input
// set, the L2 flush `l2` before each replay, `iters` replays rotating over the sets). device_sets:
// one params per input set, all of the same shape and routing. Every sample goes to *us (optional)
// and the median to *median_us.
Status time_moe_baseline_cublas(const std::vector<FusedMoeParams>& device_sets, const MoeBaselineRouting& routing,
                                int warmup, int iters, std::vector<double>* us, double* median_us,
                                L2Flush l2 = L2Flush::write);

}  // namespace moekit::cuda
