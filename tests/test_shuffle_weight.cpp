// shuffle_weight / unshuffle_weight (SPEC 4, moekit/ops/layout.h): the closed form against
// hand-worked offsets, the reference kernels against the 5-D permutation oracle
// (src/testing/oracle_layout_quant.cpp), round trips, validation errors and the harness hooks.
// Run: ./build/tests/moekit_tests --gtest_filter='ShuffleWeight*:UnshuffleWeight*'
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

#include "cpu_test_util.h"
#include "moekit/core/config.h"
#include "moekit/ops/layout.h"
#include "testing/harness.h"
#include "testing/oracle_layout_quant.h"

namespace moekit {
namespace {

using testing::Buffer;
using testing::Rng;

// SPEC 4: dst(n, c) = (((n/16 * K/32 + c/32) * (32/V) + (c%32)/V) * 16 + n%16) * V + c%V.
// Worked by hand, bf16 (V = 8, 32/V = 4), K = 64 (K/32 = 2):
//   (0, 0)   -> 0
//   (0, 7)   -> c%V = 7                                          -> 7
//   (1, 0)   -> n%16 = 1: 1 * V                                  -> 8
//   (15, 7)  -> 15 * 8 + 7                                       -> 127 (end of the first 16x8 run)
//   (0, 8)   -> (c%32)/V = 1: (1 * 16) * 8                       -> 128 = 16 * V
//   (0, 31)  -> (c%32)/V = 3, c%V = 7: (3 * 16) * 8 + 7          -> 391
//   (0, 32)  -> c/32 = 1: ((1 * 4) * 16) * 8                     -> 512 (second 16x32 tile)
//   (16, 0)  -> n/16 = 1: ((1 * 2) * 4 * 16) * 8                 -> 1024 = K * 16
//   (17, 40) -> n/16 = 1, n%16 = 1, c/32 = 1, (c%32)/V = 1, c%V = 0:
//               (((1*2 + 1) * 4 + 1) * 16 + 1) * 8 = (13*16 + 1) * 8 -> 1672
//   (31, 63) -> (((1*2 + 1) * 4 + 3) * 16 + 15) * 8 + 7 = 255*8 + 7 -> 2047 (last of 32 x 64)
TEST(ShuffleWeight, ClosedFormHandWorkedBf16) {
  const int64_t K = 64;
  EXPECT_EQ(shuffle_index(0, 0, K, 2), 0);
  EXPECT_EQ(shuffle_index(0, 7, K, 2), 7);
  EXPECT_EQ(shuffle_index(1, 0, K, 2), 8);
  EXPECT_EQ(shuffle_index(15, 7, K, 2), 127);
  EXPECT_EQ(shuffle_index(0, 8, K, 2), 128);
  EXPECT_EQ(shuffle_index(0, 31, K, 2), 391);
  EXPECT_EQ(shuffle_index(0, 32, K, 2), 512);
  EXPECT_EQ(shuffle_index(16, 0, K, 2), 1024);
  EXPECT_EQ(shuffle_index(17, 40, K, 2), 1672);
  EXPECT_EQ(shuffle_index(31, 63, K, 2), 2047);
}

// fp8 (V = 16, 32/V = 2), K = 64:
//   (1, 0)  -> 1 * 16                                    -> 16 = V
//   (0, 15) -> 15
//   (0, 16) -> (c%32)/V = 1: (1 * 16) * 16               -> 256 = 16 * V
//   (0, 32) -> c/32 = 1: ((1 * 2) * 16) * 16             -> 512
//   (16, 0) -> n/16 = 1: ((1 * 2) * 2 * 16) * 16         -> 1024 = K * 16
//   (5, 20) -> (c%32)/V = 1, n%16 = 5, c%V = 4: (1*16 + 5) * 16 + 4 -> 340
TEST(ShuffleWeight, ClosedFormHandWorkedFp8) {
  const int64_t K = 64;
  EXPECT_EQ(shuffle_index(0, 0, K, 1), 0);
  EXPECT_EQ(shuffle_index(1, 0, K, 1), 16);
  EXPECT_EQ(shuffle_index(0, 15, K, 1), 15);
  EXPECT_EQ(shuffle_index(0, 16, K, 1), 256);
  EXPECT_EQ(shuffle_index(0, 32, K, 1), 512);
  EXPECT_EQ(shuffle_index(16, 0, K, 1), 1024);
  EXPECT_EQ(shuffle_index(5, 20, K, 1), 340);
}

// f32 (V = 4, 32/V = 8), K = 32:
//   (1, 0) -> 4;  (0, 4) -> (1 * 16) * 4 = 64;  (2, 5) -> (1*16 + 2) * 4 + 1 = 73;
//   (16, 0) -> n/16 = 1: ((1 * 1) * 8 * 16) * 4 = 512 = K * 16
TEST(ShuffleWeight, ClosedFormHandWorkedF32) {
  EXPECT_EQ(shuffle_index(1, 0, 32, 4), 4);
  EXPECT_EQ(shuffle_index(0, 4, 32, 4), 64);
  EXPECT_EQ(shuffle_index(2, 5, 32, 4), 73);
  EXPECT_EQ(shuffle_index(16, 0, 32, 4), 512);
}

TEST(ShuffleWeight, ClosedFormIsAPermutation) {
  for (int eb : {1, 2, 4}) {
    for (auto [N, K] : {std::pair<int64_t, int64_t>{16, 32}, {48, 96}, {32, 160}}) {
      std::set<int64_t> seen;
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t c = 0; c < K; ++c) {
          const int64_t d = shuffle_index(n, c, K, eb);
          ASSERT_GE(d, 0);
          ASSERT_LT(d, N * K);
          seen.insert(d);
        }
      }
      EXPECT_EQ(int64_t(seen.size()), N * K) << "eb=" << eb << " N=" << N << " K=" << K;
    }
  }
}

Status shuffle(const Buffer& in, Buffer& out, const char* kernel = nullptr) {
  ShuffleWeightParams p{in.view, out.view};
  p.in.layout = Layout::row_major;
  p.out.layout = Layout::shuffled_16x16;
  RunOptions o;
  o.kernel = kernel;
  return shuffle_weight(p, o);
}

Status unshuffle(const Buffer& in, Buffer& out) {
  ShuffleWeightParams p{in.view, out.view};
  p.in.layout = Layout::shuffled_16x16;
  p.out.layout = Layout::row_major;
  return unshuffle_weight(p);
}

std::vector<unsigned char> payload(const Buffer& b) {
  return std::vector<unsigned char>(b.bytes.begin(), b.bytes.begin() + b.view.nbytes());
}

// One bf16 [16, 32] tile written out literally: 4 runs of 16 rows x 8 columns, row-major inside a
// run. Element (n, c) holds the value n * 32 + c.
TEST(ShuffleWeight, OneBf16TileLiteral) {
  Buffer in(DType::bf16, {16, 32}), out(DType::bf16, {16, 32});
  for (int i = 0; i < 16 * 32; ++i) in.data<uint16_t>()[i] = uint16_t(i);
  ASSERT_TRUE(shuffle(in, out).ok());
  const uint16_t* o = out.data<uint16_t>();
  const uint16_t first[10] = {0, 1, 2, 3, 4, 5, 6, 7, 32, 33};  // row 0 cols 0-7, then row 1
  for (int i = 0; i < 10; ++i) EXPECT_EQ(o[i], first[i]) << i;
  EXPECT_EQ(o[127], 15 * 32 + 7) << "end of run 0: row 15, col 7";
  EXPECT_EQ(o[128], 8) << "run 1 starts at row 0, col 8";
  EXPECT_EQ(o[3 * 128 + 5 * 8 + 2], 5 * 32 + 26) << "run 3, row 5, col 24 + 2";
  EXPECT_EQ(o[511], 511);
}

// One fp8 [16, 32] tile: 2 runs of 16 rows x 16 bytes.
TEST(ShuffleWeight, OneFp8TileLiteral) {
  Buffer in(DType::fp8_e4m3fn, {16, 32}), out(DType::fp8_e4m3fn, {16, 32});
  for (int n = 0; n < 16; ++n) {
    for (int c = 0; c < 32; ++c) in.data<uint8_t>()[n * 32 + c] = uint8_t((n << 4) | (c & 15));
  }
  ASSERT_TRUE(shuffle(in, out).ok());
  const uint8_t* o = out.data<uint8_t>();
  // Run 0 holds columns 0-15 of rows 0..15 in order, run 1 columns 16-31: with this fill both
  // runs read 0x00, 0x01, ..., 0xFF.
  for (int i = 0; i < 512; ++i) ASSERT_EQ(o[i], uint8_t(i & 0xFF)) << i;
}

struct Shape {
  DType dtype;
  std::vector<int64_t> dims;
};

const std::vector<Shape>& oracle_shapes() {
  static const std::vector<Shape> kShapes = {
      {DType::fp8_e4m3fn, {16, 32}},        {DType::fp8_e4m3fnuz, {3, 48, 96}},
      {DType::bf16, {16, 32}},              {DType::bf16, {2, 64, 128}},
      {DType::f16, {2, 2, 32, 64}},         {DType::f32, {32, 32}},
      {DType::i32, {2, 16, 96}},            {DType::bf16, {1, 1, 16, 32}},
  };
  return kShapes;
}

TEST(ShuffleWeight, MatchesPermutationOracle) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    Rng rng(seed);
    for (const Shape& s : oracle_shapes()) {
      Buffer in(s.dtype, s.dims), out(s.dtype, s.dims);
      for (unsigned char& b : in.bytes) b = uint8_t(rng.gen());
      ASSERT_TRUE(shuffle(in, out).ok()) << in.view.describe();
      EXPECT_EQ(payload(out), testing::oracle_shuffle_weight(in.view, false)) << in.view.describe();
    }
  }
}

TEST(ShuffleWeight, RoundTripBitExact) {
  Rng rng(7);
  for (const Shape& s : oracle_shapes()) {
    Buffer in(s.dtype, s.dims), mid(s.dtype, s.dims), back(s.dtype, s.dims);
    for (unsigned char& b : in.bytes) b = uint8_t(rng.gen());  // includes NaN and denormal patterns
    ASSERT_TRUE(shuffle(in, mid).ok());
    ASSERT_TRUE(unshuffle(mid, back).ok());
    EXPECT_EQ(payload(back), payload(in)) << in.view.describe();
    mid.view.layout = Layout::shuffled_16x16;
    EXPECT_EQ(payload(back), testing::oracle_shuffle_weight(mid.view, true));
  }
}

TEST(ShuffleWeight, EmptyTensorIsANoOp) {
  Buffer in(DType::bf16, {0, 16, 32}), out(DType::bf16, {0, 16, 32});
  out.fill_bytes(0xAB);
  EXPECT_TRUE(shuffle(in, out).ok());
  EXPECT_EQ(out.bytes[0], 0xAB);
}

TEST(ShuffleWeight, RegisteredRefKernels) {
  const Kernel* s = registry().find("shuffle_weight_ref");
  const Kernel* u = registry().find("unshuffle_weight_ref");
  ASSERT_NE(s, nullptr);
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(s->op, OpKind::shuffle_weight);
  EXPECT_EQ(u->op, OpKind::unshuffle_weight);
  EXPECT_EQ(s->backend, Backend::ref);
  EXPECT_EQ(s->priority, 0);
  Buffer in(DType::bf16, {16, 32}), out(DType::bf16, {16, 32});
  EXPECT_TRUE(shuffle(in, out, "shuffle_weight_ref").ok());
  const Status wrong = shuffle(in, out, "unshuffle_weight_ref");
  EXPECT_FALSE(wrong.ok()) << "a kernel of another op must not be accepted";
}

TEST(ShuffleWeight, RefRefusesDeviceTensors) {
  Buffer in(DType::bf16, {16, 32}), out(DType::bf16, {16, 32});
  ShuffleWeightParams p{in.view, out.view};
  p.out.layout = Layout::shuffled_16x16;
  p.in.device = p.out.device = Device::cuda;
  RunOptions o;
  o.kernel = "shuffle_weight_ref";
  const Status s = shuffle_weight(p, o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("host"), std::string::npos) << s.to_string();
}

// ---------------------------------------------------------------- validation
struct ErrorCase {
  const char* what;
  std::vector<int64_t> in_dims, out_dims;
  DType in_dtype = DType::bf16, out_dtype = DType::bf16;
  Layout in_layout = Layout::row_major, out_layout = Layout::shuffled_16x16;
  const char* must_contain[3];
};

TEST(ShuffleWeight, ValidationErrorsNameTheArgument) {
  const std::vector<ErrorCase> cases = {
      {"N not a multiple of 16", {40, 32}, {40, 32}, DType::bf16, DType::bf16, Layout::row_major,
       Layout::shuffled_16x16, {"in:", "multiple of 16", "N=40"}},
      {"K not a multiple of 32", {2, 16, 48}, {2, 16, 48}, DType::fp8_e4m3fn, DType::fp8_e4m3fn,
       Layout::row_major, Layout::shuffled_16x16, {"in:", "multiple of 32", "K=48"}},
      {"1-D", {64}, {64}, DType::bf16, DType::bf16, Layout::row_major, Layout::shuffled_16x16,
       {"in:", "2-4 dims", "[64]"}},
      {"5-D", {1, 1, 1, 16, 32}, {1, 1, 1, 16, 32}, DType::bf16, DType::bf16, Layout::row_major,
       Layout::shuffled_16x16, {"in:", "ndim", "5"}},
      {"out shape", {16, 32}, {32, 16}, DType::bf16, DType::bf16, Layout::row_major, Layout::shuffled_16x16,
       {"out:", "[16, 32]", "[32, 16]"}},
      {"out dtype", {16, 32}, {16, 32}, DType::bf16, DType::f16, Layout::row_major, Layout::shuffled_16x16,
       {"out:", "bf16", "f16"}},
      {"in layout", {16, 32}, {16, 32}, DType::bf16, DType::bf16, Layout::shuffled_16x16,
       Layout::shuffled_16x16, {"in:", "row_major", "shuffled_16x16"}},
      {"out layout", {16, 32}, {16, 32}, DType::bf16, DType::bf16, Layout::row_major, Layout::row_major,
       {"out:", "layout must be shuffled_16x16", "row_major"}},
  };
  for (const ErrorCase& c : cases) {
    Buffer in(c.in_dtype, c.in_dims.size() > 4 ? std::vector<int64_t>{16, 32} : c.in_dims);
    Buffer out(c.out_dtype, c.out_dims.size() > 4 ? std::vector<int64_t>{16, 32} : c.out_dims);
    ShuffleWeightParams p{in.view, out.view};
    if (c.in_dims.size() > 4) {
      p.in = TensorView::contiguous(in.bytes.data(), c.in_dtype, {1, 1, 1, 16, 32});
      p.out = TensorView::contiguous(out.bytes.data(), c.out_dtype, {1, 1, 1, 16, 32});
    }
    p.in.layout = c.in_layout;
    p.out.layout = c.out_layout;
    out.fill_bytes(0xAB);
    const std::vector<unsigned char> before = out.bytes;
    const Status s = shuffle_weight(p);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << c.what << ": " << s.to_string();
    for (const char* m : c.must_contain) {
      EXPECT_NE(s.message().find(m), std::string::npos) << c.what << ": '" << m << "' not in: " << s.message();
    }
    EXPECT_EQ(out.bytes, before) << c.what << ": output written on an invalid call";
  }
}

TEST(ShuffleWeight, MissingNonContiguousAndAliasingRejected) {
  Buffer in(DType::bf16, {32, 64}), out(DType::bf16, {32, 64});
  ShuffleWeightParams p{in.view, out.view};
  p.out.layout = Layout::shuffled_16x16;

  ShuffleWeightParams q = p;
  q.out = TensorView();
  Status s = shuffle_weight(q);
  EXPECT_NE(s.message().find("out: required"), std::string::npos) << s.to_string();

  q = p;
  q.in.stride[0] = 128;  // row-strided view of a wider buffer
  s = shuffle_weight(q);
  EXPECT_NE(s.message().find("in: must be contiguous"), std::string::npos) << s.to_string();

  q = p;
  q.out.data = in.bytes.data();  // in place
  s = shuffle_weight(q);
  EXPECT_NE(s.message().find("out: must not overlap in"), std::string::npos) << s.to_string();

  q = p;
  q.out.data = in.bytes.data() + 64;  // partial overlap
  s = shuffle_weight(q);
  EXPECT_NE(s.message().find("out: must not overlap in"), std::string::npos) << s.to_string();

  q = p;
  q.out.device = Device::cuda;
  s = shuffle_weight(q);
  EXPECT_NE(s.message().find("out: is on cuda"), std::string::npos) << s.to_string();
}

TEST(ShuffleWeight, PoisonedOutputUnchangedOnInvalidCall) {
  Buffer in(DType::fp8_e4m3fn, {2, 48, 64}), out(DType::fp8_e4m3fn, {2, 48, 64});
  Rng rng(3);
  for (unsigned char& b : in.bytes) b = uint8_t(rng.gen());
  out.fill_bytes(0xAB);
  ShuffleWeightParams p{in.view, out.view};  // out.layout left row_major: invalid
  EXPECT_FALSE(shuffle_weight(p).ok());
  for (unsigned char b : out.bytes) ASSERT_EQ(b, 0xAB);
}

TEST(UnshuffleWeight, ValidationErrors) {
  Buffer in(DType::bf16, {16, 32}), out(DType::bf16, {16, 32});
  ShuffleWeightParams p{in.view, out.view};  // both row_major
  Status s = unshuffle_weight(p);
  EXPECT_NE(s.message().find("in: layout must be shuffled_16x16, got row_major"), std::string::npos)
      << s.to_string();
  p.in.layout = Layout::shuffled_16x16;
  p.out.layout = Layout::shuffled_16x16;
  s = unshuffle_weight(p);
  EXPECT_NE(s.message().find("out: layout must be row_major, got shuffled_16x16"), std::string::npos)
      << s.to_string();
  Buffer bad(DType::bf16, {16, 40}), bad_out(DType::bf16, {16, 40});
  ShuffleWeightParams q{bad.view, bad_out.view};
  q.in.layout = Layout::shuffled_16x16;
  s = unshuffle_weight(q);
  EXPECT_NE(s.message().find("K=40"), std::string::npos) << s.to_string();
}

TEST(UnshuffleWeight, MatchesPermutationOracle) {
  Rng rng(11);
  for (const Shape& s : oracle_shapes()) {
    Buffer in(s.dtype, s.dims), out(s.dtype, s.dims);
    for (unsigned char& b : in.bytes) b = uint8_t(rng.gen());
    in.view.layout = Layout::shuffled_16x16;
    ASSERT_TRUE(unshuffle(in, out).ok());
    EXPECT_EQ(payload(out), testing::oracle_shuffle_weight(in.view, true)) << in.view.describe();
  }
}

// ---------------------------------------------------------------- harness hooks on presets
void expect_all_ok(const std::vector<testing::CaseResult>& results) {
  ASSERT_FALSE(results.empty());
  for (const testing::CaseResult& r : results) {
    EXPECT_TRUE(r.ok) << r.op << " " << r.kernel << " [" << r.name << "] vs " << r.reference << ": " << r.detail;
  }
}

TEST(ShuffleWeight, CheckHookOnPresets) {
  for (const char* model : {"mixtral", "deepseek-v3", "qwen3-moe"}) {
    testing::CheckRequest req;
    req.shape.model = model;
    req.edge_cases = std::string(model) == "mixtral";
    expect_all_ok(testing::check_shuffle_weight(req));
  }
}

TEST(UnshuffleWeight, CheckHookOnPresets) {
  for (const char* model : {"llama4", "deepseek-v3"}) {
    testing::CheckRequest req;
    req.shape.model = model;
    req.edge_cases = std::string(model) == "llama4";
    expect_all_ok(testing::check_unshuffle_weight(req));
  }
}

TEST(ShuffleWeight, CheckHookRejectsUnshuffleableCustomShape) {
  testing::CheckRequest req;
  req.shape.hidden = 100;  // K = 100 for w1: must be reported as an expected rejection
  req.edge_cases = false;
  const auto results = testing::check_shuffle_weight(req);
  ASSERT_FALSE(results.empty());
  for (const auto& r : results) EXPECT_TRUE(r.ok) << r.name << ": " << r.detail;
}

// ---------------------------------------------------------------- CPU kernels (*_shuffle_weight_avx512)
// Compared bit-exactly with the ref kernels; skipped where the CPU lacks AVX-512 F/BW/VL
// (cpu_test::avx512_unavailable()), where the kernels are not registered.
TEST(ShuffleWeight, CpuKernelsAreRegisteredAndRefuseDeviceTensors) {
  const bool avx512 = cpu_test::avx512_unavailable().empty();
  for (const char* name : {"shuffle_weight_avx512", "unshuffle_weight_avx512"}) {
    SCOPED_TRACE(name);
    Buffer in(DType::bf16, {16, 32}), out(DType::bf16, {16, 32});
    ShuffleWeightParams p{in.view, out.view};
    const bool inverse = name[0] == 'u';
    if (!avx512) {  // not registered; the default dispatch picks the ref kernel
      cpu_test::expect_not_registered_and_falls_back(inverse ? OpKind::unshuffle_weight : OpKind::shuffle_weight,
                                                      name, inverse ? "unshuffle_weight_ref" : "shuffle_weight_ref", p);
      continue;
    }
    const Kernel* k = registry().find(name);
    ASSERT_NE(k, nullptr) << name;
    EXPECT_EQ(k->backend, Backend::cpu);
    EXPECT_GT(k->priority, 0);
    EXPECT_TRUE(k->supports(&p).ok());
    const Kernel* chosen = nullptr;  // the default dispatch picks it on this CPU
    ASSERT_TRUE(registry().select_with(Config{}, k->op, MoeVariant::none, &p, RunOptions{}, "t", &chosen).ok());
    EXPECT_STREQ(chosen->name, name);
    p.in.device = Device::cuda;
    const Status s = k->supports(&p);
    EXPECT_EQ(s.code(), StatusCode::unsupported);
    EXPECT_NE(s.message().find("in"), std::string::npos) << s.message();
  }
}

// 1, 2 and 4-byte elements; N a multiple of 16 that is not a power of two, K a multiple of 32 that is
// not a multiple of 64; batches of matrices; sizes below and above the threaded size (256 KiB), so
// the 16-row blocks split unevenly over the threads. Shuffle against shuffle_weight_ref, unshuffle
// against unshuffle_weight_ref, and the round trip.
TEST(ShuffleWeight, CpuMatchesRefAndRoundTripsAcrossTheThreadSplit) {
  CPU_SKIP_IF(cpu_test::avx512_unavailable());
  struct Case {
    DType dtype;
    std::vector<int64_t> dims;
  };
  const Case cases[] = {{DType::fp8_e4m3fn, {16, 32}}, {DType::bf16, {48, 96}},         {DType::f32, {2, 3, 16, 160}},
                        {DType::bf16, {5, 208, 224}}, {DType::fp8_e4m3fn, {3, 400, 736}}, {DType::f32, {1, 112, 1056}}};
  Rng rng(5);
  for (const Case& c : cases) {
    Buffer in(c.dtype, c.dims);
    for (unsigned char& b : in.bytes) b = uint8_t(rng.gen());
    auto run = [&](bool inverse, const Buffer& src, const char* kernel) {
      Buffer dst(c.dtype, c.dims);
      dst.fill_bytes(0xAB);
      ShuffleWeightParams p{src.view, dst.view};
      p.in.layout = inverse ? Layout::shuffled_16x16 : Layout::row_major;
      p.out.layout = inverse ? Layout::row_major : Layout::shuffled_16x16;
      RunOptions o;
      o.kernel = kernel;
      const Status s = inverse ? unshuffle_weight(p, o) : shuffle_weight(p, o);
      EXPECT_TRUE(s.ok()) << s.to_string();
      return dst;
    };
    const Buffer shuffled = run(false, in, "shuffle_weight_avx512");
    EXPECT_EQ(payload(shuffled), payload(run(false, in, "shuffle_weight_ref"))) << in.view.describe();
    const Buffer back = run(true, shuffled, "unshuffle_weight_avx512");
    EXPECT_EQ(payload(back), payload(run(true, shuffled, "unshuffle_weight_ref"))) << in.view.describe();
    EXPECT_EQ(payload(back), payload(in)) << in.view.describe();
  }
}

TEST(ShuffleWeight, CpuCheckHookOnPresets) {
  CPU_SKIP_IF(cpu_test::avx512_unavailable());
  for (auto check : {testing::check_shuffle_weight, testing::check_unshuffle_weight}) {
    testing::CheckRequest req;
    req.shape.model = "deepseek-v3";
    req.has_backend = true;
    req.backend = Backend::cpu;
    const auto results = check(req);
    ASSERT_FALSE(results.empty());
    for (const testing::CaseResult& r : results) {
      EXPECT_TRUE(r.ok) << r.kernel << " [" << r.name << "] vs " << r.reference << ": " << r.detail;
      EXPECT_NE(r.reference, "oracle") << r.name;  // the CPU kernels are checked against the ref (or the contract)
    }
  }
}

}  // namespace
}  // namespace moekit
