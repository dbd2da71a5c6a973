// fused_moe_avx512_fp8_row / _tkw1 (the CPU backend's fp8 W8A8 per-row fused MoE) against the
// reference kernels fused_moe_ref_fp8_row / _tkw1. Skipped where the CPU lacks AVX-512 F/BW/VL;
// there the dispatch and refusal tests check that the portable kernels serve the problems and that
// these kernels refuse every problem, naming the missing feature.
#include <gtest/gtest.h>

#include <vector>

#include "cpu_test_util.h"
#include "moekit/ops/fused_moe.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit {
namespace {

using testing::MoeProblem;
using testing::MoeShape;
using testing::Scheme;

constexpr const char* kKernel = "fused_moe_avx512_fp8_row";
constexpr const char* kKernelTkw1 = "fused_moe_avx512_fp8_row_tkw1";

// Why these tests cannot run here ("" when they can): the kernel's own CPU check.
std::string cpu_unavailable() { return cpu_test::avx512_unavailable(kKernel); }

// Runs kernel `name` on p (out poisoned first) and returns the output as doubles.
std::vector<double> run(MoeProblem& p, const char* name) {
  p.out.fill_bytes(0xFF);
  RunOptions o;
  o.kernel = name;
  const Status s = fused_moe(p.params(), o);
  EXPECT_TRUE(s.ok()) << name << ": " << s.to_string();
  return testing::read_out(p.params().out);
}

void expect_matches_ref(const MoeShape& s, const testing::MoeProblemOptions& o, uint64_t seed, const std::string& what) {
  MoeProblem p;
  ASSERT_TRUE(testing::make_moe_problem(s, o, seed, &p).ok()) << what;
  const bool tkw1 = s.weight_on_input;
  const std::vector<double> want = run(p, tkw1 ? "fused_moe_ref_fp8_row_tkw1" : "fused_moe_ref_fp8_row");
  const std::vector<double> got = run(p, tkw1 ? kKernelTkw1 : kKernel);
  testing::Metrics m;
  std::string detail;
  EXPECT_TRUE(testing::judge_moe(got, want, s.T, s.H,
                                 testing::moe_tolerance(tkw1 ? MoeVariant::fp8_row_tkw1 : MoeVariant::fp8_row,
                                                        DType::f32, testing::MoeCompare::kernel_vs_ref),
                                 &m, &detail))
      << what << ": " << detail << " worst " << m.worst;
}

MoeShape shape(int64_t T, int64_t E, int64_t k, int64_t H, int64_t I, Scheme scheme) {
  MoeShape s;
  s.T = T;
  s.E = E;
  s.k = k;
  s.H = H;
  s.I = I;
  s.scheme = scheme;
  return s;
}

// Where the CPU lacks AVX-512, the portable fused_moe_cpu_generic_fp8_row / _tkw1 instead.
TEST(FusedMoeAvx512Fp8, IsPickedByDefaultOnThisCpu) {
  const bool avx512 = cpu_unavailable().empty();
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    MoeProblem p;
    ASSERT_TRUE(testing::make_moe_problem(shape(3, 8, 2, 64, 96, sc), {}, 1, &p).ok());
    const FusedMoeParams f = p.params();
    const Kernel* k = nullptr;
    ASSERT_TRUE(registry().select(OpKind::fused_moe, MoeVariant::fp8_row, &f, RunOptions{}, "t", &k).ok());
    EXPECT_STREQ(k->name, avx512 ? kKernel : "fused_moe_cpu_generic_fp8_row") << cpu_unavailable();
  }
  MoeShape woi = shape(3, 8, 1, 64, 96, Scheme::fp8_channel);
  woi.weight_on_input = true;
  MoeProblem p;
  ASSERT_TRUE(testing::make_moe_problem(woi, {}, 1, &p).ok());
  const FusedMoeParams f = p.params();
  const Kernel* k = nullptr;
  ASSERT_TRUE(registry().select(OpKind::fused_moe, MoeVariant::fp8_row_tkw1, &f, RunOptions{}, "t", &k).ok());
  EXPECT_STREQ(k->name, avx512 ? kKernelTkw1 : "fused_moe_cpu_generic_fp8_row_tkw1") << cpu_unavailable();
}

TEST(FusedMoeAvx512Fp8, EdgeCasesMatchRef) {
  CPU_SKIP_IF(cpu_unavailable());
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel}) {
    const std::string n = testing::scheme_name(sc);
    for (int64_t T : {1, 5, 37}) {
      expect_matches_ref(shape(T, 8, 2, 64, 96, sc), {}, uint64_t(T), n + " T=" + std::to_string(T));
    }
    expect_matches_ref(shape(5, 1, 1, 16, 16, sc), {}, 2, n + " E=1 k=1 H=I=16");
    expect_matches_ref(shape(3, 6, 6, 48, 80, sc), {}, 3, n + " k=E=6");
    expect_matches_ref(shape(2, 13, 3, 96, 160, sc), {}, 4, n + " E=13>T");
    testing::MoeProblemOptions g1u0;
    g1u0.g1u1 = false;
    expect_matches_ref(shape(6, 8, 2, 64, 96, sc), g1u0, 6, n + " g1u0");
    testing::MoeProblemOptions pad;
    pad.row_pad = 8;
    expect_matches_ref(shape(6, 8, 2, 64, 96, sc), pad, 7, n + " row-strided x/out");
    testing::MoeProblemOptions mask;
    mask.local_experts = 3;
    mask.ep = testing::ExpertParallel::mask;
    expect_matches_ref(shape(9, 8, 2, 64, 96, sc), mask, 8, n + " expert_mask");
    testing::MoeProblemOptions map = mask;
    map.ep = testing::ExpertParallel::map;
    expect_matches_ref(shape(9, 8, 2, 64, 96, sc), map, 9, n + " expert_map");
    testing::MoeProblemOptions stat;
    stat.static_a1_scale = true;
    expect_matches_ref(shape(7, 8, 2, 64, 96, sc), stat, 10, n + " static a1_scale");
    for (Activation a : {Activation::gelu, Activation::gelu_tanh}) {
      MoeShape s = shape(4, 8, 2, 64, 96, sc);
      s.activation = a;
      expect_matches_ref(s, {}, 11, n + " " + activation_name(a));
    }
    for (int64_t T : {1, 5, 37}) {
      MoeShape woi = shape(T, 8, 1, 64, 96, sc);
      woi.weight_on_input = true;
      expect_matches_ref(woi, {}, 12, n + " weight_on_input T=" + std::to_string(T));
    }
  }
}

// Where the CPU lacks AVX-512: both kernels (registered everywhere) refuse every problem, even one
// they could run, naming the missing feature (the shape and dtype checks come after the CPU's).
TEST(FusedMoeAvx512Fp8, RefusesWhatItCannotRun) {
  const Kernel* k = registry().find(kKernel);
  ASSERT_NE(k, nullptr);
  if (!cpu_unavailable().empty()) {
    const std::string missing = ": CPU lacks AVX-512 F/BW/VL (has: " + cpu::describe(cpu::cpu_features()) + ")";
    for (bool tkw1 : {false, true}) {
      const char* name = tkw1 ? kKernelTkw1 : kKernel;
      const Kernel* kk = registry().find(name);
      ASSERT_NE(kk, nullptr) << name;
      MoeShape runnable = shape(3, 8, tkw1 ? 1 : 2, 64, 96, Scheme::fp8_channel);
      runnable.weight_on_input = tkw1;
      const MoeShape h40 = shape(2, 4, 2, 40, 64, Scheme::fp8_channel), bf16 = shape(2, 4, 2, 64, 64, Scheme::bf16);
      for (const MoeShape& s : {runnable, h40, bf16}) {
        MoeProblem p;
        ASSERT_TRUE(testing::make_moe_problem(s, {}, 1, &p).ok());
        const FusedMoeParams f = p.params();
        const Status st = kk->supports(&f);
        EXPECT_EQ(st.code(), StatusCode::unsupported) << st.to_string();
        EXPECT_NE(st.message().find(missing), std::string::npos) << name << ": " << st.message();
      }
    }
    return;
  }
  MoeProblem p;
  ASSERT_TRUE(testing::make_moe_problem(shape(2, 4, 2, 40, 64, Scheme::fp8_channel), {}, 1, &p).ok());
  FusedMoeParams f = p.params();
  Status s = k->supports(&f);
  EXPECT_NE(s.message().find("multiples of 16, got H=40"), std::string::npos) << s.message();
  MoeProblem q;
  ASSERT_TRUE(testing::make_moe_problem(shape(2, 4, 2, 64, 64, Scheme::bf16), {}, 1, &q).ok());
  f = q.params();
  s = k->supports(&f);
  EXPECT_NE(s.message().find("weights must be fp8_e4m3fn, got w1 bf16"), std::string::npos) << s.message();
  MoeProblem b;
  ASSERT_TRUE(testing::make_moe_problem(shape(2, 4, 2, 256, 256, Scheme::fp8_block), {}, 1, &b).ok());
  f = b.params();
  s = k->supports(&f);
  EXPECT_NE(s.message().find("scale_block_n=128"), std::string::npos) << s.message();
}

TEST(FusedMoeAvx512Fp8, DeterministicAcrossRuns) {
  CPU_SKIP_IF(cpu_unavailable());
  MoeProblem p;
  ASSERT_TRUE(testing::make_moe_problem(shape(50, 16, 4, 128, 192, Scheme::fp8_channel), {}, 3, &p).ok());
  run(p, kKernel);
  const std::vector<unsigned char> first = p.out.bytes;
  run(p, kKernel);
  EXPECT_EQ(p.out.bytes, first);
}

TEST(FusedMoeAvx512Fp8, PresetsMatchRef) {
  CPU_SKIP_IF(cpu_unavailable());
  for (const char* model : {"mixtral", "qwen3-moe"}) {
    testing::ShapeRequest req;
    req.model = model;
    req.scheme = Scheme::fp8_channel;
    req.scheme_given = true;
    MoeShape s;
    ASSERT_TRUE(testing::resolve_shape(req, 2, &s).ok());
    expect_matches_ref(s, {}, 2, std::string(model) + " T=2");
  }
}

}  // namespace
}  // namespace moekit
