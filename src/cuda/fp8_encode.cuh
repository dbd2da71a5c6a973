// Fast e4m3fn / e4m3fnuz encoding on sm_90 with the hardware convert (cvt.rn.satfinite.e4m3x2.f32),
// bit-identical to dtype.h's scalar encoder (the reference) for the quotients it accepts: finite,
// |q| <= kFp8FastLimit, and normal or zero (an f32 subnormal q and NaN / huge values take the scalar
// encoder). Shared by quantize_fp8_sm90 and the fp8 fused_moe kernels' activation quantizers.
// Tests: tests/test_quantize_fp8_sm90.cpp (QuantizeFp8.CudaEncoderMatchesTheScalarEncoderOnEveryFloatClass).
// CUDA-only header: include only from .cu files.
#pragma once

#include <cstdint>

#include "cuda/fp8_quotient.h"
#include "moekit/core/dtype.h"

namespace moekit::cuda {

constexpr float kFp8FastLimit = 0x1p100f;   // |q| above this (or NaN) takes the scalar encoder,
constexpr float kFp8MinNormal = 0x1p-126f;  //   and so does an f32 subnormal q (which encodes to +-0)

// Whether the hardware path encodes q exactly as the scalar encoder.
__device__ __forceinline__ bool fp8_fast_ok(float q) {
  const float a = fabsf(q);
  return a <= kFp8FastLimit && (a >= kFp8MinNormal || a == 0.0f);
}

// Two e4m3fn codes: lo in the low byte (RNE, finite overflow saturates to +-448).
__device__ __forceinline__ uint32_t cvt_e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// The e4m3fn codes of lo / s and hi / s (lo in the low byte) for finite values within the amax of
// s = e4m3fn_scale_of(amax), ri = RN(1 / s): fp8_quotient_finite and the hardware convert, the IEEE
// quotient's codes without the checked encoder (docs/experiments.md E118, E123).
__device__ __forceinline__ uint32_t e4m3fn_quotient_codes2(float lo, float hi, float s, float ri) {
  return cvt_e4m3x2(fp8_quotient_finite(lo, s, ri), fp8_quotient_finite(hi, s, ri));
}

// The e4m3fn scale of a 128-value group a warp holds 4 values a lane (max |v|, NaN ignored as fmaxf
// does, over the warp; every lane gets it): e4m3fn_scale_of of the group's amax.
__device__ __forceinline__ float warp_group_scale(const float (&f)[4]) {
  float amax = fmaxf(fmaxf(fabsf(f[0]), fabsf(f[1])), fmaxf(fabsf(f[2]), fabsf(f[3])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  return e4m3fn_scale_of(amax);
}

// Four codes of quotients that pass fp8_fast_ok, byte k = code of q[k].
__device__ __forceinline__ uint32_t encode4(const float* q, bool fnuz) {
  if (!fnuz) return cvt_e4m3x2(q[0], q[1]) | (cvt_e4m3x2(q[2], q[3]) << 16);
  uint32_t w = cvt_e4m3x2(2.0f * q[0], 2.0f * q[1]) | (cvt_e4m3x2(2.0f * q[2], 2.0f * q[3]) << 16);
#pragma unroll
  for (int k = 0; k < 4; ++k) w |= fabsf(q[k]) > 232.0f ? (1u << (8 * k)) : 0u;  // 0x7E -> 0x7F (240)
  return w & ~__vcmpeq4(w, 0x80808080u);  // no negative zero in e4m3fnuz
}

// Two e4m3fn codes (lo in the low byte): the hardware path when both quotients allow it, else the
// scalar encoder (the reference's f32_to_e4m3fn_bits) per element.
__device__ __forceinline__ uint16_t encode2_e4m3fn(float lo, float hi) {
  if (fp8_fast_ok(lo) && fp8_fast_ok(hi)) return uint16_t(cvt_e4m3x2(lo, hi));
  return uint16_t(uint32_t(f32_to_e4m3fn_bits(lo)) | (uint32_t(f32_to_e4m3fn_bits(hi)) << 8));
}

// Four e4m3fn codes of q[0..3] (byte k = code of q[k]), a pair at a time.
__device__ __forceinline__ uint32_t encode4_e4m3fn(const float* q) {
  return uint32_t(encode2_e4m3fn(q[0], q[1])) | (uint32_t(encode2_e4m3fn(q[2], q[3])) << 16);
}

}  // namespace moekit::cuda
