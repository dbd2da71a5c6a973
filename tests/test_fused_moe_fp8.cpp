// fused_moe, fp8 variants: fp8_row (SPEC 3.2, per-row and per-tensor weight scales, dynamic or
// static activation scale), fp8_row_tkw1 (SPEC 3.4) and fp8_block (SPEC 3.3), plus the variant
// selection of SPEC 6 and the fp8-specific validation. Each reference output is compared with the
// float64 oracle on unquantized activations AND with the oracle that emulates the activation
// quantization (bounds: docs/tolerances.md).
// Run: ./build/tests/moekit_tests --gtest_filter='FusedMoeFp8*'
#include <gtest/gtest.h>

#include <cmath>
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

const Scheme kFp8Schemes[] = {Scheme::fp8_tensor, Scheme::fp8_channel, Scheme::fp8_block};

// ---------------------------------------------------------------- variant selection (SPEC 6)
TEST(FusedMoeFp8, VariantSelectionOrder) {
  MoeProblem row = make(small_shape(Scheme::fp8_channel));
  FusedMoeParams p = row.params();
  EXPECT_EQ(fused_moe_variant(p), MoeVariant::fp8_row);
  p.weight_on_input = true;
  EXPECT_EQ(fused_moe_variant(p), MoeVariant::fp8_row_tkw1);
  p.scale_block_n = p.scale_block_k = 128;  // block scale wins over weight on input
  EXPECT_EQ(fused_moe_variant(p), MoeVariant::fp8_block);
  MoeProblem tensor = make(small_shape(Scheme::fp8_tensor));
  EXPECT_EQ(fused_moe_variant(tensor.params()), MoeVariant::fp8_row);
  MoeProblem block = make(small_shape(Scheme::fp8_block));
  EXPECT_EQ(fused_moe_variant(block.params()), MoeVariant::fp8_block);
}

TEST(FusedMoeFp8, EveryVariantHasAReferenceKernel) {
  for (MoeVariant v : {MoeVariant::unquantized, MoeVariant::fp8_row, MoeVariant::fp8_row_tkw1, MoeVariant::fp8_block}) {
    bool found = false;
    for (const Kernel* k : registry().candidates(OpKind::fused_moe, v)) found = found || k->backend == Backend::ref;
    EXPECT_TRUE(found) << variant_name(v);
  }
}

// ---------------------------------------------------------------- edge cases
TEST(FusedMoeFp8, TZeroReturnsWithoutWriting) {
  for (Scheme sc : kFp8Schemes) {
    MoeProblem prob = make(small_shape(sc, 0));
    prob.out.fill_bytes(0xAB);
    const std::vector<unsigned char> before = prob.out.bytes;
    ASSERT_TRUE(fused_moe(prob.params()).ok());
    EXPECT_EQ(prob.out.bytes, before) << scheme_name(sc);
  }
}

// E = 1, k = 1, H = 2, I = 1, f32 x, per-row scales, every value exact in fp8:
//   x = [1, 0.5] -> s_x = 1/448, xq = [448, 224]
//   g = (448*1 + 224*2) * s_x * 0.25 = 0.5,  u = (448*0.5 + 224*1) * s_x * 0.5 = 0.5
//   a = silu(0.5) * 0.5 -> s_a = a/448, aq = 448
//   y = w * [448*1*s_a*1, 448*(-2)*s_a*0.5] = 0.75 * [a, -a]
TEST(FusedMoeFp8, HandComputedPerRow) {
  Buffer x(DType::f32, {1, 2}), w1(DType::fp8_e4m3fn, {1, 2, 2}), w2(DType::fp8_e4m3fn, {1, 2, 1});
  Buffer s1(DType::f32, {1, 2, 1}), s2(DType::f32, {1, 2}), ids(DType::i32, {1, 1}), wts(DType::f32, {1, 1});
  Buffer out(DType::f32, {1, 2});
  x.set(0, 1.0f);
  x.set(1, 0.5f);
  const float w1v[] = {1.0f, 2.0f, 0.5f, 1.0f};
  for (int i = 0; i < 4; ++i) w1.set(i, w1v[i]);
  w2.set(0, 1.0f);
  w2.set(1, -2.0f);
  s1.set(0, 0.25f);
  s1.set(1, 0.5f);
  s2.set(0, 1.0f);
  s2.set(1, 0.5f);
  ids.data<int32_t>()[0] = 0;
  wts.set(0, 0.75f);
  FusedMoeParams p;
  p.x = x.view;
  p.w1 = w1.view;
  p.w2 = w2.view;
  p.w1_scale = s1.view;
  p.w2_scale = s2.view;
  p.topk_ids = ids.view;
  p.topk_weights = wts.view;
  p.out = out.view;
  ASSERT_TRUE(fused_moe(p).ok());
  const double a = 0.5 / (1.0 + std::exp(-0.5)) * 0.5;
  EXPECT_NEAR(out.get(0), 0.75 * a, 1e-6);
  EXPECT_NEAR(out.get(1), -0.75 * a, 1e-6);
  // Same through the block variant with 1 x 1 blocks of the same scales (block = element).
  Buffer b1(DType::f32, {1, 2, 2}), b2(DType::f32, {1, 2, 1});
  for (int i = 0; i < 4; ++i) b1.set(i, i < 2 ? 0.25f : 0.5f);
  b2.set(0, 1.0f);
  b2.set(1, 0.5f);
  p.w1_scale = b1.view;
  p.w2_scale = b2.view;
  p.scale_block_n = p.scale_block_k = 1;
  ASSERT_TRUE(fused_moe(p).ok());
  // 1 x 1 activation groups quantize every element exactly: y = 0.75 * [a, -a] again.
  EXPECT_NEAR(out.get(0), 0.75 * a, 1e-6);
  EXPECT_NEAR(out.get(1), -0.75 * a, 1e-6);
}

TEST(FusedMoeFp8, ZeroTokenGivesZeroRowWithoutNaN) {
  for (Scheme sc : kFp8Schemes) {
    MoeProblem prob = make(small_shape(sc, 3));
    for (int64_t c = 0; c < prob.shape.H; ++c) prob.x.set(prob.shape.H + c, 0.0f);  // token 1 = 0
    expect_matches_oracle(prob);
    const std::vector<double> y = read_out(prob.params().out);
    for (int64_t c = 0; c < prob.shape.H; ++c) EXPECT_EQ(y[size_t(prob.shape.H + c)], 0.0) << scheme_name(sc);
  }
}

TEST(FusedMoeFp8, TOneKOneKEqualsE) {
  for (Scheme sc : kFp8Schemes) {
    SCOPED_TRACE(scheme_name(sc));
    MoeProblem t1 = make(small_shape(sc, 1));
    expect_matches_oracle(t1);
    MoeProblem k1 = make(small_shape(sc, 5, 6, 1));
    expect_matches_oracle(k1);
    MoeProblem kE = make(small_shape(sc, 4, 5, 5));
    expect_matches_oracle(kE);
    MoeProblem e_gt_t = make(small_shape(sc, 2, 11, 3));
    expect_matches_oracle(e_gt_t);
  }
}

TEST(FusedMoeFp8, PerTensorScaleIsBroadcastToRows) {
  MoeProblem tensor = make(small_shape(Scheme::fp8_tensor));
  ASSERT_TRUE(fused_moe(tensor.params()).ok());
  const std::vector<unsigned char> want = tensor.out.bytes;
  // The same codes with the [E] scales expanded to [E, N] and [E, N, 1].
  const int64_t E = tensor.E, N1 = tensor.N1, H = tensor.shape.H;
  for (bool three_d : {false, true}) {
    MoeProblem expanded = tensor;
    expanded.w1_scale = three_d ? Buffer(DType::f32, {E, N1, 1}) : Buffer(DType::f32, {E, N1});
    expanded.w2_scale = three_d ? Buffer(DType::f32, {E, H, 1}) : Buffer(DType::f32, {E, H});
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t n = 0; n < N1; ++n) expanded.w1_scale.set(e * N1 + n, tensor.w1_scale.get(e));
      for (int64_t n = 0; n < H; ++n) expanded.w2_scale.set(e * H + n, tensor.w2_scale.get(e));
    }
    expanded.out.fill_bytes(0);
    ASSERT_TRUE(fused_moe(expanded.params()).ok());
    EXPECT_EQ(expanded.out.bytes, want) << (three_d ? "[E, N, 1]" : "[E, N]");
  }
}

TEST(FusedMoeFp8, EmptyExpertsAreNeverRead) {
  for (Scheme sc : kFp8Schemes) {
    MoeProblem prob = make(small_shape(sc, 2, 16, 2));
    for (int64_t e = 0; e < prob.E; ++e) {
      if (prob.touched[size_t(e)]) continue;
      const int64_t per1 = prob.N1 * prob.shape.H, per2 = prob.shape.H * prob.shape.I;
      for (int64_t i = 0; i < per1; ++i) prob.w1.data<uint8_t>()[e * per1 + i] = 0x7F;  // NaN
      for (int64_t i = 0; i < per2; ++i) prob.w2.data<uint8_t>()[e * per2 + i] = 0x7F;
    }
    SCOPED_TRACE(scheme_name(sc));
    expect_matches_oracle(prob);
  }
}

TEST(FusedMoeFp8, MinusOneIdsAndExpertMask) {
  for (Scheme sc : kFp8Schemes) {
    SCOPED_TRACE(scheme_name(sc));
    MoeProblem ids = make(small_shape(sc, 5));
    ids.topk_ids.data<int32_t>()[0] = ids.topk_ids.data<int32_t>()[1] = -1;
    ids.topk_ids.data<int32_t>()[4] = -1;
    update_touched(&ids);
    expect_matches_oracle(ids);
    const std::vector<double> y = read_out(ids.params().out);
    for (int64_t c = 0; c < ids.shape.H; ++c) EXPECT_EQ(y[size_t(c)], 0.0);
    for (ExpertParallel ep : {ExpertParallel::mask, ExpertParallel::map}) {
      MoeProblemOptions o;
      o.local_experts = 3;
      o.ep = ep;
      MoeProblem m = make(small_shape(sc, 6, 9, 2), o);
      expect_matches_oracle(m);
    }
  }
}

TEST(FusedMoeFp8, SizesNotMultiplesOfTheBlock) {
  for (Scheme sc : kFp8Schemes) {
    MoeProblem prob = make(small_shape(sc, 4, 5, 2, 200, 72));
    SCOPED_TRACE(scheme_name(sc));
    expect_matches_oracle(prob);
  }
  // Several blocks with a partial last one along every dim: blocks of 32 and 64.
  for (int block : {32, 64}) {
    MoeProblemOptions o;
    o.block = block;
    MoeProblem prob = make(small_shape(Scheme::fp8_block, 4, 5, 2, 200, 72), o);
    EXPECT_EQ(prob.params().w1_scale.shape[1], (144 + block - 1) / block);
    SCOPED_TRACE(block);
    expect_matches_oracle(prob);
  }
  // Non-square blocks (bn != bk): a swapped row / column block index would show here.
  for (auto [bn, bk] : {std::pair<int, int>{32, 64}, std::pair<int, int>{128, 32}}) {
    MoeProblemOptions o;
    o.block = bn;
    o.block_k = bk;
    MoeProblem prob = make(small_shape(Scheme::fp8_block, 4, 5, 2, 200, 72), o);
    const FusedMoeParams p = prob.params();
    EXPECT_EQ(p.scale_block_n, bn);
    EXPECT_EQ(p.scale_block_k, bk);
    EXPECT_EQ(p.w2_scale.shape[1], (200 + bn - 1) / bn);
    EXPECT_EQ(p.w2_scale.shape[2], (72 + bk - 1) / bk);
    SCOPED_TRACE(std::to_string(bn) + "x" + std::to_string(bk));
    expect_matches_oracle(prob);
  }
}

TEST(FusedMoeFp8, G1U0AndEachActivation) {
  for (Scheme sc : kFp8Schemes) {
    MoeProblemOptions g1u0;
    g1u0.g1u1 = false;
    MoeProblem p = make(small_shape(sc), g1u0);
    SCOPED_TRACE(scheme_name(sc));
    expect_matches_oracle(p);
    for (Activation a : {Activation::gelu, Activation::gelu_tanh}) {
      MoeShape s = small_shape(sc);
      s.activation = a;
      MoeProblem q = make(s);
      expect_matches_oracle(q);
    }
  }
}

TEST(FusedMoeFp8, WeightOnInputEveryScheme) {
  for (Scheme sc : kFp8Schemes) {
    MoeShape s = small_shape(sc, 6, 6, 1);
    s.weight_on_input = true;
    MoeProblem prob = make(s);
    EXPECT_EQ(fused_moe_variant(prob.params()),
              sc == Scheme::fp8_block ? MoeVariant::fp8_block : MoeVariant::fp8_row_tkw1);
    SCOPED_TRACE(scheme_name(sc));
    expect_matches_oracle(prob);
  }
}

TEST(FusedMoeFp8, StaticActivationScale) {
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    MoeProblemOptions o;
    o.static_a1_scale = true;
    MoeProblem prob = make(small_shape(sc), o);
    ASSERT_TRUE(prob.params().a1_scale.present());
    SCOPED_TRACE(scheme_name(sc));
    expect_matches_oracle(prob);
    // A scale 8x too small saturates most of x to +-448: the result follows the emulation (the
    // recipe saturates, never overflows to NaN) even though it is far from the exact oracle.
    prob.a1_scale.set(0, prob.a1_scale.get(0) / 8.0f);
    FusedMoeParams p = prob.params();
    ASSERT_TRUE(fused_moe(p).ok());
    OracleOptions emu;
    emu.emulate_fp8_activations = true;
    Metrics m;
    std::string detail;
    EXPECT_TRUE(judge_moe(read_out(p.out), oracle_fused_moe(p, emu), prob.shape.T, prob.shape.H,
                          moe_tolerance(MoeVariant::fp8_row, prob.x_dtype, MoeCompare::ref_vs_emulation), &m, &detail))
        << detail;
  }
}

TEST(FusedMoeFp8, ShuffledWeightsGiveTheSameResultAsPlain) {
  for (Scheme sc : kFp8Schemes) {
    MoeProblemOptions shuffled;
    shuffled.shuffled = true;
    MoeProblem plain = make(small_shape(sc)), shuf = make(small_shape(sc), shuffled);
    EXPECT_NE(plain.w1.bytes, shuf.w1.bytes);
    ASSERT_TRUE(fused_moe(plain.params()).ok());
    ASSERT_TRUE(fused_moe(shuf.params()).ok());
    EXPECT_EQ(plain.out.bytes, shuf.out.bytes) << scheme_name(sc);
  }
}

TEST(FusedMoeFp8, RowStridedXAndOut) {
  for (Scheme sc : kFp8Schemes) {
    MoeProblemOptions o;
    o.row_pad = 3;
    MoeProblem prob = make(small_shape(sc), o);
    SCOPED_TRACE(scheme_name(sc));
    expect_matches_oracle(prob);
  }
}

TEST(FusedMoeFp8, DeterministicAcrossRuns) {
  for (Scheme sc : kFp8Schemes) {
    MoeProblem prob = make(small_shape(sc, 9, 6, 3));
    ASSERT_TRUE(fused_moe(prob.params()).ok());
    const std::vector<unsigned char> first = prob.out.bytes;
    prob.out.fill_bytes(0);
    ASSERT_TRUE(fused_moe(prob.params()).ok());
    EXPECT_EQ(prob.out.bytes, first) << scheme_name(sc);
  }
}

// ---------------------------------------------------------------- random vs oracle
TEST(FusedMoeFp8, RandomVsOracle) {
  for (Scheme sc : kFp8Schemes) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      Rng rng(seed * 131);
      MoeShape s = small_shape(sc, rng.integer(1, 10), rng.integer(2, 12), 1, rng.integer(16, 300),
                               rng.integer(8, 160));
      s.k = rng.integer(1, s.E);
      s.activation = Activation(rng.integer(0, 2));
      if (s.k == 1 && rng.integer(0, 1)) s.weight_on_input = true;
      MoeProblemOptions o;
      o.g1u1 = rng.integer(0, 3) != 0;
      o.block = int(rng.integer(0, 1) ? 128 : 64);
      MoeProblem prob = make(s, o, seed);
      SCOPED_TRACE(std::string(scheme_name(sc)) + " seed " + std::to_string(seed) + " T=" + std::to_string(s.T) +
                   " E=" + std::to_string(s.E) + " k=" + std::to_string(s.k) + " H=" + std::to_string(s.H) +
                   " I=" + std::to_string(s.I));
      expect_matches_oracle(prob);
    }
  }
}

// ---------------------------------------------------------------- harness hook
TEST(FusedMoeFp8, CheckHookEdgeCasesEachFp8Scheme) {
  for (Scheme sc : kFp8Schemes) {
    CheckRequest req;
    req.shape.scheme = sc;
    req.shape.scheme_given = true;
    req.tokens = {3};
    expect_all_ok(check_fused_moe(req));
  }
}

TEST(FusedMoeFp8, CheckHookEdgeCasesWithWeightOnInput) {
  for (Scheme sc : kFp8Schemes) {
    CheckRequest req;
    req.shape.model = "llama4";
    req.shape.scheme = sc;
    req.shape.scheme_given = true;
    req.tokens = {2};
    const std::vector<CaseResult> results = check_fused_moe(req);
    expect_all_ok(results);
    for (const CaseResult& r : results) EXPECT_NE(r.name.find("weight_on_input"), std::string::npos) << r.name;
  }
}

TEST(FusedMoeFp8, CheckHookEveryPresetFp8) {
  for (const ModelPreset& m : model_presets()) {
    for (Scheme sc : kFp8Schemes) {
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

// ---------------------------------------------------------------- validation
void expect_invalid(const FusedMoeParams& p, std::initializer_list<const char*> parts) {
  const Status st = fused_moe(p);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st.to_string();
  for (const char* s : parts) EXPECT_NE(st.message().find(s), std::string::npos) << "'" << s << "' not in: " << st.message();
}

TEST(FusedMoeFp8, ValidationWeightsAndRowScales) {
  MoeProblem prob = make(small_shape(Scheme::fp8_channel, 4, 8, 2, 64, 32));
  FusedMoeParams p = prob.params();
  p.w1.dtype = p.w2.dtype = DType::fp8_e4m3fnuz;
  expect_invalid(p, {"w1: dtype must be bf16|fp8_e4m3fn, got fp8_e4m3fnuz"});
  p = prob.params();
  p.w2.dtype = DType::bf16;
  expect_invalid(p, {"w2: dtype must equal w1's (fp8_e4m3fn), got bf16"});
  p = prob.params();
  p.w1_scale = TensorView();
  expect_invalid(p, {"w1_scale: required"});
  p = prob.params();
  p.w2_scale.dtype = DType::bf16;
  expect_invalid(p, {"w2_scale: dtype must be f32, got bf16"});
  Buffer wrong(DType::f32, {8, 65});
  p = prob.params();
  p.w1_scale = wrong.view;
  expect_invalid(p, {"w1_scale: shape must be [8] (per-tensor), [8, 64] or [8, 64, 1] (per-row), got [8, 65]"});
  Buffer a1(DType::f32, {2});
  p = prob.params();
  p.a1_scale = a1.view;
  expect_invalid(p, {"a1_scale: shape must be [1], got [2]"});
  Buffer a1_zero(DType::f32, {1});
  p = prob.params();
  p.a1_scale = a1_zero.view;
  expect_invalid(p, {"a1_scale[0]: static activation scale must be finite and > 0, got 0"});
  a1_zero.set(0, std::numeric_limits<float>::quiet_NaN());
  expect_invalid(p, {"a1_scale[0]", "got nan"});
  p = prob.params();
  p.weight_on_input = true;
  expect_invalid(p, {"weight_on_input: needs k == 1", "got k = 2"});
}

TEST(FusedMoeFp8, ValidationBlockScales) {
  MoeProblem prob = make(small_shape(Scheme::fp8_block, 4, 8, 2, 200, 72));
  FusedMoeParams p = prob.params();
  p.scale_block_k = 0;
  expect_invalid(p, {"scale_block_n/scale_block_k: must be both 0 or both > 0, got 128 x 0"});
  p = prob.params();
  p.scale_block_k = 64;  // w1_scale is [8, 2, 2]; 64-wide blocks need [8, 2, 4]
  expect_invalid(p, {"w1_scale: block scale shape must be [8, 2, 4] (= [E, ceil(144/128), ceil(200/64)]), got [8, 2, 2]"});
  Buffer w2s(DType::f32, {8, 2, 2});
  p = prob.params();
  p.w2_scale = w2s.view;
  expect_invalid(p, {"w2_scale: block scale shape must be [8, 2, 1]", "got [8, 2, 2]"});
  Buffer a1(DType::f32, {1});
  p = prob.params();
  p.a1_scale = a1.view;
  expect_invalid(p, {"a1_scale: must not be given (the block variant quantizes activations per 1 x scale_block_k group)"});
  // A per-row scale with block sizes set is a block-scale shape error, not silently per-row.
  MoeProblem row = make(small_shape(Scheme::fp8_channel, 4, 8, 2, 200, 72));
  p = row.params();
  p.scale_block_n = p.scale_block_k = 128;
  expect_invalid(p, {"w1_scale: block scale shape must be [8, 2, 2]", "got [8, 144, 1]"});
}

TEST(FusedMoeFp8, PoisonInvalidCallsLeaveOutputUntouched) {
  struct Bad {
    const char* what;
    Scheme scheme;
    void (*edit)(MoeProblem&, FusedMoeParams&);
  };
  const Bad bads[] = {
      {"bad id in the last token", Scheme::fp8_block,
       [](MoeProblem& m, FusedMoeParams&) { m.topk_ids.data<int32_t>()[m.topk_ids.numel() - 1] = 6; }},
      {"tkw1 with k = 2", Scheme::fp8_channel, [](MoeProblem&, FusedMoeParams& p) { p.weight_on_input = true; }},
      {"wrong per-row scale shape", Scheme::fp8_channel,
       [](MoeProblem&, FusedMoeParams& p) { p.w2_scale.shape[1] = p.w2_scale.shape[1] - 1; }},
      {"wrong block scale shape", Scheme::fp8_block, [](MoeProblem&, FusedMoeParams& p) { p.scale_block_n = 64; }},
      {"expert_mask sum != E", Scheme::fp8_tensor,
       [](MoeProblem& m, FusedMoeParams& p) {
         m.expert_mask.data<int32_t>()[0] = 0;  // all ones before: now 5 local experts for E = 6
         p.expert_mask = m.expert_mask.view;
       }},
  };
  for (const Bad& b : bads) {
    MoeProblem m = make(small_shape(b.scheme, 5, 6, 2, 200, 72));
    FusedMoeParams p = m.params();
    b.edit(m, p);
    m.out.fill_bytes(0xAB);
    const std::vector<unsigned char> before = m.out.bytes;
    const Status st = fused_moe(p);
    EXPECT_EQ(st.code(), StatusCode::invalid_argument) << b.what << ": " << st.to_string();
    EXPECT_EQ(m.out.bytes, before) << b.what;
  }
}

}  // namespace
}  // namespace moekit::testing
