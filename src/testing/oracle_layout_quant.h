// Independent oracles for the layout and fp8 helper ops (SPEC 4, SPEC 5), used by the unit tests
// and by `moekit check` to judge the reference kernels. Each is written differently from the
// kernel it checks:
//   - shuffle: materialises the 5-D view [N/16, 16, K/32, 32/V, V] of each matrix and walks a
//     generic permutation of it (no closed-form index);
//   - fp8 rounding: nearest code by VALUE among the codes of the format, whose values come from the
//     format definition in float64 (a binary search over the sorted magnitudes, ties to the even
//     code), no exponent / mantissa bit manipulation;
//   - quantize: element-centric group ids and float64 amax;
//   - convert: decoded value x2 / x0.5 re-encoded by value.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/ops/layout.h"
#include "moekit/ops/quant.h"
#include "moekit/registry.h"

namespace moekit::testing {

// Permutes a row-major array of `nd` dims (`shape`, elements of elem_bytes bytes) so that output
// dim i is input dim perm[i]; returns the output bytes (contiguous).
std::vector<unsigned char> oracle_permute(const void* src, int elem_bytes, const std::vector<int64_t>& shape,
                                          const std::vector<int>& perm);

// Bytes of shuffle_weight(in) (inverse = false) or unshuffle_weight(in) (inverse = true); `in` must
// be a valid host input of that op.
std::vector<unsigned char> oracle_shuffle_weight(const TensorView& in, bool inverse);

// Value of an fp8 code from the format definitions (e4m3fn: bias 7, S.1111.111 NaN; e4m3fnuz: bias 8,
// 0x80 NaN), as a double (NaN for the NaN codes).
double oracle_fp8_value(uint8_t code, DType fp8);

// fp8 code of `v` for an fp8 dtype: nearest finite code by value with the sign of v (e4m3fnuz: its
// only zero for a negative v that rounds to zero), ties to the even code; |v| beyond the largest
// finite value (incl. inf) gives the largest code; NaN gives the format's NaN code (e4m3fn:
// 0x7F | sign, e4m3fnuz: 0x80).
uint8_t oracle_fp8_code(double v, DType fp8);

// quantize_fp8 on host tensors: the expected out codes and scales (in row-major order of `scale`).
// For static_scale, `scales` is a copy of the input scale.
struct QuantizeOracleResult {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};
QuantizeOracleResult oracle_quantize_fp8(const QuantizeFp8Params& p);

// convert_fp8 on host tensors: the expected out codes, scale_out values and saturation count.
struct ConvertOracleResult {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  int64_t saturated = 0;
};
ConvertOracleResult oracle_convert_fp8(const ConvertFp8Params& p);

// Runs the op on `kernel` (RunOptions::kernel) with host params p: a device kernel gets mirrored
// copies (DeviceMirror: inputs copied, outputs copied with their current host bytes and copied back
// into p's host buffers after the call); a host kernel runs on p directly. `stream` goes to
// RunOptions::stream. Defined in check_layout_quant.cpp; used by the Cuda* tests.
Status run_quantize_fp8_kernel(const QuantizeFp8Params& p, const Kernel& kernel, void* stream = nullptr);
Status run_convert_fp8_kernel(const ConvertFp8Params& p, const Kernel& kernel, void* stream = nullptr);

}  // namespace moekit::testing
