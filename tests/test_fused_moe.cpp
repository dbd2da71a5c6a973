// fused_moe, unquantized variant (SPEC 3.1, 3.4, 3.5, 3.6) and the front door's validation.
// Named edge cases first, then random problems against the float64 oracle
// (src/testing/oracle_fused_moe.h, bounds in docs/tolerances.md), then the harness hook over every
// preset, then every validation error and the poison test.
// Run: ./build/tests/moekit_tests --gtest_filter='FusedMoe.*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "fused_moe_test_util.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit::testing {
namespace {

using moe_test::expect_all_ok;
using moe_test::expect_matches_oracle;
using moe_test::make;
using moe_test::small_shape;

std::vector<double> row(const std::vector<double>& y, int64_t t, int64_t H) {
  return std::vector<double>(y.begin() + t * H, y.begin() + (t + 1) * H);
}

// ---------------------------------------------------------------- edge cases
TEST(FusedMoe, TZeroReturnsWithoutWriting) {
  MoeProblem prob = make(small_shape(Scheme::bf16, 0));
  prob.out.fill_bytes(0xAB);
  const std::vector<unsigned char> before = prob.out.bytes;
  ASSERT_TRUE(fused_moe(prob.params()).ok());
  EXPECT_EQ(prob.out.bytes, before);
  size_t ws = 1;
  ASSERT_TRUE(fused_moe_workspace_size(prob.params(), {}, &ws).ok());
}

TEST(FusedMoe, KernelNameIsARegisteredFusedMoeKernel) {
  MoeProblem prob = make(small_shape(Scheme::bf16, 5));
  std::string name;
  ASSERT_TRUE(fused_moe_kernel_name(prob.params(), {}, &name).ok());
  const Kernel* k = registry().find(name);
  ASSERT_NE(k, nullptr) << name;
  EXPECT_EQ(k->op, OpKind::fused_moe);
  RunOptions explicit_kernel;
  explicit_kernel.kernel = name.c_str();
  std::string again;
  ASSERT_TRUE(fused_moe_kernel_name(prob.params(), explicit_kernel, &again).ok());
  EXPECT_EQ(again, name);
  explicit_kernel.kernel = "no_such_kernel";
  EXPECT_FALSE(fused_moe_kernel_name(prob.params(), explicit_kernel, &again).ok());
  EXPECT_FALSE(fused_moe_kernel_name(prob.params(), {}, nullptr).ok());
}

TEST(FusedMoe, TOne) {
  MoeProblem prob = make(small_shape(Scheme::bf16, 1));
  expect_matches_oracle(prob);
}

TEST(FusedMoe, KOne) {
  MoeProblem prob = make(small_shape(Scheme::bf16, 7, 6, 1));
  expect_matches_oracle(prob);
}

TEST(FusedMoe, KEqualsE) {
  MoeProblem prob = make(small_shape(Scheme::bf16, 5, 6, 6));
  expect_matches_oracle(prob);
}

TEST(FusedMoe, MoreExpertsThanTokensAndENotPowerOfTwo) {
  MoeProblem prob = make(small_shape(Scheme::bf16, 2, 13, 3));
  expect_matches_oracle(prob);
}

TEST(FusedMoe, AllTokensToOneExpert) {
  MoeProblem prob = make(small_shape(Scheme::bf16, 9, 6, 1));
  int32_t* ids = prob.topk_ids.data<int32_t>();
  for (int64_t i = 0; i < prob.topk_ids.numel(); ++i) ids[i] = 4;
  update_touched(&prob);
  EXPECT_TRUE(prob.touched[4]);
  expect_matches_oracle(prob);
}

TEST(FusedMoe, EmptyExpertsAreNeverRead) {
  // 16 experts, 2 tokens x 2 slots: at least 12 experts are empty. Their weights are NaN: a kernel
  // that touched them would produce NaN.
  MoeProblem prob = make(small_shape(Scheme::bf16, 2, 16, 2));
  const int64_t per1 = prob.N1 * prob.shape.H, per2 = prob.shape.H * prob.shape.I;
  int empty = 0;
  for (int64_t e = 0; e < prob.E; ++e) {
    if (prob.touched[size_t(e)]) continue;
    ++empty;
    for (int64_t i = 0; i < per1; ++i) prob.w1.set(e * per1 + i, std::numeric_limits<float>::quiet_NaN());
    for (int64_t i = 0; i < per2; ++i) prob.w2.set(e * per2 + i, std::numeric_limits<float>::quiet_NaN());
  }
  EXPECT_GE(empty, 12);
  expect_matches_oracle(prob);
}

TEST(FusedMoe, DuplicateIdsInARowAddUp) {
  MoeProblem prob = make(small_shape(Scheme::f32, 4, 6, 2));
  int32_t* ids = prob.topk_ids.data<int32_t>();
  for (int64_t t = 0; t < 4; ++t) ids[t * 2 + 1] = ids[t * 2];
  update_touched(&prob);
  expect_matches_oracle(prob);
}

TEST(FusedMoe, MinusOneIdsAreSkippedAndGiveZeroRows) {
  MoeProblem prob = make(small_shape(Scheme::bf16, 6, 6, 2));
  int32_t* ids = prob.topk_ids.data<int32_t>();
  ids[0] = ids[1] = -1;  // token 0: no expert
  ids[5] = -1;           // token 2: one expert
  update_touched(&prob);
  expect_matches_oracle(prob);
  const std::vector<double> y = read_out(prob.params().out);
  for (double v : row(y, 0, prob.shape.H)) EXPECT_EQ(v, 0.0);
}

TEST(FusedMoe, ExpertMaskRemoteExpertsGiveZeroRows) {
  MoeShape s = small_shape(Scheme::bf16, 8, 10, 2);
  MoeProblemOptions o;
  o.local_experts = 4;
  o.ep = ExpertParallel::mask;
  MoeProblem prob = make(s, o);
  // Token 0 -> two remote experts: its row must be exactly zero.
  const int32_t* mask = prob.expert_mask.data<int32_t>();
  int32_t* ids = prob.topk_ids.data<int32_t>();
  int n = 0;
  for (int32_t g = 0; g < 10 && n < 2; ++g) {
    if (!mask[g]) ids[n++] = g;
  }
  update_touched(&prob);
  expect_matches_oracle(prob);
  const std::vector<double> y = read_out(prob.params().out);
  for (double v : row(y, 0, s.H)) EXPECT_EQ(v, 0.0);
  // Some other row is not zero (local experts are used).
  double sum = 0;
  for (int64_t t = 1; t < s.T; ++t) {
    for (double v : row(y, t, s.H)) sum += std::fabs(v);
  }
  EXPECT_GT(sum, 0.0);
}

TEST(FusedMoe, ExpertMapEqualsMask) {
  MoeShape s = small_shape(Scheme::bf16, 8, 10, 3);
  MoeProblemOptions o;
  o.local_experts = 5;
  o.ep = ExpertParallel::mask;
  MoeProblem with_mask = make(s, o);
  o.ep = ExpertParallel::map;
  MoeProblem with_map = make(s, o);
  ASSERT_TRUE(fused_moe(with_mask.params()).ok());
  ASSERT_TRUE(fused_moe(with_map.params()).ok());
  EXPECT_EQ(with_mask.out.bytes, with_map.out.bytes);
  expect_matches_oracle(with_map);
}

TEST(FusedMoe, SizesNotMultiplesOf128) {
  MoeProblem prob = make(small_shape(Scheme::bf16, 5, 6, 2, 200, 72));
  expect_matches_oracle(prob);
  MoeProblem tiny = make(small_shape(Scheme::f32, 3, 3, 2, 1, 1));
  expect_matches_oracle(tiny);
}

TEST(FusedMoe, GateOnlyG1U0) {
  for (Scheme sc : {Scheme::bf16, Scheme::f32}) {
    MoeProblemOptions o;
    o.g1u1 = false;
    MoeProblem prob = make(small_shape(sc), o);
    EXPECT_EQ(moe_dims(prob.params()).g1u1, false);
    expect_matches_oracle(prob);
  }
}

TEST(FusedMoe, EachActivation) {
  for (Activation a : {Activation::silu, Activation::gelu, Activation::gelu_tanh}) {
    MoeShape s = small_shape(Scheme::bf16);
    s.activation = a;
    MoeProblem prob = make(s);
    SCOPED_TRACE(activation_name(a));
    expect_matches_oracle(prob);
  }
}

// One expert, H = I = 1, f32: y = w * w2 * act(w1_g * x) * (w1_u * x), computed by hand.
TEST(FusedMoe, HandComputedScalarForEachActivation) {
  struct Case {
    Activation act;
    double act_of_1;  // act(1)
  };
  const Case cases[] = {{Activation::silu, 0.7310585786300049}, {Activation::gelu, 0.8413447460685429},
                        {Activation::gelu_tanh, 0.8411919906082768}};
  for (const Case& c : cases) {
    Buffer x(DType::f32, {1, 1}), w1(DType::f32, {1, 2, 1}), w2(DType::f32, {1, 1, 1});
    Buffer ids(DType::i32, {1, 1}), wts(DType::f32, {1, 1}), out(DType::f32, {1, 1});
    x.set(0, 2.0f);
    w1.set(0, 0.5f);  // g = 1
    w1.set(1, 1.5f);  // u = 3
    w2.set(0, 0.25f);
    ids.data<int32_t>()[0] = 0;
    wts.set(0, 0.5f);
    FusedMoeParams p;
    p.x = x.view;
    p.w1 = w1.view;
    p.w2 = w2.view;
    p.topk_ids = ids.view;
    p.topk_weights = wts.view;
    p.out = out.view;
    p.activation = c.act;
    ASSERT_TRUE(fused_moe(p).ok());
    EXPECT_NEAR(out.get(0), 0.5 * 0.25 * c.act_of_1 * 3.0, 1e-6) << activation_name(c.act);
    // weight_on_input: y = w2 * act(w*g) * (w*u) = 0.25 * act(0.5) * 1.5
    p.weight_on_input = true;
    ASSERT_TRUE(fused_moe(p).ok());
    const double act_half = c.act == Activation::silu ? 0.5 / (1.0 + std::exp(-0.5))
                            : c.act == Activation::gelu
                                ? 0.25 * (1.0 + std::erf(0.5 / std::sqrt(2.0)))
                                : 0.25 * (1.0 + std::tanh(std::sqrt(2.0 / 3.141592653589793) * (0.5 + 0.044715 * 0.125)));
    EXPECT_NEAR(out.get(0), 0.25 * act_half * 1.5, 1e-6) << activation_name(c.act);
  }
}

TEST(FusedMoe, WeightOnInputMatchesScalingXFirst) {
  // Reference: weight on g and u. Oracle: x scaled by w first (SPEC 6.4). They must agree.
  for (Scheme sc : {Scheme::bf16, Scheme::f16, Scheme::f32}) {
    MoeShape s = small_shape(sc, 6, 6, 1);
    s.weight_on_input = true;
    MoeProblem prob = make(s);
    SCOPED_TRACE(scheme_name(sc));
    expect_matches_oracle(prob);
  }
}

TEST(FusedMoe, RoundIntermediateBothWays) {
  for (Scheme sc : {Scheme::bf16, Scheme::f16, Scheme::f32}) {
    MoeProblemOptions rounded, unrounded;
    unrounded.round_intermediate = false;
    MoeProblem a = make(small_shape(sc), rounded), b = make(small_shape(sc), unrounded);
    SCOPED_TRACE(scheme_name(sc));
    expect_matches_oracle(a);
    expect_matches_oracle(b);
    // The flag changes bf16 / f16 results (a is rounded or not) and is a no-op for f32.
    if (sc == Scheme::f32) EXPECT_EQ(a.out.bytes, b.out.bytes);
    else EXPECT_NE(a.out.bytes, b.out.bytes);
  }
}

TEST(FusedMoe, ShuffledWeightsGiveTheSameResultAsPlain) {
  // Per kernel that reads both layouts (dispatch may pick different kernels for the two).
  for (const char* kernel : {"fused_moe_ref", "fused_moe_cpu_generic"}) {
    if (registry().find(kernel) == nullptr) continue;
    RunOptions o;
    o.kernel = kernel;
    for (Scheme sc : {Scheme::bf16, Scheme::f32}) {
      MoeProblemOptions shuffled;
      shuffled.shuffled = true;
      MoeProblem plain = make(small_shape(sc)), shuf = make(small_shape(sc), shuffled);
      EXPECT_EQ(shuf.params().w1.layout, Layout::shuffled_16x16);
      EXPECT_NE(plain.w1.bytes, shuf.w1.bytes);  // really a different byte order
      ASSERT_TRUE(fused_moe(plain.params(), o).ok());
      ASSERT_TRUE(fused_moe(shuf.params(), o).ok());
      EXPECT_EQ(plain.out.bytes, shuf.out.bytes) << kernel << " " << scheme_name(sc);
    }
  }
}

TEST(FusedMoe, RowStridedXAndOutLeaveThePaddingAlone) {
  MoeProblemOptions o;
  o.row_pad = 9;
  MoeProblem prob = make(small_shape(Scheme::bf16), o);
  prob.out.fill_bytes(0xAB);
  expect_matches_oracle(prob);
  const int64_t H = prob.shape.H, stride = H + 9;
  const auto* bits = prob.out.data<uint16_t>();
  for (int64_t t = 0; t < prob.shape.T; ++t) {
    for (int64_t c = H; c < stride; ++c) EXPECT_EQ(bits[t * stride + c], 0xABABu);
  }
}

TEST(FusedMoe, DeterministicAcrossRuns) {
  MoeProblem prob = make(small_shape(Scheme::bf16, 9, 6, 3));
  ASSERT_TRUE(fused_moe(prob.params()).ok());
  const std::vector<unsigned char> first = prob.out.bytes;
  prob.out.fill_bytes(0);
  RunOptions det;
  det.deterministic = true;
  ASSERT_TRUE(fused_moe(prob.params(), det).ok());
  EXPECT_EQ(prob.out.bytes, first);
}

TEST(FusedMoe, CallerWorkspace) {
  MoeProblem prob = make(small_shape(Scheme::bf16));
  size_t need = 0;
  ASSERT_TRUE(fused_moe_workspace_size(prob.params(), {}, &need).ok());
  EXPECT_GT(need, 0u);
  std::vector<unsigned char> ws(need);
  RunOptions opts;
  opts.workspace = ws.data();
  opts.workspace_bytes = need - 1;
  const Status small = fused_moe(prob.params(), opts);
  EXPECT_EQ(small.code(), StatusCode::invalid_argument);
  EXPECT_NE(small.message().find("workspace"), std::string::npos) << small.message();
  opts.workspace_bytes = need;
  expect_matches_oracle(prob, opts);
  // A workspace that starts at an odd address works too.
  std::vector<unsigned char> odd(need + 1);
  opts.workspace = odd.data() + 1;
  expect_matches_oracle(prob, opts);
}

TEST(FusedMoe, ExplicitKernelAndWrongVariantKernel) {
  MoeProblem prob = make(small_shape(Scheme::bf16));
  RunOptions opts;
  opts.kernel = "fused_moe_ref";
  expect_matches_oracle(prob, opts);
  opts.kernel = "fused_moe_ref_fp8_block";
  const Status st = fused_moe(prob.params(), opts);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("unquantized"), std::string::npos) << st.message();
}

TEST(FusedMoe, VariantOfUnquantizedProblems) {
  MoeProblem prob = make(small_shape(Scheme::bf16));
  FusedMoeParams p = prob.params();
  EXPECT_EQ(fused_moe_variant(p), MoeVariant::unquantized);
  p.weight_on_input = true;
  EXPECT_EQ(fused_moe_variant(p), MoeVariant::unquantized);
  const MoeDims d = moe_dims(prob.params());
  EXPECT_EQ(d.T, 7);
  EXPECT_EQ(d.E, 6);
  EXPECT_EQ(d.Eg, 6);
  EXPECT_EQ(d.k, 2);
  EXPECT_EQ(d.H, 96);
  EXPECT_EQ(d.I, 64);
  EXPECT_EQ(d.N1, 128);
  EXPECT_TRUE(d.g1u1);
}

TEST(FusedMoe, ActivationNames) {
  for (Activation a : {Activation::silu, Activation::gelu, Activation::gelu_tanh}) {
    Activation b;
    ASSERT_TRUE(parse_activation(activation_name(a), &b));
    EXPECT_EQ(a, b);
  }
  Activation b;
  EXPECT_TRUE(parse_activation("swiglu", &b));
  EXPECT_EQ(b, Activation::silu);
  EXPECT_FALSE(parse_activation("relu", &b));
  EXPECT_FALSE(parse_activation(nullptr, &b));
}

// ---------------------------------------------------------------- random vs oracle
TEST(FusedMoe, RandomVsOracle) {
  for (Scheme sc : {Scheme::bf16, Scheme::f16, Scheme::f32}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      Rng rng(seed * 77);
      MoeShape s = small_shape(sc, rng.integer(1, 12), rng.integer(1, 12), 1, rng.integer(1, 160),
                               rng.integer(1, 96));
      s.k = rng.integer(1, s.E);
      s.activation = Activation(rng.integer(0, 2));
      MoeProblemOptions o;
      o.g1u1 = rng.integer(0, 3) != 0;
      o.round_intermediate = rng.integer(0, 1) != 0;
      MoeProblem prob = make(s, o, seed);
      SCOPED_TRACE(std::string(scheme_name(sc)) + " seed " + std::to_string(seed) + " T=" + std::to_string(s.T) +
                   " E=" + std::to_string(s.E) + " k=" + std::to_string(s.k) + " H=" + std::to_string(s.H) +
                   " I=" + std::to_string(s.I));
      expect_matches_oracle(prob);
    }
  }
}

// ---------------------------------------------------------------- harness hook
TEST(FusedMoe, CheckHookEdgeCasesEachUnquantizedScheme) {
  for (Scheme sc : {Scheme::bf16, Scheme::f16, Scheme::f32}) {
    CheckRequest req;
    req.shape.scheme = sc;
    req.shape.scheme_given = true;
    req.tokens = {3};
    expect_all_ok(check_fused_moe(req));
  }
}

TEST(FusedMoe, CheckHookEveryPresetUnquantized) {
  for (const ModelPreset& m : model_presets()) {
    for (Scheme sc : {Scheme::bf16, Scheme::f16, Scheme::f32}) {
      CheckRequest req;
      req.shape.model = m.name;
      req.shape.scheme = sc;
      req.shape.scheme_given = true;
      req.tokens = {2};
      req.edge_cases = false;
      SCOPED_TRACE(std::string(m.name) + " " + scheme_name(sc));
      expect_all_ok(check_fused_moe(req));
    }
  }
}

TEST(FusedMoe, CheckHookBackendFilter) {
  CheckRequest req;
  req.shape.model = "qwen3-moe";
  req.tokens = {1};
  req.edge_cases = false;
  req.has_backend = true;
  req.backend = Backend::ref;
  const std::vector<CaseResult> ref = check_fused_moe(req);
  ASSERT_EQ(ref.size(), 1u);
  EXPECT_EQ(ref[0].kernel, "fused_moe_ref");
  EXPECT_EQ(ref[0].reference, "oracle");
  EXPECT_TRUE(ref[0].ok) << ref[0].detail;
  // Every result names a kernel of the requested backend, or says it skipped.
  req.backend = Backend::cpu;
  for (const CaseResult& r : check_fused_moe(req)) {
    EXPECT_TRUE(r.ok) << r.detail;
    EXPECT_TRUE(r.backend == "cpu" || r.detail.rfind("skipped", 0) == 0) << r.kernel << " " << r.detail;
  }
}

TEST(FusedMoe, CheckHookReportsBadRequests) {
  CheckRequest req;
  req.shape.model = "mixtral";
  req.shape.weight_on_input = true;  // mixtral has k = 2
  req.tokens = {1};
  req.edge_cases = false;
  const std::vector<CaseResult> r = check_fused_moe(req);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_FALSE(r[0].ok);
  EXPECT_NE(r[0].detail.find("weight-on-input"), std::string::npos) << r[0].detail;
}

TEST(FusedMoe, BenchHook) {
  BenchRequest req;
  req.shape.model = "qwen3-moe";
  const Kernel* k = registry().find("fused_moe_ref");
  ASSERT_NE(k, nullptr);
  std::unique_ptr<BenchProblem> b;
  ASSERT_TRUE(bench_fused_moe(req, 4, *k, &b).ok());
  EXPECT_TRUE(b->run().ok());
  const double T = 4, kk = 8, H = 256, I = 128;
  EXPECT_DOUBLE_EQ(b->flops, 2 * T * kk * H * 2 * I + 2 * T * kk * I * H);
  EXPECT_GT(b->bytes, 2 * T * H * 2);
  const Kernel* fp8 = registry().find("fused_moe_ref_fp8_block");
  ASSERT_NE(fp8, nullptr);
  EXPECT_EQ(bench_fused_moe(req, 4, *fp8, &b).code(), StatusCode::unsupported);
}

// ---------------------------------------------------------------- validation
// Expects an invalid_argument whose message contains every string of `parts`.
void expect_invalid(const FusedMoeParams& p, std::initializer_list<const char*> parts) {
  const Status st = fused_moe(p);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st.to_string();
  for (const char* s : parts) EXPECT_NE(st.message().find(s), std::string::npos) << "'" << s << "' not in: " << st.message();
  EXPECT_EQ(validate_fused_moe(p).message(), st.message());
}

// The valid problem every validation test breaks one argument of: T 4, E 8, k 2, H 64, I 32.
MoeProblem validation_problem() { return make(small_shape(Scheme::bf16, 4, 8, 2, 64, 32)); }

TEST(FusedMoe, ValidationX) {
  MoeProblem prob = validation_problem();
  FusedMoeParams p = prob.params();
  p.x = TensorView();
  expect_invalid(p, {"x: required"});
  p = prob.params();
  p.x.dtype = DType::i32;
  expect_invalid(p, {"x: dtype must be bf16|f16|f32, got i32"});
  p = prob.params();
  p.x.stride[0] = 10;  // < H
  expect_invalid(p, {"x: must be 2-D", "row stride"});
  p = prob.params();
  p.x.ndim = 3;
  p.x.shape[2] = 1;
  expect_invalid(p, {"x: shape must be [*, *]"});
}

TEST(FusedMoe, ValidationWeights) {
  MoeProblem prob = validation_problem();
  FusedMoeParams p = prob.params();
  p.w1.dtype = DType::f16;
  expect_invalid(p, {"w1: dtype must be bf16|fp8_e4m3fn, got f16"});
  p = prob.params();
  p.w2.dtype = DType::f16;
  expect_invalid(p, {"w2: dtype must equal w1's (bf16), got f16"});
  p = prob.params();
  p.w1.shape[2] = 63;
  expect_invalid(p, {"w1: shape must be [*, *, 64], got [8, 64, 63]"});
  p = prob.params();
  p.w1 = TensorView::contiguous(p.w1.data, DType::bf16, {8, 48, 64});  // neither 2I = 64 nor I = 32
  expect_invalid(p, {"w1: dim 1 must be 2*I = 64", "got 48"});
  p = prob.params();
  p.w2.shape[0] = 7;
  expect_invalid(p, {"w2: shape must be [8, 64, *], got [7, 64, 32]"});
  p = prob.params();
  p.w2.layout = Layout::shuffled_16x16;
  expect_invalid(p, {"w2: layout must equal w1's (row_major), got shuffled_16x16"});
  p = prob.params();
  p.w1.stride[0] = 1;
  expect_invalid(p, {"w1: must be contiguous"});
}

TEST(FusedMoe, ValidationShuffledNeedsAlignedDims) {
  MoeProblem prob = validation_problem();
  MoeProblem odd = make(small_shape(Scheme::bf16, 2, 4, 2, 48, 32));  // H = 48: not a multiple of 32
  FusedMoeParams p = odd.params();
  p.w1.layout = p.w2.layout = Layout::shuffled_16x16;
  expect_invalid(p, {"w1: layout shuffled_16x16 needs N % 16 == 0 and K % 32 == 0, got [N, K] = [64, 48]"});
  MoeProblem odd_i = make(small_shape(Scheme::bf16, 2, 4, 2, 64, 48));  // w2 K = I = 48
  p = odd_i.params();
  p.w1.layout = p.w2.layout = Layout::shuffled_16x16;
  expect_invalid(p, {"w2: layout shuffled_16x16 needs N % 16 == 0 and K % 32 == 0, got [N, K] = [64, 48]"});
}

TEST(FusedMoe, ValidationRouting) {
  MoeProblem prob = validation_problem();
  FusedMoeParams p = prob.params();
  p.topk_ids.dtype = DType::f32;
  expect_invalid(p, {"topk_ids: dtype must be i32, got f32"});
  p = prob.params();
  p.topk_ids.shape[0] = 3;
  expect_invalid(p, {"topk_ids: shape must be [4, *], got [3, 2]"});
  p = prob.params();
  p.topk_weights.shape[1] = 3;
  p.topk_weights.stride[0] = 3;
  expect_invalid(p, {"topk_weights: shape must be [4, 2], got [4, 3]"});
  p = prob.params();
  p.topk_weights.dtype = DType::bf16;
  expect_invalid(p, {"topk_weights: dtype must be f32, got bf16"});
  Buffer wide(DType::i32, {4, 9}), wide_w(DType::f32, {4, 9});
  p = prob.params();
  p.topk_ids = wide.view;
  p.topk_weights = wide_w.view;
  expect_invalid(p, {"topk_ids: k (dim 1) must be in [1, Eg=8], got 9"});
}

TEST(FusedMoe, ValidationOut) {
  MoeProblem prob = validation_problem();
  FusedMoeParams p = prob.params();
  p.out.dtype = DType::f32;
  expect_invalid(p, {"out: dtype must be bf16, got f32"});
  p = prob.params();
  p.out.shape[1] = 63;
  expect_invalid(p, {"out: shape must be [4, 64], got [4, 63]"});
  p = prob.params();
  p.out = TensorView();
  expect_invalid(p, {"out: required"});
}

TEST(FusedMoe, ValidationWeightOnInputNeedsKOne) {
  MoeProblem prob = validation_problem();
  FusedMoeParams p = prob.params();
  p.weight_on_input = true;
  expect_invalid(p, {"weight_on_input: needs k == 1", "got k = 2"});
}

TEST(FusedMoe, ValidationUnquantizedTakesNoScales) {
  MoeProblem prob = validation_problem();
  Buffer s(DType::f32, {8});
  FusedMoeParams p = prob.params();
  p.w1_scale = s.view;
  expect_invalid(p, {"w1_scale: must not be given (unquantized weights take no scale)"});
  p = prob.params();
  p.w2_scale = s.view;
  expect_invalid(p, {"w2_scale: must not be given"});
  Buffer a(DType::f32, {1});
  p = prob.params();
  p.a1_scale = a.view;
  expect_invalid(p, {"a1_scale: must not be given"});
  p = prob.params();
  p.scale_block_n = p.scale_block_k = 128;
  expect_invalid(p, {"scale_block_n/scale_block_k: block scales need fp8 weights, got 128 x 128 with w1 bf16"});
  p = prob.params();
  p.scale_block_n = 128;
  expect_invalid(p, {"scale_block_n/scale_block_k: must be both 0 or both > 0, got 128 x 0"});
}

TEST(FusedMoe, ValidationExpertIdsOutOfRange) {
  MoeProblem prob = validation_problem();
  FusedMoeParams p = prob.params();
  prob.topk_ids.data<int32_t>()[3 * 2 + 1] = 8;
  expect_invalid(p, {"topk_ids[3, 1]: expert id must be in [-1, Eg=8), got 8 (token 3, slot 1)"});
  prob.topk_ids.data<int32_t>()[3 * 2 + 1] = -2;
  expect_invalid(p, {"topk_ids[3, 1]", "got -2"});
}

TEST(FusedMoe, ValidationExpertMaskAndMap) {
  MoeProblem prob = validation_problem();
  MoeProblemOptions o;
  o.local_experts = 3;
  o.ep = ExpertParallel::mask;
  MoeProblem ep = make(small_shape(Scheme::bf16, 4, 8, 2, 64, 32), o);
  FusedMoeParams p = ep.params();
  p.expert_map = ep.expert_map.view;
  expect_invalid(p, {"expert_map: must not be given together with expert_mask"});
  p = ep.params();
  p.expert_mask.dtype = DType::f32;
  expect_invalid(p, {"expert_mask: dtype must be i32, got f32"});
  p = ep.params();
  p.expert_mask.shape[0] = 2;
  expect_invalid(p, {"expert_mask: length Eg must be >= E = 3", "got 2"});
  int32_t* mask = ep.expert_mask.data<int32_t>();
  const std::vector<int32_t> saved(mask, mask + 8);
  int32_t zero_at = 0;
  while (mask[zero_at]) ++zero_at;
  mask[zero_at] = 2;
  p = ep.params();
  expect_invalid(p, {("expert_mask[" + std::to_string(zero_at) + "]: must be 0 or 1, got 2").c_str()});
  mask[zero_at] = 1;  // four ones for three local experts
  expect_invalid(p, {"expert_mask: sum must equal the number of local experts E = 3", "got 4"});
  std::copy(saved.begin(), saved.end(), mask);
  // Ids are global: 8 is out of range even though only 3 experts are local.
  ep.topk_ids.data<int32_t>()[0] = 8;
  expect_invalid(p, {"topk_ids[0, 0]: expert id must be in [-1, Eg=8), got 8"});
  MoeProblemOptions om = o;
  om.ep = ExpertParallel::map;
  MoeProblem mp = make(small_shape(Scheme::bf16, 4, 8, 2, 64, 32), om);
  mp.expert_map.data<int32_t>()[5] = 3;
  expect_invalid(mp.params(), {"expert_map[5]: must be a local expert in [0, 3) or -1, got 3"});
  mp.expert_map.data<int32_t>()[5] = -2;
  expect_invalid(mp.params(), {"expert_map[5]", "got -2"});
}

TEST(FusedMoe, ValidationMissingAndEmptyArguments) {
  MoeProblem prob = validation_problem();
  FusedMoeParams p = prob.params();
  p.w1 = TensorView();
  expect_invalid(p, {"w1: required"});
  p = prob.params();
  p.w2 = TensorView();
  expect_invalid(p, {"w2: required"});
  p = prob.params();
  p.topk_ids = TensorView();
  expect_invalid(p, {"topk_ids: required"});
  p = prob.params();
  p.topk_weights = TensorView();
  expect_invalid(p, {"topk_weights: required"});
  p = prob.params();
  p.x.data = nullptr;
  expect_invalid(p, {"x: data is null"});
  p = prob.params();
  p.topk_ids.stride[0] = 3;
  expect_invalid(p, {"topk_ids: must be contiguous"});
  Buffer x0(DType::bf16, {4, 0}), out0(DType::bf16, {4, 0});
  p = prob.params();
  p.x = x0.view;
  p.out = out0.view;
  expect_invalid(p, {"x: hidden size (dim 1) must be >= 1, got 0"});
  Buffer w1e(DType::bf16, {0, 64, 64});
  p = prob.params();
  p.w1 = w1e.view;
  expect_invalid(p, {"w1: number of local experts (dim 0) must be >= 1, got 0"});
  Buffer w1i(DType::bf16, {8, 0, 64}), w2i(DType::bf16, {8, 64, 0});
  p = prob.params();
  p.w1 = w1i.view;
  p.w2 = w2i.view;
  expect_invalid(p, {"w2: intermediate size (dim 2) must be >= 1, got 0"});
}

TEST(FusedMoe, ValidationWorkspaceQueryValidatesToo) {
  MoeProblem prob = validation_problem();
  FusedMoeParams p = prob.params();
  p.out.dtype = DType::f16;
  size_t bytes = 7;
  const Status st = fused_moe_workspace_size(p, {}, &bytes);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument);
  EXPECT_NE(st.message().find("out: dtype"), std::string::npos) << st.message();
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(fused_moe_workspace_size(prob.params(), {}, nullptr).code(), StatusCode::invalid_argument);
}

TEST(FusedMoe, ValidationDevices) {
  MoeProblem prob = validation_problem();
  FusedMoeParams p = prob.params();
  p.out.device = Device::cuda;
  expect_invalid(p, {"out: is on cuda:0 but x is on cpu:0"});
  p = prob.params();
  p.topk_ids.device = Device::cuda;
  expect_invalid(p, {"topk_ids: is on cuda:0 but x is on cpu:0"});
}

// [2^21, 2^22, 2^21] weights wrapped to 0 elements, so a null w1 passed validation and crashed.
TEST(FusedMoe, ValidationSizesThatOverflow) {
  MoeProblem prob = validation_problem();
  const int64_t H = int64_t(1) << 21;
  FusedMoeParams p = prob.params();
  p.x = TensorView::contiguous(p.x.data, DType::bf16, {4, H});
  p.out = TensorView::contiguous(p.out.data, DType::bf16, {4, H});
  p.w1 = TensorView::contiguous(nullptr, DType::bf16, {H, int64_t(1) << 22, H});
  p.w2 = TensorView::contiguous(nullptr, DType::bf16, {H, H, H});
  expect_invalid(p, {"w1: [2097152, 4194304, 2097152] bf16 cpu", "spans more than 2^62 bytes"});
}

// Enum fields out of range: Layout(9) skipped the layout checks and read out of bounds,
// Activation(9) silently ran the identity.
TEST(FusedMoe, ValidationUnknownEnumValues) {
  MoeProblem prob = validation_problem();
  FusedMoeParams p = prob.params();
  p.w1.layout = p.w2.layout = static_cast<Layout>(9);
  expect_invalid(p, {"w1: layout 9 is not a Layout"});
  p = prob.params();
  p.activation = static_cast<Activation>(9);
  expect_invalid(p, {"activation: 9 is not an Activation"});
}

// out may be x itself, but a partial overlap made the reference kernels read rows they had
// already overwritten: a silent wrong answer. Overlapping any other input is refused too.
TEST(FusedMoe, OutAliasingXExactlyOrNotAtAll) {
  MoeProblem prob = validation_problem();  // T 4, H 64, bf16
  ASSERT_TRUE(fused_moe(prob.params()).ok());
  const std::vector<unsigned char> expected = prob.out.bytes;

  MoeProblem in_place = prob;
  FusedMoeParams p = in_place.params();
  p.out = p.x;
  ASSERT_TRUE(fused_moe(p).ok());
  EXPECT_EQ(in_place.x.bytes, expected);

  Buffer wide(DType::bf16, {5, 64});  // x in rows 0..3, out in rows 1..4
  std::memcpy(wide.bytes.data(), prob.x.bytes.data(), prob.x.bytes.size());
  p = prob.params();
  p.x = TensorView::contiguous(wide.bytes.data(), DType::bf16, {4, 64});
  p.out = TensorView::contiguous(wide.bytes.data() + 64 * 2, DType::bf16, {4, 64});
  const std::vector<unsigned char> before = wide.bytes;
  expect_invalid(p, {"out: overlaps x without being x"});
  EXPECT_EQ(wide.bytes, before);
  p = prob.params();
  p.out = TensorView::contiguous(prob.w2.bytes.data(), DType::bf16, {4, 64});
  expect_invalid(p, {"out: must not overlap w2"});
  p = prob.params();
  p.out = TensorView::contiguous(prob.topk_weights.bytes.data(), DType::bf16, {4, 64});
  expect_invalid(p, {"out: must not overlap"});
}

// A workspace the host cannot give (H = 2^48: petabytes) is an out_of_memory Status; it used to
// be a std::bad_alloc through an API that promises never to throw. Nothing reads the fake data.
TEST(FusedMoe, HostAllocationFailureIsAStatus) {
  MoeProblem prob = make(small_shape(Scheme::bf16, 1, 1, 1, 64, 1));
  const int64_t H = int64_t(1) << 48;
  // Disjoint fake ranges above the 47-bit user address space (no real buffer is there).
  auto fake = [](int i) { return reinterpret_cast<void*>((uintptr_t(1) << 52) + uintptr_t(i) * (uintptr_t(1) << 51)); };
  FusedMoeParams p = prob.params();
  p.x = TensorView::contiguous(fake(0), DType::bf16, {1, H});
  p.out = TensorView::contiguous(fake(1), DType::bf16, {1, H});
  p.w1 = TensorView::contiguous(fake(2), DType::bf16, {1, 2, H});
  p.w2 = TensorView::contiguous(fake(3), DType::bf16, {1, H, 1});
  RunOptions ref;
  ref.kernel = "fused_moe_ref";
  const Status st = fused_moe(p, ref);
  EXPECT_EQ(st.code(), StatusCode::out_of_memory) << st.to_string();
  EXPECT_NE(st.message().find("fused_moe_ref"), std::string::npos) << st.message();
}

// ---------------------------------------------------------------- poison: invalid calls write nothing
TEST(FusedMoe, PoisonInvalidCallsLeaveOutputUntouched) {
  MoeProblem prob = make(small_shape(Scheme::bf16, 5, 6, 2));
  struct Bad {
    const char* what;
    void (*edit)(MoeProblem&, FusedMoeParams&);
  };
  const Bad bads[] = {
      {"bad id in the last token",
       [](MoeProblem& m, FusedMoeParams&) { m.topk_ids.data<int32_t>()[m.topk_ids.numel() - 1] = 99; }},
      {"weight_on_input with k = 2", [](MoeProblem&, FusedMoeParams& p) { p.weight_on_input = true; }},
      {"scale given to unquantized weights",
       [](MoeProblem& m, FusedMoeParams& p) {
         m.w1_scale = Buffer(DType::f32, {6});
         p.w1_scale = m.w1_scale.view;
       }},
      {"w2 with the wrong H", [](MoeProblem&, FusedMoeParams& p) { p.w2.shape[1] = 95; }},
  };
  for (const Bad& b : bads) {
    MoeProblem m = prob;
    FusedMoeParams p = m.params();
    b.edit(m, p);
    m.out.fill_bytes(0xAB);
    const std::vector<unsigned char> before = m.out.bytes;
    EXPECT_FALSE(fused_moe(p).ok()) << b.what;
    EXPECT_EQ(m.out.bytes, before) << b.what;
  }
}

}  // namespace
}  // namespace moekit::testing
