// moekit/core/dtype.h: element types and exact scalar conversions.
//
// Every conversion here is a pure bit-level function usable on host and device (MOEKIT_HD), so the
// reference, CPU and CUDA backends round identically. Rules (checked against PyTorch's casts by
// tests/test_dtype.cpp using tests/data/dtype_golden.json):
//   - f32 -> bf16 / f16: round to nearest even; overflow gives +-inf; NaN stays a (quiet) NaN.
//   - f32 -> fp8 (e4m3fn, e4m3fnuz): round to nearest even, SATURATE to the largest finite value
//     (+-448 / +-240; +-inf saturates too), NaN -> the format's NaN (e4m3fn: sign|0x7F, e4m3fnuz: 0x80).
//     e4m3fnuz has no negative zero: -0 and negative values that round to 0 encode as 0x00.
//   - decoding is exact (every code of the narrow formats is a float).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MOEKIT_HD __host__ __device__ __forceinline__
#else
#define MOEKIT_HD inline
#endif

namespace moekit {

enum class DType : uint8_t { f32, bf16, f16, fp8_e4m3fn, fp8_e4m3fnuz, i32 };

constexpr int kNumDTypes = 6;

// Size of one element in bytes.
constexpr int dtype_size(DType d) {
  switch (d) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::fp8_e4m3fn: return 1;
    case DType::fp8_e4m3fnuz: return 1;
    case DType::i32: return 4;
  }
  return 0;
}

constexpr bool is_fp8(DType d) { return d == DType::fp8_e4m3fn || d == DType::fp8_e4m3fnuz; }
constexpr bool is_float16ish(DType d) { return d == DType::bf16 || d == DType::f16; }
// Floating types the MoE activations may use (x / out of fused_moe, gating of routing).
constexpr bool is_activation_dtype(DType d) {
  return d == DType::f32 || d == DType::bf16 || d == DType::f16;
}

// Stable lower-case names: "f32", "bf16", "f16", "fp8_e4m3fn", "fp8_e4m3fnuz", "i32".
const char* dtype_name(DType d);
// Parses the names above (also "float32", "bfloat16", "float16", "e4m3fn", "e4m3fnuz", "int32").
bool parse_dtype(const char* s, DType* out);

// Largest finite value of the fp8 formats.
constexpr float kFp8E4m3fnMax = 448.0f;
constexpr float kFp8E4m3fnuzMax = 240.0f;

namespace dtype_detail {

MOEKIT_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

MOEKIT_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Rounds the magnitude bits `mag` (a non-negative f32, finite) to an unsigned integer count of
// 2^-shift_base units: returns round_half_even(mant * 2^(exp - 150 + base)) where base is chosen by
// the caller. Helper for subnormal targets. `shift` = bits dropped (may be >= 32).
MOEKIT_HD uint32_t rne_shift(uint32_t mant, int shift) {
  if (shift <= 0) return mant << (-shift);
  if (shift >= 32) return 0;
  const uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// Generic float -> 8-bit e4m3 family encoder (4 exponent bits, 3 mantissa bits), saturating.
// bias: 7 (e4m3fn) or 8 (e4m3fnuz); max_code: 0x7E / 0x7F; nan_code: 0x7F (| sign) / 0x80.
MOEKIT_HD uint8_t encode_e4m3(float f, int bias, uint32_t max_code, float max_val, bool fnuz) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return fnuz ? uint8_t(0x80) : uint8_t(sign | 0x7Fu);  // NaN
  uint32_t code;
  if (f32_from_bits(mag) >= max_val) {
    code = max_code;  // saturate (incl. inf)
  } else {
    const int e = int(mag >> 23);  // biased f32 exponent
    const uint32_t mant = (mag & 0x7FFFFFu) | (e ? 0x800000u : 0u);
    const int min_normal_e = 127 + 1 - bias;  // f32 biased exponent of the smallest fp8 normal
    if (e < min_normal_e) {
      // subnormal target: units of 2^(1 - bias - 3). value = mant * 2^(e - 150) (e>=1);
      // count = mant * 2^(e - 150 - (1 - bias - 3)).
      const int ee = e ? e : 1;
      const int shift = 150 + (1 - bias - 3) - ee;  // bits to drop
      code = rne_shift(mant, shift);                 // 0..8; 8 == smallest normal code, correct
    } else {
      // normal: keep 3 mantissa bits, round the other 20 to nearest even.
      const uint32_t exp8 = uint32_t(e - 127 + bias);
      const uint32_t m3 = (mag >> 20) & 7u;
      const uint32_t rem = mag & 0xFFFFFu;
      code = (exp8 << 3) | m3;
      if (rem > 0x80000u || (rem == 0x80000u && (code & 1u))) code += 1;  // carry into exponent ok
    }
    if (code > max_code) code = max_code;
  }
  if (fnuz && code == 0) return 0;  // no negative zero in e4m3fnuz
  return uint8_t(sign | code);
}

}  // namespace dtype_detail

// ---- bf16 ----
MOEKIT_HD uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = dtype_detail::f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
MOEKIT_HD float bf16_bits_to_f32(uint16_t b) { return dtype_detail::f32_from_bits(uint32_t(b) << 16); }

// ---- f16 (IEEE binary16) ----
MOEKIT_HD uint16_t f32_to_f16_bits(float f) {
  const uint32_t u = dtype_detail::f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t mag = u & 0x7FFFFFFFu;
  if (mag >= 0x7F800000u) return uint16_t(sign | (mag > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (mag >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // >= 65520 rounds to inf
  const int e = int(mag >> 23);
  if (e < 113) {  // below 2^-14: subnormal half, units of 2^-24
    if (e < 102) return uint16_t(sign);
    const uint32_t mant = (mag & 0x7FFFFFu) | 0x800000u;
    return uint16_t(sign | dtype_detail::rne_shift(mant, 126 - e));
  }
  uint32_t h = (uint32_t(e - 112) << 10) | ((mag >> 13) & 0x3FFu);
  const uint32_t rem = mag & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1;
  return uint16_t(sign | h);
}
MOEKIT_HD float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0x1F) return dtype_detail::f32_from_bits(sign | 0x7F800000u | (m << 13));
  if (e == 0) {
    const float v = float(m) * (1.0f / 16777216.0f);  // m * 2^-24, exact
    return sign ? -v : v;
  }
  return dtype_detail::f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

// ---- fp8 e4m3fn (OCP; max 448, NaN = S.1111.111, no inf) ----
MOEKIT_HD uint8_t f32_to_e4m3fn_bits(float f) {
  return dtype_detail::encode_e4m3(f, 7, 0x7Eu, kFp8E4m3fnMax, false);
}
MOEKIT_HD float e4m3fn_bits_to_f32(uint8_t c) {
  const uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
  float v;
  if ((c & 0x7Fu) == 0x7Fu) return dtype_detail::f32_from_bits(0x7FC00000u | (uint32_t(c & 0x80u) << 24));
  if (e == 0) v = float(m) * (1.0f / 512.0f);  // m * 2^-9
  else v = dtype_detail::f32_from_bits(((e + 120u) << 23) | (m << 20));
  return (c & 0x80u) ? -v : v;
}

// ---- fp8 e4m3fnuz (max 240, bias 8, 0x80 = NaN, no negative zero, no inf) ----
MOEKIT_HD uint8_t f32_to_e4m3fnuz_bits(float f) {
  return dtype_detail::encode_e4m3(f, 8, 0x7Fu, kFp8E4m3fnuzMax, true);
}
MOEKIT_HD float e4m3fnuz_bits_to_f32(uint8_t c) {
  if (c == 0x80u) return dtype_detail::f32_from_bits(0x7FC00000u);
  const uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
  float v;
  if (e == 0) v = float(m) * (1.0f / 1024.0f);  // m * 2^-10
  else v = dtype_detail::f32_from_bits(((e + 119u) << 23) | (m << 20));
  return (c & 0x80u) ? -v : v;
}

// ---- typed storage wrappers (trivial, 1:1 with the stored bits) ----
struct bf16_t {
  uint16_t bits;
  MOEKIT_HD static bf16_t from_f32(float f) { return bf16_t{f32_to_bf16_bits(f)}; }
  MOEKIT_HD float to_f32() const { return bf16_bits_to_f32(bits); }
};
struct f16_t {
  uint16_t bits;
  MOEKIT_HD static f16_t from_f32(float f) { return f16_t{f32_to_f16_bits(f)}; }
  MOEKIT_HD float to_f32() const { return f16_bits_to_f32(bits); }
};
struct e4m3fn_t {
  uint8_t bits;
  MOEKIT_HD static e4m3fn_t from_f32(float f) { return e4m3fn_t{f32_to_e4m3fn_bits(f)}; }
  MOEKIT_HD float to_f32() const { return e4m3fn_bits_to_f32(bits); }
};
struct e4m3fnuz_t {
  uint8_t bits;
  MOEKIT_HD static e4m3fnuz_t from_f32(float f) { return e4m3fnuz_t{f32_to_e4m3fnuz_bits(f)}; }
  MOEKIT_HD float to_f32() const { return e4m3fnuz_bits_to_f32(bits); }
};
static_assert(sizeof(bf16_t) == 2 && sizeof(f16_t) == 2, "16-bit storage types must be 2 bytes");
static_assert(sizeof(e4m3fn_t) == 1 && sizeof(e4m3fnuz_t) == 1, "fp8 storage types must be 1 byte");

// Loads element i of a buffer of dtype d as float (d must be a floating type; i32 converts exactly
// up to 2^24). Host-side convenience for the reference backend and tests.
inline float load_as_f32(const void* p, DType d, int64_t i) {
  switch (d) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::fp8_e4m3fn: return e4m3fn_bits_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::fp8_e4m3fnuz: return e4m3fnuz_bits_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::i32: return float(static_cast<const int32_t*>(p)[i]);
  }
  return 0.0f;
}

// Stores v (rounded per the rules above) into element i of a buffer of dtype d.
inline void store_from_f32(void* p, DType d, int64_t i, float v) {
  switch (d) {
    case DType::f32: static_cast<float*>(p)[i] = v; return;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v); return;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(v); return;
    case DType::fp8_e4m3fn: static_cast<uint8_t*>(p)[i] = f32_to_e4m3fn_bits(v); return;
    case DType::fp8_e4m3fnuz: static_cast<uint8_t*>(p)[i] = f32_to_e4m3fnuz_bits(v); return;
    case DType::i32: static_cast<int32_t*>(p)[i] = int32_t(v); return;
  }
}

// Rounds v to dtype d and back (identity for f32 / i32 semantics aside).
inline float round_to(DType d, float v) {
  switch (d) {
    case DType::bf16: return bf16_bits_to_f32(f32_to_bf16_bits(v));
    case DType::f16: return f16_bits_to_f32(f32_to_f16_bits(v));
    case DType::fp8_e4m3fn: return e4m3fn_bits_to_f32(f32_to_e4m3fn_bits(v));
    case DType::fp8_e4m3fnuz: return e4m3fnuz_bits_to_f32(f32_to_e4m3fnuz_bits(v));
    default: return v;
  }
}

// Largest finite value of an fp8 dtype (0 for others).
constexpr float fp8_max(DType d) {
  return d == DType::fp8_e4m3fn ? kFp8E4m3fnMax : (d == DType::fp8_e4m3fnuz ? kFp8E4m3fnuzMax : 0.0f);
}

}  // namespace moekit
