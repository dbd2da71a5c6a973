// fused_moe_avx512_bf16 (the CPU backend's bf16 fused MoE) against the reference kernel, on
// row_major and on packed (cpu_vnni2_n32) weights, plus the CPU thread pool. Skipped where the CPU
// lacks AVX-512 F/BW/VL or BF16 (there the kernel is not registered); the dispatch and refusal tests
// check what the CPU backend does there instead.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "cpu/thread_pool.h"
#include "cpu_test_util.h"
#include "moekit/ops/fused_moe.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit {
namespace {

using testing::MoeProblem;
using testing::MoeShape;

constexpr const char* kKernel = "fused_moe_avx512_bf16";

// Why the kernel cannot run here ("" when it can), naming the missing CPU feature.
std::string cpu_unavailable() { return cpu_test::avx512_unavailable(kKernel, true); }

// Runs kernel `name` on p (out poisoned first) and returns the output as doubles.
std::vector<double> run(MoeProblem& p, const char* name) {
  p.out.fill_bytes(0xFF);
  RunOptions o;
  o.kernel = name;
  const Status s = fused_moe(p.params(), o);
  EXPECT_TRUE(s.ok()) << name << ": " << s.to_string();
  return testing::read_out(p.params().out);
}

// The reference on the row_major weights, then the kernel on them, or (packed) on pack_weight's
// copies of them.
void expect_matches_ref(const MoeShape& s, const testing::MoeProblemOptions& o, uint64_t seed, const std::string& what,
                        bool packed = false) {
  MoeProblem p;
  ASSERT_TRUE(testing::make_moe_problem(s, o, seed, &p).ok()) << what;
  const std::vector<double> want = run(p, "fused_moe_ref");
  if (packed) {
    ASSERT_TRUE(testing::pack_moe_weights(&p).ok()) << what;
    ASSERT_EQ(p.params().w2.layout, Layout::cpu_vnni2_n32);
  }
  const std::vector<double> got = run(p, kKernel);
  testing::Metrics m;
  std::string detail;
  EXPECT_TRUE(testing::judge_moe(got, want, s.T, s.H,
                                 testing::moe_tolerance(MoeVariant::unquantized, DType::bf16,
                                                        testing::MoeCompare::kernel_vs_ref),
                                 &m, &detail))
      << what << ": " << detail << " worst " << m.worst;
}

MoeShape shape(int64_t T, int64_t E, int64_t k, int64_t H, int64_t I) {
  MoeShape s;
  s.T = T;
  s.E = E;
  s.k = k;
  s.H = H;
  s.I = I;
  s.scheme = testing::Scheme::bf16;
  return s;
}

// Where the CPU lacks AVX-512 BF16, the next kernel down serves bf16: fused_moe_avx512_fma with
// AVX-512 F/BW/VL, else the portable fused_moe_cpu_generic.
TEST(FusedMoeAvx512, IsPickedByDefaultForBf16OnThisCpu) {
  const char* want = kKernel;
  if (!cpu_unavailable().empty()) {
    want = cpu_test::avx512_unavailable("fused_moe_avx512_fma").empty() ? "fused_moe_avx512_fma"
                                                                         : "fused_moe_cpu_generic";
  }
  MoeProblem p;
  ASSERT_TRUE(testing::make_moe_problem(shape(3, 8, 2, 64, 96), {}, 1, &p).ok());
  const FusedMoeParams f = p.params();
  const Kernel* k = nullptr;
  ASSERT_TRUE(registry().select(OpKind::fused_moe, MoeVariant::unquantized, &f, RunOptions{}, "t", &k).ok());
  EXPECT_STREQ(k->name, want) << cpu_unavailable();
}

struct EdgeCase {
  MoeShape s;
  testing::MoeProblemOptions o;
  std::string what;
};

// The edge cases of both weight layouts: T=1, E=1, k=E, E>T, a T of tails, g1u0, row-strided x and
// out, expert_mask, expert_map, the gelu activations, the router weight on the input.
std::vector<EdgeCase> edge_cases() {
  std::vector<EdgeCase> v = {{shape(1, 8, 2, 64, 96), {}, "T=1"},
                             {shape(5, 1, 1, 32, 32), {}, "E=1 k=1"},
                             {shape(3, 6, 6, 64, 64), {}, "k=E=6"},
                             {shape(2, 13, 3, 96, 160), {}, "E=13>T, H=96"},
                             {shape(37, 8, 2, 128, 224), {}, "T=37 (entry chunks / row groups of 4 with tails)"}};
  testing::MoeProblemOptions g1u0;
  g1u0.g1u1 = false;
  v.push_back({shape(6, 8, 2, 64, 96), g1u0, "g1u0"});
  testing::MoeProblemOptions pad;
  pad.row_pad = 8;
  v.push_back({shape(6, 8, 2, 64, 96), pad, "row-strided x/out"});
  testing::MoeProblemOptions mask;
  mask.local_experts = 3;
  mask.ep = testing::ExpertParallel::mask;
  v.push_back({shape(9, 8, 2, 64, 96), mask, "expert_mask"});
  testing::MoeProblemOptions map = mask;
  map.ep = testing::ExpertParallel::map;
  v.push_back({shape(9, 8, 2, 64, 96), map, "expert_map"});
  for (Activation a : {Activation::gelu, Activation::gelu_tanh}) {
    MoeShape s = shape(4, 8, 2, 64, 96);
    s.activation = a;
    v.push_back({s, {}, activation_name(a)});
  }
  MoeShape woi = shape(5, 8, 1, 64, 96);
  woi.weight_on_input = true;
  v.push_back({woi, {}, "weight_on_input"});
  return v;
}

TEST(FusedMoeAvx512, EdgeCasesMatchRef) {
  CPU_SKIP_IF(cpu_unavailable());
  uint64_t seed = 1;
  for (const EdgeCase& c : edge_cases()) expect_matches_ref(c.s, c.o, seed++, c.what);
}

// Where the CPU lacks AVX-512 BF16: the kernel is not registered (src/cpu/cpu_backend.cpp), or, once
// its supports() checks the CPU (the NOTE there), it refuses even a problem it could run, naming the
// missing feature.
TEST(FusedMoeAvx512, RefusesWhatItCannotRun) {
  const Kernel* k = registry().find(kKernel);
  const std::string why = cpu_unavailable();
  if (!why.empty()) {
    if (k == nullptr) return;  // not registered: the default dispatch never sees it
    MoeProblem ok;
    ASSERT_TRUE(testing::make_moe_problem(shape(3, 8, 2, 64, 96), {}, 1, &ok).ok());
    const FusedMoeParams f = ok.params();
    const Status s = k->supports(&f);
    EXPECT_EQ(s.code(), StatusCode::unsupported) << s.to_string();
    EXPECT_NE(why.find(s.message()), std::string::npos) << s.message() << " vs " << why;
    return;
  }
  MoeProblem p;
  ASSERT_TRUE(testing::make_moe_problem(shape(2, 4, 2, 40, 64), {}, 1, &p).ok());
  ASSERT_NE(k, nullptr);
  FusedMoeParams f = p.params();
  Status s = k->supports(&f);
  EXPECT_NE(s.message().find("multiples of 32, got H=40"), std::string::npos) << s.message();
  MoeProblem q;
  MoeShape f16 = shape(2, 4, 2, 64, 64);
  f16.scheme = testing::Scheme::f16;
  ASSERT_TRUE(testing::make_moe_problem(f16, {}, 1, &q).ok());
  f = q.params();
  s = k->supports(&f);
  EXPECT_NE(s.message().find("x must be bf16, got f16"), std::string::npos) << s.message();
}

TEST(FusedMoeAvx512, DeterministicAcrossRuns) {
  CPU_SKIP_IF(cpu_unavailable());
  MoeProblem p;
  ASSERT_TRUE(testing::make_moe_problem(shape(50, 16, 4, 128, 192), {}, 3, &p).ok());
  run(p, kKernel);
  const std::vector<unsigned char> first = p.out.bytes;
  run(p, kKernel);
  EXPECT_EQ(p.out.bytes, first);
}

TEST(FusedMoeAvx512, PresetsMatchRef) {
  CPU_SKIP_IF(cpu_unavailable());
  for (const char* model : {"mixtral", "deepseek-v3", "qwen3-moe"}) {
    testing::ShapeRequest req;
    req.model = model;
    req.scheme = testing::Scheme::bf16;
    req.scheme_given = true;
    for (int64_t T : {1, 16}) {
      MoeShape s;
      ASSERT_TRUE(testing::resolve_shape(req, T, &s).ok());
      expect_matches_ref(s, {}, uint64_t(T), std::string(model) + " T=" + std::to_string(T));
    }
  }
}

// ---------------------------------------------------------------- packed (cpu_vnni2_n32) weights
// The shared edge cases, and the packed layout's own: panels of 32 columns (E=1 k=1: one each; H=96
// and g1u0 I=96: odd panel counts), K chunks of 256 with a tail, 1-row decode micro-kernel, token
// blocks of ~128 entries.
TEST(FusedMoeAvx512, PackedEdgeCasesMatchRef) {
  CPU_SKIP_IF(cpu_unavailable());
  std::vector<EdgeCase> cases = edge_cases();
  testing::MoeProblemOptions g1u0;
  g1u0.g1u1 = false;
  cases.push_back({shape(6, 8, 2, 64, 128), g1u0, "g1u0, I=128"});
  cases.push_back({shape(7, 4, 2, 320, 288), {}, "H=320, I=288: K chunks of 256 with a tail"});
  cases.push_back({shape(300, 2, 1, 64, 64), {}, "~150 entries per expert: 2 token blocks"});
  cases.push_back({shape(260, 1, 1, 32, 32), {}, "260 entries on one expert: 3 token blocks"});
  uint64_t seed = 1;
  for (const EdgeCase& c : cases) expect_matches_ref(c.s, c.o, seed++, c.what, true);
}

TEST(FusedMoeAvx512, PackedDeterministicAcrossRuns) {
  CPU_SKIP_IF(cpu_unavailable());
  MoeProblem p;
  ASSERT_TRUE(testing::make_moe_problem(shape(200, 4, 2, 128, 192), {}, 3, &p).ok());
  ASSERT_TRUE(testing::pack_moe_weights(&p).ok());
  run(p, kKernel);
  const std::vector<unsigned char> first = p.out.bytes;
  run(p, kKernel);
  EXPECT_EQ(p.out.bytes, first);
}

TEST(FusedMoeAvx512, PackedCheckHookOnPresets) {
  CPU_SKIP_IF(cpu_unavailable());
  for (const char* model : {"mixtral", "qwen3-moe"}) {
    testing::CheckRequest req;
    req.shape.model = model;
    req.shape.scheme = testing::Scheme::bf16;
    req.shape.scheme_given = true;
    req.edge_cases = false;
    req.backend = Backend::cpu;
    req.has_backend = true;
    int packed_cases = 0;
    for (const testing::CaseResult& r : testing::check_fused_moe(req)) {
      EXPECT_TRUE(r.ok) << r.kernel << " [" << r.name << "]: " << r.detail;
      if (r.name.find("cpu_vnni2_n32") != std::string::npos && r.kernel == std::string(kKernel)) ++packed_cases;
    }
    EXPECT_EQ(packed_cases, 3) << model << ": one packed case per default token count";
  }
}

TEST(CpuThreadPool, EveryItemOnceFixedPartition) {
  for (int64_t n : {0, 1, 2, 3, 17, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    cpu::parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
  }
  // A nested call runs serially inside the task instead of deadlocking.
  std::atomic<int64_t> sum{0};
  cpu::parallel_for(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      cpu::parallel_for(3, [&](int64_t bb, int64_t ee) { sum += ee - bb; });
    }
  });
  EXPECT_EQ(sum.load(), 12);
  EXPECT_GE(cpu::num_threads(), 1);
}

}  // namespace
}  // namespace moekit
