// The portable CPU fused_moe kernels (fused_moe_cpu_generic*, src/ops/fused_moe/fused_moe_cpu_generic.cpp),
// forced through RunOptions.kernel so they are tested on an AVX-512 machine too; the AVX-512 fp8
// block-scale kernel (fused_moe_avx512_fp8_block.cpp) and the AVX-512 f32-FMA kernel for
// unquantized bf16 / f16 / f32 weights (fused_moe_avx512_fma, fused_moe_avx512_fp8.cpp), each
// against the reference kernel of its variant; which kernel the cpu backend picks; the kernels'
// refusals and the CPU feature check of the AVX-512 kernels on faked CPUs; and the check hook
// (`moekit check --op fused_moe --backend cpu`) over every scheme and llama4 --weight-on-input.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu/cpu_features.h"
#include "cpu_test_util.h"
#include "fused_moe_test_util.h"
#include "moekit/core/config.h"
#include "moekit/ops/fused_moe.h"
#include "ops/fused_moe/fused_moe_cpu.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit {
namespace {

using testing::MoeProblem;
using testing::MoeProblemOptions;
using testing::MoeShape;
using testing::Scheme;
using testing::moe_test::small_shape;

const Scheme kAllSchemes[] = {Scheme::bf16,       Scheme::f16,         Scheme::f32,
                              Scheme::fp8_tensor, Scheme::fp8_channel, Scheme::fp8_block};

bool has_avx512() { return cpu_test::avx512_unavailable("fused_moe_avx512_*").empty(); }

// The reference kernel and the generic kernel of a problem's variant.
const char* ref_name(MoeVariant v) {
  switch (v) {
    case MoeVariant::fp8_block: return "fused_moe_ref_fp8_block";
    case MoeVariant::fp8_row_tkw1: return "fused_moe_ref_fp8_row_tkw1";
    case MoeVariant::fp8_row: return "fused_moe_ref_fp8_row";
    default: return "fused_moe_ref";
  }
}
const char* generic_name(MoeVariant v) {
  switch (v) {
    case MoeVariant::fp8_block: return "fused_moe_cpu_generic_fp8_block";
    case MoeVariant::fp8_row_tkw1: return "fused_moe_cpu_generic_fp8_row_tkw1";
    case MoeVariant::fp8_row: return "fused_moe_cpu_generic_fp8_row";
    default: return "fused_moe_cpu_generic";
  }
}

// Runs kernel `name` on p (out poisoned with NaN bytes first) and returns the output as doubles.
std::vector<double> run(MoeProblem& p, const char* name) {
  p.out.fill_bytes(0xFF);
  RunOptions o;
  o.kernel = name;
  const Status s = fused_moe(p.params(), o);
  EXPECT_TRUE(s.ok()) << name << ": " << s.to_string();
  return testing::read_out(p.params().out);
}

// Kernel `name` (nullptr: the generic kernel of the variant) against the reference on one problem.
void expect_matches_ref(const MoeShape& s, const MoeProblemOptions& o, uint64_t seed, const std::string& what,
                        const char* name = nullptr) {
  MoeProblem p;
  ASSERT_TRUE(testing::make_moe_problem(s, o, seed, &p).ok()) << what;
  const MoeVariant v = fused_moe_variant(p.params());
  const std::vector<double> want = run(p, ref_name(v));
  const std::vector<double> got = run(p, name ? name : generic_name(v));
  testing::Metrics m;
  std::string detail;
  EXPECT_TRUE(testing::judge_moe(got, want, s.T, s.H,
                                 testing::moe_tolerance(v, p.x_dtype, testing::MoeCompare::kernel_vs_ref), &m, &detail))
      << what << " (" << (name ? name : generic_name(v)) << "): " << detail << " worst " << m.worst;
}

// ---------------------------------------------------------------- named edge cases

TEST(FusedMoeCpuGeneric, SizesNotMultiplesOfTheVectorOrPanel) {
  // H = 52, I = 36: dot tails of 4 elements, partial 8-row panels; N1 = 72 and E = 5 odd.
  for (Scheme sc : kAllSchemes) {
    const std::string n = testing::scheme_name(sc);
    expect_matches_ref(small_shape(sc, 9, 5, 2, 52, 36), {}, 1, n + " H=52 I=36");
    expect_matches_ref(small_shape(sc, 1, 5, 1, 20, 12), {}, 2, n + " T=1 k=1 H=20 I=12");
  }
}

TEST(FusedMoeCpuGeneric, EveryVariantAndOption) {
  for (Scheme sc : kAllSchemes) {
    const std::string n = testing::scheme_name(sc);
    expect_matches_ref(small_shape(sc, 1), {}, 3, n + " T=1");
    expect_matches_ref(small_shape(sc, 40, 6, 6), {}, 4, n + " k=E=6");
    expect_matches_ref(small_shape(sc, 3, 13, 3), {}, 5, n + " E=13>T");
    MoeProblemOptions g1u0;
    g1u0.g1u1 = false;
    expect_matches_ref(small_shape(sc), g1u0, 6, n + " g1u0");
    MoeProblemOptions shuf;
    shuf.shuffled = true;
    expect_matches_ref(small_shape(sc), shuf, 7, n + " shuffled_16x16 weights");
    MoeProblemOptions pad;
    pad.row_pad = 5;
    expect_matches_ref(small_shape(sc), pad, 8, n + " row-strided x/out");
    MoeProblemOptions mask;
    mask.local_experts = 3;
    mask.ep = testing::ExpertParallel::mask;
    expect_matches_ref(small_shape(sc, 9, 8), mask, 9, n + " expert_mask");
    MoeProblemOptions map = mask;
    map.ep = testing::ExpertParallel::map;
    expect_matches_ref(small_shape(sc, 9, 8), map, 10, n + " expert_map");
    for (Activation a : {Activation::gelu, Activation::gelu_tanh}) {
      MoeShape s = small_shape(sc, 4);
      s.activation = a;
      expect_matches_ref(s, {}, 11, n + " " + activation_name(a));
    }
    MoeShape woi = small_shape(sc, 6, 6, 1);
    woi.weight_on_input = true;
    expect_matches_ref(woi, {}, 12, n + " weight_on_input");
  }
  MoeProblemOptions nr;
  nr.round_intermediate = false;
  expect_matches_ref(small_shape(Scheme::bf16), nr, 13, "bf16 round_intermediate=false");
  MoeProblemOptions stat;
  stat.static_a1_scale = true;
  expect_matches_ref(small_shape(Scheme::fp8_channel), stat, 14, "fp8_channel static a1_scale");
}

TEST(FusedMoeCpuGeneric, AllTokensToOneExpertSplitOverThreads) {
  // One active expert: the tasks are its row panels only, split across every thread.
  for (Scheme sc : {Scheme::f16, Scheme::fp8_channel, Scheme::fp8_block}) {
    MoeProblem p;
    ASSERT_TRUE(testing::make_moe_problem(small_shape(sc, 33, 4, 1, 128, 96), {}, 15, &p).ok());
    int32_t* ids = p.topk_ids.data<int32_t>();
    for (int64_t i = 0; i < p.topk_ids.numel(); ++i) ids[i] = 1;
    const MoeVariant v = fused_moe_variant(p.params());
    const std::vector<double> want = run(p, ref_name(v));
    const std::vector<double> got = run(p, generic_name(v));
    testing::Metrics m;
    std::string detail;
    EXPECT_TRUE(testing::judge_moe(
        got, want, 33, 128, testing::moe_tolerance(v, p.x_dtype, testing::MoeCompare::kernel_vs_ref), &m, &detail))
        << testing::scheme_name(sc) << ": " << detail;
  }
}

TEST(FusedMoeCpuGeneric, Fp8BlockOtherBlockShapes) {
  // bn != bk, blocks that do not divide N or K, for both fp8_block kernels (the AVX-512 one needs
  // bk % 16 == 0 and H, I % 16 == 0).
  for (const auto& [bn, bk] : {std::pair<int, int>{64, 32}, {48, 16}, {128, 128}, {16, 64}}) {
    MoeProblemOptions o;
    o.block = bn;
    o.block_k = bk;
    const std::string n = "fp8_block bn=" + std::to_string(bn) + " bk=" + std::to_string(bk);
    expect_matches_ref(small_shape(Scheme::fp8_block, 7, 6, 2, 160, 80), o, 16, n);
    if (has_avx512()) {
      expect_matches_ref(small_shape(Scheme::fp8_block, 7, 6, 2, 160, 80), o, 16, n, "fused_moe_avx512_fp8_block");
      expect_matches_ref(small_shape(Scheme::fp8_block, 37, 6, 2, 160, 80), o, 17, n + " T=37",
                         "fused_moe_avx512_fp8_block");
    }
  }
}

TEST(FusedMoeCpuGeneric, Avx512Fp8BlockEdgeCases) {
  constexpr const char* k = "fused_moe_avx512_fp8_block";
  CPU_SKIP_IF(cpu_test::avx512_unavailable(k));
  for (int64_t T : {1, 2, 3, 4, 7}) {  // 1, 2, 3 entries per register block and their tails
    expect_matches_ref(small_shape(Scheme::fp8_block, T, 4, 2, 256, 128), {}, uint64_t(T), "T=" + std::to_string(T), k);
  }
  expect_matches_ref(small_shape(Scheme::fp8_block, 7, 6, 2, 96, 64), {}, 18, "H=96 I=64 (partial blocks)", k);
  MoeProblemOptions g1u0;
  g1u0.g1u1 = false;
  expect_matches_ref(small_shape(Scheme::fp8_block), g1u0, 19, "g1u0", k);
  MoeProblemOptions pad;
  pad.row_pad = 3;
  expect_matches_ref(small_shape(Scheme::fp8_block), pad, 20, "row-strided x/out", k);
  MoeProblemOptions mask;
  mask.local_experts = 3;
  mask.ep = testing::ExpertParallel::map;
  expect_matches_ref(small_shape(Scheme::fp8_block, 9, 8), mask, 21, "expert_map", k);
  MoeShape woi = small_shape(Scheme::fp8_block, 5, 6, 1);
  woi.weight_on_input = true;
  expect_matches_ref(woi, {}, 22, "weight_on_input", k);
  MoeShape gelu = small_shape(Scheme::fp8_block, 5);
  gelu.activation = Activation::gelu;
  expect_matches_ref(gelu, {}, 23, "gelu", k);
}

TEST(FusedMoeCpuGeneric, Avx512FmaEdgeCases) {
  // fused_moe_avx512_fma: unquantized bf16 / f16 / f32 weights widened in registers.
  constexpr const char* k = "fused_moe_avx512_fma";
  CPU_SKIP_IF(cpu_test::avx512_unavailable(k));
  for (Scheme sc : {Scheme::bf16, Scheme::f16, Scheme::f32}) {
    const std::string n = testing::scheme_name(sc);
    for (int64_t T : {1, 2, 3, 4, 9}) {  // 1 to 4 entries per register block and their tails
      expect_matches_ref(small_shape(sc, T, 4, 2, 64, 96), {}, uint64_t(T), n + " T=" + std::to_string(T), k);
    }
    expect_matches_ref(small_shape(sc, 7, 6, 2, 48, 80), {}, 30, n + " H=48 I=80 (not multiples of 32)", k);
    MoeProblemOptions nr;
    nr.round_intermediate = false;
    expect_matches_ref(small_shape(sc), nr, 31, n + " round_intermediate=false", k);
    MoeProblemOptions g1u0;
    g1u0.g1u1 = false;
    expect_matches_ref(small_shape(sc), g1u0, 32, n + " g1u0", k);
    MoeProblemOptions pad;
    pad.row_pad = 3;
    expect_matches_ref(small_shape(sc), pad, 33, n + " row-strided x/out", k);
    MoeProblemOptions mask;
    mask.local_experts = 3;
    mask.ep = testing::ExpertParallel::mask;
    expect_matches_ref(small_shape(sc, 9, 8), mask, 34, n + " expert_mask", k);
    MoeShape woi = small_shape(sc, 5, 6, 1);
    woi.weight_on_input = true;
    expect_matches_ref(woi, {}, 35, n + " weight_on_input", k);
    MoeShape gelu = small_shape(sc, 5);
    gelu.activation = Activation::gelu_tanh;
    expect_matches_ref(gelu, {}, 36, n + " gelu_tanh", k);
  }
}

TEST(FusedMoeCpuGeneric, DispatchPicksTheAvx512KernelsElseTheGenericOnes) {
  // The cpu backend's choice: f16 / f32 -> fused_moe_avx512_fma, fp8_block ->
  // fused_moe_avx512_fp8_block where the CPU has AVX-512; shuffled weights (no AVX-512 kernel
  // reads them) and CPUs without AVX-512 -> the generic kernels.
  auto pick = [](const MoeShape& s, const MoeProblemOptions& o) {
    MoeProblem p = testing::moe_test::make(s, o);
    const FusedMoeParams f = p.params();
    Config cfg;
    cfg.backend = "cpu";
    const Kernel* k = nullptr;
    const Status st = registry().select_with(cfg, OpKind::fused_moe, fused_moe_variant(f), &f, RunOptions{}, "t", &k);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return std::string(k ? k->name : "-");
  };
  const bool avx = has_avx512();
  for (Scheme sc : {Scheme::f16, Scheme::f32}) {
    EXPECT_EQ(pick(small_shape(sc), {}), avx ? "fused_moe_avx512_fma" : "fused_moe_cpu_generic");
  }
  EXPECT_EQ(pick(small_shape(Scheme::fp8_block, 3, 6, 2, 256, 128), {}),
            avx ? "fused_moe_avx512_fp8_block" : "fused_moe_cpu_generic_fp8_block");
  MoeProblemOptions shuf;
  shuf.shuffled = true;
  EXPECT_EQ(pick(small_shape(Scheme::f16), shuf), "fused_moe_cpu_generic");
  EXPECT_EQ(pick(small_shape(Scheme::fp8_channel), shuf), "fused_moe_cpu_generic_fp8_row");
}

// Where the CPU lacks AVX-512 the kernels refuse every one of these naming the missing feature
// instead (the shape and layout checks come after the CPU's); the generic kernels take them anyway.
TEST(FusedMoeCpuGeneric, Avx512KernelsRefuseWhatTheyCannotRunNamingIt) {
  auto reason = [](const char* kernel, const MoeShape& s, const MoeProblemOptions& o) {
    MoeProblem p = testing::moe_test::make(s, o);
    const FusedMoeParams f = p.params();
    return registry().find(kernel)->supports(&f).message();
  };
  constexpr const char* kBlock = "fused_moe_avx512_fp8_block";
  constexpr const char* kFma = "fused_moe_avx512_fma";
  MoeProblemOptions shuf;
  shuf.shuffled = true;
  MoeProblemOptions bn24;
  bn24.block = 24;
  const std::pair<std::string, std::string> cases[] = {
      {reason(kBlock, small_shape(Scheme::fp8_block, 3, 4, 2, 40, 64), {}),
       "H and I must be multiples of 16, got H=40 I=64"},
      {reason(kBlock, small_shape(Scheme::fp8_block), shuf), "weights must be row_major, got w1 shuffled_16x16"},
      {reason(kBlock, small_shape(Scheme::fp8_block), bn24), "got scale_block_n=24 scale_block_k=24"},
      {reason(kFma, small_shape(Scheme::f16, 3, 4, 2, 64, 40), {}), "H and I must be multiples of 16, got H=64 I=40"},
      {reason(kFma, small_shape(Scheme::f32), shuf), "weights must be row_major, got shuffled_16x16"},
  };
  const std::string missing = ": CPU lacks AVX-512 F/BW/VL (has: " + cpu::describe(cpu::cpu_features()) + ")";
  for (const auto& [got, want] : cases) EXPECT_NE(got.find(has_avx512() ? want : missing), std::string::npos) << got;
  // The generic kernels take all of these.
  for (const auto& [s, o] : {std::pair<MoeShape, MoeProblemOptions>{small_shape(Scheme::fp8_block), shuf},
                             {small_shape(Scheme::fp8_block), bn24},
                             {small_shape(Scheme::f16, 3, 4, 2, 64, 40), {}}}) {
    MoeProblem p = testing::moe_test::make(s, o);
    const FusedMoeParams f = p.params();
    EXPECT_TRUE(registry().find(generic_name(fused_moe_variant(f)))->supports(&f).ok());
  }
}

TEST(FusedMoeCpuGeneric, Avx512KernelsRefuseACpuWithoutTheFeature) {
  // The check every AVX-512 kernel's supports() runs, on faked CPUs. (The kernels themselves read
  // the real cpu_features(), which cannot be faked: on this machine they accept.)
  cpu::CpuFeatures none;
  Status s = cpu::moe::require_avx512("fused_moe_avx512_fp8_block", none, false);
  EXPECT_EQ(s.code(), StatusCode::unsupported);
  EXPECT_NE(s.message().find("fused_moe_avx512_fp8_block: CPU lacks AVX-512 F/BW/VL"), std::string::npos)
      << s.message();
  cpu::CpuFeatures no_bf16;
  no_bf16.avx512f = no_bf16.avx512bw = no_bf16.avx512vl = no_bf16.os_saves_zmm = true;
  EXPECT_TRUE(cpu::moe::require_avx512("k", no_bf16, false).ok());
  s = cpu::moe::require_avx512("fused_moe_avx512_bf16", no_bf16, true);
  EXPECT_NE(s.message().find("CPU lacks AVX-512 BF16 (has: avx512f avx512bw avx512vl)"), std::string::npos)
      << s.message();
  cpu::CpuFeatures no_os = no_bf16;
  no_os.avx512bf16 = true;
  no_os.os_saves_zmm = false;
  s = cpu::moe::require_avx512("k", no_os, true);
  EXPECT_NE(s.message().find("OS does not enable zmm state"), std::string::npos) << s.message();
  // The backend itself is available on any x86-64 (the portable kernels serve it).
  EXPECT_TRUE(registry().backend_available(Backend::cpu).ok());
}

TEST(FusedMoeCpuGeneric, DeterministicAcrossRuns) {
  for (Scheme sc : {Scheme::bf16, Scheme::fp8_block}) {
    MoeProblem p;
    ASSERT_TRUE(testing::make_moe_problem(small_shape(sc, 50, 16, 4, 128, 192), {}, 3, &p).ok());
    const char* k = generic_name(fused_moe_variant(p.params()));
    run(p, k);
    const std::vector<unsigned char> first = p.out.bytes;
    run(p, k);
    EXPECT_EQ(p.out.bytes, first) << k;
    if (sc == Scheme::fp8_block && has_avx512()) {
      run(p, "fused_moe_avx512_fp8_block");
      const std::vector<unsigned char> avx = p.out.bytes;
      run(p, "fused_moe_avx512_fp8_block");
      EXPECT_EQ(p.out.bytes, avx);
    }
  }
}

// ---------------------------------------------------------------- the check hook

TEST(FusedMoeCpuGeneric, CheckHookCpuBackendEveryScheme) {
  // `moekit check --op fused_moe --backend cpu --scheme S`: edge cases plus a preset at 1 and 5
  // tokens, every cpu kernel of the variant against the reference.
  for (Scheme sc : kAllSchemes) {
    testing::CheckRequest req;
    req.shape.model = sc == Scheme::fp8_block ? "deepseek-v3" : "mixtral";
    req.shape.scheme = sc;
    req.shape.scheme_given = true;
    req.tokens = {1, 5};
    req.has_backend = true;
    req.backend = Backend::cpu;
    testing::moe_test::expect_all_ok(testing::check_fused_moe(req));
  }
  testing::CheckRequest woi;
  woi.shape.model = "llama4";
  woi.shape.weight_on_input = true;
  woi.tokens = {3};
  woi.has_backend = true;
  woi.backend = Backend::cpu;
  testing::moe_test::expect_all_ok(testing::check_fused_moe(woi));
}

}  // namespace
}  // namespace moekit
