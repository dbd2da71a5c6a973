// moekit/ops/quant.h: fp8 quantization helpers (SPEC 5) and the e4m3fn <-> e4m3fnuz checkpoint
// conversion.
//
// quantize_fp8: scale = max(amax, kFp8AmaxFloor) / fp8_max(out dtype) for each group of elements,
// q = fp8(x / scale) rounded to nearest even and saturated (dtype.h). Granularities:
//   per_tensor      in [...]            scale [1]
//   per_row         in [..., K]         scale [rows] or [..., 1] (rows = product of leading dims):
//                                       per-channel weights AND per-token activations
//   per_token_group in [..., K]         scale [rows, ceil(K / group_k)]      (1 x group_k, 128)
//   block           in [..., N, K]      scale [..., ceil(N / block_n), ceil(K / block_k)] (128x128)
// With static_scale present (per_tensor only) that scale is used instead of the amax.
#pragma once

#include <cstdint>

#include "moekit/core/tensor_view.h"
#include "moekit/registry.h"

namespace moekit {

// amax floor: an all-zero group gets scale kFp8AmaxFloor / fp8_max instead of 0 (no 0/0).
constexpr float kFp8AmaxFloor = 1e-12f;

enum class QuantGranularity : uint8_t { per_tensor, per_row, per_token_group, block };
const char* granularity_name(QuantGranularity g);

struct QuantizeFp8Params {
  TensorView in;            // [...] f32|bf16|f16, contiguous
  TensorView out;           // same shape, fp8_e4m3fn (or fp8_e4m3fnuz), contiguous
  TensorView scale;         // f32 out (or in, for static_scale): shape per granularity above
  QuantGranularity granularity = QuantGranularity::per_row;
  int group_k = 128;        // per_token_group group width, block width along K
  int block_n = 128;        // block height along N (block granularity)
  bool static_scale = false;  // per_tensor: `scale` is an input, not computed
};
Status quantize_fp8(const QuantizeFp8Params& p, const RunOptions& opts = {});
Status validate_quantize_fp8(const QuantizeFp8Params& p);

// Checkpoint conversion between the two e4m3 formats, bits-preserving where exact:
//   e4m3fn -> e4m3fnuz: same bits mean half the value, so scales x2; fn's -0 (0x80) -> 0x00
//                       (0x80 is NaN in fnuz); fn NaN (0x7F/0xFF) -> 0x80. Exact.
//   e4m3fnuz -> e4m3fn: same bits mean twice the value, so scales x0.5; fnuz NaN (0x80) -> 0x00;
//                       +-240 (0x7F/0xFF, which would be NaN in fn) -> +-448 (0x7E/0xFE), the only
//                       inexact codes; their count is returned in num_saturated.
struct ConvertFp8Params {
  TensorView in;            // [...] fp8 (either format), contiguous
  TensorView out;           // same shape, the other fp8 format
  TensorView scale_in;      // [...] f32 scales of `in` (any shape), optional
  TensorView scale_out;     // same shape as scale_in, f32 out, optional (may alias scale_in)
  int64_t* num_saturated = nullptr;  // optional out: codes clamped (fnuz -> fn only)
};
Status convert_fp8(const ConvertFp8Params& p, const RunOptions& opts = {});
Status validate_convert_fp8(const ConvertFp8Params& p);

}  // namespace moekit
