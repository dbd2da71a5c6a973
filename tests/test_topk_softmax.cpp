// Tests of topk_softmax (SPEC 1.1, include/moekit/ops/routing.h): named edge cases first, then
// random cases against the float64 oracle (src/testing/oracle_routing.h), then the `moekit check`
// cases on the model presets. Run: ./build/tests/moekit_tests --gtest_filter='TopkSoftmax*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/cpu_simd.h"
#include "moekit/core/config.h"
#include "moekit/ops/routing.h"
#include "routing_test_util.h"
#include "testing/harness.h"
#include "testing/oracle_routing.h"

namespace moekit {
namespace {

using routing_test::expect_error;
using routing_test::kInf;
using routing_test::kNaN;
using testing::Buffer;
using testing::logits_from_rows;
using testing::Rng;

// Outputs (token_expert_indices too) poisoned with 0xAB, and the params pointing at them.
struct Call : routing_test::RoutingCall<TopkSoftmaxParams, topk_softmax> {
  Buffer tei;
  Call(const Buffer& gating, int k, bool renormalize = false, bool with_tei = true)
      : RoutingCall(gating, k), tei(DType::i32, {gating.view.shape[0], k}) {
    tei.fill_bytes(0xAB);
    p.renormalize = renormalize;
    if (with_tei) p.token_expert_indices = tei.view;
  }
};

// Runs `c` and compares everything with the oracle (ids and tei exactly).
void expect_matches_oracle(Call& c, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(c.run().ok());
  const testing::RoutingExpect e = testing::oracle_topk_softmax(c.p);
  c.expect_outputs_match(e);
  if (c.p.token_expert_indices.present()) {
    const testing::Metrics mt =
        testing::compare_exact(testing::to_ints(c.tei.view), e.token_expert_indices, {e.T, e.k});
    EXPECT_EQ(mt.mismatches, 0) << mt.worst;
  }
}

Buffer certified_logits(uint64_t seed, int64_t T, int64_t E, int k, DType dt, float grid = 1.0f / 256,
                        int64_t stride = 0) {
  Rng rng(seed);
  return testing::random_logits(rng, T, E, dt, 2.0f, grid, stride, [k](const TensorView& g) {
    TopkSoftmaxParams p;
    p.gating = g;
    p.k = k;
    return testing::oracle_topk_softmax(p).min_rel_gap;
  });
}

// ------------------------------------------------------------------ edge cases
TEST(TopkSoftmax, T0ReturnsOkAndWritesNothing) {
  Buffer g(DType::bf16, {0, 8});
  Call c(g, 2, true);
  ASSERT_TRUE(c.run().ok());
  routing_test::expect_untouched({&c.w, &c.ids, &c.tei});
}

TEST(TopkSoftmax, T1MatchesClosedForm) {
  Buffer g = logits_from_rows({{0, 1, 2, 3, 4, 5, 6, 7}});
  Call c(g, 2);
  ASSERT_TRUE(c.run().ok());
  double sum = 0;
  for (int e = 0; e < 8; ++e) sum += std::exp(double(e));
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{7, 6}));
  EXPECT_NEAR(c.row_w(0)[0], std::exp(7.0) / sum, 1e-6);
  EXPECT_NEAR(c.row_w(0)[1], std::exp(6.0) / sum, 1e-6);
  EXPECT_EQ(c.tei.data<int32_t>()[0], 0);
  EXPECT_EQ(c.tei.data<int32_t>()[1], 1);  // j*T + t with T = 1
}

TEST(TopkSoftmax, K1PicksTheArgmax) {
  Buffer g = logits_from_rows({{0.5f, -1, 3, 2.9f}, {9, 0, 0, 0}, {-5, -4, -3, -6}});
  Call c(g, 1, true);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), std::vector<int>{2});
  EXPECT_EQ(c.row_ids(1), std::vector<int>{0});
  EXPECT_EQ(c.row_ids(2), std::vector<int>{2});
  for (int t = 0; t < 3; ++t) EXPECT_FLOAT_EQ(c.row_w(t)[0], 1.0f);  // renormalized single pick
}

TEST(TopkSoftmax, KEqualsEReturnsEveryExpertInDescendingOrder) {
  Buffer g = logits_from_rows({{0.25f, -1, 3, 2, 0.5f, 1}});
  Call c(g, 6);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{2, 3, 5, 4, 0, 1}));
  float sum = 0;
  for (float w : c.row_w(0)) sum += w;
  EXPECT_NEAR(sum, 1.0f, 1e-6f);  // no renormalize needed: the whole mass
}

TEST(TopkSoftmax, ExpertsNotAPowerOfTwo) {
  for (int64_t E : {6, 60, 257}) {
    Buffer g = certified_logits(uint64_t(E), 9, E, 3, DType::bf16);
    Call c(g, 3, true);
    expect_matches_oracle(c, "E=" + std::to_string(E));
  }
}

TEST(TopkSoftmax, MoreExpertsThanTokens) {
  Buffer g = certified_logits(3, 2, 128, 8, DType::f32);
  Call c(g, 8, true);
  expect_matches_oracle(c, "T=2 E=128");
}

TEST(TopkSoftmax, AllTokensPreferOneExpert) {
  Buffer g = certified_logits(4, 16, 12, 2, DType::f32);
  for (int64_t t = 0; t < 16; ++t) g.set(t * 12 + 7, 30.0f);
  Call c(g, 2);
  ASSERT_TRUE(c.run().ok());
  for (int64_t t = 0; t < 16; ++t) {
    EXPECT_EQ(c.row_ids(t)[0], 7);
    EXPECT_NEAR(c.row_w(t)[0], 1.0f, 1e-6f);
  }
  expect_matches_oracle(c, "one expert");
}

TEST(TopkSoftmax, TiedLogitsGoToTheLowerId) {
  Buffer g = logits_from_rows({{0, 0, 0, 0, 0, 0}, {1, 3, 3, 1, 3, 0}, {-2, 5, -2, -2, 5, -2}});
  Call c(g, 3);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{0, 1, 2}));
  for (float w : c.row_w(0)) EXPECT_FLOAT_EQ(w, 1.0f / 6);
  EXPECT_EQ(c.row_ids(1), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(c.row_ids(2), (std::vector<int>{1, 4, 0}));
  // Coarse logits: ties everywhere, in every dtype.
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    Buffer q = certified_logits(5, 20, 32, 6, dt, 0.5f);
    Call cq(q, 6, true);
    expect_matches_oracle(cq, std::string("ties ") + dtype_name(dt));
  }
}

TEST(TopkSoftmax, NanCountsAsMinusInf) {
  Buffer g = logits_from_rows({{kNaN, 1, kNaN, 0, -kInf}});
  Call c(g, 3, true);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{1, 3, 0}));  // then NaN (= -inf) ties, lower id first
  const float e = std::exp(1.0f);
  EXPECT_NEAR(c.row_w(0)[0], e / (e + 1), 1e-6f);
  EXPECT_NEAR(c.row_w(0)[1], 1 / (e + 1), 1e-6f);
  EXPECT_EQ(c.row_w(0)[2], 0.0f);
}

TEST(TopkSoftmax, AllNanOrAllMinusInfRowGivesIdsZeroToKWithWeightZero) {
  for (bool renorm : {false, true}) {
    Buffer g = logits_from_rows({{kNaN, kNaN, kNaN, kNaN, kNaN}, {-kInf, -kInf, -kInf, -kInf, -kInf},
                                 {kNaN, -kInf, kNaN, -kInf, kNaN}});
    Call c(g, 3, renorm);
    ASSERT_TRUE(c.run().ok());
    for (int64_t t = 0; t < 3; ++t) {
      EXPECT_EQ(c.row_ids(t), (std::vector<int>{0, 1, 2}));
      for (float w : c.row_w(t)) EXPECT_EQ(w, 0.0f);  // exactly 0, never NaN
    }
  }
}

TEST(TopkSoftmax, PlusInfLogitsShareTheMass) {
  Buffer g = logits_from_rows({{1, kInf, 2, kInf, kNaN}, {kInf, kNaN, kNaN, kNaN, kNaN}});
  Call c(g, 3, true);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{1, 3, 0}));
  EXPECT_EQ(c.row_w(0), (std::vector<float>{0.5f, 0.5f, 0.0f}));
  EXPECT_EQ(c.row_ids(1), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(c.row_w(1), (std::vector<float>{1.0f, 0.0f, 0.0f}));
}

TEST(TopkSoftmax, NonFiniteRowsMatchOracleAndIdsStayDistinct) {
  Buffer g = routing_test::pool_logits(6, 40, 10, DType::f32);
  Call c(g, 4, true);
  expect_matches_oracle(c, "random non-finite");
  for (int64_t t = 0; t < 40; ++t) {
    routing_test::expect_distinct_ids(c.row_ids(t), 10);
    for (float w : c.row_w(t)) EXPECT_TRUE(std::isfinite(w));
  }
}

TEST(TopkSoftmax, RowStridedGatingMatchesContiguous) {
  Buffer strided = certified_logits(7, 11, 20, 4, DType::bf16, 1.0f / 256, 29);  // padding holds 100
  Buffer dense(DType::bf16, {11, 20});
  for (int64_t t = 0; t < 11; ++t) {
    for (int64_t e = 0; e < 20; ++e) dense.set(t * 20 + e, strided.get(t * 29 + e));
  }
  Call a(strided, 4, true), b(dense, 4, true);
  ASSERT_TRUE(a.run().ok());
  ASSERT_TRUE(b.run().ok());
  a.expect_same_outputs(b);
  expect_matches_oracle(a, "row-strided");
}

TEST(TopkSoftmax, GatingDtypesAgreeOnExactlyRepresentableLogits) {
  Buffer g32 = certified_logits(8, 13, 24, 5, DType::f32, 1.0f / 16);
  Buffer gbf(DType::bf16, {13, 24}), gf16(DType::f16, {13, 24});
  for (int64_t i = 0; i < g32.numel(); ++i) {
    gbf.set(i, g32.get(i));
    gf16.set(i, g32.get(i));
    ASSERT_EQ(gbf.get(i), g32.get(i));  // |x| < 8 on a 1/16 grid: exact in bf16 and f16
  }
  Call a(g32, 5), b(gbf, 5), c(gf16, 5);
  ASSERT_TRUE(a.run().ok());
  ASSERT_TRUE(b.run().ok());
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(a.ids.bytes, b.ids.bytes);
  EXPECT_EQ(a.ids.bytes, c.ids.bytes);
  EXPECT_EQ(a.w.bytes, b.w.bytes);
  EXPECT_EQ(a.w.bytes, c.w.bytes);
}

TEST(TopkSoftmax, RenormalizeOnAndOff) {
  Buffer g = certified_logits(9, 17, 16, 4, DType::f32);
  Call off(g, 4, false), on(g, 4, true);
  ASSERT_TRUE(off.run().ok());
  ASSERT_TRUE(on.run().ok());
  EXPECT_EQ(off.ids.bytes, on.ids.bytes);
  for (int64_t t = 0; t < 17; ++t) {
    float sum_off = 0, sum_on = 0;
    for (int j = 0; j < 4; ++j) {
      sum_off += off.row_w(t)[size_t(j)];
      sum_on += on.row_w(t)[size_t(j)];
    }
    EXPECT_LT(sum_off, 1.0f);
    EXPECT_NEAR(sum_on, 1.0f, 1e-6f);
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(on.row_w(t)[size_t(j)], off.row_w(t)[size_t(j)] / sum_off, 1e-6f);
  }
  expect_matches_oracle(off, "renormalize off");
  expect_matches_oracle(on, "renormalize on");
}

TEST(TopkSoftmax, TokenExpertIndicesPresentOrAbsent) {
  Buffer g = certified_logits(10, 5, 8, 3, DType::f32);
  Call with(g, 3, false, true), without(g, 3, false, false);
  ASSERT_TRUE(with.run().ok());
  ASSERT_TRUE(without.run().ok());
  for (int64_t t = 0; t < 5; ++t) {
    for (int j = 0; j < 3; ++j) EXPECT_EQ(with.tei.data<int32_t>()[t * 3 + j], j * 5 + t);
  }
  routing_test::expect_untouched({&without.tei});  // not passed, not touched
  with.expect_same_outputs(without);
}

TEST(TopkSoftmax, InvalidArgumentsNameTheArgument) {
  using P = TopkSoftmaxParams;
  Buffer g(DType::f32, {4, 8});
  const routing_test::ArgumentErrors errors([&] { return Call(g, 2); });
  errors.expect([](P& p) { p.gating = TensorView(); }, "gating: required");
  errors.expect_replaced(&P::gating, DType::i32, {4, 8}, "gating: dtype must be f32|bf16|f16, got i32");
  errors.expect_replaced(&P::gating, DType::f32, {2, 2, 8}, "gating: shape must be [*, *], got [2, 2, 8]");
  errors.expect([](P& p) { p.gating.stride[1] = 2; }, "gating: must be 2-D with a contiguous last dim");
  errors.expect_replaced(&P::gating, DType::f32, {4, 0}, "gating: number of experts (dim 1) must be >= 1, got 0");
  for (int k : {0, 9, -1}) {
    errors.expect([k](P& p) { p.k = k; }, "k: must be in [1, Eg=8], got " + std::to_string(k));
  }
  errors.expect([](P& p) { p.topk_weights = TensorView(); }, "topk_weights: required");
  errors.expect_replaced(&P::topk_weights, DType::bf16, {4, 2}, "topk_weights: dtype must be f32, got bf16");
  errors.expect_replaced(&P::topk_weights, DType::f32, {4, 3}, "topk_weights: shape must be [4, 2], got [4, 3]");
  Buffer wide(DType::f32, {4, 4});
  errors.expect(
      [&](P& p) {
        p.topk_weights = wide.view;
        p.topk_weights.shape[1] = 2;  // row stride 4: not contiguous
      },
      "topk_weights: must be contiguous");
  errors.expect_replaced(&P::topk_ids, DType::f32, {4, 2}, "topk_ids: dtype must be i32, got f32");
  errors.expect_replaced(&P::topk_ids, DType::i32, {5, 2}, "topk_ids: shape must be [4, 2], got [5, 2]");
  errors.expect([](P& p) { p.topk_ids.device = Device::cuda; }, "topk_ids: is on cuda:0 but gating is on cpu:0");
  errors.expect_replaced(&P::token_expert_indices, DType::i32, {4, 3},
                         "token_expert_indices: shape must be [4, 2], got [4, 3]");
  errors.expect_replaced(&P::token_expert_indices, DType::f32, {4, 2},
                         "token_expert_indices: dtype must be i32, got f32");
}

// Never dereferenced: validation fails before any access.
TEST(TopkSoftmax, TokenExpertIndicesMustFitInt32) {
  // Views of 16 GiB each that validation never reads: fake, disjoint base addresses 1 TiB apart (one
  // shared dummy made the outputs overlap each other and gating, refused before the T*k check).
  auto fake = [](int i) { return reinterpret_cast<void*>(uintptr_t(i) << 40); };
  const int64_t T = int64_t(1) << 29;
  TopkSoftmaxParams p;
  p.gating = TensorView::contiguous(fake(1), DType::bf16, {T, 16});
  p.k = 8;
  p.topk_weights = TensorView::contiguous(fake(2), DType::f32, {T, 8});
  p.topk_ids = TensorView::contiguous(fake(3), DType::i32, {T, 8});
  EXPECT_TRUE(validate_topk_softmax(p).ok());  // without indices nothing overflows
  p.token_expert_indices = TensorView::contiguous(fake(4), DType::i32, {T, 8});
  expect_error(validate_topk_softmax(p), "token_expert_indices: T*k = 536870912*8 = 4294967296 exceeds");
}

TEST(TopkSoftmax, InvalidCallLeavesOutputsUntouched) {
  Buffer g = certified_logits(11, 6, 8, 2, DType::f32);
  Buffer bad_tei(DType::i32, {6, 3});  // checked last: everything before it is valid
  Call c(g, 2, true);
  c.p.token_expert_indices = bad_tei.view;
  bad_tei.fill_bytes(0xAB);
  const Buffer w0 = c.w, ids0 = c.ids;
  EXPECT_FALSE(c.run().ok());
  EXPECT_EQ(c.w.bytes, w0.bytes);
  EXPECT_EQ(c.ids.bytes, ids0.bytes);
  routing_test::expect_untouched({&bad_tei});
}

TEST(TopkSoftmax, RefKernelIsRegisteredAndRefusesDeviceTensors) {
  Buffer g(DType::f32, {2, 8});
  Call c(g, 2);
  routing_test::expect_ref_kernel_registered(OpKind::topk_softmax, "topk_softmax_ref", c.p, &TopkSoftmaxParams::gating,
                                             "gating");
}

// ------------------------------------------------------------------ random cases
TEST(TopkSoftmax, RandomMatchesOracle) {
  routing_test::for_each_random_case(
      {{1, 8, 2}, {33, 8, 2}, {17, 128, 8}, {5, 256, 8}, {24, 60, 4}, {7, 257, 6}},
      [](uint64_t seed, const routing_test::Shape& s, DType dt, const std::string& what) {
        Buffer g = certified_logits(seed * 1000 + uint64_t(s.E), s.T, s.E, s.k, dt);
        Call c(g, s.k, (seed + uint64_t(s.T)) % 2 == 0, seed % 2 == 1);
        expect_matches_oracle(c, what);
      });
}

// ------------------------------------------------------------------ the `moekit check` cases
// The edge cases run on mixtral only: they do not depend on the preset.
TEST(TopkSoftmax, CheckHarnessPassesOnPresets) {
  routing_test::expect_check_harness_passes(
      testing::check_topk_softmax, {"mixtral", "deepseek-v3", "llama4", "qwen3-moe"}, 6, /*require_detail=*/true);
}

TEST(TopkSoftmax, BenchProblemRuns) {
  routing_test::expect_ref_bench_problem_runs(testing::bench_topk_softmax, "qwen3-moe", "topk_softmax_ref", "E=128",
                                              /*with_flops=*/true);
}

// ------------------------------------------------------------------ CUDA kernel (topk_softmax_sm90)
// Skipped without a CUDA device. The kernel is compared with topk_softmax_ref: ids and
// token_expert_indices exactly, weights within kWeightAtol / kWeightRtol.

// One problem on the CUDA kernel (mirrored to the device) and on the ref.
void expect_cuda_matches_ref(const Buffer& gating, int k, bool renormalize, const std::string& what) {
  SCOPED_TRACE(what);
  using P = TopkSoftmaxParams;
  Call want(gating, k, renormalize), got(gating, k, renormalize);
  ASSERT_NO_FATAL_FAILURE(routing_test::expect_cuda_kernel_matches_ref(
      got, want, "topk_softmax_sm90", "topk_softmax_ref", topk_softmax, {&P::gating},
      {&P::topk_weights, &P::topk_ids, &P::token_expert_indices}));
  const testing::Metrics mt = testing::compare_exact(testing::to_ints(got.tei.view), testing::to_ints(want.tei.view),
                                                     {want.p.gating.shape[0], int64_t(k)});
  EXPECT_EQ(mt.mismatches, 0) << mt.worst;
}

TEST(TopkSoftmax, CudaKernelIsRegisteredAndRefusesHostTensorsAndLargeEg) {
  const Kernel* k = registry().find("topk_softmax_sm90");
  if (k == nullptr) GTEST_SKIP() << "built without CUDA";
  EXPECT_EQ(k->backend, Backend::cuda);
  EXPECT_GE(k->priority, 100);
  Buffer g = certified_logits(3, 2, 8, 2, DType::f32);
  Call c(g, 2);
  const Status host = k->supports(&c.p);
  EXPECT_EQ(host.code(), StatusCode::unsupported);
  EXPECT_NE(host.message().find("gating"), std::string::npos) << host.message();
  TopkSoftmaxParams big = c.p;
  for (TensorView* t : {&big.gating, &big.topk_weights, &big.topk_ids, &big.token_expert_indices}) {
    t->device = Device::cuda;
  }
  big.gating.shape[1] = 513;
  const Status wide = k->supports(&big);
  EXPECT_EQ(wide.code(), StatusCode::unsupported);
  EXPECT_NE(wide.message().find("513"), std::string::npos) << wide.message();
}

TEST(TopkSoftmax, CudaEdgeCasesMatchRef) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::expect_edge_cases_pass(Backend::cuda, testing::check_topk_softmax, "mixtral", {1});
}

TEST(TopkSoftmax, CudaNonFiniteAndTiedRowsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::for_each_nonfinite_case(
      {8, 60, 257, 512}, 100, [](int64_t, int) { return int64_t(97); },
      [](const Buffer& g, int k, int n, DType dt, const std::string& what) {
        expect_cuda_matches_ref(g, k, n % 2 == 0, what + " " + dtype_name(dt));
      });
}

TEST(TopkSoftmax, CudaRandomShapesMatchRef) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::expect_cuda_random_shapes(testing::check_topk_softmax);
}

TEST(TopkSoftmax, CudaPresetsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::expect_presets_pass(Backend::cuda, testing::check_topk_softmax,
                                    {"mixtral", "deepseek-v3", "llama4", "qwen3-moe"}, {1, 64, 4096});
}

TEST(TopkSoftmax, CudaBenchProblemRuns) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::expect_bench_problem_runs(testing::bench_topk_softmax, "deepseek-v3", "topk_softmax_sm90");
}

// ------------------------------------------------------------------ CPU kernel (topk_softmax_avx512)
// Skipped where the CPU lacks AVX-512 F/BW/VL (routing_test::cpu_unavailable()); there the kernel
// is not registered. Compared with topk_softmax_ref: ids and token_expert_indices exactly, weights
// within kWeightAtol / kWeightRtol.
namespace cpu_cases {

// One problem on the CPU kernel and on the ref.
void expect_cpu_matches_ref(const Buffer& gating, int k, bool renormalize, const std::string& what) {
  SCOPED_TRACE(what);
  Call want(gating, k, renormalize), got(gating, k, renormalize);
  routing_test::expect_kernel_matches_ref(got, want, "topk_softmax_avx512", "topk_softmax_ref", topk_softmax);
  EXPECT_EQ(got.tei.bytes, want.tei.bytes);
}

TEST(TopkSoftmax, CpuKernelIsRegisteredAndRefusesDeviceTensors) {
  Buffer g = certified_logits(3, 2, 8, 2, DType::f32);
  Call c(g, 2);
  routing_test::expect_cpu_kernel_registered(OpKind::topk_softmax, "topk_softmax_avx512", "topk_softmax_ref",
                                             c.p, &TopkSoftmaxParams::topk_ids, "topk_ids");
}

TEST(TopkSoftmax, CpuEdgeCasesMatchRef) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  routing_test::expect_edge_cases_pass(Backend::cpu, testing::check_topk_softmax, "mixtral", {1, 7, 64});
}

// T not a multiple of the thread split, E not a multiple of the 16-lane vector (or a power of two),
// k = 1 and k = E, strided rows, and problems big enough to run on every thread.
TEST(TopkSoftmax, CpuThreadSplitAndVectorTailsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  const std::vector<routing_test::Shape> shapes = {{1031, 60, 4, 0}, {517, 257, 8, 0},   {33, 17, 17, 0}, {3, 1, 1, 0},
                                                   {64, 130, 32, 0}, {301, 100, 2, 113}, {2049, 8, 2, 0}};
  routing_test::for_each_cpu_shape(shapes, [](const routing_test::Shape& s, int n, DType dt) {
    const Buffer g = certified_logits(uint64_t(40 + n), s.T, s.E, s.k, dt, 1.0f / 256, s.stride);
    expect_cpu_matches_ref(g, s.k, n % 2 == 0, routing_test::shape_name(s));
  });
}

TEST(TopkSoftmax, CpuNonFiniteAndTiedRowsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  // T = 97, but 1031 for one problem: large enough for every thread.
  routing_test::for_each_nonfinite_case(
      {8, 60, 257}, 200, [](int64_t Eg, int k) { return Eg == 60 && k == 4 ? int64_t(1031) : int64_t(97); },
      [](const Buffer& g, int k, int n, DType, const std::string& what) {
        expect_cpu_matches_ref(g, k, n % 2 == 0, what);
      });
}

// Distinct logits whose probabilities round to the same f32 (exp underflowing to 0, logits one ulp
// apart next to the maximum): the ref ranks those equal p by id, and so must the CPU kernel.
TEST(TopkSoftmax, CpuCollapsedProbabilitiesFollowTheRefTieRule) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  const float below = std::nextafter(0.25f, 0.0f), two_below = std::nextafter(below, 0.0f);
  const Buffer g = logits_from_rows({
      {0.0f, -300.0f, -200.0f, -150.0f, -120.0f, -500.0f, -110.0f, -400.0f},  // five p == 0
      {two_below, below, 0.25f, -1.0f, below, two_below, 0.25f, -2.0f},       // p may collapse
      {-104.0f, -103.0f, -90.0f, 0.0f, -103.5f, -88.0f, -87.9f, -200.0f},     // subnormal p
  });
  for (int k : {1, 3, 5, 8}) {
    for (bool renormalize : {false, true}) expect_cpu_matches_ref(g, k, renormalize, "k=" + std::to_string(k));
  }
  // Random rows drawn from a few values that collide after exp (and a few that do not).
  const float pool[] = {0.25f, below, two_below, std::nextafter(two_below, 0.0f), -1.0f, -100.0f, -103.9f, -104.0f,
                        -150.0f, -routing_test::kInf, 3.0f, std::nextafter(3.0f, 0.0f)};
  Rng rng(99);
  Buffer r(DType::f32, {301, 24});
  for (int64_t i = 0; i < r.numel(); ++i) r.set(i, pool[rng.integer(0, 9 + (i % 7 == 0 ? 2 : 0))]);
  for (int k : {1, 2, 4, 7, 24}) expect_cpu_matches_ref(r, k, k % 2 == 0, "pool k=" + std::to_string(k));
}

// The vector exp that feeds the fast path's softmax sum, against libm on the inputs it gets
// (x - max <= 0): relative error <= kExpRelErr where the result is a normal float.
MOEKIT_CPU_AVX512 void exp_approx_16(const float* x, float* out) {
  _mm512_storeu_ps(out, cpu::simd::exp_approx(_mm512_loadu_ps(x)));
}

TEST(TopkSoftmax, CpuVectorExpMeetsItsErrorBound) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  alignas(64) float x[16], y[16];
  int n = 0;
  for (uint32_t u = 0x80000000u; u < 0xFF800001u && u >= 0x80000000u; u += 1021) {  // -0 .. -inf
    std::memcpy(&x[n++], &u, 4);
    if (n < 16) continue;
    n = 0;
    exp_approx_16(x, y);
    for (int i = 0; i < 16; ++i) {
      const double want = std::exp(double(x[i]));
      if (want < 1.2e-38) {
        ASSERT_LE(y[i], 1.2e-38f) << "x=" << x[i];
        continue;
      }
      ASSERT_LE(std::fabs(double(y[i]) - want), cpu::simd::kExpRelErr * want) << "x=" << x[i] << " got " << y[i];
    }
  }
}

// The threaded split changes nothing: a big call equals itself run to run and equals, row by row,
// small (single-threaded) calls on slices of the same logits.
TEST(TopkSoftmax, CpuIsDeterministicAndIndependentOfTheThreadSplit) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  const int64_t T = 1500, E = 64;
  const int k = 6;
  const Buffer g = certified_logits(77, T, E, k, DType::bf16);
  Call a(g, k, true), b(g, k, true);
  ASSERT_NO_FATAL_FAILURE(routing_test::expect_same_run_to_run(a, b, "topk_softmax_avx512", topk_softmax));
  RunOptions opts;
  opts.kernel = "topk_softmax_avx512";
  for (int64_t t0 : {int64_t(0), int64_t(749), T - 3}) {
    Buffer slice(DType::bf16, {3, E});
    std::copy_n(g.bytes.begin() + t0 * E * 2, 3 * E * 2, slice.bytes.begin());
    Call c(slice, k, true);
    ASSERT_TRUE(topk_softmax(c.p, opts).ok());
    for (int64_t t = 0; t < 3; ++t) {
      EXPECT_EQ(c.row_ids(t), a.row_ids(t0 + t)) << "row " << t0 + t;
      EXPECT_EQ(c.row_w(t), a.row_w(t0 + t)) << "row " << t0 + t;
    }
  }
}

TEST(TopkSoftmax, CpuPresetsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  routing_test::expect_cpu_presets_pass(testing::check_topk_softmax);
}

}  // namespace cpu_cases

}  // namespace
}  // namespace moekit
