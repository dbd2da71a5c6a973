// The AITER-named entry points (moekit/aiter.h) produce exactly what the moekit front doors
// produce for the same problem, and reject what their AITER counterparts do not cover.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "moekit/aiter.h"
#include "moekit/ops/layout.h"
#include "moekit/ops/routing.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit {
namespace {

using testing::Buffer;
using testing::MoeProblem;
using testing::MoeShape;
using testing::Scheme;

MoeProblem problem(Scheme scheme, int64_t k, bool weight_on_input) {
  MoeShape s;
  s.T = 5;
  s.E = 6;
  s.k = k;
  s.H = 256;
  s.I = 128;
  s.scheme = scheme;
  s.weight_on_input = weight_on_input;
  MoeProblem p;
  testing::MoeProblemOptions o;
  EXPECT_TRUE(testing::make_moe_problem(s, o, 7, &p).ok());
  return p;
}

// Runs the moekit front door on p, returns the output bytes.
std::vector<unsigned char> expected_bytes(MoeProblem& p) {
  EXPECT_TRUE(fused_moe(p.params()).ok());
  return p.out.bytes;
}

TEST(Aiter, CkMoeEqualsFusedMoe) {
  MoeProblem p = problem(Scheme::bf16, 2, false);
  const std::vector<unsigned char> want = expected_bytes(p);
  p.out.fill_bytes(0);
  const FusedMoeParams f = p.params();
  ASSERT_TRUE(aiter::ck_moe(f.x, f.w1, f.w2, f.topk_weights, f.topk_ids, f.out).ok());
  EXPECT_EQ(p.out.bytes, want);
}

TEST(Aiter, AsmMoeEqualsFusedMoeForPerTensorAndPerChannel) {
  for (Scheme s : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    MoeProblem p = problem(s, 2, false);
    const std::vector<unsigned char> want = expected_bytes(p);
    p.out.fill_bytes(0);
    const FusedMoeParams f = p.params();
    ASSERT_TRUE(aiter::asm_moe(f.x, f.w1, f.w2, f.topk_weights, f.topk_ids, f.w1_scale, f.w2_scale, f.out).ok());
    EXPECT_EQ(p.out.bytes, want) << testing::scheme_name(s);
  }
}

TEST(Aiter, AsmMoeTkw1EqualsFusedMoeWithWeightOnInput) {
  MoeProblem p = problem(Scheme::fp8_channel, 1, true);
  const std::vector<unsigned char> want = expected_bytes(p);
  p.out.fill_bytes(0);
  const FusedMoeParams f = p.params();
  ASSERT_TRUE(
      aiter::asm_moe_tkw1(f.x, f.w1, f.w2, f.topk_weights, f.topk_ids, f.w1_scale, f.w2_scale, f.out).ok());
  EXPECT_EQ(p.out.bytes, want);
}

TEST(Aiter, FmoeFp8BlockscaleEqualsFusedMoe) {
  MoeProblem p = problem(Scheme::fp8_block, 2, false);
  const std::vector<unsigned char> want = expected_bytes(p);
  p.out.fill_bytes(0);
  const FusedMoeParams f = p.params();
  ASSERT_TRUE(aiter::fmoe_fp8_blockscale_g1u1(f.x, f.w1, f.w2, f.topk_weights, f.topk_ids, f.w1_scale,
                                              f.w2_scale, f.out, f.scale_block_n, f.scale_block_k)
                  .ok());
  EXPECT_EQ(p.out.bytes, want);
}

TEST(Aiter, WrongFamilyIsRejectedBeforeAnyWrite) {
  MoeProblem q = problem(Scheme::fp8_channel, 2, false);
  const FusedMoeParams fq = q.params();
  q.out.fill_bytes(0xAB);
  const std::vector<unsigned char> poisoned = q.out.bytes;
  Status s = aiter::ck_moe(fq.x, fq.w1, fq.w2, fq.topk_weights, fq.topk_ids, fq.out);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("ck_moe: w1: fp8 weights need scales"), std::string::npos) << s.message();
  // tkw1 needs k == 1.
  s = aiter::asm_moe_tkw1(fq.x, fq.w1, fq.w2, fq.topk_weights, fq.topk_ids, fq.w1_scale, fq.w2_scale, fq.out);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_EQ(q.out.bytes, poisoned);

  MoeProblem b = problem(Scheme::bf16, 2, false);
  const FusedMoeParams fb = b.params();
  s = aiter::asm_moe(fb.x, fb.w1, fb.w2, fb.topk_weights, fb.topk_ids, {}, {}, fb.out);
  EXPECT_NE(s.message().find("asm_moe: w1: dtype must be fp8_e4m3fn, got bf16"), std::string::npos)
      << s.message();
  s = aiter::fmoe_fp8_blockscale_g1u1(fq.x, fq.w1, fq.w2, fq.topk_weights, fq.topk_ids, fq.w1_scale,
                                      fq.w2_scale, fq.out, 0, 128);
  EXPECT_NE(s.message().find("block_n and block_k must be >= 1, got 0, 128"), std::string::npos) << s.message();
}

TEST(Aiter, TopkSoftmaxEqualsMoekitOp) {
  const int64_t T = 9, E = 12, k = 3;
  Buffer logits(DType::f32, {T, E});
  testing::Rng rng(3);
  rng.fill_normal(logits, 1.0f);
  Buffer w1(DType::f32, {T, k}), id1(DType::i32, {T, k}), tei1(DType::i32, {T, k});
  Buffer w2 = w1, id2 = id1, tei2 = tei1;
  ASSERT_TRUE(aiter::topk_softmax(w1.view, id1.view, tei1.view, logits.view, true).ok());
  TopkSoftmaxParams p;
  p.gating = logits.view;
  p.k = int(k);
  p.renormalize = true;
  p.topk_weights = w2.view;
  p.topk_ids = id2.view;
  p.token_expert_indices = tei2.view;
  ASSERT_TRUE(topk_softmax(p).ok());
  EXPECT_EQ(w1.bytes, w2.bytes);
  EXPECT_EQ(id1.bytes, id2.bytes);
  EXPECT_EQ(tei1.bytes, tei2.bytes);
}

TEST(Aiter, ShuffleWeightTagsTheOutputLayout) {
  Buffer in(DType::bf16, {2, 32, 64});
  testing::Rng rng(5);
  rng.fill_normal(in, 1.0f);
  Buffer a(DType::bf16, {2, 32, 64}), b(DType::bf16, {2, 32, 64});
  // The caller's view of `a` is untagged; the adapter tags it (AITER's shuffle_weight returns a
  // tensor in the shuffled layout).
  ASSERT_TRUE(aiter::shuffle_weight(in.view, a.view).ok());
  ShuffleWeightParams p;
  p.in = in.view;
  p.out = b.view;
  p.out.layout = Layout::shuffled_16x16;
  ASSERT_TRUE(shuffle_weight(p).ok());
  EXPECT_EQ(a.bytes, b.bytes);
}

}  // namespace
}  // namespace moekit
