// The fp8 half of the unfused cuBLAS baseline of fused_moe (SPEC 3.2 - 3.4 as a framework without
// a fused kernel runs them). run_moe_baseline_cublas / time_moe_baseline_cublas
// (moe_baseline_cublas.h) forward here when w1 is fp8; callers use those. Implementation:
// moe_baseline_cublas_fp8.cu; test: tests/test_moe_baseline_cublas.cpp (MoeBaselineCublas.Fp8*).
//
//   1. quantize x with moekit's quantize_fp8_sm90 (the GPU-validated op): dynamic per token
//      (fp8_row), dynamic per 1 x 128 group (fp8_block), or the static a1_scale;
//   2. gather the fp8 rows of every (token, slot) routed to a local expert, grouped by expert, and
//      their activation scales in the layout cuBLASLt wants (one kernel);
//   3. per expert, cublasLtMatmul e4m3 x e4m3 -> x's dtype (bf16 / f16), f32 accumulation (no fast
//      accumulation), the scales applied by cuBLASLt:
//        fp8_row, static a1_scale and per-tensor w1_scale: SCALAR_32F x SCALAR_32F (GEMM1 only);
//        fp8_row otherwise: OUTER_VEC_32F x OUTER_VEC_32F (per weight row x per gathered row; a
//          per-tensor weight scale or the static a1_scale is broadcast into the vector);
//        fp8_block: BLK128x128_32F (weights) x VEC128_32F (1 x 128 activation groups);
//   4. a = act(g) * u in f32 from h (weight_on_input: g and u times the router weight first), then
//      quantized to e4m3fn per gathered row (fp8_row) or per 1 x 128 group (fp8_block), dynamic,
//      scales written straight into cuBLASLt's layout (one kernel);
//   5. per expert GEMM2 like step 3;
//   6. the weighted sum over k of the bf16 path (f32, slot order, no atomics).
// What it refuses (Unsupported, with the reason, never a crash): a block other than 128 x 128, H or
// I not a multiple of 16 (16-byte fp8 rows), x not contiguous or not bf16 / f16, shuffled layouts,
// e4m3fnuz weights, and any GEMM for which cublasLtMatmulAlgoGetHeuristic returns no algorithm on
// this device (the message names the GEMM, the scale modes and m / n / k).
#pragma once

#include <vector>

#include "cuda/moe_baseline_cublas.h"

namespace moekit::cuda {

// Same contracts as run_moe_baseline_cublas / time_moe_baseline_cublas, for fp8 weights (w1, w2
// fp8_e4m3fn with w1_scale / w2_scale, optional a1_scale; all on the device).
Status run_moe_baseline_cublas_fp8(const FusedMoeParams& device_params, const MoeBaselineRouting& routing);
Status time_moe_baseline_cublas_fp8(const std::vector<FusedMoeParams>& device_sets, const MoeBaselineRouting& routing,
                                    int warmup, int iters, std::vector<double>* us, double* median_us,
                                    L2Flush l2 = L2Flush::write);

}  // namespace moekit::cuda
