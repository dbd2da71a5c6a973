// fused_moe_sm90_small_m (src/ops/fused_moe/fused_moe_sm90_small_m.cu), the decode CUDA kernel of
// the unquantized variant, against fused_moe_ref with the kernel_vs_ref row of docs/tolerances.md:
// the harness edge cases for each dtype / activation / weight place, the deepseek-v3 / qwen3-moe /
// mixtral small presets at T 1, 8, 64, random shapes with mask / map / g1u0 / row-strided x and out
// and T up to 300, ids outside [-1, Eg) on the device, determinism, and supports()' refusals.
// Device tests GTEST_SKIP when the kernel is not compiled in or no sm_90 device is present.
// Run: ./build/tests/moekit_tests --gtest_filter='FusedMoeSm90SmallM*'
#include <gtest/gtest.h>

#include <algorithm>
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

constexpr const char* kSmallM = "fused_moe_sm90_small_m";

// Why the CUDA kernel cannot run here ("" when it can).
std::string small_m_unavailable() {
  const Kernel* k = registry().find(kSmallM);
  if (k == nullptr) return "fused_moe_sm90_small_m is not compiled in (MOEKIT_CUDA off)";
  const Status st = registry().backend_available(Backend::cuda);
  return st.ok() ? "" : "CUDA backend unavailable: " + st.to_string();
}
#define SKIP_WITHOUT_SMALL_M()                             \
  do {                                                     \
    const std::string why = small_m_unavailable();         \
    if (!why.empty()) GTEST_SKIP() << why;                 \
  } while (0)

// Runs the CUDA kernel on device copies of p (out poisoned with NaN first) into prob's out; returns
// the status of the call.
Status run_small_m(MoeProblem& prob, FusedMoeParams p) {
  prob.out.fill_bytes(0xFF);
  DeviceMirror dev(Backend::cuda);
  for (TensorView* t : {&p.x, &p.w1, &p.w2, &p.topk_ids, &p.topk_weights, &p.expert_mask, &p.expert_map}) {
    MOEKIT_RETURN_IF_ERROR(dev.input(t));
  }
  MOEKIT_RETURN_IF_ERROR(dev.output(&p.out));
  RunOptions opts;
  opts.kernel = kSmallM;
  size_t ws = 0;
  MOEKIT_RETURN_IF_ERROR(fused_moe_workspace_size(p, opts, &ws));
  MOEKIT_RETURN_IF_ERROR(dev.scratch(ws, &opts.workspace));
  opts.workspace_bytes = ws;
  MOEKIT_RETURN_IF_ERROR(fused_moe(p, opts));
  return dev.copy_back();
}

// The kernel on prob (with `kernel_params`, default prob.params()) against the ref kernel on prob.
void expect_small_m_matches_ref(MoeProblem& prob, const FusedMoeParams* kernel_params = nullptr) {
  RunOptions ro;
  ro.kernel = "fused_moe_ref";
  prob.out.fill_bytes(0xFF);
  ASSERT_TRUE(fused_moe(prob.params(), ro).ok());
  const std::vector<double> expected = read_out(prob.params().out);
  const Status st = run_small_m(prob, kernel_params ? *kernel_params : prob.params());
  ASSERT_TRUE(st.ok()) << st.to_string();
  Metrics m;
  std::string detail;
  EXPECT_TRUE(judge_moe(read_out(prob.params().out), expected, prob.shape.T, prob.shape.H,
                        moe_tolerance(MoeVariant::unquantized, prob.x_dtype, MoeCompare::kernel_vs_ref), &m, &detail))
      << detail;
}

// Every case ok, and the CUDA kernel really ran (only shuffled / CPU-packed weights may be skipped).
void expect_small_m_ran(const std::vector<CaseResult>& results) {
  expect_all_ok(results);
  int ran = 0;
  for (const CaseResult& r : results) {
    if (r.kernel != kSmallM) continue;
    const bool skipped = r.detail.rfind("skipped", 0) == 0;
    // Refused by design: shuffled and CPU-packed (cpu_vnni2_n32) weights.
    const bool may_skip = r.name.find("shuffled") != std::string::npos || r.name.find("(packed)") != std::string::npos;
    EXPECT_TRUE(!skipped || may_skip) << r.name << " | " << r.detail;
    ran += skipped ? 0 : 1;
  }
  EXPECT_GT(ran, 0);
}

TEST(FusedMoeSm90SmallM, EdgeCasesEachDtypeActivationAndWeightPlace) {
  SKIP_WITHOUT_SMALL_M();
  for (Scheme sc : {Scheme::bf16, Scheme::f16}) {
    for (int act = 0; act < 3; ++act) {
      for (bool on_input : {false, true}) {
        CheckRequest req;
        req.shape.scheme = sc;
        req.shape.scheme_given = true;
        req.shape.activation = Activation(act);
        req.shape.weight_on_input = on_input;
        if (on_input) req.shape.topk = 1;
        req.tokens = {1, 8, 64};
        req.has_backend = true;
        req.backend = Backend::cuda;
        SCOPED_TRACE(std::string(scheme_name(sc)) + " " + activation_name(Activation(act)) +
                     (on_input ? " weight_on_input" : ""));
        expect_small_m_ran(check_fused_moe(req));
      }
    }
  }
}

TEST(FusedMoeSm90SmallM, Presets) {
  SKIP_WITHOUT_SMALL_M();
  for (const char* model : {"deepseek-v3", "qwen3-moe", "mixtral"}) {
    for (Scheme sc : {Scheme::bf16, Scheme::f16}) {
      CheckRequest req;
      req.shape.model = model;
      req.shape.scheme = sc;
      req.shape.scheme_given = true;
      req.tokens = {1, 8, 64};
      req.edge_cases = false;
      req.has_backend = true;
      req.backend = Backend::cuda;
      SCOPED_TRACE(std::string(model) + " " + scheme_name(sc));
      expect_small_m_ran(check_fused_moe(req));
    }
  }
}

TEST(FusedMoeSm90SmallM, RandomShapesMaskMapAndLargeT) {
  SKIP_WITHOUT_SMALL_M();
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    Rng rng(seed * 131);
    // T up to 300: experts get more slots than one pass stages (the chunk loop).
    MoeShape s = small_shape(seed % 2 ? Scheme::bf16 : Scheme::f16, seed == 8 ? 300 : rng.integer(1, 70),
                             rng.integer(1, 40), 1, 8 * rng.integer(1, 64), 8 * rng.integer(1, 48));
    s.k = rng.integer(1, std::min<int64_t>(s.E, 8));
    s.activation = Activation(rng.integer(0, 2));
    MoeProblemOptions o;
    o.g1u1 = rng.integer(0, 3) != 0;
    o.round_intermediate = rng.integer(0, 3) != 0;
    o.row_pad = rng.integer(0, 1) ? rng.integer(1, 9) : 0;
    if (s.E >= 4 && rng.integer(0, 1)) {
      o.local_experts = rng.integer(1, s.E - 1);
      o.ep = rng.integer(0, 1) ? ExpertParallel::mask : ExpertParallel::map;
    }
    MoeProblem prob = make(s, o, seed);
    SCOPED_TRACE("seed " + std::to_string(seed) + " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E) +
                 " k=" + std::to_string(s.k) + " H=" + std::to_string(s.H) + " I=" + std::to_string(s.I) +
                 (o.g1u1 ? " g1u1" : " g1u0") + " pad " + std::to_string(o.row_pad));
    expect_small_m_matches_ref(prob);
  }
}

TEST(FusedMoeSm90SmallM, BadIdsAreSkippedSafely) {
  SKIP_WITHOUT_SMALL_M();
  // Device ids are not scanned by the front door: ids outside [-1, Eg) must be skipped. The
  // expected output is the ref's on the same problem with those ids replaced by -1.
  MoeProblem prob = make(small_shape(Scheme::bf16, 9, 6, 3, 64, 32));
  Buffer bad = prob.topk_ids;
  for (int64_t i = 0; i < bad.numel(); i += 4) bad.data<int32_t>()[i] = i % 8 == 0 ? 6 : -7;
  for (int64_t i = 0; i < bad.numel(); i += 4) prob.topk_ids.data<int32_t>()[i] = -1;
  FusedMoeParams p = prob.params();
  p.topk_ids = bad.view;
  expect_small_m_matches_ref(prob, &p);
}

TEST(FusedMoeSm90SmallM, DeterministicAndPaddingUntouched) {
  SKIP_WITHOUT_SMALL_M();
  MoeProblemOptions o;
  o.row_pad = 3;
  MoeProblem prob = make(small_shape(Scheme::bf16, 64, 16, 4, 256, 128), o);
  ASSERT_TRUE(run_small_m(prob, prob.params()).ok());
  const std::vector<unsigned char> first = prob.out.bytes;
  for (int64_t t = 0; t < 64; ++t) {  // padding keeps the 0xFF poison bytes
    for (int64_t c = 256; c < 259; ++c) EXPECT_EQ(prob.out.data<uint16_t>()[t * 259 + c], 0xFFFF) << t << "," << c;
  }
  ASSERT_TRUE(run_small_m(prob, prob.params()).ok());
  EXPECT_EQ(prob.out.bytes, first);
}

TEST(FusedMoeSm90SmallM, Refusals) {
  const Kernel* k = registry().find(kSmallM);
  if (k == nullptr) GTEST_SKIP() << "fused_moe_sm90_small_m is not compiled in";
  // supports() reads no data: host buffers labelled as device tensors exercise each reason.
  auto on_device = [](MoeProblem& prob) {
    FusedMoeParams p = prob.params();
    for (TensorView* t : {&p.x, &p.w1, &p.w2, &p.topk_ids, &p.topk_weights, &p.out}) t->device = Device::cuda;
    return p;
  };
  auto expect_refused = [&](const FusedMoeParams& p, const char* part) {
    const Status st = k->supports(&p);
    EXPECT_EQ(st.code(), StatusCode::unsupported) << st.to_string();
    EXPECT_NE(st.message().find(part), std::string::npos) << "'" << part << "' not in: " << st.message();
  };
  MoeProblem host = make(small_shape(Scheme::bf16, 2, 4, 2, 64, 32));
  expect_refused(host.params(), "device tensors");
  MoeProblem f32 = make(small_shape(Scheme::f32, 2, 4, 2, 64, 32));
  expect_refused(on_device(f32), "bf16 and f16 only");
  MoeProblemOptions shuf;
  shuf.shuffled = true;
  MoeProblem sh = make(small_shape(Scheme::bf16, 2, 4, 2, 64, 32), shuf);
  expect_refused(on_device(sh), "row_major");
  MoeProblem odd = make(small_shape(Scheme::bf16, 2, 4, 2, 60, 32));
  expect_refused(on_device(odd), "multiples of 8");
  MoeProblem ok = make(small_shape(Scheme::bf16, 2, 4, 2, 64, 32));
  const FusedMoeParams good = on_device(ok);
  EXPECT_TRUE(k->supports(&good).ok()) << k->supports(&good).to_string();
}

}  // namespace
}  // namespace moekit::testing
