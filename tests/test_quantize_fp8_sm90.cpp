// quantize_fp8_sm90 and convert_fp8_sm90 (src/ops/quantize_fp8/quantize_fp8_sm90.cu,
// src/ops/convert_fp8/convert_fp8_sm90.cu): the CUDA quantizer against quantize_fp8_ref, codes and
// scales bit-exact, on every granularity and each path of the kernel (16-element chunks cached in
// registers, two-pass groups, 1-element chunks, unaligned pointers, the per_tensor reduction), the
// encoder on about a million f32 bit patterns and on PyTorch's golden casts, named edge cases (T = 0, T = 1, all-zero rows,
// saturation, NaN / inf, large T), an invalid static scale, the check hook on every preset, and
// CUDA-graph capture / replay with changed inputs for both ops (suites QuantizeFp8 and ConvertFp8,
// Cuda* cases). The ConvertFp8 Cuda* cases that need no graph are in tests/test_convert_fp8.cpp.
// Built only with the CUDA backend; every case that runs a kernel is skipped without a CUDA device.
// Run: ./build/tests/moekit_tests --gtest_filter='*Fp8.Cuda*'
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_data_dir.h"
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
constexpr const char* kCuda = "quantize_fp8_sm90";
constexpr const char* kRef = "quantize_fp8_ref";
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

std::string cuda_unavailable() {
  if (registry().find(kCuda) == nullptr) return "built without the quantize_fp8_sm90 kernel";
  const Status s = registry().backend_available(Backend::cuda);
  return s.ok() ? "" : "CUDA backend unavailable: " + s.to_string();
}
#define SKIP_WITHOUT_CUDA()                    \
  do {                                         \
    const std::string why = cuda_unavailable(); \
    if (!why.empty()) GTEST_SKIP() << why;     \
  } while (0)

TensorView device_view(void* p, DType d, const Dims& dims) {
  return TensorView::contiguous(p, d, int(dims.size()), dims.data(), Device::cuda);
}

std::string hex(unsigned v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%02X", v);
  return b;
}

struct Case {
  G g;
  Dims dims;
  int group_k = 128, block_n = 128;
  float static_scale = 0.0f;  // > 0: per_tensor static
};

Dims scale_dims_of(const Case& c) {
  const int64_t K = c.dims.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < c.dims.size(); ++i) rows *= c.dims[i];
  switch (c.g) {
    case G::per_tensor: return {1};
    case G::per_row: return {rows};
    case G::per_token_group: return {rows, (K + c.group_k - 1) / c.group_k};
    case G::block: {
      Dims d(c.dims.begin(), c.dims.end() - 2);
      d.push_back((c.dims[c.dims.size() - 2] + c.block_n - 1) / c.block_n);
      d.push_back((K + c.group_k - 1) / c.group_k);
      return d;
    }
  }
  return {1};
}

struct Result {
  Buffer out, scale;
  Status status;
};

// `in` quantized by `kernel` (outputs poisoned with 0xAB first; device kernels on mirrored copies).
Result run(const char* kernel, const Buffer& in, DType od, const Case& c) {
  Result r{Buffer(od, c.dims), Buffer(DType::f32, scale_dims_of(c)), Status()};
  r.out.fill_bytes(0xAB);
  r.scale.fill_bytes(0xAB);
  if (c.static_scale > 0.0f) r.scale.set(0, c.static_scale);
  QuantizeFp8Params p;
  p.in = in.view;
  p.out = r.out.view;
  p.scale = r.scale.view;
  p.granularity = c.g;
  p.group_k = c.group_k;
  p.block_n = c.block_n;
  p.static_scale = c.static_scale > 0.0f;
  r.status = testing::run_quantize_fp8_kernel(p, *registry().find(kernel));
  return r;
}

// Codes and scales of `got` equal `want` bit for bit; the first mismatches are reported with their
// input value, so a GPU run says exactly which element class differs.
void expect_identical(const Result& got, const Result& want, const Buffer& in, const std::string& what) {
  ASSERT_TRUE(want.status.ok()) << what << ": ref: " << want.status.to_string();
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status.to_string();
  int64_t bad = 0;
  for (int64_t i = 0; i < want.scale.numel(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, got.scale.bytes.data() + 4 * i, 4);
    std::memcpy(&b, want.scale.bytes.data() + 4 * i, 4);
    if (a != b && bad++ < 3) {
      ADD_FAILURE() << what << ": scale[" << i << "] = " << got.scale.get(i) << " want " << want.scale.get(i);
    }
  }
  EXPECT_EQ(bad, 0) << what << ": scale mismatches";
  bad = 0;
  for (int64_t i = 0; i < in.numel(); ++i) {
    const unsigned a = got.out.bytes[size_t(i)], b = want.out.bytes[size_t(i)];
    if (a != b && bad++ < 5) {
      ADD_FAILURE() << what << ": code[" << i << "] of x = " << in.get(i) << " is " << hex(a) << ", want " << hex(b);
    }
  }
  EXPECT_EQ(bad, 0) << what << ": code mismatches";
}

// Normal values spread over 2^-5 .. 2^5 by row, with NaN, +-inf, +-0 and tiny values mixed in
// (one in `special_every` elements; 0 = none).
Buffer random_input(DType d, const Dims& dims, Rng& rng, int special_every) {
  Buffer in(d, dims);
  const int64_t K = dims.back();
  for (int64_t i = 0; i < in.numel(); ++i) {
    float v = rng.normal(0.0f, 1.0f) * std::ldexp(1.0f, int(i / K % 11) - 5);
    if (special_every > 0 && rng.integer(0, special_every - 1) == 0) {
      const float specials[] = {kNaN, -kNaN, kInf, -kInf, 0.0f, -0.0f, 1e-30f, -3e-41f};
      v = specials[rng.integer(0, 7)];
    }
    in.set(i, v);
  }
  return in;
}

void expect_cuda_matches_ref(const Buffer& in, DType od, const Case& c, const std::string& what) {
  expect_identical(run(kCuda, in, od, c), run(kRef, in, od, c), in, what);
}

// ---------------------------------------------------------------- registration (no device needed)
TEST(QuantizeFp8, CudaKernelIsRegisteredAndRefusesHostTensors) {
  const Kernel* k = registry().find(kCuda);
  if (k == nullptr) GTEST_SKIP() << "built without CUDA";
  EXPECT_EQ(k->backend, Backend::cuda);
  EXPECT_EQ(k->op, OpKind::quantize_fp8);
  EXPECT_GE(k->priority, 100);
  EXPECT_EQ(k->workspace_bytes, nullptr);  // no workspace: per_tensor reduces through scale[0]
  Buffer in(DType::bf16, {2, 32}), out(kFn, {2, 32}), scale(DType::f32, {2});
  QuantizeFp8Params p;
  p.in = in.view;
  p.out = out.view;
  p.scale = scale.view;
  const Status s = k->supports(&p);
  EXPECT_EQ(s.code(), StatusCode::unsupported);
  EXPECT_NE(s.message().find("in"), std::string::npos) << s.message();
  p.in.device = p.out.device = Device::cuda;
  EXPECT_NE(k->supports(&p).message().find("scale"), std::string::npos);
  p.scale.device = Device::cuda;
  EXPECT_TRUE(k->supports(&p).ok());
}

// Without a device every CUDA case is reported skipped (ok), never failed; with one, none is skipped.
TEST(QuantizeFp8, CudaCheckHookOnEveryPreset) {
  if (registry().find(kCuda) == nullptr) GTEST_SKIP() << "built without CUDA";
  const bool available = cuda_unavailable().empty();
  for (const char* model : {"deepseek-v3", "mixtral", "llama4", "qwen3-moe"}) {
    testing::CheckRequest req;
    req.shape.model = model;
    req.has_backend = true;
    req.backend = Backend::cuda;
    req.tokens = {1, 7, 64, 1000};
    req.edge_cases = std::string(model) == "deepseek-v3";
    const auto results = testing::check_quantize_fp8(req);
    ASSERT_FALSE(results.empty());
    for (const testing::CaseResult& r : results) {
      EXPECT_TRUE(r.ok) << model << " " << r.kernel << " [" << r.name << "] vs " << r.reference << ": " << r.detail;
      EXPECT_EQ(r.detail.rfind("skipped", 0) == 0, !available) << r.name << ": " << r.detail;
    }
  }
}

// ---------------------------------------------------------------- bit-exact against the ref
// Every granularity x input dtype, both formats, with specials mixed in; the shapes take every
// kernel path (see the comments).
TEST(QuantizeFp8, CudaMatchesRefEveryGranularity) {
  SKIP_WITHOUT_CUDA();
  const std::vector<Case> cases = {
      {G::per_tensor, {3, 7, 33}},              // 43 chunks of 16 + a 5-element tail, one CTA
      {G::per_tensor, {301, 257}},              // 16-element chunks + a tail, several CTAs
      {G::per_tensor, {64, 128}, 128, 128, 0.02f},  // static
      {G::per_row, {17, 130}},                  // 1-element chunks (130 % 16 != 0)
      {G::per_row, {513, 112}},                 // 7 chunks: 8 threads per row
      {G::per_row, {9, 4096}},                  // 256 chunks: one per thread of a CTA
      {G::per_row, {5, 7168}},                  // 448 chunks: four per thread, 128 threads
      {G::per_row, {3, 16400}},                 // 1025 chunks: two reads
      {G::per_token_group, {9, 384}},           // 8 threads per group, 32 groups per CTA
      {G::per_token_group, {67, 7168}},
      {G::per_token_group, {3, 2, 100}, 13},    // ragged 1x13 groups, 1-element chunks
      {G::per_token_group, {5, 96}, 32},        // 2 threads per group
      {G::per_token_group, {4, 80}, 48},        // 16-element chunks, ragged 32-wide last group
      {G::per_token_group, {4, 96}, 40},        // C % 16 == 0 but bk % 16 != 0: 1-element chunks
      {G::block, {3, 130, 257}},                // 1-element chunks
      {G::block, {2, 2, 40, 70}, 32, 16},
      {G::block, {515, 384}},                   // 1024 chunks per block, ragged last block row
      {G::block, {300, 512}, 256, 256},         // 4096 chunks per block: two reads
      {G::block, {64, 256}, 128, 1},            // 1 x 128 blocks == token groups
  };
  Rng rng(7);
  int n = 0;
  for (const Case& c : cases) {
    for (DType id : {DType::f32, DType::bf16, DType::f16}) {
      const DType od = n++ % 2 ? kFn : kFnuz;
      const Buffer in = random_input(id, c.dims, rng, 97);
      const std::string what = std::string(granularity_name(c.g)) + " " + in.view.describe() + " g" +
                               std::to_string(c.block_n) + "x" + std::to_string(c.group_k) + " -> " + dtype_name(od) +
                               (c.static_scale > 0 ? " static" : "");
      expect_cuda_matches_ref(in, od, c, what);
      expect_cuda_matches_ref(in, od == kFn ? kFnuz : kFn, c, what + " (other format)");
    }
  }
}

// The hardware encoder (cvt.rn.satfinite.e4m3x2.f32 + the e4m3fnuz fix-ups) against dtype.h's on
// about a million f32 bit patterns over the whole range plus every RNE midpoint between adjacent
// codes and its neighbours: a static per-tensor scale of 1 makes q = x exactly.
TEST(QuantizeFp8, CudaEncoderMatchesTheScalarEncoderOnEveryFloatClass) {
  SKIP_WITHOUT_CUDA();
  std::vector<float> xs;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4093) {
    float f;
    const uint32_t b = uint32_t(u);
    std::memcpy(&f, &b, 4);
    xs.push_back(f);
  }
  for (DType od : {kFn, kFnuz}) {
    for (int c = 0; c < 0x7F; ++c) {
      const float lo = float(testing::oracle_fp8_value(uint8_t(c), od));
      const float hi = float(testing::oracle_fp8_value(uint8_t(c + 1), od));
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const float mid = 0.5f * (lo + hi);
      for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), lo, hi}) {
        xs.push_back(v);
        xs.push_back(-v);
      }
    }
  }
  for (float v : {224.0f, 232.0f, 232.00002f, 239.99998f, 240.0f, 448.0f, 464.0f, 464.00003f, 480.0f, 1e38f, kInf, kNaN,
                  -kNaN, 0.0f, -0.0f, 1e-45f, -1e-45f}) {
    xs.push_back(v);
    xs.push_back(-v);
  }
  while (xs.size() % 16 != 0) xs.push_back(1.0f);  // 16-element chunks throughout
  Buffer in(DType::f32, {int64_t(xs.size())});
  std::memcpy(in.bytes.data(), xs.data(), xs.size() * 4);
  const Case c{G::per_tensor, {int64_t(xs.size())}, 128, 128, 1.0f};
  for (DType od : {kFn, kFnuz}) {
    const Result got = run(kCuda, in, od, c);
    ASSERT_TRUE(got.status.ok()) << got.status.to_string();
    int64_t bad = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const unsigned want = od == kFn ? f32_to_e4m3fn_bits(xs[i]) : f32_to_e4m3fnuz_bits(xs[i]);
      const unsigned have = got.out.bytes[i];
      if (have != want && bad++ < 8) {
        uint32_t bits;
        std::memcpy(&bits, &xs[i], 4);
        ADD_FAILURE() << dtype_name(od) << " x = " << xs[i] << " (bits " << std::hex << bits << std::dec << ") got "
                      << hex(have) << " want " << hex(want);
      }
    }
    EXPECT_EQ(bad, 0) << dtype_name(od) << ": mismatching codes";
  }
}

// The PyTorch golden casts (tests/data/dtype_golden.json, the file tests/test_dtype.cpp checks
// dtype.h with): the 340 inputs quantized on the GPU with a static scale of 1 give PyTorch's
// clamped-cast codes (NaN inputs: a NaN code, and exactly dtype.h's, i.e. the reference's).
TEST(QuantizeFp8, CudaMatchesThePyTorchGoldenCasts) {
  SKIP_WITHOUT_CUDA();
  const std::string path = testing::test_data_dir() + "/dtype_golden.json";
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << "cannot open " << path;
  const nlohmann::json golden = nlohmann::json::parse(f);
  const auto& bits = golden.at("inputs_f32_bits");
  Buffer in(DType::f32, {int64_t(bits.size())});
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint32_t b = bits[i].get<uint32_t>();
    std::memcpy(in.bytes.data() + 4 * i, &b, 4);
  }
  const Case c{G::per_tensor, {int64_t(bits.size())}, 128, 128, 1.0f};
  for (DType od : {kFn, kFnuz}) {
    const auto& want = golden.at(od == kFn ? "e4m3fn_clamped_cast_bits" : "e4m3fnuz_clamped_cast_bits");
    const Result got = run(kCuda, in, od, c);
    ASSERT_TRUE(got.status.ok()) << got.status.to_string();
    for (size_t i = 0; i < bits.size(); ++i) {
      const float x = in.get(int64_t(i));
      const unsigned code = got.out.bytes[i];
      if (std::isnan(x)) {
        EXPECT_EQ(code, od == kFn ? f32_to_e4m3fn_bits(x) : f32_to_e4m3fnuz_bits(x)) << dtype_name(od) << " NaN " << i;
      } else {
        EXPECT_EQ(code, want[i].get<unsigned>()) << dtype_name(od) << " input " << i << " x = " << x;
      }
    }
  }
}

// ---------------------------------------------------------------- named edge cases
TEST(QuantizeFp8, CudaTZeroWritesNothing) {
  SKIP_WITHOUT_CUDA();
  for (G g : {G::per_tensor, G::per_row, G::per_token_group, G::block}) {
    const Case c{g, {0, 256}};
    const Buffer in(DType::bf16, c.dims);
    const Result r = run(kCuda, in, kFn, c);
    ASSERT_TRUE(r.status.ok()) << granularity_name(g) << ": " << r.status.to_string();
    if (g == G::per_tensor) {  // the one scale of an empty tensor is not written either
      uint32_t bits;
      std::memcpy(&bits, r.scale.bytes.data(), 4);
      EXPECT_EQ(bits, 0xABABABABu);
    }
  }
}

TEST(QuantizeFp8, CudaSingleElementAndSingleRow) {
  SKIP_WITHOUT_CUDA();
  for (float x : {3.5f, -1e-3f, 0.0f, -kInf, kNaN}) {
    Buffer in(DType::f32, {1, 1});
    in.set(0, x);
    for (G g : {G::per_tensor, G::per_row, G::per_token_group, G::block}) {
      for (DType od : {kFn, kFnuz}) {
        expect_cuda_matches_ref(in, od, Case{g, {1, 1}}, std::string("T=1 [1, 1] x=") + std::to_string(x) + " " +
                                                            granularity_name(g) + " " + dtype_name(od));
      }
    }
  }
  Rng rng(3);
  const Buffer row = random_input(DType::bf16, {1, 7168}, rng, 0);
  for (G g : {G::per_tensor, G::per_row, G::per_token_group, G::block}) {
    expect_cuda_matches_ref(row, kFn, Case{g, {1, 7168}}, std::string("T=1 [1, 7168] ") + granularity_name(g));
  }
}

// All-zero rows / groups / blocks (+0 and -0): the floor scale, codes 0x00 / 0x80 (fn) or 0x00 (fnuz).
TEST(QuantizeFp8, CudaAllZeroRowsUseTheFloorScale) {
  SKIP_WITHOUT_CUDA();
  Buffer in(DType::bf16, {6, 256});
  Rng rng(5);
  for (int64_t i = 0; i < in.numel(); ++i) in.set(i, i / 256 % 2 ? rng.normal(0.0f, 2.0f) : (i % 3 ? 0.0f : -0.0f));
  for (G g : {G::per_tensor, G::per_row, G::per_token_group, G::block}) {
    for (DType od : {kFn, kFnuz}) {
      const Case c{g, {6, 256}, 128, 2};
      expect_cuda_matches_ref(in, od, c, std::string("zero rows ") + granularity_name(g) + " " + dtype_name(od));
      if (g == G::per_row) {
        const Result r = run(kCuda, in, od, c);
        EXPECT_EQ(r.scale.get(0), kFp8AmaxFloor / fp8_max(od));
      }
    }
  }
  const Buffer zeros(DType::f32, {4, 64});  // the whole tensor: per_tensor's reduction finds 0
  expect_cuda_matches_ref(zeros, kFn, Case{G::per_tensor, {4, 64}}, "all-zero tensor per_tensor");
}

// Values that saturate: huge inputs with dynamic scales (amax itself -> +-max code), huge quotients
// of a small static scale (finite and past 2^100, the scalar path), and inputs that overflow to inf
// in the division.
TEST(QuantizeFp8, CudaSaturation) {
  SKIP_WITHOUT_CUDA();
  Rng rng(9);
  Buffer huge = random_input(DType::f32, {8, 512}, rng, 0);
  for (int64_t i = 0; i < huge.numel(); ++i) huge.set(i, huge.get(i) * (i % 5 == 0 ? 3e38f : 1e30f));
  for (DType od : {kFn, kFnuz}) {
    for (G g : {G::per_tensor, G::per_row, G::per_token_group, G::block}) {
      expect_cuda_matches_ref(huge, od, Case{g, {8, 512}}, std::string("huge ") + granularity_name(g));
    }
    for (float s : {1e-3f, 1e-30f, 1e-40f}) {
      expect_cuda_matches_ref(huge, od, Case{G::per_tensor, {8, 512}, 128, 128, s},
                              std::string("static ") + std::to_string(s) + " " + dtype_name(od));
    }
  }
}

// NaN / inf inputs as the reference defines them: excluded from amax, inf -> +-max code, NaN ->
// the format's NaN code (e4m3fn keeps the sign: 0xFF for a negative NaN).
TEST(QuantizeFp8, CudaNonFiniteInputs) {
  SKIP_WITHOUT_CUDA();
  Rng rng(13);
  for (DType id : {DType::f32, DType::bf16, DType::f16}) {
    const Buffer in = random_input(id, {33, 512}, rng, 5);
    for (DType od : {kFn, kFnuz}) {
      for (G g : {G::per_tensor, G::per_row, G::per_token_group, G::block}) {
        expect_cuda_matches_ref(in, od, Case{g, {33, 512}, 128, 16},
                                std::string("specials ") + dtype_name(id) + " " + granularity_name(g) + " " + dtype_name(od));
      }
    }
    Buffer nan_row(id, {2, 64});  // a row of NaN only: floor scale, every code NaN
    for (int64_t i = 0; i < 64; ++i) nan_row.set(i, i % 2 ? kNaN : -kNaN);
    expect_cuda_matches_ref(nan_row, kFn, Case{G::per_row, {2, 64}}, std::string("NaN row ") + dtype_name(id));
  }
}

// Large T (several thousand tokens): many CTAs, the grid-stride loops of the per_tensor kernels.
TEST(QuantizeFp8, CudaLargeT) {
  SKIP_WITHOUT_CUDA();
  Rng rng(17);
  const Buffer in = random_input(DType::bf16, {4096, 2048}, rng, 4099);
  for (G g : {G::per_token_group, G::per_row, G::per_tensor, G::block}) {
    expect_cuda_matches_ref(in, kFn, Case{g, {4096, 2048}}, std::string("T=4096 ") + granularity_name(g));
  }
}

// Pointers that are not 16-byte aligned (a view one element into its allocation) take the
// 1-element chunk paths; codes and scales still match.
TEST(QuantizeFp8, CudaUnalignedPointers) {
  SKIP_WITHOUT_CUDA();
  Rng rng(19);
  const Dims dims = {48, 256};
  const int64_t n = 48 * 256;
  for (DType id : {DType::f32, DType::bf16}) {
    const Buffer in = random_input(id, dims, rng, 61);
    for (G g : {G::per_tensor, G::per_row, G::per_token_group, G::block}) {
      const Case c{g, dims};
      const Result want = run(kRef, in, kFn, c);
      const int es = dtype_size(id);
      Buffer scale(DType::f32, scale_dims_of(c));
      void *d_in = nullptr, *d_out = nullptr, *d_scale = nullptr;
      CUDA_OK(cudaMalloc(&d_in, size_t(n + 16) * size_t(es)));
      CUDA_OK(cudaMalloc(&d_out, size_t(n + 16)));
      CUDA_OK(cudaMalloc(&d_scale, size_t(scale.numel()) * 4));
      char* in_p = static_cast<char*>(d_in) + es;
      char* out_p = static_cast<char*>(d_out) + 3;
      CUDA_OK(cudaMemcpy(in_p, in.bytes.data(), size_t(n) * size_t(es), cudaMemcpyHostToDevice));
      QuantizeFp8Params p;
      p.in = device_view(in_p, id, dims);
      p.out = device_view(out_p, kFn, dims);
      p.scale = device_view(d_scale, DType::f32, scale_dims_of(c));
      p.granularity = g;
      RunOptions o;
      o.kernel = kCuda;
      const Status s = quantize_fp8(p, o);
      Result got{Buffer(kFn, dims), scale, s};
      CUDA_OK(cudaMemcpy(got.out.bytes.data(), out_p, size_t(n), cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(got.scale.bytes.data(), d_scale, size_t(scale.numel()) * 4, cudaMemcpyDeviceToHost));
      cudaFree(d_in);
      cudaFree(d_out);
      cudaFree(d_scale);
      expect_identical(got, want, in, std::string("unaligned ") + dtype_name(id) + " " + granularity_name(g));
    }
  }
}

// Device data is not readable by the front door: a static scale that is not finite and > 0 (the
// reference's invalid_argument) makes the kernel write nothing; the call itself returns ok.
TEST(QuantizeFp8, CudaInvalidStaticScaleWritesNothing) {
  SKIP_WITHOUT_CUDA();
  Rng rng(23);
  const Buffer in = random_input(DType::bf16, {8, 64}, rng, 0);
  for (float s : {0.0f, -1.0f, kInf, kNaN}) {
    Result r{Buffer(kFn, {8, 64}), Buffer(DType::f32, {1}), Status()};
    r.out.fill_bytes(0xAB);
    r.scale.set(0, s);
    QuantizeFp8Params p;
    p.in = in.view;
    p.out = r.out.view;
    p.scale = r.scale.view;
    p.granularity = G::per_tensor;
    p.static_scale = true;
    const Status st = testing::run_quantize_fp8_kernel(p, *registry().find(kCuda));
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (unsigned char b : r.out.bytes) ASSERT_EQ(b, 0xAB) << "scale " << s;
  }
}

// ---------------------------------------------------------------- CUDA graphs
// The op is captured once per granularity on a non-default stream (per_tensor dynamic: a memset
// and three kernels), replayed, the input changes in place and the graph is replayed again: each
// replay must match the ref on the data it saw. A T = 0 call captures no node at all.
TEST(QuantizeFp8, CudaGraphCaptureAndReplay) {
  SKIP_WITHOUT_CUDA();
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Dims dims = {37, 1024};
  const int64_t n = 37 * 1024;
  for (const Case& c : {Case{G::per_tensor, dims}, Case{G::per_tensor, dims, 128, 128, 0.01f},
                        Case{G::per_token_group, dims}, Case{G::per_row, dims}, Case{G::block, dims}}) {
    const Dims sd = scale_dims_of(c);
    Buffer scale(DType::f32, sd);
    if (c.static_scale > 0) scale.set(0, c.static_scale);
    void *d_in = nullptr, *d_out = nullptr, *d_scale = nullptr;
    CUDA_OK(cudaMalloc(&d_in, size_t(n) * 2));
    CUDA_OK(cudaMalloc(&d_out, size_t(n)));
    CUDA_OK(cudaMalloc(&d_scale, size_t(scale.numel()) * 4));
    CUDA_OK(cudaMemcpy(d_scale, scale.bytes.data(), size_t(scale.numel()) * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());  // the graph runs on a non-blocking stream
    QuantizeFp8Params p;
    p.in = device_view(d_in, DType::bf16, dims);
    p.out = device_view(d_out, kFn, dims);
    p.scale = device_view(d_scale, DType::f32, sd);
    p.granularity = c.g;
    p.static_scale = c.static_scale > 0;
    RunOptions o;
    o.kernel = kCuda;
    o.stream = stream;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const Status st = quantize_fp8(p, o);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (uint64_t round = 0; round < 2; ++round) {
      Rng rng(100 + round);
      const Buffer in = random_input(DType::bf16, dims, rng, 50);
      // On `stream`: a plain cudaMemcpy from pageable memory may return before its DMA lands, and
      // the non-blocking stream does not wait for the legacy stream (replay 1 read stale input).
      CUDA_OK(cudaMemcpyAsync(d_in, in.bytes.data(), size_t(n) * 2, cudaMemcpyHostToDevice, stream));
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      Result got{Buffer(kFn, dims), Buffer(DType::f32, sd), Status()};
      CUDA_OK(cudaMemcpy(got.out.bytes.data(), d_out, size_t(n), cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(got.scale.bytes.data(), d_scale, size_t(scale.numel()) * 4, cudaMemcpyDeviceToHost));
      expect_identical(got, run(kRef, in, kFn, c), in,
                       std::string("graph replay ") + std::to_string(round) + " " + granularity_name(c.g) +
                           (c.static_scale > 0 ? " static" : ""));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(d_in);
    cudaFree(d_out);
    cudaFree(d_scale);
  }
  // T = 0: validated, then nothing is enqueued.
  QuantizeFp8Params empty;
  empty.in = TensorView::contiguous(nullptr, DType::bf16, {0, 128}, Device::cuda);
  empty.out = TensorView::contiguous(nullptr, kFn, {0, 128}, Device::cuda);
  empty.scale = TensorView::contiguous(nullptr, DType::f32, {0}, Device::cuda);
  RunOptions o;
  o.kernel = kCuda;
  o.stream = stream;
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status st = quantize_fp8(empty, o);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(st.ok()) << st.to_string();
  size_t nodes = 99;
  CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_EQ(nodes, 0u);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// convert_fp8_sm90 without a count is capturable; with num_saturated (a host sync) it refuses to
// run under capture, naming the argument.
TEST(ConvertFp8, CudaGraphCaptureAndReplay) {
  if (registry().find("convert_fp8_sm90") == nullptr) GTEST_SKIP() << "built without CUDA";
  SKIP_WITHOUT_CUDA();
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int64_t n = 5000;
  void *d_in = nullptr, *d_out = nullptr, *d_s = nullptr;
  CUDA_OK(cudaMalloc(&d_in, size_t(n)));
  CUDA_OK(cudaMalloc(&d_out, size_t(n)));
  CUDA_OK(cudaMalloc(&d_s, 8 * 4));
  ConvertFp8Params p;
  p.in = TensorView::contiguous(d_in, kFnuz, {n}, Device::cuda);
  p.out = TensorView::contiguous(d_out, kFn, {n}, Device::cuda);
  p.scale_in = TensorView::contiguous(d_s, DType::f32, {8}, Device::cuda);
  p.scale_out = p.scale_in;  // in place
  RunOptions o;
  o.kernel = "convert_fp8_sm90";
  o.stream = stream;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status st = convert_fp8(p, o);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 2; ++round) {
    Rng rng(300 + uint64_t(round));
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    for (uint8_t& c : codes) c = uint8_t(rng.gen() & 0xFF);
    std::vector<float> sc(8);
    for (float& v : sc) v = rng.uniform(1e-3f, 1.0f);
    CUDA_OK(cudaMemcpyAsync(d_in, codes.data(), size_t(n), cudaMemcpyHostToDevice, stream));  // see above
    CUDA_OK(cudaMemcpyAsync(d_s, sc.data(), 8 * 4, cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<uint8_t> got(static_cast<size_t>(n));
    std::vector<float> got_s(8);
    CUDA_OK(cudaMemcpy(got.data(), d_out, size_t(n), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got_s.data(), d_s, 8 * 4, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t c = codes[size_t(i)];
      const uint8_t want = c == 0x80 ? 0x00 : (c & 0x7F) == 0x7F ? uint8_t((c & 0x80) | 0x7E) : c;
      ASSERT_EQ(got[size_t(i)], want) << "round " << round << " code " << int(c);
    }
    for (int i = 0; i < 8; ++i) EXPECT_EQ(got_s[size_t(i)], sc[size_t(i)] * 0.5f) << "round " << round;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  int64_t sat = -1;
  p.num_saturated = &sat;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status refused = convert_fp8(p, o);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  EXPECT_EQ(refused.code(), StatusCode::invalid_argument);
  EXPECT_NE(refused.message().find("num_saturated"), std::string::npos) << refused.message();
  EXPECT_EQ(sat, -1);
  cudaGraphDestroy(graph);
  cudaFree(d_in);
  cudaFree(d_out);
  cudaFree(d_s);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace moekit
