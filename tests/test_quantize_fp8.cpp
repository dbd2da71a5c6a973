// quantize_fp8 (SPEC 5, moekit/ops/quant.h): hand-worked codes and scales, the non-finite input
// policy, every granularity (incl. ragged last groups / blocks and static per-tensor scales)
// against the float64 nearest-code oracle (src/testing/oracle_layout_quant.cpp), the dequantization
// error bound, validation errors and the harness hook on model presets.
// Run: ./build/tests/moekit_tests --gtest_filter='QuantizeFp8*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cpu_test_util.h"
#include "moekit/core/config.h"
#include "moekit/ops/quant.h"
#include "testing/harness.h"
#include "testing/oracle_layout_quant.h"

namespace moekit {
namespace {

using testing::Buffer;
using testing::Rng;
using G = QuantGranularity;
using Dims = std::vector<int64_t>;

constexpr DType kFn = DType::fp8_e4m3fn;
constexpr DType kFnuz = DType::fp8_e4m3fnuz;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Quantized {
  Buffer out, scale;
  Status status;
};

QuantizeFp8Params make_params(const Buffer& in, Buffer& out, Buffer& scale, G g, int group_k = 128,
                              int block_n = 128, bool static_scale = false) {
  QuantizeFp8Params p;
  p.in = in.view;
  p.out = out.view;
  p.scale = scale.view;
  p.granularity = g;
  p.group_k = group_k;
  p.block_n = block_n;
  p.static_scale = static_scale;
  return p;
}

Quantized quantize(const Buffer& in, DType od, G g, const Dims& scale_dims, int group_k = 128, int block_n = 128) {
  std::vector<int64_t> dims(in.view.shape, in.view.shape + in.view.ndim);
  Quantized q{Buffer(od, dims), Buffer(DType::f32, scale_dims), Status()};
  q.out.fill_bytes(0xAB);
  q.scale.fill_bytes(0xAB);
  q.status = quantize_fp8(make_params(in, q.out, q.scale, g, group_k, block_n));
  return q;
}

Buffer from_values(DType d, const Dims& dims, const std::vector<float>& v) {
  Buffer b(d, dims);
  for (size_t i = 0; i < v.size(); ++i) b.set(int64_t(i), v[i]);
  return b;
}

// ---------------------------------------------------------------- named edge cases
TEST(QuantizeFp8, EmptyInputReturnsAtOnce) {
  Buffer in(DType::bf16, {0, 128});
  Quantized q = quantize(in, kFn, G::per_row, {0});
  EXPECT_TRUE(q.status.ok()) << q.status.to_string();
  Buffer in2(DType::bf16, {0, 128});
  Quantized t = quantize(in2, kFn, G::per_tensor, {1});
  EXPECT_TRUE(t.status.ok());
  EXPECT_EQ(t.scale.bytes[0], 0xAB) << "empty input: the per-tensor scale is not written (documented)";
}

TEST(QuantizeFp8, SingleElement) {
  Quantized q = quantize(from_values(DType::f32, {1, 1}, {3.0f}), kFn, G::per_row, {1});
  ASSERT_TRUE(q.status.ok());
  EXPECT_EQ(q.scale.data<float>()[0], 3.0f / 448.0f);
  EXPECT_EQ(q.out.data<uint8_t>()[0], 0x7E) << "the amax element maps to the largest code";
}

// Hand-worked e4m3fn codes: 448 = 1.75 * 2^8 -> 0x7E; 224 = 1.75 * 2^7 -> 0x76; 112 -> 0x6E;
// 1 = 2^0 -> exponent field 7 -> 0x38; sign bit 0x80.
TEST(QuantizeFp8, HandWorkedPerRowE4m3fn) {
  Buffer in = from_values(DType::f32, {2, 4}, {448.0f, -224.0f, 1.0f, 0.0f, 1.0f, 0.5f, -0.25f, 0.0f});
  Quantized q = quantize(in, kFn, G::per_row, {2, 1});
  ASSERT_TRUE(q.status.ok()) << q.status.to_string();
  EXPECT_EQ(q.scale.data<float>()[0], 1.0f) << "amax 448 / 448";
  EXPECT_EQ(q.scale.data<float>()[1], 1.0f / 448.0f);
  const uint8_t want[8] = {0x7E, 0xF6, 0x38, 0x00, 0x7E, 0x76, 0xEE, 0x00};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q.out.data<uint8_t>()[i], want[i]) << i;
}

// e4m3fnuz: bias 8, so 1 -> 0x40; 240 = 1.875 * 2^7 -> 0x7F; 120 -> 0x77.
TEST(QuantizeFp8, HandWorkedPerRowE4m3fnuz) {
  Buffer in = from_values(DType::bf16, {1, 4}, {240.0f, -120.0f, 0.0f, 1.0f});
  Quantized q = quantize(in, kFnuz, G::per_row, {1});
  ASSERT_TRUE(q.status.ok());
  EXPECT_EQ(q.scale.data<float>()[0], 1.0f);
  const uint8_t want[4] = {0x7F, 0xF7, 0x00, 0x40};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(q.out.data<uint8_t>()[i], want[i]) << i;
}

TEST(QuantizeFp8, AllZeroGroupsUseTheFloorScale) {
  Buffer in = from_values(DType::f32, {2, 3}, {0.0f, -0.0f, 0.0f, 5.0f, 0.0f, 0.0f});
  for (DType od : {kFn, kFnuz}) {
    Quantized q = quantize(in, od, G::per_row, {2});
    ASSERT_TRUE(q.status.ok());
    EXPECT_EQ(q.scale.data<float>()[0], kFp8AmaxFloor / fp8_max(od));
    EXPECT_TRUE(std::isfinite(q.scale.data<float>()[0]) && q.scale.data<float>()[0] > 0.0f);
    EXPECT_EQ(q.out.data<uint8_t>()[0], 0x00);
    EXPECT_EQ(q.out.data<uint8_t>()[1], od == kFn ? 0x80 : 0x00) << "-0: e4m3fn keeps it, e4m3fnuz has none";
    EXPECT_EQ(q.scale.data<float>()[1], 5.0f / fp8_max(od));
  }
}

TEST(QuantizeFp8, TinyValuesBelowTheFloorQuantizeToZero) {
  Buffer in = from_values(DType::f32, {1, 2}, {1e-30f, -2e-30f});
  Quantized q = quantize(in, kFn, G::per_tensor, {1});
  ASSERT_TRUE(q.status.ok());
  EXPECT_EQ(q.scale.data<float>()[0], kFp8AmaxFloor / 448.0f);
  EXPECT_EQ(q.out.data<uint8_t>()[0], 0x00);
  EXPECT_EQ(q.out.data<uint8_t>()[1], 0x80);
}

// Policy (quant.h): amax over the finite elements; +-inf saturates; NaN -> the format's NaN code.
TEST(QuantizeFp8, NonFiniteInputsPolicy) {
  Buffer in = from_values(DType::f32, {2, 5}, {kNaN, INFINITY, -INFINITY, 2.0f, -1.0f, kNaN, kNaN, kNaN, kNaN, kNaN});
  Quantized fn = quantize(in, kFn, G::per_row, {2});
  ASSERT_TRUE(fn.status.ok());
  EXPECT_EQ(fn.scale.data<float>()[0], 2.0f / 448.0f) << "amax ignores NaN and inf";
  const uint8_t want_fn[5] = {0x7F, 0x7E, 0xFE, 0x7E, 0xF6};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(fn.out.data<uint8_t>()[i], want_fn[i]) << i;
  EXPECT_EQ(fn.scale.data<float>()[1], kFp8AmaxFloor / 448.0f) << "an all-NaN row gets the floor scale";
  for (int i = 5; i < 10; ++i) EXPECT_TRUE(std::isnan(e4m3fn_bits_to_f32(fn.out.data<uint8_t>()[i])));

  Quantized uz = quantize(in, kFnuz, G::per_row, {2});
  ASSERT_TRUE(uz.status.ok());
  EXPECT_EQ(uz.scale.data<float>()[0], 2.0f / 240.0f);
  const uint8_t want_uz[5] = {0x80, 0x7F, 0xFF, 0x7F, 0xF7};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(uz.out.data<uint8_t>()[i], want_uz[i]) << i;
}

// [3, 300] in groups of 128: widths 128, 128, 44; each group's scale is its own amax / 448.
TEST(QuantizeFp8, RaggedPerTokenGroup) {
  Buffer in(DType::bf16, {3, 300});
  Rng(5).fill_normal(in, 1.0f);
  in.set(1 * 300 + 290, 40.0f);  // the ragged group of row 1 has the big value
  Quantized q = quantize(in, kFn, G::per_token_group, {3, 3});
  ASSERT_TRUE(q.status.ok()) << q.status.to_string();
  for (int r = 0; r < 3; ++r) {
    for (int g = 0; g < 3; ++g) {
      float amax = 0.0f;
      for (int c = g * 128; c < std::min(300, (g + 1) * 128); ++c) amax = std::max(amax, std::fabs(in.get(r * 300 + c)));
      EXPECT_EQ(q.scale.data<float>()[r * 3 + g], amax / 448.0f) << "row " << r << " group " << g;
    }
  }
  EXPECT_EQ(q.scale.data<float>()[1 * 3 + 2], 40.0f / 448.0f);
  EXPECT_EQ(q.out.data<uint8_t>()[1 * 300 + 290], 0x7E);
}

// [2, 200, 300] in 128 x 128 blocks: scale [2, 2, 3]; block (e, 1, 2) covers rows 128..199 and
// columns 256..299.
TEST(QuantizeFp8, RaggedBlock128x128) {
  Buffer in(DType::bf16, {2, 200, 300});
  Rng(6).fill_normal(in, 0.1f);
  in.set((1 * 200 + 199) * 300 + 299, -3.0f);  // the last element, in the ragged corner block
  Quantized q = quantize(in, kFn, G::block, {2, 2, 3});
  ASSERT_TRUE(q.status.ok()) << q.status.to_string();
  EXPECT_EQ(q.scale.data<float>()[(1 * 2 + 1) * 3 + 2], 3.0f / 448.0f);
  EXPECT_EQ(q.out.data<uint8_t>()[2 * 200 * 300 - 1], 0xFE);
  const testing::QuantizeOracleResult o = testing::oracle_quantize_fp8(make_params(in, q.out, q.scale, G::block));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(q.scale.data<float>()[i], o.scales[size_t(i)]) << i;
}

TEST(QuantizeFp8, StaticPerTensorScale) {
  Buffer in = from_values(DType::f32, {2, 3}, {1.0f, -0.5f, 1000.0f, 0.01f, 0.0f, -300.0f});
  Buffer out(kFn, {2, 3}), scale(DType::f32, {1});
  scale.data<float>()[0] = 0.5f;
  ASSERT_TRUE(quantize_fp8(make_params(in, out, scale, G::per_tensor, 128, 128, true)).ok());
  EXPECT_EQ(scale.data<float>()[0], 0.5f) << "a static scale is an input";
  const uint8_t* o = out.data<uint8_t>();
  EXPECT_EQ(o[0], f32_to_e4m3fn_bits(2.0f));
  EXPECT_EQ(o[1], f32_to_e4m3fn_bits(-1.0f));
  EXPECT_EQ(o[2], 0x7E) << "2000 saturates to 448";
  EXPECT_EQ(o[3], f32_to_e4m3fn_bits(0.02f));
  EXPECT_EQ(o[5], 0xFE) << "-600 saturates to -448";
}

TEST(QuantizeFp8, StaticScaleMustBeFinitePositive) {
  Buffer in = from_values(DType::f32, {1, 2}, {1.0f, 2.0f});
  for (float bad : {0.0f, -1.0f, kNaN, INFINITY}) {
    Buffer out(kFn, {1, 2}), scale(DType::f32, {1});
    out.fill_bytes(0xAB);
    scale.data<float>()[0] = bad;
    const Status s = quantize_fp8(make_params(in, out, scale, G::per_tensor, 128, 128, true));
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << bad;
    EXPECT_NE(s.message().find("scale: static per-tensor scale must be finite and > 0"), std::string::npos)
        << s.to_string();
    EXPECT_EQ(out.bytes[0], 0xAB);
    EXPECT_EQ(out.bytes[1], 0xAB);
  }
}

TEST(QuantizeFp8, AlternativeScaleShapesGiveTheSameResult) {
  Buffer in(DType::f16, {2, 3, 200});
  Rng(9).fill_normal(in, 2.0f);
  Quantized a = quantize(in, kFn, G::per_row, {6});
  Quantized b = quantize(in, kFn, G::per_row, {2, 3, 1});
  Quantized c = quantize(in, kFn, G::per_token_group, {6, 2});
  Quantized d = quantize(in, kFn, G::per_token_group, {2, 3, 2});
  for (const Quantized* q : {&a, &b, &c, &d}) ASSERT_TRUE(q->status.ok()) << q->status.to_string();
  EXPECT_EQ(a.out.bytes, b.out.bytes);
  EXPECT_EQ(a.scale.bytes, b.scale.bytes);
  EXPECT_EQ(c.out.bytes, d.out.bytes);
  EXPECT_EQ(c.scale.bytes, d.scale.bytes);
}

// ---------------------------------------------------------------- against the oracle
TEST(QuantizeFp8, OracleNearestCodeAgreesWithTheEncoders) {
  Rng rng(21);
  for (int i = 0; i < 20000; ++i) {
    const float x = rng.normal(0.0f, 1.0f) * std::ldexp(1.0f, int(rng.integer(-14, 10)));
    ASSERT_EQ(testing::oracle_fp8_code(x, kFn), f32_to_e4m3fn_bits(x)) << x;
    ASSERT_EQ(testing::oracle_fp8_code(x, kFnuz), f32_to_e4m3fnuz_bits(x)) << x;
  }
}

struct GranCase {
  G g;
  Dims dims;
  Dims scale_dims;
  int group_k, block_n;
};

TEST(QuantizeFp8, EveryGranularityMatchesOracle) {
  const std::vector<GranCase> cases = {
      {G::per_tensor, {3, 7, 33}, {1}, 128, 128},
      {G::per_row, {17, 130}, {17}, 128, 128},
      {G::per_row, {2, 5, 64}, {2, 5, 1}, 128, 128},
      {G::per_token_group, {9, 384}, {9, 3}, 128, 128},
      {G::per_token_group, {4, 250}, {4, 2}, 128, 128},
      {G::per_token_group, {3, 2, 100}, {6, 4}, 32, 128},
      {G::block, {256, 384}, {2, 3}, 128, 128},
      {G::block, {3, 130, 257}, {3, 2, 3}, 128, 128},
      {G::block, {2, 2, 40, 70}, {2, 2, 3, 3}, 32, 16},
  };
  int compared = 0;
  for (uint64_t seed : {1u, 2u, 3u}) {
    Rng rng(seed);
    for (const GranCase& c : cases) {
      for (DType id : {DType::f32, DType::bf16, DType::f16}) {
        for (DType od : {kFn, kFnuz}) {
          Buffer in(id, c.dims);
          for (int64_t i = 0; i < in.numel(); ++i) {
            const int64_t row = i / c.dims.back();
            in.set(i, rng.normal(0.0f, 1.0f) * std::ldexp(1.0f, int(row % 11) - 5));
          }
          Quantized q = quantize(in, od, c.g, c.scale_dims, c.group_k, c.block_n);
          ASSERT_TRUE(q.status.ok()) << q.status.to_string();
          const testing::QuantizeOracleResult o =
              testing::oracle_quantize_fp8(make_params(in, q.out, q.scale, c.g, c.group_k, c.block_n));
          const std::string what = std::string(granularity_name(c.g)) + " " + in.view.describe() + " -> " +
                                   dtype_name(od) + " seed " + std::to_string(seed);
          ASSERT_EQ(int64_t(o.scales.size()), q.scale.numel()) << what;
          for (size_t i = 0; i < o.scales.size(); ++i) {
            ASSERT_EQ(q.scale.data<float>()[i], o.scales[i]) << what << " scale " << i;
          }
          for (int64_t i = 0; i < in.numel(); ++i) {
            ASSERT_EQ(q.out.data<uint8_t>()[i], o.codes[size_t(i)]) << what << " element " << i << " x=" << in.get(i);
          }
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 3 * 9 * 3 * 2);
}

// |dequant - x| <= half a code step at x/scale, times the scale (plus the f32 rounding of x/scale).
TEST(QuantizeFp8, DequantizedErrorBound) {
  for (DType od : {kFn, kFnuz}) {
    const int bias = od == kFn ? 7 : 8;
    Buffer in(DType::f32, {8, 1000});
    Rng rng(31);
    for (int64_t i = 0; i < in.numel(); ++i) in.set(i, rng.normal(0.0f, 1.0f) * std::ldexp(1.0f, int(i % 13) - 6));
    Quantized q = quantize(in, od, G::per_token_group, {8, 8});
    ASSERT_TRUE(q.status.ok());
    for (int64_t i = 0; i < in.numel(); ++i) {
      const double x = in.get(i), s = q.scale.data<float>()[(i / 1000) * 8 + (i % 1000) / 128];
      const double y = std::fabs(x / s);
      const int e = std::max(int(std::floor(std::log2(std::max(y, 1e-30)))), 1 - bias);
      const double half_step = std::ldexp(0.5, e - 3);
      const double deq = testing::oracle_fp8_value(q.out.data<uint8_t>()[i], od) * s;
      ASSERT_LE(std::fabs(deq - x), half_step * s + 1e-6 * std::fabs(x)) << dtype_name(od) << " element " << i;
    }
  }
}

// ---------------------------------------------------------------- validation
TEST(QuantizeFp8, ValidationErrorsNameTheArgumentAndWriteNothing) {
  struct Case {
    const char* what;
    std::function<void(QuantizeFp8Params&)> mutate;
    const char* must_contain;
  };
  Buffer in(DType::bf16, {3, 300}), other(DType::bf16, {3, 300});
  Buffer wide(DType::bf16, {3, 600});
  const std::vector<Case> cases = {
      {"in absent", [](QuantizeFp8Params& p) { p.in = TensorView(); }, "in: required"},
      {"in dtype", [](QuantizeFp8Params& p) { p.in.dtype = DType::i32; }, "in: dtype must be f32|bf16|f16, got i32"},
      {"in strided", [](QuantizeFp8Params& p) { p.in.stride[0] = 600; }, "in: must be contiguous"},
      {"out absent", [](QuantizeFp8Params& p) { p.out = TensorView(); }, "out: required"},
      {"out dtype", [](QuantizeFp8Params& p) { p.out.dtype = DType::bf16; },
       "out: dtype must be fp8_e4m3fn|fp8_e4m3fnuz, got bf16"},
      {"out shape", [](QuantizeFp8Params& p) { p.out.shape[1] = 299; }, "out: shape must equal in's [3, 300], got [3, 299]"},
      {"out overlaps in", [&](QuantizeFp8Params& p) { p.out.data = in.bytes.data() + 10; }, "out: must not overlap in"},
      {"out device", [](QuantizeFp8Params& p) { p.out.device = Device::cuda; }, "out: is on cuda"},
      {"granularity", [](QuantizeFp8Params& p) { p.granularity = QuantGranularity(9); }, "granularity: unknown value 9"},
      {"group_k", [](QuantizeFp8Params& p) { p.group_k = 0; }, "group_k: must be >= 1, got 0"},
      {"block_n", [](QuantizeFp8Params& p) {
         p.granularity = G::block;
         p.block_n = -3;
       }, "block_n: must be >= 1, got -3"},
      {"static with per_token_group", [](QuantizeFp8Params& p) { p.static_scale = true; },
       "static_scale: only supported with per_tensor granularity, got per_token_group"},
      {"scale absent", [](QuantizeFp8Params& p) { p.scale = TensorView(); }, "scale: required"},
      {"scale dtype", [](QuantizeFp8Params& p) { p.scale.dtype = DType::bf16; }, "scale: dtype must be f32, got bf16"},
      {"scale shape", [](QuantizeFp8Params& p) { p.scale.shape[1] = 2; },
       "scale: shape must be [3, 3] for per_token_group of in [3, 300], got [3, 2]"},
      {"scale shape for per_row", [](QuantizeFp8Params& p) { p.granularity = G::per_row; },
       "scale: shape must be [3] or [3, 1] for per_row of in [3, 300], got [3, 3]"},
      {"scale device", [](QuantizeFp8Params& p) { p.scale.device = Device::cuda; }, "scale: is on cuda"},
      {"scale overlaps out", [](QuantizeFp8Params& p) { p.scale.data = p.out.data; }, "scale: must not overlap in or out"},
  };
  for (const Case& c : cases) {
    Buffer out(kFn, {3, 300}), scale(DType::f32, {3, 3});
    out.fill_bytes(0xAB);
    scale.fill_bytes(0xAB);
    const std::vector<unsigned char> out_before = out.bytes, scale_before = scale.bytes;
    QuantizeFp8Params p = make_params(in, out, scale, G::per_token_group);
    c.mutate(p);
    const Status s = quantize_fp8(p);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << c.what << ": " << s.to_string();
    EXPECT_NE(s.message().find(c.must_contain), std::string::npos) << c.what << ": got '" << s.message() << "'";
    EXPECT_EQ(out.bytes, out_before) << c.what << ": out written";
    EXPECT_EQ(scale.bytes, scale_before) << c.what << ": scale written";
  }
  Buffer flat(DType::f32, {64}), fout(kFn, {64}), fs(DType::f32, {1, 1});
  const Status s = quantize_fp8(make_params(flat, fout, fs, G::block));
  EXPECT_NE(s.message().find("in: block granularity needs [..., N, K] (>= 2 dims), got [64]"), std::string::npos)
      << s.to_string();
}

TEST(QuantizeFp8, RegisteredRefKernel) {
  const Kernel* k = registry().find("quantize_fp8_ref");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->op, OpKind::quantize_fp8);
  EXPECT_EQ(k->backend, Backend::ref);
  EXPECT_EQ(k->priority, 0);
  EXPECT_STREQ(granularity_name(G::per_token_group), "per_token_group");
  EXPECT_STREQ(granularity_name(G::block), "block");
}

// ---------------------------------------------------------------- harness hook on presets
TEST(QuantizeFp8, CheckHookOnPresets) {
  for (const char* model : {"deepseek-v3", "qwen3-moe"}) {
    testing::CheckRequest req;
    req.shape.model = model;
    req.edge_cases = std::string(model) == "deepseek-v3";
    const auto results = testing::check_quantize_fp8(req);
    ASSERT_FALSE(results.empty());
    for (const testing::CaseResult& r : results) {
      EXPECT_TRUE(r.ok) << r.kernel << " [" << r.name << "] vs " << r.reference << ": " << r.detail;
    }
  }
}

// ---------------------------------------------------------------- CPU kernel (quantize_fp8_avx512)
// Codes and scales compared bit-exactly with quantize_fp8_ref (and the encoder with dtype.h's);
// skipped where the CPU lacks AVX-512 F/BW/VL (cpu_test::avx512_unavailable()), where the kernel is
// not registered.

// One problem on `kernel` (outputs poisoned first).
Quantized quantize_with(const char* kernel, const Buffer& in, DType od, G g, const Dims& scale_dims, int group_k,
                        int block_n, const Buffer* static_scale = nullptr) {
  std::vector<int64_t> dims(in.view.shape, in.view.shape + in.view.ndim);
  Quantized q{Buffer(od, dims), static_scale ? *static_scale : Buffer(DType::f32, scale_dims), Status()};
  q.out.fill_bytes(0xAB);
  if (!static_scale) q.scale.fill_bytes(0xAB);
  RunOptions opts;
  opts.kernel = kernel;
  q.status = quantize_fp8(make_params(in, q.out, q.scale, g, group_k, block_n, static_scale != nullptr), opts);
  return q;
}

// Where the CPU lacks AVX-512: not registered, and the default dispatch picks quantize_fp8_ref.
TEST(QuantizeFp8, CpuKernelIsRegisteredAndRefusesDeviceTensors) {
  Buffer in(DType::bf16, {2, 32}), out(kFn, {2, 32}), scale(DType::f32, {2});
  QuantizeFp8Params p = make_params(in, out, scale, G::per_row);
  if (!cpu_test::avx512_unavailable().empty()) {
    cpu_test::expect_not_registered_and_falls_back(OpKind::quantize_fp8, "quantize_fp8_avx512", "quantize_fp8_ref", p);
    return;
  }
  const Kernel* k = registry().find("quantize_fp8_avx512");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->backend, Backend::cpu);
  EXPECT_GT(k->priority, registry().find("quantize_fp8_ref")->priority);
  EXPECT_TRUE(k->supports(&p).ok());
  const Kernel* chosen = nullptr;  // the default dispatch picks it on this CPU
  ASSERT_TRUE(registry().select_with(Config{}, OpKind::quantize_fp8, MoeVariant::none, &p, RunOptions{}, "t", &chosen).ok());
  EXPECT_STREQ(chosen->name, "quantize_fp8_avx512");
  p.scale.device = Device::cuda;
  const Status s = k->supports(&p);
  EXPECT_EQ(s.code(), StatusCode::unsupported);
  EXPECT_NE(s.message().find("scale"), std::string::npos) << s.message();
}

// Every granularity, both formats, three input dtypes; rows / groups / blocks whose widths are not
// multiples of the 16-lane vector, ragged last groups, row counts not a multiple of the thread
// split, problems above and below the threaded size; NaN, +-inf, zeros and tiny values mixed in.
TEST(QuantizeFp8, CpuMatchesRefBitExactlyEveryGranularity) {
  CPU_SKIP_IF(cpu_test::avx512_unavailable());
  const std::vector<GranCase> cases = {
      {G::per_tensor, {3, 7, 33}, {1}, 128, 128},         {G::per_tensor, {301, 257}, {1}, 128, 128},
      {G::per_row, {17, 130}, {17}, 128, 128},            {G::per_row, {513, 100}, {513, 1}, 128, 128},
      {G::per_token_group, {9, 384}, {9, 3}, 128, 128},   {G::per_token_group, {67, 7168}, {67, 56}, 128, 128},
      {G::per_token_group, {3, 2, 100}, {6, 8}, 13, 128}, {G::block, {3, 130, 257}, {3, 2, 3}, 128, 128},
      {G::block, {2, 2, 40, 70}, {2, 2, 3, 3}, 32, 16},   {G::block, {515, 300}, {5, 3}, 128, 128},
  };
  Rng rng(11);
  int n = 0;
  for (const GranCase& c : cases) {
    for (DType id : {DType::f32, DType::bf16, DType::f16}) {
      const DType od = n++ % 2 ? kFn : kFnuz;
      Buffer in(id, c.dims);
      for (int64_t i = 0; i < in.numel(); ++i) {
        const int64_t r = rng.integer(0, 199);
        const float v = rng.normal(0.0f, 1.0f) * std::ldexp(1.0f, int(i / c.dims.back() % 11) - 5);
        in.set(i, r == 0 ? kNaN : r == 1 ? std::numeric_limits<float>::infinity() : r == 2 ? 0.0f : r == 3 ? 1e-30f : v);
      }
      const std::string what = std::string(granularity_name(c.g)) + " " + in.view.describe() + " -> " + dtype_name(od);
      const Quantized want = quantize_with("quantize_fp8_ref", in, od, c.g, c.scale_dims, c.group_k, c.block_n);
      const Quantized got = quantize_with("quantize_fp8_avx512", in, od, c.g, c.scale_dims, c.group_k, c.block_n);
      ASSERT_TRUE(got.status.ok()) << what << ": " << got.status.to_string();
      EXPECT_EQ(got.scale.bytes, want.scale.bytes) << what;
      EXPECT_EQ(got.out.bytes, want.out.bytes) << what;
    }
  }
}

// The vector encoder against dtype.h's scalar one on about a million f32 bit patterns spread over
// the whole range, plus every RNE midpoint between adjacent codes and its neighbours: a static
// per-tensor scale of 1 makes q = fp8(x) exactly.
TEST(QuantizeFp8, CpuEncoderMatchesTheScalarEncoderOnEveryFloatClass) {
  CPU_SKIP_IF(cpu_test::avx512_unavailable());
  std::vector<float> xs;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4093) {
    float f;
    const uint32_t b = uint32_t(u);
    std::memcpy(&f, &b, 4);
    xs.push_back(f);
  }
  for (DType od : {kFn, kFnuz}) {
    for (int c = 0; c < 0x7F; ++c) {
      const float lo = testing::oracle_fp8_value(uint8_t(c), od), hi = testing::oracle_fp8_value(uint8_t(c + 1), od);
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const float mid = 0.5f * (lo + hi);
      for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), lo, hi}) {
        xs.push_back(v);
        xs.push_back(-v);
      }
    }
  }
  Buffer in(DType::f32, {int64_t(xs.size())});
  std::memcpy(in.bytes.data(), xs.data(), xs.size() * 4);
  Buffer one(DType::f32, {1});
  one.set(0, 1.0f);
  for (DType od : {kFn, kFnuz}) {
    const Quantized got = quantize_with("quantize_fp8_avx512", in, od, G::per_tensor, {1}, 128, 128, &one);
    ASSERT_TRUE(got.status.ok()) << got.status.to_string();
    int64_t bad = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const uint8_t want = od == kFn ? f32_to_e4m3fn_bits(xs[i]) : f32_to_e4m3fnuz_bits(xs[i]);
      if (got.out.data<uint8_t>()[i] != want && bad++ < 5) {
        ADD_FAILURE() << dtype_name(od) << " x=" << xs[i] << " got " << int(got.out.data<uint8_t>()[i]) << " want " << int(want);
      }
    }
    EXPECT_EQ(bad, 0) << dtype_name(od);
  }
}

TEST(QuantizeFp8, CpuCheckHookOnPresets) {
  CPU_SKIP_IF(cpu_test::avx512_unavailable());
  for (const char* model : {"deepseek-v3", "mixtral"}) {
    testing::CheckRequest req;
    req.shape.model = model;
    req.has_backend = true;
    req.backend = Backend::cpu;
    req.tokens = {1, 7, 600};
    const auto results = testing::check_quantize_fp8(req);
    ASSERT_FALSE(results.empty());
    for (const testing::CaseResult& r : results) {
      EXPECT_TRUE(r.ok) << r.kernel << " [" << r.name << "] vs " << r.reference << ": " << r.detail;
      EXPECT_EQ(r.reference, "ref") << r.name;
    }
  }
}

}  // namespace
}  // namespace moekit
