// fused_moe_sm90_small_m_fp8_row(_tkw1) (src/ops/fused_moe/fused_moe_sm90_small_m_fp8.cuh): the fp8
// W8A8 decode CUDA kernel against the fp8 reference kernels with the kernel_vs_ref rows of
// docs/tolerances.md: the harness edge cases and presets for per-tensor and per-row schemes (and
// the router weight on the input), a static activation scale, g1u0 with gelu, an expert map, rows
// of all zeros (amax floor), very large values, and supports()' refusals.
// Device tests GTEST_SKIP when the kernel is not compiled in or no sm_90 device is present.
// Run: ./build/tests/moekit_tests --gtest_filter='FusedMoeSm90SmallMFp8*'
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "fused_moe_test_util.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit::testing {
namespace {

using moe_test::expect_all_ok;
using moe_test::make;
using moe_test::small_shape;

constexpr const char* kRow = "fused_moe_sm90_small_m_fp8_row";
constexpr const char* kTkw1 = "fused_moe_sm90_small_m_fp8_row_tkw1";

std::string unavailable() {
  if (registry().find(kRow) == nullptr) return "fused_moe_sm90_small_m_fp8_row is not compiled in (MOEKIT_CUDA off)";
  const Status st = registry().backend_available(Backend::cuda);
  return st.ok() ? "" : "CUDA backend unavailable: " + st.to_string();
}
#define SKIP_WITHOUT_KERNEL()                      \
  do {                                             \
    const std::string why = unavailable();         \
    if (!why.empty()) GTEST_SKIP() << why;         \
  } while (0)

// The CUDA kernel on device copies of prob's tensors against the fp8 ref kernel on the host.
void expect_matches_ref(MoeProblem& prob) {
  FusedMoeParams p = prob.params();
  const bool tkw1 = p.weight_on_input;
  RunOptions ro;
  ro.kernel = tkw1 ? "fused_moe_ref_fp8_row_tkw1" : "fused_moe_ref_fp8_row";
  prob.out.fill_bytes(0xFF);
  const Status rs = fused_moe(p, ro);
  ASSERT_TRUE(rs.ok()) << rs.to_string();
  const std::vector<double> expected = read_out(p.out);
  prob.out.fill_bytes(0xFF);
  {
    DeviceMirror dev(Backend::cuda);
    for (TensorView* t : {&p.x, &p.w1, &p.w2, &p.topk_ids, &p.topk_weights, &p.expert_mask, &p.expert_map,
                          &p.w1_scale, &p.w2_scale, &p.a1_scale}) {
      ASSERT_TRUE(dev.input(t).ok());
    }
    ASSERT_TRUE(dev.output(&p.out).ok());
    RunOptions opts;
    opts.kernel = tkw1 ? kTkw1 : kRow;
    size_t ws = 0;
    ASSERT_TRUE(fused_moe_workspace_size(p, opts, &ws).ok());
    ASSERT_TRUE(dev.scratch(ws, &opts.workspace).ok());
    opts.workspace_bytes = ws;
    const Status st = fused_moe(p, opts);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(dev.copy_back().ok());
  }
  const std::vector<double> actual = read_out(prob.params().out);
  for (double v : actual) ASSERT_TRUE(std::isfinite(v));
  Metrics m;
  std::string detail;
  const MoeVariant v = tkw1 ? MoeVariant::fp8_row_tkw1 : MoeVariant::fp8_row;
  EXPECT_TRUE(judge_moe(actual, expected, prob.shape.T, prob.shape.H,
                        moe_tolerance(v, prob.x_dtype, MoeCompare::kernel_vs_ref), &m, &detail))
      << detail << " | worst " << m.worst;
}

// Every case ok and the fp8 CUDA kernel really ran (except the refusals named below).
void expect_ran(const std::vector<CaseResult>& results) {
  expect_all_ok(results);
  int ran = 0;
  for (const CaseResult& r : results) {
    if (r.kernel != kRow && r.kernel != kTkw1) continue;
    // Refused by design: shuffled and CPU-packed (cpu_vnni2_n32) weights, and H or I not multiples
    // of 16 (the "H=200 I=72" case).
    const bool may_skip = r.name.find("shuffled") != std::string::npos || r.name.find("(packed)") != std::string::npos ||
                          r.name.find("H=200") != std::string::npos;
    EXPECT_TRUE(r.detail.rfind("skipped", 0) != 0 || may_skip) << r.name << " | " << r.detail;
    ran += r.detail.rfind("skipped", 0) == 0 ? 0 : 1;
  }
  EXPECT_GT(ran, 0);
}

TEST(FusedMoeSm90SmallMFp8, EdgeCasesPerTensorPerRowAndWeightOnInput) {
  SKIP_WITHOUT_KERNEL();
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    for (bool on_input : {false, true}) {
      CheckRequest req;
      req.shape.scheme = sc;
      req.shape.scheme_given = true;
      req.shape.weight_on_input = on_input;
      if (on_input) req.shape.topk = 1;
      req.tokens = {1, 8, 64};
      req.has_backend = true;
      req.backend = Backend::cuda;
      SCOPED_TRACE(std::string(scheme_name(sc)) + (on_input ? " weight_on_input" : ""));
      expect_ran(check_fused_moe(req));
    }
  }
}

TEST(FusedMoeSm90SmallMFp8, Presets) {
  SKIP_WITHOUT_KERNEL();
  for (const char* model : {"deepseek-v3", "qwen3-moe", "mixtral"}) {
    CheckRequest req;
    req.shape.model = model;
    req.shape.scheme = Scheme::fp8_channel;
    req.shape.scheme_given = true;
    req.tokens = {1, 8, 64};
    req.edge_cases = false;
    req.has_backend = true;
    req.backend = Backend::cuda;
    SCOPED_TRACE(model);
    expect_ran(check_fused_moe(req));
  }
}

TEST(FusedMoeSm90SmallMFp8, StaticActivationScale) {
  SKIP_WITHOUT_KERNEL();
  MoeProblemOptions o;
  o.static_a1_scale = true;
  MoeProblem prob = make(small_shape(Scheme::fp8_channel, 9, 6, 2, 128, 96), o);
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90SmallMFp8, G1U0GeluAndExpertMap) {
  SKIP_WITHOUT_KERNEL();
  MoeShape s = small_shape(Scheme::fp8_channel, 13, 10, 3, 160, 64);
  s.activation = Activation::gelu;
  MoeProblemOptions o;
  o.g1u1 = false;
  o.local_experts = 4;
  o.ep = ExpertParallel::map;
  MoeProblem prob = make(s, o);
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90SmallMFp8, ZeroRowsAndLargeValues) {
  SKIP_WITHOUT_KERNEL();
  MoeProblem prob = make(small_shape(Scheme::fp8_tensor, 6, 5, 2, 64, 64));
  const int64_t H = prob.shape.H;
  for (int64_t c = 0; c < H; ++c) {
    prob.x.set(0 * H + c, 0.0f);         // token 0: all zeros (the amax floor)
    prob.x.set(3 * H + c, 3.0e4f * ((c % 7) - 3));  // token 3: large values (scaled, not saturated)
  }
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90SmallMFp8, RefusesBlockScalesAndUnquantizedWeights) {
  const Kernel* k = registry().find(kRow);
  if (k == nullptr) GTEST_SKIP() << "not compiled in";
  MoeProblem blk = make(small_shape(Scheme::fp8_block, 3, 4, 2, 128, 128));
  const FusedMoeParams bp = blk.params();
  EXPECT_FALSE(k->supports(&bp).ok());
  MoeProblem bf = make(small_shape(Scheme::bf16, 3, 4, 2, 128, 128));
  const FusedMoeParams fp = bf.params();
  EXPECT_FALSE(k->supports(&fp).ok());
}

}  // namespace
}  // namespace moekit::testing
