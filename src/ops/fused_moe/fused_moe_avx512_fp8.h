// AVX-512 pieces shared by the CPU fp8 fused_moe kernels (fused_moe_avx512_fp8.cpp: per-row /
// per-tensor scales, fused_moe_avx512_fp8_block.cpp: 128 x 128 block scales): the in-register fp8
// e4m3fn decode and a fixed-order horizontal sum. Compiled through target attributes: including
// this header needs no AVX-512 flags, and nothing here runs unless a kernel's supports() said the
// CPU has AVX-512 F/BW/VL (moe::require_avx512).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace moekit::cpu::moe {

// 16 fp8 e4m3fn codes at w -> their f32 values times 2^-120, EXACTLY for every code incl.
// subnormals (which become f32 denormals, kept by the default MXCSR): the byte is sign-extended to
// 32 bits and shifted left by 20, which puts the sign at bit 31 (the copies at bits 30..27 are
// masked off) and the 4 exponent + 3 mantissa bits at the top of the f32 exponent / mantissa. NaN
// codes (0x7F, 0xFF) decode to NaN. A product of a decoded weight (4 significant bits, >= 2^-129)
// and an fp8 activation value (>= 2^-9) is exact even as a denormal, so the 2^-120 can be undone
// once per dot product (or per block) instead of once per 16 codes.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 decode16_fp8(const uint8_t* w) {
  // NOTE: the maskz forms with a full mask, not _mm512_cvtepi8_epi32 / _mm512_slli_epi32, whose
  // _mm512_undefined_epi32 trips a false -Wmaybe-uninitialized in GCC 12's headers.
  const __m512i v = _mm512_maskz_cvtepi8_epi32(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  const __m512i bits =
      _mm512_and_si512(_mm512_maskz_slli_epi32(0xFFFF, v, 20), _mm512_set1_epi32(int32_t(0x87F00000u)));
  return _mm512_castsi512_ps(bits);
}

// Sum of the 16 lanes in a fixed order. NOTE: not _mm512_reduce_add_ps, which trips a false
// -Wmaybe-uninitialized in GCC 12's headers.
__attribute__((target("avx512f"))) inline float hsum16(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0.0f;
  for (float x : t) s += x;
  return s;
}

}  // namespace moekit::cpu::moe
