// convert_fp8 (SPEC 5, moekit/ops/quant.h): the e4m3fn <-> e4m3fnuz checkpoint conversion on every
// code both ways (written out literally), value preservation with the scales, counted
// saturations, in-place use, the decoded-value oracle (src/testing/oracle_layout_quant.cpp),
// validation errors and the harness hook on model presets.
// Run: ./build/tests/moekit_tests --gtest_filter='ConvertFp8*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
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

constexpr DType kFn = DType::fp8_e4m3fn;
constexpr DType kFnuz = DType::fp8_e4m3fnuz;

DType other(DType d) { return d == kFn ? kFnuz : kFn; }

struct Converted {
  Buffer out, scale_out;
  int64_t saturated = -7;
  Status status;
};

Converted convert(const Buffer& in, const Buffer* scale_in) {
  std::vector<int64_t> dims(in.view.shape, in.view.shape + in.view.ndim);
  Converted c{Buffer(other(in.view.dtype), dims), scale_in ? *scale_in : Buffer(DType::f32, {1}), -7, Status()};
  c.out.fill_bytes(0xAB);
  c.scale_out.fill_bytes(0xAB);
  ConvertFp8Params p;
  p.in = in.view;
  p.out = c.out.view;
  if (scale_in != nullptr) {
    p.scale_in = scale_in->view;
    p.scale_out = c.scale_out.view;
  }
  p.num_saturated = &c.saturated;
  c.status = convert_fp8(p);
  return c;
}

Buffer all_codes(DType d) {
  Buffer b(d, {256});
  for (int i = 0; i < 256; ++i) b.bytes[size_t(i)] = uint8_t(i);
  return b;
}

float decode(uint8_t c, DType d) { return d == kFn ? e4m3fn_bits_to_f32(c) : e4m3fnuz_bits_to_f32(c); }

// ---------------------------------------------------------------- every code, literally
TEST(ConvertFp8, EveryCodeFnToFnuz) {
  Buffer in = all_codes(kFn), s(DType::f32, {1});
  s.data<float>()[0] = 0.75f;
  Converted c = convert(in, &s);
  ASSERT_TRUE(c.status.ok()) << c.status.to_string();
  for (int i = 0; i < 256; ++i) {
    // Same bits except -0 (0x80 is NaN in fnuz) and the NaNs 0x7F / 0xFF.
    const int want = i == 0x80 ? 0x00 : (i == 0x7F || i == 0xFF) ? 0x80 : i;
    EXPECT_EQ(c.out.bytes[size_t(i)], want) << "code 0x" << std::hex << i;
  }
  EXPECT_EQ(c.scale_out.data<float>()[0], 1.5f) << "same bits = half the value: scale x2";
  EXPECT_EQ(c.saturated, 0) << "fn -> fnuz is exact";
}

TEST(ConvertFp8, EveryCodeFnuzToFn) {
  Buffer in = all_codes(kFnuz), s(DType::f32, {1});
  s.data<float>()[0] = 0.75f;
  Converted c = convert(in, &s);
  ASSERT_TRUE(c.status.ok()) << c.status.to_string();
  for (int i = 0; i < 256; ++i) {
    // Same bits except the NaN 0x80 (-> 0) and +-240 (0x7F / 0xFF: NaN in fn) clamped to +-448.
    const int want = i == 0x80 ? 0x00 : i == 0x7F ? 0x7E : i == 0xFF ? 0xFE : i;
    EXPECT_EQ(c.out.bytes[size_t(i)], want) << "code 0x" << std::hex << i;
  }
  EXPECT_EQ(c.scale_out.data<float>()[0], 0.375f) << "same bits = twice the value: scale x0.5";
  EXPECT_EQ(c.saturated, 2) << "0x7F and 0xFF";
}

TEST(ConvertFp8, ValuePreservedForEveryNonSpecialCode) {
  for (DType d : {kFn, kFnuz}) {
    Buffer in = all_codes(d), s(DType::f32, {1});
    s.data<float>()[0] = 0.013f;
    Converted c = convert(in, &s);
    ASSERT_TRUE(c.status.ok());
    const double si = s.data<float>()[0], so = c.scale_out.data<float>()[0];
    int preserved = 0;
    for (int i = 0; i < 256; ++i) {
      const float v = decode(uint8_t(i), d);
      const bool special = std::isnan(v) || (d == kFnuz && (i & 0x7F) == 0x7F);
      if (special) continue;
      const double before = double(v) * si, after = double(decode(c.out.bytes[size_t(i)], other(d))) * so;
      EXPECT_EQ(after, before) << dtype_name(d) << " code 0x" << std::hex << i;
      EXPECT_EQ(std::signbit(after), std::signbit(before) && !(d == kFn && i == 0x80))
          << "only fn's -0 loses its sign";
      ++preserved;
    }
    EXPECT_EQ(preserved, d == kFn ? 254 : 253);
  }
  // The clamped codes: 240 * s becomes 224 * s (448 in fn units at half the scale).
  Buffer in = all_codes(kFnuz), s(DType::f32, {1});
  s.data<float>()[0] = 1.0f;
  Converted c = convert(in, &s);
  EXPECT_EQ(decode(c.out.bytes[0x7F], kFn) * c.scale_out.data<float>()[0], 224.0f);
  EXPECT_EQ(decode(c.out.bytes[0xFF], kFn) * c.scale_out.data<float>()[0], -224.0f);
}

TEST(ConvertFp8, SaturationsAreCounted) {
  Rng rng(4);
  Buffer in(kFnuz, {4, 1000});
  int64_t want = 0;
  for (int64_t i = 0; i < in.numel(); ++i) {
    const uint8_t c = uint8_t(rng.gen());
    in.bytes[size_t(i)] = c;
    want += (c & 0x7F) == 0x7F;
  }
  ASSERT_GT(want, 0);
  Converted c = convert(in, nullptr);
  ASSERT_TRUE(c.status.ok());
  EXPECT_EQ(c.saturated, want);
  Converted back = convert(c.out, nullptr);
  EXPECT_EQ(back.saturated, 0);
}

// ---------------------------------------------------------------- named edge cases
TEST(ConvertFp8, EmptyInputStillConvertsScales) {
  Buffer in(kFn, {0, 16}), s(DType::f32, {3});
  for (int i = 0; i < 3; ++i) s.data<float>()[i] = float(i + 1);
  Converted c = convert(in, &s);
  ASSERT_TRUE(c.status.ok());
  EXPECT_EQ(c.saturated, 0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.scale_out.data<float>()[i], 2.0f * float(i + 1));
  Converted none = convert(in, nullptr);
  EXPECT_TRUE(none.status.ok());
  EXPECT_EQ(none.saturated, 0) << "num_saturated is set even when there is nothing to convert";
}

TEST(ConvertFp8, WithoutScales) {
  Buffer in = all_codes(kFn);
  Converted c = convert(in, nullptr);
  ASSERT_TRUE(c.status.ok());
  EXPECT_EQ(c.out.bytes[0x38], 0x38);
  EXPECT_EQ(c.scale_out.bytes[0], 0xAB) << "no scale given: none written";
}

TEST(ConvertFp8, InPlace) {
  Rng rng(8);
  Buffer in(kFnuz, {3, 77}), s(DType::f32, {3, 1});
  for (unsigned char& b : in.bytes) b = uint8_t(rng.gen());
  for (int i = 0; i < 3; ++i) s.data<float>()[i] = rng.uniform(0.01f, 1.0f);
  Converted want = convert(in, &s);
  ASSERT_TRUE(want.status.ok());
  ConvertFp8Params p;
  p.in = in.view;
  p.out = in.view;
  p.out.dtype = kFn;  // the same bytes, re-typed
  p.scale_in = s.view;
  p.scale_out = s.view;
  int64_t sat = -1;
  p.num_saturated = &sat;
  ASSERT_TRUE(convert_fp8(p).ok());
  EXPECT_EQ(0, std::memcmp(in.bytes.data(), want.out.bytes.data(), size_t(in.view.nbytes())));
  EXPECT_EQ(0, std::memcmp(s.bytes.data(), want.scale_out.bytes.data(), size_t(s.view.nbytes())));
  EXPECT_EQ(sat, want.saturated);
}

// ---------------------------------------------------------------- against the oracle
TEST(ConvertFp8, MatchesDecodedValueOracle) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    Rng rng(seed);
    for (DType d : {kFn, kFnuz}) {
      Buffer in(d, {2, 64, 96}), s(DType::f32, {2, 1, 1});
      for (unsigned char& b : in.bytes) b = uint8_t(rng.gen());
      for (int i = 0; i < 2; ++i) s.data<float>()[i] = rng.uniform(1e-4f, 10.0f);
      Converted c = convert(in, &s);
      ASSERT_TRUE(c.status.ok());
      ConvertFp8Params p;
      p.in = in.view;
      p.scale_in = s.view;
      const testing::ConvertOracleResult o = testing::oracle_convert_fp8(p);
      for (int64_t i = 0; i < in.numel(); ++i) {
        ASSERT_EQ(c.out.bytes[size_t(i)], o.codes[size_t(i)]) << dtype_name(d) << " element " << i;
      }
      EXPECT_EQ(c.saturated, o.saturated);
      for (int i = 0; i < 2; ++i) EXPECT_EQ(c.scale_out.data<float>()[i], o.scales[size_t(i)]);
    }
  }
}

// ---------------------------------------------------------------- validation
TEST(ConvertFp8, ValidationErrorsNameTheArgumentAndWriteNothing) {
  struct Case {
    const char* what;
    std::function<void(ConvertFp8Params&)> mutate;
    const char* must_contain;
  };
  Buffer in(kFn, {4, 32});
  Buffer s(DType::f32, {4});
  const std::vector<Case> cases = {
      {"in absent", [](ConvertFp8Params& p) { p.in = TensorView(); }, "in: required"},
      {"in dtype", [](ConvertFp8Params& p) { p.in.dtype = DType::bf16; },
       "in: dtype must be fp8_e4m3fn|fp8_e4m3fnuz, got bf16"},
      {"in strided", [](ConvertFp8Params& p) { p.in.stride[0] = 64; }, "in: must be contiguous"},
      {"out absent", [](ConvertFp8Params& p) { p.out = TensorView(); }, "out: required"},
      {"out same format", [](ConvertFp8Params& p) { p.out.dtype = kFn; },
       "out: dtype must be fp8_e4m3fnuz (the other format of in's fp8_e4m3fn), got fp8_e4m3fn"},
      {"out shape", [](ConvertFp8Params& p) { p.out.shape[0] = 2; }, "out: shape must equal in's [4, 32], got [2, 32]"},
      {"out device", [](ConvertFp8Params& p) { p.out.device = Device::cuda; }, "out: is on cuda"},
      {"out partial overlap", [&](ConvertFp8Params& p) { p.out.data = in.bytes.data() + 1; },
       "out: must be the same buffer as in or not overlap it"},
      {"scale_out missing", [](ConvertFp8Params& p) { p.scale_out = TensorView(); },
       "scale_out: required when scale_in is given"},
      {"scale_in missing", [](ConvertFp8Params& p) { p.scale_in = TensorView(); },
       "scale_in: required when scale_out is given"},
      {"scale_in dtype", [](ConvertFp8Params& p) { p.scale_in.dtype = DType::f16; }, "scale_in: dtype must be f32, got f16"},
      {"scale_out shape", [](ConvertFp8Params& p) { p.scale_out.shape[0] = 5; },
       "scale_out: shape must equal scale_in's [4], got [5]"},
      {"scale_in device", [](ConvertFp8Params& p) { p.scale_in.device = Device::cuda; }, "scale_in: is on cuda"},
      {"scale_out partial overlap", [&](ConvertFp8Params& p) { p.scale_out.data = s.bytes.data() + 4; },
       "scale_out: must be the same buffer as scale_in or not overlap it"},
      {"scale_out overlaps out", [](ConvertFp8Params& p) { p.scale_out.data = p.out.data; },
       "scale_out: must not overlap in or out"},
  };
  for (const Case& c : cases) {
    Buffer out(kFnuz, {4, 32}), so(DType::f32, {4});
    out.fill_bytes(0xAB);
    so.fill_bytes(0xAB);
    const std::vector<unsigned char> out_before = out.bytes, so_before = so.bytes, s_before = s.bytes;
    ConvertFp8Params p;
    p.in = in.view;
    p.out = out.view;
    p.scale_in = s.view;
    p.scale_out = so.view;
    int64_t sat = -7;
    p.num_saturated = &sat;
    c.mutate(p);
    const Status st = convert_fp8(p);
    EXPECT_EQ(st.code(), StatusCode::invalid_argument) << c.what << ": " << st.to_string();
    EXPECT_NE(st.message().find(c.must_contain), std::string::npos) << c.what << ": got '" << st.message() << "'";
    EXPECT_EQ(out.bytes, out_before) << c.what;
    EXPECT_EQ(so.bytes, so_before) << c.what;
    EXPECT_EQ(s.bytes, s_before) << c.what;
    EXPECT_EQ(sat, -7) << c.what << ": num_saturated written on an invalid call";
  }
}

TEST(ConvertFp8, RegisteredRefKernel) {
  const Kernel* k = registry().find("convert_fp8_ref");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->op, OpKind::convert_fp8);
  EXPECT_EQ(k->backend, Backend::ref);
  EXPECT_EQ(k->priority, 0);
}

// ---------------------------------------------------------------- harness hook on presets
TEST(ConvertFp8, CheckHookOnPresets) {
  for (const char* model : {"deepseek-v3", "mixtral"}) {
    testing::CheckRequest req;
    req.shape.model = model;
    req.edge_cases = std::string(model) == "deepseek-v3";
    const auto results = testing::check_convert_fp8(req);
    ASSERT_FALSE(results.empty());
    for (const testing::CaseResult& r : results) {
      EXPECT_TRUE(r.ok) << r.kernel << " [" << r.name << "] vs " << r.reference << ": " << r.detail;
    }
  }
}

// ---------------------------------------------------------------- CPU kernel (convert_fp8_avx512)
// Codes, scales and the saturation count compared bit-exactly with convert_fp8_ref; skipped where the
// CPU lacks AVX-512 F/BW/VL (cpu_test::avx512_unavailable()), where the kernel is not registered and
// the default dispatch picks convert_fp8_ref.
TEST(ConvertFp8, CpuKernelIsRegisteredAndRefusesDeviceTensors) {
  Buffer in = all_codes(kFn), out(kFnuz, {256});
  ConvertFp8Params p;
  p.in = in.view;
  p.out = out.view;
  if (!cpu_test::avx512_unavailable().empty()) {
    cpu_test::expect_not_registered_and_falls_back(OpKind::convert_fp8, "convert_fp8_avx512", "convert_fp8_ref", p);
    return;
  }
  const Kernel* k = registry().find("convert_fp8_avx512");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->backend, Backend::cpu);
  EXPECT_GT(k->priority, registry().find("convert_fp8_ref")->priority);
  EXPECT_TRUE(k->supports(&p).ok());
  const Kernel* chosen = nullptr;  // the default dispatch picks it on this CPU
  ASSERT_TRUE(registry().select_with(Config{}, OpKind::convert_fp8, MoeVariant::none, &p, RunOptions{}, "t", &chosen).ok());
  EXPECT_STREQ(chosen->name, "convert_fp8_avx512");
  p.out.device = Device::cuda;
  const Status s = k->supports(&p);
  EXPECT_EQ(s.code(), StatusCode::unsupported);
  EXPECT_NE(s.message().find("out"), std::string::npos) << s.message();
}

// Every code many times over lengths that are not multiples of the 64-byte vector, below and above
// the threaded size (2^18 codes), both directions, out of place and in place, with and without scales.
TEST(ConvertFp8, CpuMatchesRefOnEveryCodeAcrossTheThreadSplit) {
  CPU_SKIP_IF(cpu_test::avx512_unavailable());
  Rng rng(21);
  for (int64_t n : {int64_t(1), int64_t(63), int64_t(256), int64_t(1000), int64_t(262144 + 77), int64_t(1) << 20}) {
    for (DType d : {kFn, kFnuz}) {
      for (bool in_place : {false, true}) {
        Buffer in(d, {n}), scale(DType::f32, {5});
        for (int64_t i = 0; i < n; ++i) in.bytes[size_t(i)] = uint8_t(i < 256 ? i : int64_t(rng.gen() & 0xFF));
        for (int i = 0; i < 5; ++i) scale.data<float>()[i] = rng.uniform(1e-3f, 4.0f);
        auto run = [&](const char* kernel, Buffer* out, Buffer* scale_out, int64_t* sat) {
          *out = in_place ? in : Buffer(other(d), {n});
          *scale_out = scale;
          ConvertFp8Params p;
          p.in = out->view;  // in place: in and out are the very same buffer
          if (!in_place) p.in = in.view;
          p.out = out->view;
          p.out.dtype = other(d);
          p.scale_in = scale_out->view;
          p.scale_out = scale_out->view;
          p.num_saturated = sat;
          RunOptions opts;
          opts.kernel = kernel;
          return convert_fp8(p, opts);
        };
        Buffer want, got, want_s, got_s;
        int64_t want_sat = -1, got_sat = -2;
        ASSERT_TRUE(run("convert_fp8_ref", &want, &want_s, &want_sat).ok());
        ASSERT_TRUE(run("convert_fp8_avx512", &got, &got_s, &got_sat).ok());
        const std::string what = std::string(dtype_name(d)) + " n=" + std::to_string(n) + (in_place ? " in place" : "");
        EXPECT_EQ(got.bytes, want.bytes) << what;
        EXPECT_EQ(got_s.bytes, want_s.bytes) << what;
        EXPECT_EQ(got_sat, want_sat) << what;
      }
    }
  }
}

// ---------------------------------------------------------------- CUDA kernel (convert_fp8_sm90)
// Codes, scales and the saturation count compared bit-exactly with convert_fp8_ref; skipped without
// a CUDA device (graph capture: tests/test_quantize_fp8_sm90.cpp).
constexpr const char* kCudaKernel = "convert_fp8_sm90";

std::string cuda_unavailable() {
  if (registry().find(kCudaKernel) == nullptr) return "built without CUDA";
  const Status s = registry().backend_available(Backend::cuda);
  return s.ok() ? "" : "CUDA backend unavailable: " + s.to_string();
}

// `in` (and scales, when given) converted by `kernel`; outputs poisoned first.
Converted convert_on(const char* kernel, const Buffer& in, const Buffer* scale_in, bool count) {
  std::vector<int64_t> dims(in.view.shape, in.view.shape + in.view.ndim);
  Converted c{Buffer(other(in.view.dtype), dims), scale_in ? *scale_in : Buffer(DType::f32, {1}), -7, Status()};
  c.out.fill_bytes(0xAB);
  c.scale_out.fill_bytes(0xAB);
  ConvertFp8Params p;
  p.in = in.view;
  p.out = c.out.view;
  if (scale_in != nullptr) {
    p.scale_in = scale_in->view;
    p.scale_out = c.scale_out.view;
  }
  p.num_saturated = count ? &c.saturated : nullptr;
  c.status = testing::run_convert_fp8_kernel(p, *registry().find(kernel));
  return c;
}

void expect_cuda_matches_ref(const Buffer& in, const Buffer* scale_in, bool count, const std::string& what) {
  const Converted want = convert_on("convert_fp8_ref", in, scale_in, true);
  const Converted got = convert_on(kCudaKernel, in, scale_in, count);
  ASSERT_TRUE(want.status.ok()) << what << ": " << want.status.to_string();
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status.to_string();
  int64_t bad = 0;
  for (size_t i = 0; i < want.out.bytes.size(); ++i) {
    if (got.out.bytes[i] != want.out.bytes[i] && bad++ < 5) {
      ADD_FAILURE() << what << ": code[" << i << "] of " << int(in.bytes[i]) << " is " << int(got.out.bytes[i])
                    << ", want " << int(want.out.bytes[i]);
    }
  }
  EXPECT_EQ(bad, 0) << what;
  if (scale_in != nullptr) {
    EXPECT_EQ(got.scale_out.bytes, want.scale_out.bytes) << what;
  }
  EXPECT_EQ(got.saturated, count ? want.saturated : -7) << what;  // untouched when not asked for
}

TEST(ConvertFp8, CudaKernelIsRegisteredAndRefusesHostTensors) {
  const Kernel* k = registry().find(kCudaKernel);
  if (k == nullptr) GTEST_SKIP() << "built without CUDA";
  EXPECT_EQ(k->backend, Backend::cuda);
  EXPECT_GE(k->priority, 100);
  EXPECT_EQ(k->workspace_bytes, nullptr);
  Buffer in = all_codes(kFn), out(kFnuz, {256});
  ConvertFp8Params p;
  p.in = in.view;
  p.out = out.view;
  const Status s = k->supports(&p);
  EXPECT_EQ(s.code(), StatusCode::unsupported);
  EXPECT_NE(s.message().find("in"), std::string::npos) << s.message();
  p.in.device = p.out.device = Device::cuda;
  EXPECT_TRUE(k->supports(&p).ok());
}

// Every code many times over lengths below / at / above 16 and not multiples of it (the 16-byte
// chunks and the byte tail), many CTAs, both directions, with and without scales and the count.
TEST(ConvertFp8, CudaMatchesRefOnEveryCode) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  Rng rng(41);
  for (int64_t n : {int64_t(1), int64_t(15), int64_t(16), int64_t(256), int64_t(1000), int64_t(3) << 20}) {
    for (DType d : {kFn, kFnuz}) {
      Buffer in(d, {n}), scale(DType::f32, {7});
      for (int64_t i = 0; i < n; ++i) in.bytes[size_t(i)] = uint8_t(i < 256 ? i : int64_t(rng.gen() & 0xFF));
      for (int i = 0; i < 7; ++i) scale.data<float>()[i] = rng.uniform(1e-3f, 4.0f);
      const std::string what = std::string(dtype_name(d)) + " n=" + std::to_string(n);
      expect_cuda_matches_ref(in, &scale, true, what);
      expect_cuda_matches_ref(in, nullptr, false, what + " no scales, no count");
    }
  }
  // Denormal and extreme scales keep their exact x2 / x0.5.
  Buffer in = all_codes(kFnuz), scale(DType::f32, {4});
  scale.data<float>()[0] = 1e-45f;
  scale.data<float>()[1] = 3e-39f;
  scale.data<float>()[2] = 3e38f;
  scale.data<float>()[3] = 1.0f;
  expect_cuda_matches_ref(in, &scale, true, "extreme scales");
}

// No codes, only scales: the scales are still converted, the count is 0.
TEST(ConvertFp8, CudaEmptyInputStillConvertsScales) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  Buffer in(kFnuz, {0, 16}), scale(DType::f32, {3});
  for (int i = 0; i < 3; ++i) scale.data<float>()[i] = float(i + 1);
  const Converted c = convert_on(kCudaKernel, in, &scale, true);
  ASSERT_TRUE(c.status.ok()) << c.status.to_string();
  EXPECT_EQ(c.saturated, 0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.scale_out.data<float>()[i], 0.5f * float(i + 1));
}

// In place (out and scale_out the very same device buffers as in and scale_in) and from pointers
// that are not 16-byte aligned (the byte path).
TEST(ConvertFp8, CudaInPlaceAndUnaligned) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  const DeviceOps* ops = registry().device_ops(Backend::cuda);
  ASSERT_NE(ops, nullptr);
  Rng rng(43);
  const int64_t n = 4133;
  for (DType d : {kFn, kFnuz}) {
    for (int64_t offset : {int64_t(0), int64_t(5)}) {
      Buffer in(d, {n}), scale(DType::f32, {9});
      for (int64_t i = 0; i < n; ++i) in.bytes[size_t(i)] = uint8_t(i < 256 ? i : int64_t(rng.gen() & 0xFF));
      for (int i = 0; i < 9; ++i) scale.data<float>()[i] = rng.uniform(1e-3f, 4.0f);
      const Converted want = convert_on("convert_fp8_ref", in, &scale, true);
      void* codes = nullptr;
      void* scales = nullptr;
      ASSERT_TRUE(ops->alloc(size_t(n + offset), &codes).ok());
      ASSERT_TRUE(ops->alloc(9 * 4, &scales).ok());
      char* c = static_cast<char*>(codes) + offset;
      ASSERT_TRUE(ops->copy_to_device(c, in.bytes.data(), size_t(n)).ok());
      ASSERT_TRUE(ops->copy_to_device(scales, scale.bytes.data(), 9 * 4).ok());
      ConvertFp8Params p;
      p.in = TensorView::contiguous(c, d, {n}, Device::cuda);
      p.out = TensorView::contiguous(c, other(d), {n}, Device::cuda);
      p.scale_in = TensorView::contiguous(scales, DType::f32, {9}, Device::cuda);
      p.scale_out = p.scale_in;
      int64_t sat = -1;
      p.num_saturated = &sat;
      RunOptions o;
      o.kernel = kCudaKernel;
      const Status s = convert_fp8(p, o);
      std::vector<uint8_t> got(static_cast<size_t>(n));
      std::vector<unsigned char> got_s(9 * 4);
      ASSERT_TRUE(ops->copy_to_host(got.data(), c, size_t(n)).ok());
      ASSERT_TRUE(ops->copy_to_host(got_s.data(), scales, 9 * 4).ok());
      ops->free(codes);
      ops->free(scales);
      const std::string what = std::string(dtype_name(d)) + " in place, offset " + std::to_string(offset);
      ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
      int bad = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] != want.out.bytes[i] && bad++ < 5) {
          ADD_FAILURE() << what << ": code[" << i << "] of " << int(in.bytes[i]) << " is " << int(got[i]) << ", want "
                        << int(want.out.bytes[i]);
        }
      }
      EXPECT_EQ(bad, 0) << what;
      for (int i = 0; i < 9; ++i) {
        float g = 0.0f, w = 0.0f;
        std::memcpy(&g, got_s.data() + 4 * i, 4);
        std::memcpy(&w, want.scale_out.bytes.data() + 4 * i, 4);
        EXPECT_EQ(g, w) << what << ": scale[" << i << "] of " << scale.data<float>()[i];
      }
      EXPECT_EQ(sat, want.saturated) << what;
    }
  }
}

// Without a device every CUDA case is reported skipped (ok), never failed; with one, none is skipped.
TEST(ConvertFp8, CudaCheckHookOnEveryPreset) {
  if (registry().find(kCudaKernel) == nullptr) GTEST_SKIP() << "built without CUDA";
  const bool available = cuda_unavailable().empty();
  for (const char* model : {"deepseek-v3", "mixtral", "llama4", "qwen3-moe"}) {
    testing::CheckRequest req;
    req.shape.model = model;
    req.has_backend = true;
    req.backend = Backend::cuda;
    req.edge_cases = std::string(model) == "deepseek-v3";
    const auto results = testing::check_convert_fp8(req);
    ASSERT_FALSE(results.empty());
    for (const testing::CaseResult& r : results) {
      EXPECT_TRUE(r.ok) << model << " " << r.kernel << " [" << r.name << "] vs " << r.reference << ": " << r.detail;
      EXPECT_EQ(r.detail.rfind("skipped", 0) == 0, !available) << r.name << ": " << r.detail;
    }
  }
}

}  // namespace
}  // namespace moekit
