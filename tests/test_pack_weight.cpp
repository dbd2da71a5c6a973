// pack_weight / unpack_weight (moekit/ops/layout.h, layout cpu_vnni2_n32): the closed form against
// hand-worked offsets, the reference kernels against the sequential-walk oracle
// (src/testing/oracle_pack_weight.h), bit-exact round trips, validation errors, the fused_moe front
// door's rules for packed weights, and the harness hooks.
// Run: ./build/tests/moekit_tests --gtest_filter='PackWeight*:UnpackWeight*'
#include <gtest/gtest.h>

#include <algorithm>

#include <cstring>
#include <set>
#include <vector>

#include "moekit/ops/fused_moe.h"
#include "moekit/ops/layout.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"
#include "testing/oracle_pack_weight.h"

namespace moekit {
namespace {

using testing::Buffer;
using testing::Rng;

Buffer random_bits(DType d, const std::vector<int64_t>& dims, uint64_t seed) {
  Buffer b(d, dims);
  Rng rng(seed);
  for (unsigned char& c : b.bytes) c = static_cast<unsigned char>(rng.gen() & 0xFFu);  // NaN patterns too
  return b;
}

Status pack(const Buffer& in, Buffer& out, const char* kernel = nullptr) {
  PackWeightParams p{in.view, out.view};
  p.out.layout = Layout::cpu_vnni2_n32;
  RunOptions o;
  o.kernel = kernel;
  return pack_weight(p, o);
}

Status unpack(const Buffer& in, Buffer& out, const char* kernel = nullptr) {
  PackWeightParams p{in.view, out.view};
  p.in.layout = Layout::cpu_vnni2_n32;
  RunOptions o;
  o.kernel = kernel;
  return unpack_weight(p, o);
}

std::vector<uint16_t> halves(const Buffer& b) {
  std::vector<uint16_t> v(static_cast<size_t>(b.numel()));
  std::memcpy(v.data(), b.bytes.data(), v.size() * 2);
  return v;
}

void expect_all_ok(const std::vector<testing::CaseResult>& rs) {
  ASSERT_FALSE(rs.empty());
  for (const auto& r : rs) EXPECT_TRUE(r.ok) << r.kernel << " / " << r.name << ": " << r.detail;
}

// dst(n, c) = ((n/32 * K/2 + c/2) * 32 + n%32) * 2 + c%2. Worked by hand, K = 6 (K/2 = 3):
//   (0, 0)  -> 0;  (0, 1) -> 1 (pair partner);  (1, 0) -> 2 (next row, same pair)
//   (31, 1) -> 31*2 + 1                                  -> 63 (end of K-pair 0 of panel 0)
//   (0, 2)  -> pair 1: 1 * 32 * 2                        -> 64
//   (5, 5)  -> pair 2, row 5, odd: (2*32 + 5) * 2 + 1    -> 139
//   (32, 0) -> panel 1: (1*3 * 32) * 2                   -> 192 = 32 * K
//   (63, 5) -> ((1*3 + 2) * 32 + 31) * 2 + 1             -> 383 (last of 64 x 6)
TEST(PackWeight, ClosedFormHandWorked) {
  const int64_t K = 6;
  EXPECT_EQ(vnni2_index(0, 0, K), 0);
  EXPECT_EQ(vnni2_index(0, 1, K), 1);
  EXPECT_EQ(vnni2_index(1, 0, K), 2);
  EXPECT_EQ(vnni2_index(31, 1, K), 63);
  EXPECT_EQ(vnni2_index(0, 2, K), 64);
  EXPECT_EQ(vnni2_index(5, 5, K), 139);
  EXPECT_EQ(vnni2_index(32, 0, K), 192);
  EXPECT_EQ(vnni2_index(63, 5, K), 383);
}

TEST(PackWeight, ClosedFormIsAPermutation) {
  for (const auto& [N, K] : {std::pair<int64_t, int64_t>{32, 2}, {64, 6}, {96, 64}}) {
    std::set<int64_t> seen;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < K; ++c) {
        const int64_t i = vnni2_index(n, c, K);
        EXPECT_GE(i, 0);
        EXPECT_LT(i, N * K);
        seen.insert(i);
      }
    }
    EXPECT_EQ(int64_t(seen.size()), N * K) << N << "x" << K;
  }
}

// One 16-row vector of the micro-kernel: rows 0..15 of K-pair q, as (row, pair) bf16 values.
TEST(PackWeight, OnePanelLiteral) {
  Buffer in(DType::bf16, {32, 4}), out(DType::bf16, {32, 4});
  auto* src = in.data<uint16_t>();
  for (int64_t n = 0; n < 32; ++n) {
    for (int64_t c = 0; c < 4; ++c) src[n * 4 + c] = uint16_t(n * 100 + c);
  }
  ASSERT_TRUE(pack(in, out).ok());
  const std::vector<uint16_t> got = halves(out);
  // K-pair 0: (row 0: c0, c1), (row 1: c0, c1), ...; K-pair 1 starts at 64.
  EXPECT_EQ(got[0], 0);
  EXPECT_EQ(got[1], 1);
  EXPECT_EQ(got[2], 100);
  EXPECT_EQ(got[3], 101);
  EXPECT_EQ(got[62], 3100);
  EXPECT_EQ(got[63], 3101);
  EXPECT_EQ(got[64], 2);
  EXPECT_EQ(got[65], 3);
  EXPECT_EQ(got[127], 3103);
}

TEST(PackWeight, MatchesSequentialWalkOracle) {
  for (const auto& [d, dims] : {std::pair<DType, std::vector<int64_t>>{DType::bf16, {3, 64, 160}},
                                {DType::f16, {96, 6}},
                                {DType::bf16, {2, 2, 32, 34}}}) {
    const Buffer in = random_bits(d, dims, 5);
    Buffer out(d, dims);
    ASSERT_TRUE(pack(in, out).ok());
    EXPECT_EQ(halves(out), testing::oracle_pack_weight(in.view, false)) << dtype_name(d);
  }
}

TEST(PackWeight, RoundTripBitExact) {
  const Buffer in = random_bits(DType::bf16, {4, 128, 96}, 9);
  Buffer packed(DType::bf16, {4, 128, 96}), back(DType::bf16, {4, 128, 96});
  ASSERT_TRUE(pack(in, packed).ok());
  EXPECT_NE(halves(packed), halves(in));
  ASSERT_TRUE(unpack(packed, back).ok());
  EXPECT_EQ(halves(back), halves(in));
}

TEST(PackWeight, EmptyTensorIsANoOp) {
  Buffer in(DType::bf16, {0, 32, 32}), out(DType::bf16, {0, 32, 32});
  out.fill_bytes(0xAB);
  EXPECT_TRUE(pack(in, out).ok());
  EXPECT_TRUE(unpack(in, out).ok());
}

TEST(PackWeight, RegisteredRefKernels) {
  const Kernel* p = registry().find("pack_weight_ref");
  const Kernel* u = registry().find("unpack_weight_ref");
  ASSERT_NE(p, nullptr);
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(p->op, OpKind::pack_weight);
  EXPECT_EQ(u->op, OpKind::unpack_weight);
  EXPECT_EQ(p->backend, Backend::ref);
  EXPECT_EQ(p->priority, 0);
  OpKind op;
  ASSERT_TRUE(parse_op("pack_weight", &op));
  EXPECT_EQ(op, OpKind::pack_weight);
  EXPECT_STREQ(layout_name(Layout::cpu_vnni2_n32), "cpu_vnni2_n32");
  Buffer in(DType::bf16, {32, 32}), out(DType::bf16, {32, 32});
  EXPECT_TRUE(pack(in, out, "pack_weight_ref").ok());
  EXPECT_FALSE(pack(in, out, "unpack_weight_ref").ok()) << "a kernel of another op must not be accepted";
}

// The CPU kernels (threads over panels, word transposes) equal the ref bit for bit, both ways, on
// several matrices, panel counts and K not a multiple of the 16-pair block.
TEST(PackWeight, CpuKernelsMatchRef) {
  if (registry().find("pack_weight_cpu") == nullptr) GTEST_SKIP() << "CPU backend not compiled in";
  for (const auto& dims : std::vector<std::vector<int64_t>>{{32, 2}, {3, 96, 70}, {2, 64, 4096}, {1, 2, 32, 34}}) {
    const Buffer in = random_bits(DType::bf16, dims, 7);
    Buffer a(DType::bf16, dims), b(DType::bf16, dims), ua(DType::bf16, dims), ub(DType::bf16, dims);
    ASSERT_TRUE(pack(in, a, "pack_weight_ref").ok());
    ASSERT_TRUE(pack(in, b, "pack_weight_cpu").ok());
    EXPECT_EQ(halves(a), halves(b));
    ASSERT_TRUE(unpack(a, ua, "unpack_weight_ref").ok());
    ASSERT_TRUE(unpack(a, ub, "unpack_weight_cpu").ok());
    EXPECT_EQ(halves(ua), halves(ub));
    EXPECT_EQ(halves(ub), halves(in));
  }
}

TEST(PackWeight, RefRefusesDeviceTensors) {
  Buffer in(DType::bf16, {32, 32}), out(DType::bf16, {32, 32});
  PackWeightParams p{in.view, out.view};
  p.out.layout = Layout::cpu_vnni2_n32;
  p.in.device = p.out.device = Device::cuda;
  RunOptions o;
  o.kernel = "pack_weight_ref";
  const Status s = pack_weight(p, o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("host"), std::string::npos) << s.to_string();
}

// ---------------------------------------------------------------- validation
struct ErrorCase {
  const char* what;
  std::vector<int64_t> in_dims, out_dims;
  DType in_dtype, out_dtype;
  Layout in_layout, out_layout;
  const char* must_contain[3];
};

constexpr Layout kRow = Layout::row_major, kVnni = Layout::cpu_vnni2_n32;

TEST(PackWeight, ValidationErrorsNameTheArgument) {
  const std::vector<ErrorCase> cases = {
      {"N not a multiple of 32", {48, 32}, {48, 32}, DType::bf16, DType::bf16, kRow, kVnni,
       {"out:", "N % 32 == 0", "[48, 32]"}},
      {"K odd", {2, 32, 33}, {2, 32, 33}, DType::bf16, DType::bf16, kRow, kVnni, {"out:", "K % 2 == 0", "33]"}},
      {"1-D", {64}, {64}, DType::bf16, DType::bf16, kRow, kVnni, {"in:", "2-4 dims", "[64]"}},
      {"f32", {32, 32}, {32, 32}, DType::f32, DType::f32, kRow, kVnni, {"in:", "dtype", "f32"}},
      {"i32", {32, 32}, {32, 32}, DType::i32, DType::i32, kRow, kVnni, {"in:", "dtype", "i32"}},
      {"out shape", {32, 64}, {64, 32}, DType::bf16, DType::bf16, kRow, kVnni, {"out:", "[32, 64]", "[64, 32]"}},
      {"out dtype", {32, 32}, {32, 32}, DType::bf16, DType::f16, kRow, kVnni, {"out:", "bf16", "f16"}},
      {"in layout", {32, 32}, {32, 32}, DType::bf16, DType::bf16, kVnni, kVnni, {"in:", "row_major", "cpu_vnni2_n32"}},
      {"out layout row_major", {32, 32}, {32, 32}, DType::bf16, DType::bf16, kRow, kRow,
       {"out:", "packed layout (cpu_vnni2_n32)", "got row_major"}},
      {"out layout shuffled", {32, 32}, {32, 32}, DType::bf16, DType::bf16, kRow, Layout::shuffled_16x16,
       {"out:", "packed layout", "shuffled_16x16"}},
  };
  for (const ErrorCase& c : cases) {
    Buffer in(c.in_dtype, c.in_dims), out(c.out_dtype, c.out_dims);
    PackWeightParams p{in.view, out.view};
    p.in.layout = c.in_layout;
    p.out.layout = c.out_layout;
    out.fill_bytes(0xAB);
    const std::vector<unsigned char> before = out.bytes;
    const Status s = pack_weight(p);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << c.what << ": " << s.to_string();
    for (const char* m : c.must_contain) {
      EXPECT_NE(s.message().find(m), std::string::npos) << c.what << ": '" << m << "' not in: " << s.message();
    }
    EXPECT_EQ(out.bytes, before) << c.what << ": output written on an invalid call";
  }
}

TEST(PackWeight, MissingNonContiguousAndAliasingRejected) {
  Buffer in(DType::bf16, {32, 64}), out(DType::bf16, {32, 64});
  PackWeightParams p{in.view, out.view};
  p.out.layout = kVnni;

  PackWeightParams q = p;
  q.out = TensorView();
  Status s = pack_weight(q);
  EXPECT_NE(s.message().find("out: required"), std::string::npos) << s.to_string();

  q = p;
  q.in = TensorView();
  s = pack_weight(q);
  EXPECT_NE(s.message().find("in: required"), std::string::npos) << s.to_string();

  q = p;
  q.in.stride[0] = 128;  // row-strided view of a wider buffer
  s = pack_weight(q);
  EXPECT_NE(s.message().find("in: must be contiguous"), std::string::npos) << s.to_string();

  q = p;
  q.out.data = in.bytes.data();  // in place
  s = pack_weight(q);
  EXPECT_NE(s.message().find("out: must not overlap in"), std::string::npos) << s.to_string();

  q = p;
  q.out.device = Device::cuda;
  s = pack_weight(q);
  EXPECT_NE(s.message().find("out: is on cuda"), std::string::npos) << s.to_string();
}

TEST(PackWeight, PoisonedOutputUnchangedOnInvalidCall) {
  const Buffer in = random_bits(DType::bf16, {2, 48, 64}, 3);  // N = 48: not packable
  Buffer out(DType::bf16, {2, 48, 64});
  out.fill_bytes(0xAB);
  const std::vector<unsigned char> before = out.bytes;
  EXPECT_EQ(pack(in, out).code(), StatusCode::invalid_argument);
  EXPECT_EQ(unpack(in, out).code(), StatusCode::invalid_argument);
  EXPECT_EQ(out.bytes, before);
}

TEST(UnpackWeight, ValidationErrors) {
  Buffer in(DType::bf16, {32, 64}), out(DType::bf16, {32, 64});
  PackWeightParams p{in.view, out.view};  // in left row_major: not a packed tensor
  Status s = unpack_weight(p);
  EXPECT_NE(s.message().find("in: layout must be a packed layout (cpu_vnni2_n32), got row_major"), std::string::npos)
      << s.to_string();
  p.in.layout = kVnni;
  p.out.layout = kVnni;
  s = unpack_weight(p);
  EXPECT_NE(s.message().find("out:"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("row_major"), std::string::npos) << s.to_string();
  Buffer odd(DType::bf16, {40, 64}), odd_out(DType::bf16, {40, 64});
  s = unpack(odd, odd_out);
  EXPECT_NE(s.message().find("in: layout cpu_vnni2_n32 needs N % 32 == 0"), std::string::npos) << s.to_string();
}

TEST(UnpackWeight, MatchesSequentialWalkOracle) {
  Buffer in = random_bits(DType::f16, {2, 64, 10}, 4);
  in.view.layout = kVnni;
  Buffer out(DType::f16, {2, 64, 10});
  ASSERT_TRUE(unpack(in, out).ok());
  EXPECT_EQ(halves(out), testing::oracle_pack_weight(in.view, true));
}

// ---------------------------------------------------------------- fused_moe with packed weights
TEST(PackWeight, FusedMoeFrontDoorChecksPackedWeights) {
  testing::MoeShape s;
  s.T = 2;
  s.E = 2;
  s.k = 1;
  s.H = 48;  // w2 [E, 48, I]: N = 48 is not a multiple of 32
  s.I = 64;
  s.scheme = testing::Scheme::bf16;
  testing::MoeProblem p;
  ASSERT_TRUE(testing::make_moe_problem(s, {}, 1, &p).ok());
  FusedMoeParams f = p.params();
  f.w1.layout = f.w2.layout = kVnni;
  p.out.fill_bytes(0xAB);
  const std::vector<unsigned char> before = p.out.bytes;
  Status st = fused_moe(f);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument);
  EXPECT_NE(st.message().find("w2: layout cpu_vnni2_n32 needs N % 32 == 0 and K % 2 == 0, got [N, K] = [48, 64]"),
            std::string::npos)
      << st.to_string();
  f.w2.layout = kRow;
  st = fused_moe(f);
  EXPECT_NE(st.message().find("w2: layout must equal w1's (cpu_vnni2_n32), got row_major"), std::string::npos)
      << st.to_string();
  EXPECT_EQ(p.out.bytes, before);

  testing::MoeShape q = s;
  q.H = 64;
  q.scheme = testing::Scheme::f32;
  testing::MoeProblem f32;
  ASSERT_TRUE(testing::make_moe_problem(q, {}, 1, &f32).ok());
  f = f32.params();
  f.w1.layout = f.w2.layout = kVnni;
  st = fused_moe(f);
  EXPECT_NE(st.message().find("w1: layout cpu_vnni2_n32 needs bf16, f16 or fp8 elements, got f32"), std::string::npos)
      << st.to_string();
}

// The reference fused_moe reads packed weights too: bit-identical to its row_major result.
TEST(PackWeight, FusedMoeRefOnPackedWeightsIsBitIdentical) {
 for (testing::Scheme scheme : {testing::Scheme::bf16, testing::Scheme::fp8_channel}) {
  SCOPED_TRACE(testing::scheme_name(scheme));
  testing::MoeShape s;
  s.T = 5;
  s.E = 4;
  s.k = 2;
  s.H = 64;
  s.I = 48;  // I % 32 != 0: the CPU kernels refuse, the default dispatch falls back to the ref
  s.scheme = scheme;
  testing::MoeProblem p;
  ASSERT_TRUE(testing::make_moe_problem(s, {}, 2, &p).ok());
  RunOptions o;
  o.kernel = scheme == testing::Scheme::bf16 ? "fused_moe_ref" : "fused_moe_ref_fp8_row";
  p.out.fill_bytes(0xFF);
  ASSERT_TRUE(fused_moe(p.params(), o).ok());
  const std::vector<unsigned char> plain = p.out.bytes;
  ASSERT_TRUE(testing::pack_moe_weights(&p).ok());
  EXPECT_EQ(p.params().w1.layout, kVnni);
  p.out.fill_bytes(0xFF);
  ASSERT_TRUE(fused_moe(p.params(), o).ok());
  EXPECT_EQ(p.out.bytes, plain);
  p.out.fill_bytes(0xFF);
  ASSERT_TRUE(fused_moe(p.params()).ok()) << "default dispatch must find a kernel for packed weights";
  EXPECT_EQ(p.out.bytes, plain);
 }
}

// fp8 weights pack too (a K-pair is a 16-bit word): bit-exact round trip, ref and CPU kernels equal.
TEST(PackWeight, Fp8RoundTripRefAndCpu) {
  for (DType d : {DType::fp8_e4m3fn, DType::fp8_e4m3fnuz}) {
    const std::vector<int64_t> dims = {3, 64, 70};
    const Buffer in = random_bits(d, dims, 9);
    Buffer a(d, dims), b(d, dims), back(d, dims);
    ASSERT_TRUE(pack(in, a, "pack_weight_ref").ok());
    if (registry().find("pack_weight_cpu") != nullptr) {
      ASSERT_TRUE(pack(in, b, "pack_weight_cpu").ok());
      EXPECT_TRUE(std::equal(a.bytes.begin(), a.bytes.begin() + long(a.numel()), b.bytes.begin()));
    }
    // One spot check of the closed form in bytes: element (n, c) of matrix 1.
    const int64_t n = 37, c = 9, K = 70;
    EXPECT_EQ(a.bytes[size_t(64 * 70 + vnni2_index(n, c, K))], in.bytes[size_t(64 * 70 + n * K + c)]);
    for (const char* k : {"unpack_weight_ref", "unpack_weight_cpu"}) {
      if (registry().find(k) == nullptr) continue;
      back.fill_bytes(0);
      ASSERT_TRUE(unpack(a, back, k).ok()) << k;
      const size_t ne = size_t(in.numel());  // 1 byte per element (the buffers may hold spare bytes)
      EXPECT_TRUE(std::equal(back.bytes.begin(), back.bytes.begin() + long(ne), in.bytes.begin())) << k;
    }
  }
}

// ---------------------------------------------------------------- harness hooks
TEST(PackWeight, CheckHookOnPresets) {
  for (const char* model : {"mixtral", "qwen3-moe"}) {
    testing::CheckRequest req;
    req.shape.model = model;
    req.edge_cases = std::string(model) == "mixtral";
    expect_all_ok(testing::check_pack_weight(req));
  }
}

TEST(UnpackWeight, CheckHookOnPresets) {
  for (const char* model : {"llama4", "deepseek-v3"}) {
    testing::CheckRequest req;
    req.shape.model = model;
    req.edge_cases = std::string(model) == "llama4";
    expect_all_ok(testing::check_unpack_weight(req));
  }
}

TEST(PackWeight, CheckHookReportsUnpackableCustomShapeAsRejected) {
  testing::CheckRequest req;
  req.shape.hidden = 100;  // w2 [E, 100, I]: N = 100 must be reported as an expected rejection
  req.edge_cases = false;
  const auto results = testing::check_pack_weight(req);
  ASSERT_FALSE(results.empty());
  for (const auto& r : results) EXPECT_TRUE(r.ok) << r.name << ": " << r.detail;
}

}  // namespace
}  // namespace moekit
