// fp8_quotient: v / s for the fp8 activation quantizers, from a precomputed reciprocal ri = RN(1 / s)
// (__frcp_rn on the GPU): q0 = v * ri, then one correction by its exact residual r = v - q0 s
// (Markstein). For s = max(amax, kFp8AmaxFloor) / 448 and |v| <= amax it gives the same e4m3fn code
// as the IEEE quotient v / s (SPEC 3.2 / 5 divide; docs/tolerances.md says why x * (1 / s) is not
// enough): the f32 quotient itself except where the residual underflows (|v| < 2^-103, code +-0
// either way). Host and device; the 256-column block gemm1 epilogues (blk_store_codes) divide the
// values of a group a thread holds by one scale with it, where __fdiv_rn cost more than the
// quantizer kernel the epilogue replaces (docs/experiments.md E74).
// Test: tests/test_fp8_quotient.cpp (codes against the IEEE quotient on random and edge pairs).
#pragma once

#include <cmath>

#include "moekit/core/dtype.h"  // MOEKIT_HD
#include "moekit/ops/quant.h"     // kFp8AmaxFloor, kFp8E4m3fnMax

namespace moekit {

// The dynamic e4m3fn scale of a row or group with absolute maximum amax (SPEC 5):
// max(amax, kFp8AmaxFloor) / 448, an IEEE division; fmaxf drops a NaN amax for the floor.
MOEKIT_HD float e4m3fn_scale_of(float amax) { return fmaxf(amax, kFp8AmaxFloor) / kFp8E4m3fnMax; }

MOEKIT_HD float fp8_quotient(float v, float s, float ri) {
#if defined(__CUDA_ARCH__)
  const float q0 = __fmul_rn(v, ri);
  const float r = __fmaf_rn(-q0, s, v);
  return r == 0.0f ? q0 : __fmaf_rn(r, ri, q0);  // r == 0: q0 is exact (and keeps the sign of -0)
#else
  const float q0 = v * ri;
  const float r = std::fma(-q0, s, v);
  return r == 0.0f ? q0 : std::fma(r, ri, q0);
#endif
}

// fp8_quotient for finite v with |v| <= amax (s = e4m3fn_scale_of(amax), ri = RN(1 / s)), with an
// f32 subnormal quotient flushed to zero and the sign taken from v: always normal or +-0 and at most
// ~448, so the hardware e4m3 convert (cvt_e4m3x2) encodes it as f32_to_e4m3fn_bits encodes the IEEE
// quotient, without fp8_fast_ok's checks. Flushing drops a residual only where |v| < 2^-79, and then
// v / s < 2^-30 encodes to +-0 either way (docs/experiments.md E118).
MOEKIT_HD float fp8_quotient_finite(float v, float s, float ri) {
#if defined(__CUDA_ARCH__)
  const float q0 = __fmul_rn(v, ri);
  const float r = __fmaf_rn(-q0, s, v);
  float q;
  asm("fma.rn.ftz.f32 %0, %1, %2, %3;" : "=f"(q) : "f"(r), "f"(ri), "f"(q0));
  return copysignf(q, v);
#else
  const float q0 = v * ri;
  const float r = std::fma(-q0, s, v);
  const float q = std::fma(r, ri, q0);
  return std::copysign(std::fabs(q) < 0x1p-126f ? 0.0f : q, v);
#endif
}

}  // namespace moekit
