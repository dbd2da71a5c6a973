// Random device data for `moekit bench` (declarations without CUDA types; bench_fill.cu). Full-size
// fused-MoE weights are up to 22.5 GB per input set (DeepSeek-V3); generating them on the host
// takes minutes, on the device milliseconds. Used by bench_fused_moe's device path
// (src/testing/check_fused_moe.cpp); covered by tests/test_moe_baseline_cublas.cpp
// (MoeBaselineCublas.FillNormalDevice).
#pragma once

#include <cstdint>

#include "moekit/core/dtype.h"
#include "moekit/core/status.h"

namespace moekit::cuda {

// dst[i] = stddev * z_i rounded to dtype (bf16, f16 or f32), z_i ~ N(0, 1) from a counter-based
// hash of (seed, i) (Box-Muller), so the values depend only on (seed, i). Synchronous.
Status fill_normal_device(void* dst, DType dtype, int64_t n, float stddev, uint64_t seed);

}  // namespace moekit::cuda
