// moekit/ops/quant.h: fp8 quantization helpers (SPEC 5) and the e4m3fn <-> e4m3fnuz checkpoint
// conversion.
//
// quantize_fp8: for each group of elements
//   scale = max(amax, kFp8AmaxFloor) / fp8_max(out dtype)    (f32 IEEE division; 448 or 240)
//   q     = fp8(x / scale)                                   (f32 IEEE division, then round to
//                                                             nearest even and saturate, dtype.h)
// Granularities (rows = product of the leading dims of `in`, K = its last dim):
//   per_tensor      in [...]            scale [1]
//   per_row         in [..., K]         scale [rows] or [..., 1] (in's leading dims): per-channel
//                                       weights AND per-token activations
//   per_token_group in [..., K]         scale [rows, ceil(K / group_k)] or [..., ceil(K / group_k)]
//                                       (1 x group_k; DeepSeek-V3 uses 128)
//   block           in [..., N, K]      scale [..., ceil(N / block_n), ceil(K / block_k = group_k)]
//                                       (block_n x group_k; 128 x 128 for DeepSeek-V3 weights)
// Sizes need not be multiples of the group: the last group / block of a row or matrix is ragged
// (smaller) and has its own scale.
// With static_scale (per_tensor only) `scale` is an input: q = fp8(x / scale[0]); the value must be
// finite and > 0 (checked before anything is written).
//
// Non-finite inputs (a choice, tested in tests/test_quantize_fp8.cpp): amax is taken over the
// FINITE elements of the group only, so one bad value does not poison its neighbours' scale. Then
// +-inf saturates to the largest code (+-fp8_max) and NaN encodes as the format's NaN code
// (e4m3fn: 0x7F, or 0xFF for a negative NaN; e4m3fnuz: 0x80). A group whose finite amax is below
// kFp8AmaxFloor (all zeros, all NaN, tiny values) gets scale kFp8AmaxFloor / fp8_max.
// An input with no elements returns at once: out and scale are not written.
//
// convert_fp8: see ConvertFp8Params below.
// Tests: tests/test_quantize_fp8.cpp (QuantizeFp8), tests/test_convert_fp8.cpp (ConvertFp8).
#pragma once

#include <cstdint>

#include "moekit/core/tensor_view.h"
#include "moekit/registry.h"

namespace moekit {

// amax floor: an all-zero group gets scale kFp8AmaxFloor / fp8_max instead of 0 (no 0/0).
constexpr float kFp8AmaxFloor = 1e-12f;

enum class QuantGranularity : uint8_t { per_tensor, per_row, per_token_group, block };
// "per_tensor", "per_row", "per_token_group", "block".
const char* granularity_name(QuantGranularity g);

struct QuantizeFp8Params {
  TensorView in;            // [...] f32|bf16|f16, contiguous (>= 2 dims for block)
  TensorView out;           // same shape, fp8_e4m3fn (or fp8_e4m3fnuz), contiguous, not overlapping in
  TensorView scale;         // f32, contiguous: out (or in, for static_scale); shape per granularity
  QuantGranularity granularity = QuantGranularity::per_row;
  int group_k = 128;        // >= 1: per_token_group group width, block width along K
  int block_n = 128;        // >= 1: block height along N (block granularity)
  bool static_scale = false;  // per_tensor only: `scale` is an input, not computed
};
Status quantize_fp8(const QuantizeFp8Params& p, const RunOptions& opts = {});
Status validate_quantize_fp8(const QuantizeFp8Params& p);

// Checkpoint conversion between the two e4m3 formats, bits-preserving where exact:
//   e4m3fn -> e4m3fnuz: same bits mean half the value, so scales x2; fn's -0 (0x80) -> 0x00
//                       (0x80 is NaN in fnuz); fn NaN (0x7F/0xFF) -> 0x80. Exact.
//   e4m3fnuz -> e4m3fn: same bits mean twice the value, so scales x0.5; fnuz NaN (0x80) -> 0x00;
//                       +-240 (0x7F/0xFF, which would be NaN in fn) -> +-448 (0x7E/0xFE), the only
//                       inexact codes; their count is returned in num_saturated.
// So decode(out) * scale_out == decode(in) * scale_in for every other code (exactly, for scales
// whose doubled / halved value is a normal f32). The direction follows in.dtype; out.dtype must be
// the other format. out may be the very same buffer as in (elementwise, in-place) but must not
// partially overlap it; scale_out likewise. scale_in and scale_out are given together or not at all.
// When in and scale_in have no elements the call returns at once (num_saturated set to 0).
struct ConvertFp8Params {
  TensorView in;            // [...] fp8 (either format), contiguous
  TensorView out;           // same shape, the other fp8 format, contiguous
  TensorView scale_in;      // [...] f32 scales of `in` (any shape), optional, contiguous
  TensorView scale_out;     // same shape as scale_in, f32 out, required with scale_in (may alias it)
  int64_t* num_saturated = nullptr;  // optional host out: codes clamped (fnuz -> fn only; else 0)
};
Status convert_fp8(const ConvertFp8Params& p, const RunOptions& opts = {});
Status validate_convert_fp8(const ConvertFp8Params& p);

}  // namespace moekit
