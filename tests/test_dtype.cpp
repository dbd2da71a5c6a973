// Scalar conversions of moekit/core/dtype.h against PyTorch (tests/data/dtype_golden.json, made by
// PyTorch 2.11; see golden/README.md in the project's shared documents) and against hand-worked cases.
//
// The golden file holds 340 float32 inputs (special values, rounding ties, format limits, random
// magnitudes) with their bf16, f16, e4m3fn and e4m3fnuz bit patterns, and the float32 value of all
// 256 codes of both fp8 formats. moekit's fp8 encoders SATURATE, so they are compared with the
// "clamped" columns (PyTorch's cast after clamping to +-448 / +-240). NaN inputs and NaN codes are
// compared by NaN-ness only (payloads differ, e.g. PyTorch gives bf16 0xFFFF for a NaN); moekit's
// own NaN codes are pinned separately: bf16 0x7FC0 | sign (quiet), f16 0x7E00 | sign, e4m3fn
// 0x7F | sign, e4m3fnuz 0x80.
// Run: ./build/tests/moekit_tests --gtest_filter='DType*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "test_data_dir.h"
#include "moekit/core/dtype.h"

namespace moekit {
namespace {

float f32(uint32_t bits) { return dtype_detail::f32_from_bits(bits); }
uint32_t bits(float f) { return dtype_detail::f32_bits(f); }

const nlohmann::json& golden() {
  static const nlohmann::json j = [] {
    const std::string path = testing::test_data_dir() + "/dtype_golden.json";
    std::ifstream f(path);
    EXPECT_TRUE(f.good()) << "cannot open " << path;
    return f.good() ? nlohmann::json::parse(f) : nlohmann::json::object();
  }();
  return j;
}

// Compares encoder `enc` with golden column `col` for every input; `decode` tells NaN codes.
template <class Enc, class Dec>
void check_column(const char* col, Enc enc, Dec decode) {
  const auto& in = golden().at("inputs_f32_bits");
  const auto& want = golden().at(col);
  ASSERT_EQ(in.size(), 340u);
  ASSERT_EQ(want.size(), in.size());
  int nan_inputs = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const float x = f32(in[i].get<uint32_t>());
    const uint32_t got = enc(x), exp = want[i].get<uint32_t>();
    if (std::isnan(x)) {
      ++nan_inputs;
      EXPECT_TRUE(std::isnan(decode(got))) << col << " input " << i << ": NaN must encode to a NaN code";
      EXPECT_TRUE(std::isnan(decode(exp))) << col << " input " << i << ": golden NaN code";
      continue;
    }
    EXPECT_EQ(got, exp) << col << " input " << i << " x=" << x << " (0x" << std::hex << bits(x) << ")";
  }
  EXPECT_GE(nan_inputs, 1) << "the golden inputs should include a NaN";
}

TEST(DType, GoldenBf16) {
  check_column("bf16_bits", [](float x) { return uint32_t(f32_to_bf16_bits(x)); },
               [](uint32_t c) { return bf16_bits_to_f32(uint16_t(c)); });
}

TEST(DType, GoldenF16) {
  check_column("f16_bits", [](float x) { return uint32_t(f32_to_f16_bits(x)); },
               [](uint32_t c) { return f16_bits_to_f32(uint16_t(c)); });
}

TEST(DType, GoldenE4m3fnClampedCast) {
  check_column("e4m3fn_clamped_cast_bits", [](float x) { return uint32_t(f32_to_e4m3fn_bits(x)); },
               [](uint32_t c) { return e4m3fn_bits_to_f32(uint8_t(c)); });
}

TEST(DType, GoldenE4m3fnuzClampedCast) {
  check_column("e4m3fnuz_clamped_cast_bits", [](float x) { return uint32_t(f32_to_e4m3fnuz_bits(x)); },
               [](uint32_t c) { return e4m3fnuz_bits_to_f32(uint8_t(c)); });
}

// Where PyTorch's raw cast is finite it must agree with moekit's saturating cast (the two differ
// only where the raw cast overflows to NaN).
TEST(DType, GoldenRawCastAgreesWhereFinite) {
  const auto& in = golden().at("inputs_f32_bits");
  for (size_t i = 0; i < in.size(); ++i) {
    const float x = f32(in[i].get<uint32_t>());
    if (std::isnan(x)) continue;
    const auto fn = golden().at("e4m3fn_raw_cast_bits")[i].get<uint32_t>();
    const auto fnuz = golden().at("e4m3fnuz_raw_cast_bits")[i].get<uint32_t>();
    if (!std::isnan(e4m3fn_bits_to_f32(uint8_t(fn)))) {
      EXPECT_EQ(f32_to_e4m3fn_bits(x), fn) << "input " << i;
    }
    if (!std::isnan(e4m3fnuz_bits_to_f32(uint8_t(fnuz)))) {
      EXPECT_EQ(f32_to_e4m3fnuz_bits(x), fnuz) << "input " << i;
    }
  }
}

template <class Dec>
void check_decode(const char* col, Dec decode) {
  const auto& want = golden().at(col);
  ASSERT_EQ(want.size(), 256u);
  for (int c = 0; c < 256; ++c) {
    const float got = decode(uint8_t(c)), exp = f32(want[size_t(c)].get<uint32_t>());
    if (std::isnan(exp)) {
      EXPECT_TRUE(std::isnan(got)) << col << " code 0x" << std::hex << c;
    } else {
      EXPECT_EQ(bits(got), bits(exp)) << col << " code 0x" << std::hex << c << ": " << got << " vs " << exp;
    }
  }
}

TEST(DType, GoldenDecodeAllE4m3fnCodes) { check_decode("e4m3fn_decode_f32_bits", e4m3fn_bits_to_f32); }
TEST(DType, GoldenDecodeAllE4m3fnuzCodes) { check_decode("e4m3fnuz_decode_f32_bits", e4m3fnuz_bits_to_f32); }

// ---------------------------------------------------------------- hand-worked cases
TEST(DType, NanCodesMoekitUses) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(f32_to_bf16_bits(qnan), 0x7FC0);
  EXPECT_EQ(f32_to_bf16_bits(-qnan), 0xFFC0);
  EXPECT_EQ(f32_to_bf16_bits(f32(0x7F800001u)), 0x7FC0) << "signalling NaN must stay NaN (quieted)";
  EXPECT_EQ(f32_to_f16_bits(qnan), 0x7E00);
  EXPECT_EQ(f32_to_e4m3fn_bits(qnan), 0x7F);
  EXPECT_EQ(f32_to_e4m3fn_bits(-qnan), 0xFF);
  EXPECT_EQ(f32_to_e4m3fnuz_bits(qnan), 0x80);
  EXPECT_EQ(f32_to_e4m3fnuz_bits(-qnan), 0x80);
  EXPECT_TRUE(std::isnan(e4m3fn_bits_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3fn_bits_to_f32(0xFF)));
  EXPECT_TRUE(std::isnan(e4m3fnuz_bits_to_f32(0x80)));
}

TEST(DType, Bf16RoundToNearestEven) {
  // bf16 keeps 7 mantissa bits: ulp(1) = 2^-7, so 1 + 2^-8 is a tie.
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 0x1p-8f), 0x3F80) << "tie, 1.0 is even";
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 3 * 0x1p-8f), 0x3F82) << "tie between 0x3F81 and 0x3F82: even";
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81) << "just above the tie";
  EXPECT_EQ(f32_to_bf16_bits(-1.0f - 0x1p-8f), 0xBF80);
  EXPECT_EQ(f32_to_bf16_bits(3.4028235e38f), 0x7F80) << "FLT_MAX rounds up to inf";
  EXPECT_EQ(f32_to_bf16_bits(-INFINITY), 0xFF80);
  EXPECT_EQ(f32_to_bf16_bits(f32(0x00000001u)), 0x0000) << "smallest f32 denormal rounds to 0";
  EXPECT_EQ(f32_to_bf16_bits(f32(0x00018000u)), 0x0002) << "denormal tie 1.5 ulp -> even";
  EXPECT_EQ(bf16_bits_to_f32(0x3F80), 1.0f);
}

TEST(DType, F16RoundingSubnormalsAndOverflow) {
  // f16 keeps 10 mantissa bits: ulp(1) = 2^-10, so 1 + 2^-11 is a tie.
  EXPECT_EQ(f32_to_f16_bits(1.0f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(f32_to_f16_bits(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(f32_to_f16_bits(0x1p-24f), 0x0001) << "smallest subnormal";
  EXPECT_EQ(f32_to_f16_bits(0x1p-25f), 0x0000) << "tie between 0 and 2^-24: even (0)";
  EXPECT_EQ(f32_to_f16_bits(3 * 0x1p-25f), 0x0002) << "tie between 1 and 2 units: even";
  EXPECT_EQ(f32_to_f16_bits(0x1p-14f), 0x0400) << "smallest normal";
  EXPECT_EQ(f32_to_f16_bits(0x1p-14f - 0x1p-25f), 0x0400) << "rounds up into the normals";
  EXPECT_EQ(f32_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7BFF) << "largest finite";
  EXPECT_EQ(f32_to_f16_bits(65519.99f), 0x7BFF);
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7C00) << "tie above max rounds to inf";
  EXPECT_EQ(f32_to_f16_bits(-1e30f), 0xFC00);
  EXPECT_EQ(f16_bits_to_f32(0x0001), 0x1p-24f);
  EXPECT_TRUE(std::isinf(f16_bits_to_f32(0x7C00)));
}

TEST(DType, E4m3fnHandCases) {
  // bias 7, 3 mantissa bits; subnormal unit 2^-9; max 0x7E = 1.75 * 2^8 = 448.
  EXPECT_EQ(f32_to_e4m3fn_bits(1.0f), 0x38);
  EXPECT_EQ(f32_to_e4m3fn_bits(1.0f + 1.0f / 16), 0x38) << "tie, even";
  EXPECT_EQ(f32_to_e4m3fn_bits(1.0f + 3.0f / 16), 0x3A) << "tie between 1.125 and 1.25: even";
  EXPECT_EQ(f32_to_e4m3fn_bits(0x1p-9f), 0x01) << "smallest subnormal";
  EXPECT_EQ(f32_to_e4m3fn_bits(0x1p-10f), 0x00) << "tie between 0 and 2^-9";
  EXPECT_EQ(f32_to_e4m3fn_bits(3 * 0x1p-10f), 0x02);
  EXPECT_EQ(f32_to_e4m3fn_bits(7.5f * 0x1p-9f), 0x08) << "tie between the largest subnormal and 2^-6";
  EXPECT_EQ(f32_to_e4m3fn_bits(0x1p-6f), 0x08) << "smallest normal";
  EXPECT_EQ(f32_to_e4m3fn_bits(-0x1p-10f), 0x80) << "negative value rounding to 0 keeps the sign";
  EXPECT_EQ(f32_to_e4m3fn_bits(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3fn_bits(448.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3fn_bits(464.0f), 0x7E) << "would round to 480 (NaN code): saturates";
  EXPECT_EQ(f32_to_e4m3fn_bits(1e30f), 0x7E);
  EXPECT_EQ(f32_to_e4m3fn_bits(INFINITY), 0x7E);
  EXPECT_EQ(f32_to_e4m3fn_bits(-INFINITY), 0xFE);
  EXPECT_EQ(f32_to_e4m3fn_bits(-1e30f), 0xFE);
  EXPECT_EQ(e4m3fn_bits_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3fn_bits_to_f32(0x01), 0x1p-9f);
  EXPECT_TRUE(std::signbit(e4m3fn_bits_to_f32(0x80)) && e4m3fn_bits_to_f32(0x80) == 0.0f);
}

TEST(DType, E4m3fnuzHandCases) {
  // bias 8; subnormal unit 2^-10; max 0x7F = 1.875 * 2^7 = 240; 0x80 is NaN: no negative zero.
  EXPECT_EQ(f32_to_e4m3fnuz_bits(1.0f), 0x40);
  EXPECT_EQ(f32_to_e4m3fnuz_bits(1.0f + 3.0f / 16), 0x42);
  EXPECT_EQ(f32_to_e4m3fnuz_bits(0x1p-10f), 0x01);
  EXPECT_EQ(f32_to_e4m3fnuz_bits(-0x1p-10f), 0x81);
  EXPECT_EQ(f32_to_e4m3fnuz_bits(-0.0f), 0x00) << "no negative zero";
  EXPECT_EQ(f32_to_e4m3fnuz_bits(-0x1p-11f), 0x00) << "negative tie to zero gives +0";
  EXPECT_EQ(f32_to_e4m3fnuz_bits(-0x1p-20f), 0x00);
  EXPECT_EQ(f32_to_e4m3fnuz_bits(240.0f), 0x7F);
  EXPECT_EQ(f32_to_e4m3fnuz_bits(248.0f), 0x7F) << "tie above max saturates";
  EXPECT_EQ(f32_to_e4m3fnuz_bits(1e30f), 0x7F);
  EXPECT_EQ(f32_to_e4m3fnuz_bits(-INFINITY), 0xFF);
  EXPECT_EQ(e4m3fnuz_bits_to_f32(0x7F), 240.0f);
  EXPECT_EQ(e4m3fnuz_bits_to_f32(0xFF), -240.0f);
  EXPECT_EQ(e4m3fnuz_bits_to_f32(0x01), 0x1p-10f);
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3fnuz_bits_to_f32(uint8_t(c));
    EXPECT_FALSE(v == 0.0f && std::signbit(v)) << "code 0x" << std::hex << c << " decodes to -0";
  }
}

TEST(DType, Fp8RoundTripsEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const float a = e4m3fn_bits_to_f32(uint8_t(c));
    const float b = e4m3fnuz_bits_to_f32(uint8_t(c));
    const float a2 = e4m3fn_bits_to_f32(f32_to_e4m3fn_bits(a));
    const float b2 = e4m3fnuz_bits_to_f32(f32_to_e4m3fnuz_bits(b));
    EXPECT_TRUE(std::isnan(a) ? std::isnan(a2) : bits(a2) == bits(a)) << "e4m3fn 0x" << std::hex << c;
    EXPECT_TRUE(std::isnan(b) ? std::isnan(b2) : bits(b2) == bits(b)) << "e4m3fnuz 0x" << std::hex << c;
    if (!std::isnan(a)) {
      EXPECT_EQ(f32_to_e4m3fn_bits(a), c) << "e4m3fn code must be canonical";
    }
    if (!std::isnan(b)) {
      EXPECT_EQ(f32_to_e4m3fnuz_bits(b), c) << "e4m3fnuz code must be canonical";
    }
  }
}

TEST(DType, SixteenBitRoundTripsEveryCode) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const float b = bf16_bits_to_f32(uint16_t(c)), h = f16_bits_to_f32(uint16_t(c));
    if (!std::isnan(b)) {
      EXPECT_EQ(f32_to_bf16_bits(b), c) << "bf16 0x" << std::hex << c;
    }
    if (!std::isnan(h)) {
      EXPECT_EQ(f32_to_f16_bits(h), c) << "f16 0x" << std::hex << c;
    }
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(b))));
    }
    if (std::isnan(h)) {
      EXPECT_TRUE(std::isnan(f16_bits_to_f32(f32_to_f16_bits(h))));
    }
  }
}

TEST(DType, NamesParseAndSizes) {
  const DType all[] = {DType::f32, DType::bf16, DType::f16, DType::fp8_e4m3fn, DType::fp8_e4m3fnuz, DType::i32};
  static_assert(sizeof(all) / sizeof(all[0]) == kNumDTypes, "every dtype listed");
  for (DType d : all) {
    DType back = DType::i32 == d ? DType::f32 : DType::i32;
    ASSERT_TRUE(parse_dtype(dtype_name(d), &back)) << dtype_name(d);
    EXPECT_EQ(back, d);
  }
  EXPECT_STREQ(dtype_name(DType::fp8_e4m3fnuz), "fp8_e4m3fnuz");
  struct Alias {
    const char* s;
    DType d;
  };
  for (const Alias& a : {Alias{"float32", DType::f32}, Alias{"bfloat16", DType::bf16}, Alias{"float16", DType::f16},
                         Alias{"e4m3fn", DType::fp8_e4m3fn}, Alias{"fp8", DType::fp8_e4m3fn},
                         Alias{"e4m3fnuz", DType::fp8_e4m3fnuz}, Alias{"int32", DType::i32}}) {
    DType d = DType::i32;
    EXPECT_TRUE(parse_dtype(a.s, &d)) << a.s;
    EXPECT_EQ(d, a.d) << a.s;
  }
  DType untouched = DType::bf16;
  EXPECT_FALSE(parse_dtype("fp16x", &untouched));
  EXPECT_FALSE(parse_dtype("", &untouched));
  EXPECT_FALSE(parse_dtype("BF16", &untouched)) << "names are case-sensitive";
  EXPECT_FALSE(parse_dtype(nullptr, &untouched));
  EXPECT_EQ(untouched, DType::bf16) << "a failed parse leaves the output alone";
  EXPECT_EQ(dtype_size(DType::f32), 4);
  EXPECT_EQ(dtype_size(DType::bf16), 2);
  EXPECT_EQ(dtype_size(DType::fp8_e4m3fnuz), 1);
  EXPECT_EQ(fp8_max(DType::fp8_e4m3fn), 448.0f);
  EXPECT_EQ(fp8_max(DType::fp8_e4m3fnuz), 240.0f);
  EXPECT_EQ(fp8_max(DType::bf16), 0.0f);
  EXPECT_TRUE(is_fp8(DType::fp8_e4m3fnuz));
  EXPECT_FALSE(is_fp8(DType::bf16));
}

TEST(DType, LoadStoreRoundTo) {
  unsigned char buf[16] = {};
  store_from_f32(buf, DType::bf16, 1, 1.0f + 0x1p-8f);
  EXPECT_EQ(load_as_f32(buf, DType::bf16, 1), 1.0f);
  store_from_f32(buf, DType::fp8_e4m3fn, 3, 1000.0f);
  EXPECT_EQ(buf[3], 0x7E);
  EXPECT_EQ(load_as_f32(buf, DType::fp8_e4m3fn, 3), 448.0f);
  store_from_f32(buf, DType::fp8_e4m3fnuz, 4, -1000.0f);
  EXPECT_EQ(load_as_f32(buf, DType::fp8_e4m3fnuz, 4), -240.0f);
  EXPECT_EQ(round_to(DType::f16, 65520.0f), INFINITY);
  EXPECT_EQ(round_to(DType::fp8_e4m3fn, 0.3f), 0.3125f) << "0.3 = 1.2 * 2^-2 -> 1.25 * 2^-2";
  EXPECT_EQ(round_to(DType::f32, 0.3f), 0.3f);
}

}  // namespace
}  // namespace moekit
