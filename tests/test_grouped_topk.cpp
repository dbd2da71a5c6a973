// Tests of grouped_topk (SPEC 1.2, include/moekit/ops/routing.h): named edge cases first (bias for
// selection only, group ties, -inf masking, rsf once, non-finite logits, argument errors), then
// random cases against the float64 oracle (src/testing/oracle_routing.h), then the `moekit check`
// cases on the model presets. Run: ./build/tests/moekit_tests --gtest_filter='GroupedTopk*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/cpu_simd.h"
#include "moekit/core/config.h"
#include "moekit/ops/routing.h"
#include "ref/ref_topk.h"
#include "grouped_topk_test_util.h"
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

using grouped_test::bias_of;
using grouped_test::Call;
using grouped_test::certified_logits;
using grouped_test::config;
using grouped_test::expect_matches_oracle;
using grouped_test::sigmoid;

// ------------------------------------------------------------------ edge cases
TEST(GroupedTopk, T0ReturnsOkAndWritesNothing) {
  Buffer g(DType::bf16, {0, 256});
  Rng rng(1);
  Buffer bias = testing::random_bias(rng, 256);
  Call c(g, 8, 8, 4, Scoring::sigmoid, &bias, true, 2.5f);
  ASSERT_TRUE(c.run().ok());
  routing_test::expect_untouched({&c.w, &c.ids});
}

// s = 0.5 everywhere; b = 0.5 + bias = [.625 .5 | .875 .25 | .75 .75 | .5 .5]; top-2 group sums
// [1.125, 1.125, 1.5, 1.0] keep group 2 and group 0 (tied with group 1: lower id); picks by b
// among {0, 1, 4, 5}: 4, 5 (tie: lower id), 0. Weights are the UNBIASED s = 0.5.
TEST(GroupedTopk, HandComputedSigmoidWithBias) {
  Buffer g = logits_from_rows({{0, 0, 0, 0, 0, 0, 0, 0}});
  Buffer bias = bias_of({0.125f, 0, 0.375f, -0.25f, 0.25f, 0.25f, 0, 0});
  Call c(g, 3, 4, 2, Scoring::sigmoid, &bias);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{4, 5, 0}));
  EXPECT_EQ(c.row_w(0), (std::vector<float>{0.5f, 0.5f, 0.5f}));  // bias is for selection only
  Call r(g, 3, 4, 2, Scoring::sigmoid, &bias, true, 2.5f);
  ASSERT_TRUE(r.run().ok());
  EXPECT_EQ(r.row_ids(0), (std::vector<int>{4, 5, 0}));
  for (float w : r.row_w(0)) EXPECT_FLOAT_EQ(w, 2.5f / 3);  // renormalized, then rsf once
}

// Without a bias the group score is the group MAX, not a top-2 sum: [3, 0 | 2, 2.5] with 2 groups
// keeps group 0 (max 3 > 2.5) although group 1 has the larger sum.
TEST(GroupedTopk, GroupScoreIsMaxWithoutBiasAndTop2SumWithBias) {
  Buffer g = logits_from_rows({{3, 0, 2, 2.5f}});
  Call nob(g, 1, 2, 1, Scoring::sigmoid);
  ASSERT_TRUE(nob.run().ok());
  EXPECT_EQ(nob.row_ids(0), std::vector<int>{0});
  Buffer zero = bias_of({0, 0, 0, 0});
  Call withb(g, 1, 2, 1, Scoring::sigmoid, &zero);
  ASSERT_TRUE(withb.run().ok());
  EXPECT_EQ(withb.row_ids(0), std::vector<int>{3});  // sum 0.88 + 0.92 > 0.95 + 0.5
  EXPECT_FLOAT_EQ(withb.row_w(0)[0], sigmoid(2.5f));
}

// Softmax scoring is over the WHOLE row (all groups), not per group.
TEST(GroupedTopk, SoftmaxScoringIsOverTheWholeRow) {
  Buffer g = logits_from_rows({{1, 0, 0, 3}});
  Call c(g, 1, 2, 1, Scoring::softmax);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), std::vector<int>{3});
  const double e1 = std::exp(1.0), e3 = std::exp(3.0);
  EXPECT_NEAR(c.row_w(0)[0], e3 / (e1 + 2 + e3), 1e-6);
}

TEST(GroupedTopk, RoutedScalingFactorIsAppliedExactlyOnce) {
  Rng rng(2);
  Buffer bias = testing::random_bias(rng, 64);
  const GroupedTopkParams cfg = config(6, 8, 3, Scoring::sigmoid, &bias);
  Buffer g = certified_logits(3, 9, 64, cfg, DType::bf16);
  for (bool renorm : {false, true}) {
    Call one(g, 6, 8, 3, Scoring::sigmoid, &bias, renorm, 1.0f);
    Call scaled(g, 6, 8, 3, Scoring::sigmoid, &bias, renorm, 2.5f);
    ASSERT_TRUE(one.run().ok());
    ASSERT_TRUE(scaled.run().ok());
    EXPECT_EQ(one.ids.bytes, scaled.ids.bytes);
    for (int64_t i = 0; i < 9 * 6; ++i) EXPECT_EQ(scaled.w.data<float>()[i], one.w.data<float>()[i] * 2.5f);
    if (renorm) {
      for (int64_t t = 0; t < 9; ++t) {
        float sum = 0;
        for (float w : scaled.row_w(t)) sum += w;
        EXPECT_NEAR(sum, 2.5f, 1e-5f);
      }
    }
  }
}

// A group of one expert with a bias: the group score is that expert's b (no second member).
TEST(GroupedTopk, GroupOfOneExpertWithBias) {
  Buffer g = logits_from_rows({{0.5f, -1, 2, 0, 1, -0.5f}});
  Buffer bias = bias_of({0, 0.25f, -0.5f, 0.5f, 0, 0});
  Call c(g, 2, 6, 3, Scoring::sigmoid, &bias);
  ASSERT_TRUE(c.run().ok());
  // b = sigmoid(x) + bias: [.62, .52, .38, 1.0, .73, .38]; kept groups = ids 3, 4, 0.
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{3, 4}));
  EXPECT_FLOAT_EQ(c.row_w(0)[0], 0.5f);
  expect_matches_oracle(c, "group size 1");
}

TEST(GroupedTopk, MaskedGroupsAreMinusInfNotZero) {
  // Biased: every kept expert has b < 0; dropped experts scored 0 would win.
  Buffer g = logits_from_rows({{0.1f, 0.2f, 0.3f, 0.4f, 9, 9, 9, 9}});
  Buffer bias = bias_of({-2, -2, -2, -2, -4, -4, -4, -4});
  Call c(g, 2, 2, 1, Scoring::sigmoid, &bias);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{3, 2}));
  EXPECT_FLOAT_EQ(c.row_w(0)[0], sigmoid(0.4f));
  // Unbiased: the kept group's -inf logits score exactly 0; dropped experts 0..3 (lower ids) scored
  // 0 would win those ties.
  Buffer z = logits_from_rows({{-kInf, -kInf, -kInf, -kInf, 5, -kInf, -kInf, -kInf}});
  Call cz(z, 3, 2, 1, Scoring::softmax);
  ASSERT_TRUE(cz.run().ok());
  EXPECT_EQ(cz.row_ids(0), (std::vector<int>{4, 5, 6}));
  EXPECT_EQ(cz.row_w(0), (std::vector<float>{1, 0, 0}));
}

TEST(GroupedTopk, TiedGroupsAndExpertsGoToTheLowerId) {
  Buffer g = logits_from_rows({{1, 1, 1, 1, 1, 1, 1, 1}, {0, 2, 2, 0, 0, 2, 2, 0}});
  Call c(g, 3, 4, 2, Scoring::softmax);
  ASSERT_TRUE(c.run().ok());
  EXPECT_EQ(c.row_ids(0), (std::vector<int>{0, 1, 2}));  // groups 0, 1 kept
  EXPECT_EQ(c.row_ids(1), (std::vector<int>{1, 2, 0}));  // groups 0 (max 2) and 1 (max 2) kept
  Rng rng(4);
  Buffer bias(DType::f32, {32});
  for (int64_t e = 0; e < 32; ++e) bias.set(e, float(rng.integer(0, 2)) * 0.25f);  // tied biases too
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    const GroupedTopkParams cfg = config(5, 8, 3, Scoring::sigmoid, &bias);
    Buffer q = certified_logits(5, 24, 32, cfg, dt, 0.5f);
    Call cq(q, 5, 8, 3, Scoring::sigmoid, &bias, true, 2.5f);
    expect_matches_oracle(cq, std::string("ties ") + dtype_name(dt));
  }
}

TEST(GroupedTopk, KEqualsTopkGroupTimesGroupSizeTakesTheKeptGroupsWhole) {
  const GroupedTopkParams cfg = config(16, 4, 2, Scoring::softmax);
  Buffer g = certified_logits(6, 10, 32, cfg, DType::f32);
  Call c(g, 16, 4, 2, Scoring::softmax, nullptr, true);
  expect_matches_oracle(c, "k = 16");
  for (int64_t t = 0; t < 10; ++t) {
    std::vector<int> groups;
    for (int id : c.row_ids(t)) groups.push_back(id / 8);
    std::sort(groups.begin(), groups.end());
    EXPECT_EQ(std::count(groups.begin(), groups.end(), groups.front()), 8);
    EXPECT_EQ(std::count(groups.begin(), groups.end(), groups.back()), 8);
  }
}

TEST(GroupedTopk, OneGroupOrAllGroupsKeptIsPlainTopkOfB) {
  Rng rng(7);
  Buffer bias = testing::random_bias(rng, 24);
  Buffer g = certified_logits(8, 12, 24, config(5, 1, 1, Scoring::sigmoid, &bias), DType::f32);
  Call one(g, 5, 1, 1, Scoring::sigmoid, &bias), all(g, 5, 6, 6, Scoring::sigmoid, &bias);
  ASSERT_TRUE(one.run().ok());
  ASSERT_TRUE(all.run().ok());
  one.expect_same_outputs(all);
  expect_matches_oracle(one, "n_group 1");
}

TEST(GroupedTopk, ExpertsNotAPowerOfTwo) {
  struct Cfg {
    int64_t E;
    int k, n_group, topk_group;
  };
  for (const Cfg& s : {Cfg{6, 3, 3, 2}, Cfg{60, 6, 4, 3}, Cfg{60, 4, 5, 2}, Cfg{257, 8, 1, 1}, Cfg{257, 4, 257, 8}}) {
    Rng rng(uint64_t(s.E));
    Buffer bias = testing::random_bias(rng, s.E);
    for (bool with_bias : {false, true}) {
      const Buffer* b = with_bias ? &bias : nullptr;
      const GroupedTopkParams cfg = config(s.k, s.n_group, s.topk_group, Scoring::sigmoid, b);
      Buffer g = certified_logits(uint64_t(s.E) + 1, 7, s.E, cfg, DType::bf16);
      Call c(g, s.k, s.n_group, s.topk_group, Scoring::sigmoid, b, true, 2.5f);
      expect_matches_oracle(c, "E=" + std::to_string(s.E) + " n_group=" + std::to_string(s.n_group) +
                                   (with_bias ? " bias" : ""));
    }
  }
}

TEST(GroupedTopk, MoreExpertsThanTokensAndAllTokensPreferOneExpert) {
  Rng rng(9);
  Buffer bias = testing::random_bias(rng, 256);
  const GroupedTopkParams cfg = config(8, 8, 4, Scoring::sigmoid, &bias);
  Buffer g = certified_logits(10, 3, 256, cfg, DType::bf16);
  Call c(g, 8, 8, 4, Scoring::sigmoid, &bias, true, 2.5f);
  expect_matches_oracle(c, "T=3 E=256");
  // Two hot experts of group 2 give it the largest possible group score (b <= 1 + 0.5 each).
  for (int64_t t = 0; t < 3; ++t) {
    g.set(t * 256 + 77, 40.0f);
    g.set(t * 256 + 78, 40.0f);
  }
  bias.set(77, 0.5f);
  bias.set(78, 0.5f);
  Call hot(g, 8, 8, 4, Scoring::sigmoid, &bias, true, 2.5f);
  ASSERT_TRUE(hot.run().ok());
  for (int64_t t = 0; t < 3; ++t) {
    EXPECT_EQ(hot.row_ids(t)[0], 77);  // tied with 78: lower id first
    EXPECT_EQ(hot.row_ids(t)[1], 78);
  }
}

// NaN = -inf: sigmoid and softmax scores are 0; with a bias the selection score is the bias alone.
TEST(GroupedTopk, NanLogitsScoreZero) {
  Buffer g = logits_from_rows({{kNaN, 0, kNaN, kNaN}});
  Call sg(g, 2, 1, 1, Scoring::sigmoid);
  ASSERT_TRUE(sg.run().ok());
  EXPECT_EQ(sg.row_ids(0), (std::vector<int>{1, 0}));
  EXPECT_EQ(sg.row_w(0), (std::vector<float>{0.5f, 0.0f}));
  Buffer bias = bias_of({1, 0, 0, 0});
  Call biased(g, 2, 1, 1, Scoring::sigmoid, &bias);
  ASSERT_TRUE(biased.run().ok());
  EXPECT_EQ(biased.row_ids(0), (std::vector<int>{0, 1}));  // b = [1, .5, 0, 0]
  EXPECT_EQ(biased.row_w(0), (std::vector<float>{0.0f, 0.5f}));
  Call sm(g, 2, 2, 1, Scoring::softmax, nullptr, true);
  ASSERT_TRUE(sm.run().ok());
  EXPECT_EQ(sm.row_ids(0), (std::vector<int>{1, 0}));
  EXPECT_EQ(sm.row_w(0), (std::vector<float>{1.0f, 0.0f}));
}

TEST(GroupedTopk, AllNanRowGivesWeightZeroNeverNan) {
  Buffer g = logits_from_rows({{kNaN, kNaN, kNaN, kNaN, kNaN, kNaN}, {-kInf, -kInf, -kInf, -kInf, -kInf, -kInf}});
  for (Scoring sc : {Scoring::softmax, Scoring::sigmoid}) {
    Call c(g, 3, 3, 2, sc, nullptr, true, 2.5f);
    ASSERT_TRUE(c.run().ok());
    for (int64_t t = 0; t < 2; ++t) {
      EXPECT_EQ(c.row_ids(t), (std::vector<int>{0, 1, 2}));
      for (float w : c.row_w(t)) EXPECT_EQ(w, 0.0f);
    }
  }
}

TEST(GroupedTopk, PlusInfLogits) {
  Buffer g = logits_from_rows({{1, kInf, 2, kInf}});
  Call sg(g, 2, 2, 2, Scoring::sigmoid);
  ASSERT_TRUE(sg.run().ok());
  EXPECT_EQ(sg.row_ids(0), (std::vector<int>{1, 3}));
  EXPECT_EQ(sg.row_w(0), (std::vector<float>{1.0f, 1.0f}));
  Call sm(g, 2, 2, 2, Scoring::softmax);
  ASSERT_TRUE(sm.run().ok());
  EXPECT_EQ(sm.row_ids(0), (std::vector<int>{1, 3}));
  EXPECT_EQ(sm.row_w(0), (std::vector<float>{0.5f, 0.5f}));
}

TEST(GroupedTopk, NonFiniteLogitsAndBiasKeepIdsDistinctAndInKeptGroups) {
  Buffer g = routing_test::pool_logits(11, 60, 12, DType::f32);
  Buffer bias = bias_of({kNaN, 0.5f, -kInf, kInf, 0, 0, kNaN, kNaN, kNaN, -kInf, -kInf, 0.25f});
  for (Scoring sc : {Scoring::softmax, Scoring::sigmoid}) {
    for (const Buffer* b : {static_cast<const Buffer*>(nullptr), static_cast<const Buffer*>(&bias)}) {
      Call c(g, 4, 4, 2, sc, b, true, 2.5f);
      expect_matches_oracle(c, std::string(scoring_name(sc)) + (b ? " nonfinite bias" : ""));
      for (int64_t t = 0; t < 60; ++t) {
        const std::vector<int> ids = c.row_ids(t);
        std::vector<int> groups;
        for (int id : ids) groups.push_back(id / 3);
        std::sort(groups.begin(), groups.end());
        groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
        EXPECT_LE(groups.size(), 2u);
        routing_test::expect_distinct_ids(ids, 12);
        for (float w : c.row_w(t)) EXPECT_TRUE(std::isfinite(w));
      }
    }
  }
}

TEST(GroupedTopk, RowStridedGatingAndDtypes) {
  Rng rng(12);
  Buffer bias = testing::random_bias(rng, 40);
  const GroupedTopkParams cfg = config(4, 4, 2, Scoring::sigmoid, &bias);
  Buffer strided = certified_logits(13, 9, 40, cfg, DType::f32, 1.0f / 16, 57);  // exact in bf16 and f16
  const auto make = [&](const Buffer& g) { return Call(g, 4, 4, 2, Scoring::sigmoid, &bias, true, 2.5f); };
  Call a = make(strided);
  ASSERT_NO_FATAL_FAILURE(routing_test::expect_dense_copies_agree(strided, a, make));
  expect_matches_oracle(a, "row-strided");
}

TEST(GroupedTopk, InvalidArgumentsNameTheArgument) {
  using P = GroupedTopkParams;
  Buffer g(DType::f32, {4, 16});
  Buffer bias(DType::f32, {16});
  const routing_test::ArgumentErrors errors([&] { return Call(g, 4, 4, 2, Scoring::sigmoid, &bias, true, 2.5f); });
  errors.expect([](P& p) { p.gating = TensorView(); }, "gating: required");
  errors.expect_replaced(&P::gating, DType::fp8_e4m3fn, {4, 16}, "gating: dtype must be f32|bf16|f16, got fp8_e4m3fn");
  errors.expect_replaced(&P::gating, DType::f32, {64}, "gating: shape must be [*, *], got [64]");
  errors.expect([](P& p) { p.n_group = 0; }, "n_group: must be >= 1, got 0");
  errors.expect([](P& p) { p.n_group = 3; }, "n_group: Eg=16 is not divisible by n_group=3");
  for (int tg : {0, 5}) {
    errors.expect([tg](P& p) { p.topk_group = tg; },
                  "topk_group: must be in [1, n_group=4], got " + std::to_string(tg));
  }
  for (int k : {0, 9}) {
    errors.expect([k](P& p) { p.k = k; }, "k: must be in [1, topk_group*(Eg/n_group)=2*4=8], got " + std::to_string(k));
  }
  errors.expect([](P& p) { p.scoring = static_cast<Scoring>(7); }, "scoring: must be softmax or sigmoid, got 7");
  for (float rsf : {0.0f, -1.0f, kNaN, kInf}) {
    errors.expect([rsf](P& p) { p.routed_scaling_factor = rsf; }, "routed_scaling_factor: must be finite and > 0, got");
  }
  errors.expect_replaced(&P::correction_bias, DType::bf16, {16}, "correction_bias: dtype must be f32, got bf16");
  errors.expect_replaced(&P::correction_bias, DType::f32, {17}, "correction_bias: shape must be [16], got [17]");
  errors.expect_replaced(&P::correction_bias, DType::f32, {1, 16}, "correction_bias: shape must be [16], got [1, 16]");
  Buffer wide(DType::f32, {32});
  errors.expect(
      [&](P& p) {
        p.correction_bias = wide.view;
        p.correction_bias.shape[0] = 16;
        p.correction_bias.stride[0] = 2;
      },
      "correction_bias: must be contiguous");
  errors.expect([](P& p) { p.correction_bias.device = Device::cuda; },
                "correction_bias: is on cuda:0 but gating is on cpu:0");
  errors.expect_replaced(&P::topk_weights, DType::f32, {4, 3}, "topk_weights: shape must be [4, 4], got [4, 3]");
  errors.expect([](P& p) { p.topk_ids = TensorView(); }, "topk_ids: required");
  errors.expect_replaced(&P::topk_ids, DType::f32, {4, 4}, "topk_ids: dtype must be i32, got f32");
}

TEST(GroupedTopk, InvalidCallLeavesOutputsUntouched) {
  Rng rng(14);
  Buffer bias = testing::random_bias(rng, 16);
  Buffer g = certified_logits(15, 6, 16, config(4, 4, 2, Scoring::sigmoid, &bias), DType::f32);
  Call c(g, 4, 4, 2, Scoring::sigmoid, &bias, true, 2.5f);
  routing_test::expect_bad_ids_leave_outputs_untouched(c);
}

TEST(GroupedTopk, RefKernelIsRegisteredAndRefusesDeviceTensors) {
  Buffer g(DType::f32, {2, 8});
  Buffer bias(DType::f32, {8});
  Call c(g, 2, 2, 1, Scoring::sigmoid, &bias);
  routing_test::expect_ref_kernel_registered(OpKind::grouped_topk, "grouped_topk_ref", c.p,
                                             &GroupedTopkParams::correction_bias, "correction_bias");
}

// ------------------------------------------------------------------ random cases
TEST(GroupedTopk, RandomMatchesOracle) {
  struct Shape {
    int64_t T, E;
    int k, n_group, topk_group;
  };
  const Shape shapes[] = {{1, 256, 8, 8, 4}, {29, 256, 8, 8, 4}, {16, 128, 8, 8, 4}, {9, 64, 6, 4, 2},
                          {12, 8, 2, 8, 4},  {20, 96, 5, 3, 2}};
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    for (const Shape& s : shapes) {
      for (Scoring sc : {Scoring::softmax, Scoring::sigmoid}) {
        for (bool with_bias : {false, true}) {
          const DType dt = (seed + uint64_t(with_bias)) % 2 ? DType::bf16 : DType::f32;
          Rng rng(seed * 7919 + uint64_t(s.E));
          Buffer bias = testing::random_bias(rng, s.E);
          const Buffer* b = with_bias ? &bias : nullptr;
          const GroupedTopkParams cfg = config(s.k, s.n_group, s.topk_group, sc, b);
          Buffer g = certified_logits(seed * 31 + uint64_t(s.T), s.T, s.E, cfg, dt);
          const bool renorm = (seed + uint64_t(s.k)) % 2 == 0;
          Call c(g, s.k, s.n_group, s.topk_group, sc, b, renorm, seed == 2 ? 1.0f : 2.5f);
          expect_matches_oracle(c, "seed " + std::to_string(seed) + " T=" + std::to_string(s.T) + " E=" +
                                       std::to_string(s.E) + " " + scoring_name(sc) + (with_bias ? "+bias " : " ") +
                                       dtype_name(dt));
        }
      }
    }
  }
}

// ------------------------------------------------------------------ the `moekit check` cases
TEST(GroupedTopk, CheckHarnessPassesOnPresets) {
  routing_test::expect_check_harness_passes(
      testing::check_grouped_topk, {"deepseek-v3", "mixtral", "llama4", "qwen3-moe"}, 12, /*require_detail=*/false);
}

TEST(GroupedTopk, BenchProblemRuns) {
  routing_test::expect_ref_bench_problem_runs(testing::bench_grouped_topk, "deepseek-v3", "grouped_topk_ref",
                                              "groups 4/8", /*with_flops=*/false);
}

// ------------------------------------------------------------------ CUDA kernel (grouped_topk_sm90)
// Skipped without a CUDA device. The kernel is compared with grouped_topk_ref: ids exactly,
// weights within kWeightAtol / kWeightRtol. The check hook's cases cover DeepSeek-V3 routing
// (sigmoid + bias, groups 4/8, k 8, rsf 2.5) and softmax without bias on every shape.

// One problem on the CUDA kernel (mirrored to the device) and on the ref.
void expect_cuda_matches_ref(const Buffer& gating, const Buffer* bias, int k, int n_group, int topk_group,
                             Scoring scoring, bool renormalize, float rsf, const std::string& what) {
  SCOPED_TRACE(what);
  using P = GroupedTopkParams;
  Call want(gating, k, n_group, topk_group, scoring, bias, renormalize, rsf);
  Call got(gating, k, n_group, topk_group, scoring, bias, renormalize, rsf);
  routing_test::expect_cuda_kernel_matches_ref(got, want, "grouped_topk_sm90", "grouped_topk_ref", grouped_topk,
                                               {&P::gating, &P::correction_bias}, {&P::topk_weights, &P::topk_ids});
}

TEST(GroupedTopk, CudaEdgeCasesMatchRef) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::expect_edge_cases_pass(Backend::cuda, testing::check_grouped_topk, "deepseek-v3", {1});
}

TEST(GroupedTopk, CudaNonFiniteAndTiedRowsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  // (Eg, n_group, topk_group, k): DeepSeek-V3, groups of 1, uneven sizes, many groups.
  const int shapes[][4] = {{256, 8, 4, 8}, {8, 8, 4, 2}, {60, 4, 3, 6}, {512, 64, 8, 32}, {96, 3, 1, 32}};
  int n = 0;
  for (const auto& sh : shapes) {
    for (Scoring sc : {Scoring::sigmoid, Scoring::softmax}) {
      const DType dt = routing_test::rotating_dtype(n, DType::f32, DType::bf16, DType::f16);
      const Buffer g = routing_test::nonfinite_logits(uint64_t(300 + n), 97, sh[0], dt);
      // NaN-free bias on a 1/4 grid, so biased scores tie exactly where the scores do.
      Buffer bias(DType::f32, {sh[0]});
      Rng rng(uint64_t(400 + n));
      for (int64_t e = 0; e < sh[0]; ++e) bias.set(e, float(rng.integer(-2, 2)) * 0.25f);
      const std::string what = "Eg=" + std::to_string(sh[0]) + " groups " + std::to_string(sh[2]) + "/" +
                               std::to_string(sh[1]) + " k=" + std::to_string(sh[3]) + " " + scoring_name(sc) +
                               " " + dtype_name(dt);
      expect_cuda_matches_ref(g, &bias, sh[3], sh[1], sh[2], sc, true, 2.5f, what + " +bias");
      expect_cuda_matches_ref(g, nullptr, sh[3], sh[1], sh[2], sc, n % 2 == 0, 1.0f, what);
      ++n;
    }
  }
}

TEST(GroupedTopk, CudaRandomShapesMatchRef) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::expect_cuda_random_shapes(testing::check_grouped_topk);
}

TEST(GroupedTopk, CudaPresetsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::expect_presets_pass(Backend::cuda, testing::check_grouped_topk, {"deepseek-v3", "mixtral", "qwen3-moe"},
                                    {1, 64, 4096});
}

TEST(GroupedTopk, CudaBenchProblemRuns) {
  ROUTING_SKIP_IF(routing_test::cuda_unavailable());
  routing_test::expect_bench_problem_runs(testing::bench_grouped_topk, "deepseek-v3", "grouped_topk_sm90");
}


}  // namespace
}  // namespace moekit
