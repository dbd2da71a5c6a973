// Tests of sigmoid_topk (SPEC 1.3, include/moekit/ops/routing.h): named edge cases first, then
// random cases against the float64 oracle (src/testing/oracle_routing.h), then the `moekit check`
// cases on the model presets. Run: ./build/tests/moekit_tests --gtest_filter='SigmoidTopk*'
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "moekit/core/config.h"
#include "moekit/ops/routing.h"
#include "routing_test_util.h"
#include "testing/harness.h"
#include "testing/oracle_routing.h"

namespace moekit {
namespace {

using routing_test::kInf;
using routing_test::kNaN;
using testing::Buffer;
using testing::logits_from_rows;
using testing::Rng;

// Outputs poisoned with 0xAB, and the params pointing at them.
using Call = routing_test::RoutingCall<SigmoidTopkParams, sigmoid_topk>;

void expect_matches_oracle(Call& c, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(c.run().ok());
  c.expect_outputs_match(testing::oracle_sigmoid_topk(c.p));
}

// Raw logits compare exactly in every implementation: no certification needed.
Buffer random_logits(uint64_t seed, int64_t T, int64_t E, DType dt, float grid = 1.0f / 256, int64_t stride = 0) {
  Rng rng(seed);
  return testing::random_logits(rng, T, E, dt, 2.0f, grid, stride);
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ------------------------------------------------------------------ edge cases
TEST(SigmoidTopk, T0ReturnsOkAndWritesNothing) {
  Buffer g(DType::bf16, {0, 128});
  Call c(g, 1);
  ASSERT_TRUE(c.run().ok());
  routing_test::expect_untouched({&c.w, &c.ids});
}

TEST(SigmoidTopk, T1Llama4TopOneIsArgmaxWithSigmoidWeight) {
  Buffer g = random_logits(1, 1, 128, DType::bf16);
  g.set(93, 4.5f);
  Call c(g, 1);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), std::vector<int>{93});
  EXPECT_NEAR(c.row_w(0)[0], sigmoid(4.5), 1e-7);
}

// Weights are sigmoid of each pick on its own: not a softmax, never renormalized.
TEST(SigmoidTopk, WeightsAreSigmoidOfRawLogitsWithoutRenormalization) {
  Buffer g = logits_from_rows({{-1, 2, 0.5f, 3, -4}});
  Call c(g, 3);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{3, 1, 2}));
  const std::vector<float> w = c.row_w(0);
  EXPECT_NEAR(w[0], sigmoid(3), 1e-7);
  EXPECT_NEAR(w[1], sigmoid(2), 1e-7);
  EXPECT_NEAR(w[2], sigmoid(0.5), 1e-7);
  EXPECT_GT(w[0] + w[1] + w[2], 2.0f);
}

// Selection is on the raw logit: sigmoid(20) and sigmoid(30) are both 1.0f, but 30 still wins.
TEST(SigmoidTopk, SelectionIsOnRawLogitsNotOnSaturatedSigmoids) {
  Buffer g = logits_from_rows({{20, 30, -20, -30}});
  Call c(g, 3);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{1, 0, 2}));
  EXPECT_EQ(c.row_w(0)[0], 1.0f);
  EXPECT_EQ(c.row_w(0)[1], 1.0f);
}

TEST(SigmoidTopk, KEqualsEReturnsEveryExpertInDescendingOrder) {
  Buffer g = logits_from_rows({{0.25f, -1, 3, 2, 0.5f, 1}});
  Call c(g, 6);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{2, 3, 5, 4, 0, 1}));
  expect_matches_oracle(c, "k = E");
}

TEST(SigmoidTopk, ExpertsNotAPowerOfTwoAndMoreExpertsThanTokens) {
  for (int64_t E : {6, 60, 257}) {
    Buffer g = random_logits(uint64_t(E), 3, E, DType::bf16);
    Call c(g, 2);
    expect_matches_oracle(c, "E=" + std::to_string(E));
  }
}

TEST(SigmoidTopk, AllTokensPreferOneExpert) {
  Buffer g = random_logits(2, 16, 12, DType::f32);
  for (int64_t t = 0; t < 16; ++t) g.set(t * 12 + 11, 30.0f);
  Call c(g, 2);
  ASSERT_TRUE(c.run().ok());
  for (int64_t t = 0; t < 16; ++t) {
    EXPECT_EQ(c.row_ids(t)[0], 11);
    EXPECT_EQ(c.row_w(t)[0], 1.0f);  // sigmoid(30) rounds to 1 in f32
  }
  expect_matches_oracle(c, "one expert");
}

TEST(SigmoidTopk, TiedLogitsGoToTheLowerId) {
  Buffer g = logits_from_rows({{0, 0, 0, 0, 0}, {1, 3, 3, 1, 3}});
  Call c(g, 3);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(c.row_ids(1), (std::vector<int>{1, 2, 4}));
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    Buffer q = random_logits(3, 20, 32, dt, 0.5f);
    Call cq(q, 4);
    expect_matches_oracle(cq, std::string("ties ") + dtype_name(dt));
  }
}

TEST(SigmoidTopk, NanCountsAsMinusInfAndInfinitiesGiveZeroAndOne) {
  Buffer g = logits_from_rows({{kNaN, -kInf, 3, kInf}, {kNaN, kNaN, kNaN, kNaN}, {-kInf, -kInf, -kInf, -kInf}});
  Call c(g, 3);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{3, 2, 0}));  // NaN (id 0) ties -inf (id 1): lower id
  EXPECT_EQ(c.row_w(0)[0], 1.0f);
  EXPECT_NEAR(c.row_w(0)[1], sigmoid(3), 1e-7);
  EXPECT_EQ(c.row_w(0)[2], 0.0f);
  for (int64_t t = 1; t < 3; ++t) {
    EXPECT_EQ(c.row_ids(t), (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(c.row_w(t), (std::vector<float>{0, 0, 0}));
  }
}

TEST(SigmoidTopk, LargeNegativeLogitsGiveTinyFiniteWeights) {
  Buffer g = logits_from_rows({{-100, -90, -200, -1e30f}});
  Call c(g, 4);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{1, 0, 2, 3}));
  for (float w : c.row_w(0)) {
    EXPECT_TRUE(std::isfinite(w));
    EXPECT_GE(w, 0.0f);
    EXPECT_LT(w, 1e-38f);
  }
  EXPECT_GT(c.row_w(0)[0], 0.0f);  // sigmoid(-90) ~ 8e-40: a subnormal, not flushed through overflow
}

TEST(SigmoidTopk, NonFiniteRowsMatchOracleAndIdsStayDistinct) {
  Buffer g = routing_test::pool_logits(4, 40, 10, DType::bf16);
  Call c(g, 4);
  expect_matches_oracle(c, "random non-finite");
  for (int64_t t = 0; t < 40; ++t) routing_test::expect_distinct_ids(c.row_ids(t), 10);
}

TEST(SigmoidTopk, RowStridedGatingAndDtypesAgree) {
  Buffer strided = random_logits(5, 11, 20, DType::f32, 1.0f / 16, 27);  // exact in bf16 and f16
  const auto make = [](const Buffer& g) { return Call(g, 3); };
  Call a = make(strided);
  ASSERT_NO_FATAL_FAILURE(routing_test::expect_dense_copies_agree(strided, a, make));
  expect_matches_oracle(a, "row-strided");
}

TEST(SigmoidTopk, InvalidArgumentsNameTheArgument) {
  using P = SigmoidTopkParams;
  Buffer g(DType::f32, {4, 8});
  const routing_test::ArgumentErrors errors([&] { return Call(g, 2); });
  errors.expect([](P& p) { p.gating = TensorView(); }, "gating: required");
  errors.expect_replaced(&P::gating, DType::i32, {4, 8}, "gating: dtype must be f32|bf16|f16, got i32");
  errors.expect([](P& p) { p.gating.stride[0] = 4; },  // rows overlap
                "gating: must be 2-D with a contiguous last dim and row stride >= 8");
  for (int k : {0, 9}) errors.expect([k](P& p) { p.k = k; }, "k: must be in [1, Eg=8], got " + std::to_string(k));
  errors.expect_replaced(&P::topk_weights, DType::f32, {4, 3}, "topk_weights: shape must be [4, 2], got [4, 3]");
  errors.expect_replaced(&P::topk_weights, DType::f16, {4, 2}, "topk_weights: dtype must be f32, got f16");
  errors.expect([](P& p) { p.topk_ids = TensorView(); }, "topk_ids: required");
  errors.expect_replaced(&P::topk_ids, DType::i32, {5, 2}, "topk_ids: shape must be [4, 2], got [5, 2]");
  errors.expect(
      [](P& p) {
        p.topk_weights.device = Device::cuda;
        p.topk_weights.device_index = 1;
      },
      "topk_weights: is on cuda:1 but gating is on cpu:0");
}

TEST(SigmoidTopk, InvalidCallLeavesOutputsUntouched) {
  Buffer g = random_logits(6, 6, 8, DType::f32);
  Call c(g, 2);
  routing_test::expect_bad_ids_leave_outputs_untouched(c);
}

TEST(SigmoidTopk, RefKernelIsRegisteredAndRefusesDeviceTensors) {
  Buffer g(DType::f32, {2, 8});
  Call c(g, 1);
  routing_test::expect_ref_kernel_registered(OpKind::sigmoid_topk, "sigmoid_topk_ref", c.p,
                                             &SigmoidTopkParams::topk_ids, "topk_ids");
}

// ------------------------------------------------------------------ random cases
TEST(SigmoidTopk, RandomMatchesOracle) {
  routing_test::for_each_random_case(
      {{1, 128, 1}, {37, 128, 1}, {16, 16, 4}, {9, 257, 8}, {20, 60, 3}},
      [](uint64_t seed, const routing_test::Shape& s, DType dt, const std::string& what) {
        Buffer g = random_logits(seed * 1000 + uint64_t(s.E), s.T, s.E, dt);
        Call c(g, s.k);
        expect_matches_oracle(c, what);
      });
}

// ------------------------------------------------------------------ the `moekit check` cases
TEST(SigmoidTopk, CheckHarnessPassesOnPresets) {
  routing_test::expect_check_harness_passes(
      testing::check_sigmoid_topk, {"llama4", "mixtral", "deepseek-v3", "qwen3-moe"}, 6, /*require_detail=*/false);
}

TEST(SigmoidTopk, BenchProblemRuns) {
  routing_test::expect_ref_bench_problem_runs(testing::bench_sigmoid_topk, "llama4", "sigmoid_topk_ref", "k=1",
                                              /*with_flops=*/false);
}

// ------------------------------------------------------------------ CUDA kernel (sigmoid_topk_sm90)
// Skipped without a CUDA device. The kernel is compared with sigmoid_topk_ref: ids exactly,
// weights within kWeightAtol / kWeightRtol.

// One problem on the CUDA kernel (mirrored to the device) and on the ref.
void expect_cuda_matches_ref(const Buffer& gating, int k, const std::string& what) {
  SCOPED_TRACE(what);
  Call want(gating, k), got(gating, k);
  routing_test::expect_cuda_kernel_matches_ref(got, want, "sigmoid_topk_sm90", "sigmoid_topk_ref", sigmoid_topk,
                                               {&SigmoidTopkParams::gating},
                                               {&SigmoidTopkParams::topk_weights, &SigmoidTopkParams::topk_ids});
}

TEST(SigmoidTopk, CudaEdgeCasesMatchRef) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::expect_edge_cases_pass(Backend::cuda, testing::check_sigmoid_topk, "llama4", {1});
}

TEST(SigmoidTopk, CudaNonFiniteAndTiedRowsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::for_each_nonfinite_case(
      {8, 60, 257, 512}, 200, [](int64_t, int) { return int64_t(97); },
      [](const Buffer& g, int k, int, DType dt, const std::string& what) {
        expect_cuda_matches_ref(g, k, what + " " + dtype_name(dt));
      });
}

TEST(SigmoidTopk, CudaRandomShapesMatchRef) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::expect_cuda_random_shapes(testing::check_sigmoid_topk);
}

TEST(SigmoidTopk, CudaPresetsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::expect_presets_pass(Backend::cuda, testing::check_sigmoid_topk, {"llama4", "mixtral", "deepseek-v3"},
                                    {1, 64, 4096});
}

TEST(SigmoidTopk, CudaBenchProblemRuns) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::expect_bench_problem_runs(testing::bench_sigmoid_topk, "llama4", "sigmoid_topk_sm90");
}

// ------------------------------------------------------------------ CPU kernel (sigmoid_topk_avx512)
// Skipped where the CPU lacks AVX-512 F/BW/VL (routing_test::cpu_unavailable()); there the kernel
// is not registered. Compared with sigmoid_topk_ref: ids exactly, weights within kWeightAtol /
// kWeightRtol.
namespace cpu_cases {

void expect_cpu_matches_ref(const Buffer& gating, int k, const std::string& what) {
  SCOPED_TRACE(what);
  Call want(gating, k), got(gating, k);
  routing_test::expect_kernel_matches_ref(got, want, "sigmoid_topk_avx512", "sigmoid_topk_ref", sigmoid_topk);
}

TEST(SigmoidTopk, CpuKernelIsRegisteredAndRefusesDeviceTensors) {
  Buffer g = random_logits(3, 2, 8, DType::f32);
  Call c(g, 1);
  routing_test::expect_cpu_kernel_registered(OpKind::sigmoid_topk, "sigmoid_topk_avx512", "sigmoid_topk_ref",
                                             c.p, &SigmoidTopkParams::gating, "gating");
}

TEST(SigmoidTopk, CpuEdgeCasesMatchRef) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  routing_test::expect_edge_cases_pass(Backend::cpu, testing::check_sigmoid_topk, "llama4", {1, 7, 64});
}

// T not a multiple of the thread split, E not a multiple of the 16-lane vector (or a power of two),
// k = 1 and k = E, strided rows, ties (1/4 grid), and problems big enough for every thread.
TEST(SigmoidTopk, CpuThreadSplitAndVectorTailsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  const std::vector<routing_test::Shape> shapes = {{1031, 128, 1, 0}, {517, 257, 8, 0},   {33, 17, 17, 0}, {3, 1, 1, 0},
                                                   {64, 130, 32, 0},  {301, 100, 2, 113}, {4099, 16, 1, 0}};
  routing_test::for_each_cpu_shape(shapes, [](const routing_test::Shape& s, int n, DType dt) {
    const Buffer g = random_logits(uint64_t(40 + n), s.T, s.E, dt, n % 2 ? 0.25f : 1.0f / 256, s.stride);
    expect_cpu_matches_ref(g, s.k, routing_test::shape_name(s));
  });
}

TEST(SigmoidTopk, CpuNonFiniteAndTiedRowsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  // T = 97, but 1031 for one problem: large enough for every thread.
  routing_test::for_each_nonfinite_case(
      {8, 60, 257}, 200, [](int64_t Eg, int k) { return Eg == 257 && k == 1 ? int64_t(1031) : int64_t(97); },
      [](const Buffer& g, int k, int, DType, const std::string& what) { expect_cpu_matches_ref(g, k, what); });
}

// A big call equals itself run to run (fixed partition; no dependence on scheduling).
TEST(SigmoidTopk, CpuIsDeterministicRunToRun) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  const Buffer g = random_logits(78, 1500, 128, DType::bf16);
  Call a(g, 4), b(g, 4);
  routing_test::expect_same_run_to_run(a, b, "sigmoid_topk_avx512", sigmoid_topk);
}

TEST(SigmoidTopk, CpuPresetsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  routing_test::expect_cpu_presets_pass(testing::check_sigmoid_topk);
}

}  // namespace cpu_cases

}  // namespace
}  // namespace moekit
