// fp8_quotient (src/cuda/fp8_quotient.h): the e4m3fn code of v / s from the reciprocal and one
// residual correction equals the code of the IEEE quotient, on random (amax, v) pairs over 2^-140 ..
// 2^20 (all-ones and zero scale mantissas, values down to 40 binades below amax) and on the edges
// (+-0, +-amax, amax below kFp8AmaxFloor). The f32 quotient itself matches wherever |v| >= 2^-100.
// fp8_quotient_finite (its host form) gives the same codes and never an f32 subnormal.
// Run: ./build/tests/moekit_tests --gtest_filter='Fp8Quotient*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "cuda/fp8_quotient.h"
#include "moekit/core/dtype.h"
#include "moekit/ops/quant.h"

namespace moekit {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Counts the pairs whose code (and, where |v| >= 2^-100, f32 quotient) differs from v / s.
struct Mismatch {
  int64_t codes = 0, quotients = 0;
};
void check_pair(float v, float amax, Mismatch& m) {
  const float s = e4m3fn_scale_of(amax);
  const float q = fp8_quotient(v, s, 1.0f / s), e = v / s;
  const float qf = fp8_quotient_finite(v, s, 1.0f / s);
  if (f32_to_e4m3fn_bits(q) != f32_to_e4m3fn_bits(e)) ++m.codes;
  // fp8_quotient_finite: the same code, and a quotient the hardware convert takes (normal or zero).
  if (f32_to_e4m3fn_bits(qf) != f32_to_e4m3fn_bits(e)) ++m.codes;
  if (qf != 0.0f && std::fabs(qf) < 0x1p-126f) ++m.codes;
  if (std::fabs(v) >= 0x1p-100f && bits_of(q) != bits_of(e)) ++m.quotients;
}

TEST(Fp8Quotient, CodesMatchTheIeeeQuotientOnRandomPairs) {
  std::mt19937_64 g(20261201);
  Mismatch m;
  for (int it = 0; it < 4000000; ++it) {
    const uint64_t r = g();
    const int ex = int(r % 161) - 140;
    uint32_t man = uint32_t(r >> 8) & 0x7fffffu;
    if ((r >> 40) % 8 == 0) man = 0x7fffffu;
    if ((r >> 40) % 8 == 1) man = 0;
    const float amax = std::ldexp(1.0f + float(man) / 8388608.0f, ex);
    const uint32_t vm = uint32_t(r >> 30) & 0x7fffffu;
    float v = std::fmin(std::ldexp(1.0f + float(vm) / 8388608.0f, ex - int((r >> 53) % 40)), amax);
    if ((r >> 59) & 1) v = -v;
    check_pair(v, amax, m);
  }
  EXPECT_EQ(m.codes, 0);
  EXPECT_EQ(m.quotients, 0);
}

TEST(Fp8Quotient, Edges) {
  Mismatch m;
  for (float amax : {0.0f, 1e-30f, 1e-12f, 0x1.fffffep-1f, 1.0f, 3.0f, 448.0f, 0x1.fffffep+19f, 1e6f}) {
    for (float v : {0.0f, -0.0f, amax, -amax, amax * 0.5f, -amax * 0.999f, amax * 1e-20f}) check_pair(v, amax, m);
  }
  EXPECT_EQ(m.codes, 0);
  EXPECT_EQ(m.quotients, 0);
  const float s = 1.0f / kFp8E4m3fnMax;
  EXPECT_EQ(f32_to_e4m3fn_bits(fp8_quotient(-0.0f, s, 1.0f / s)), 0x80);  // -0 keeps its sign
  EXPECT_EQ(f32_to_e4m3fn_bits(fp8_quotient_finite(-0.0f, s, 1.0f / s)), 0x80);
}

}  // namespace
}  // namespace moekit
