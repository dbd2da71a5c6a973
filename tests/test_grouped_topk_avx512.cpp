// grouped_topk_avx512 (src/ops/grouped_topk/grouped_topk_avx512.cpp): the CPU kernel against
// grouped_topk_ref (suite GroupedTopk, the Cpu* cases).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
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
using testing::Buffer;
using testing::Rng;

using grouped_test::Call;
using grouped_test::certified_logits;
using grouped_test::config;

// ------------------------------------------------------------------ CPU kernel (grouped_topk_avx512)
// Skipped where the CPU lacks AVX-512 F/BW/VL (routing_test::cpu_unavailable()); there the kernel
// is not registered. Compared with grouped_topk_ref: ids exactly, weights within kWeightAtol /
// kWeightRtol.
namespace cpu_cases {

Buffer random_bias(uint64_t seed, int64_t E) {
  Rng rng(seed);
  return testing::random_bias(rng, E);
}

// One problem (configuration `cfg`, its bias if any) on the CPU kernel and on the ref.
void expect_cpu_matches_ref(const Buffer& gating, const GroupedTopkParams& cfg, const Buffer* bias,
                            const std::string& what) {
  SCOPED_TRACE(what);
  Call want(gating, cfg.k, cfg.n_group, cfg.topk_group, cfg.scoring, bias, cfg.renormalize, cfg.routed_scaling_factor);
  Call got(gating, cfg.k, cfg.n_group, cfg.topk_group, cfg.scoring, bias, cfg.renormalize, cfg.routed_scaling_factor);
  routing_test::expect_kernel_matches_ref(got, want, "grouped_topk_avx512", "grouped_topk_ref", grouped_topk);
}

TEST(GroupedTopk, CpuKernelIsRegisteredAndRefusesDeviceTensors) {
  const Buffer bias = random_bias(1, 8);
  Buffer g = certified_logits(3, 2, 8, config(2, 4, 2, Scoring::sigmoid, &bias), DType::f32);
  Call c(g, 2, 4, 2, Scoring::sigmoid, &bias);
  routing_test::expect_cpu_kernel_registered(OpKind::grouped_topk, "grouped_topk_avx512", "grouped_topk_ref",
                                             c.p, &GroupedTopkParams::correction_bias, "correction_bias");
}

TEST(GroupedTopk, CpuEdgeCasesMatchRef) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  routing_test::expect_edge_cases_pass(Backend::cpu, testing::check_grouped_topk, "deepseek-v3", {1, 7, 64});
}

// T not a multiple of the thread split, E and group sizes not multiples of the 16-lane vector (or
// powers of two), both scorings with and without bias, and problems big enough for every thread.
TEST(GroupedTopk, CpuThreadSplitAndVectorTailsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  struct Shape {
    int64_t T, E;
    int k, n_group, topk_group;
    Scoring scoring;
    bool bias;
  };
  const Scoring sg = Scoring::sigmoid, sm = Scoring::softmax;
  const std::vector<Shape> shapes = {{1031, 256, 8, 8, 4, sg, true}, {517, 60, 6, 4, 3, sm, true},
                                     {333, 96, 5, 3, 2, sg, false},  {97, 6, 3, 3, 2, sg, true},
                                     {7, 257, 4, 1, 1, sm, false},   {2049, 18, 2, 9, 2, sm, false},
                                     {64, 40, 20, 5, 5, sg, true}};
  routing_test::for_each_cpu_shape(shapes, [](const Shape& s, int n, DType dt) {
    const Buffer bias = random_bias(uint64_t(60 + n), s.E);
    GroupedTopkParams cfg = config(s.k, s.n_group, s.topk_group, s.scoring, s.bias ? &bias : nullptr);
    cfg.renormalize = n % 2 == 0;
    cfg.routed_scaling_factor = n % 3 == 0 ? 2.5f : 1.0f;
    const Buffer g = certified_logits(uint64_t(50 + n), s.T, s.E, cfg, dt);
    expect_cpu_matches_ref(g, cfg, s.bias ? &bias : nullptr, routing_test::shape_name(s));
  });
}

// Non-finite logits, an infinite bias, and logits on a 1/4 grid (exact ties): only the tie rules
// decide, so the ids must equal the ref's exactly.
TEST(GroupedTopk, CpuNonFiniteAndTiedRowsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  int n = 0;
  for (int64_t Eg : {8, 60, 256}) {
    for (Scoring sc : {Scoring::softmax, Scoring::sigmoid}) {
      for (bool with_bias : {false, true}) {
        Buffer bias = random_bias(uint64_t(300 + n), Eg);
        if (n % 4 == 3) bias.set(1, kInf);
        const int n_group = Eg == 60 ? 4 : 8 > Eg ? int(Eg) : 8;
        GroupedTopkParams cfg = config(4, n_group, std::max(1, n_group / 2), sc, with_bias ? &bias : nullptr);
        cfg.renormalize = n % 2 == 0;
        const DType dt = routing_test::rotating_dtype(n, DType::f32, DType::bf16, DType::f16);
        const int64_t T = Eg == 256 && n % 4 == 1 ? 1031 : 97;  // some problems large enough for every thread
        const Buffer g = routing_test::nonfinite_logits(uint64_t(400 + n), T, Eg, dt);
        expect_cpu_matches_ref(g, cfg, with_bias ? &bias : nullptr,
                               "Eg=" + std::to_string(Eg) + " n=" + std::to_string(n));
        ++n;
      }
    }
  }
}

// Biased scores a few ulps apart (identical logits, biases 1e-7 apart, also across groups): too
// close for the fast path's error bound, so the kernel must take the exact path and still give
// the reference's ids.
TEST(GroupedTopk, CpuNearTiesTakeTheExactPath) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  const int64_t T = 40, E = 64;
  Buffer g(DType::f32, {T, E});
  Rng rng(12);
  for (int64_t t = 0; t < T; ++t) {
    const float base = rng.uniform(-1.0f, 1.0f);
    for (int64_t e = 0; e < E; ++e) g.set(t * E + e, t % 2 ? base : base + float(e % 3) * 1e-6f);
  }
  Buffer bias(DType::f32, {E});
  for (int64_t e = 0; e < E; ++e) bias.set(e, float((e * 37) % E) * 1e-7f);
  for (int k : {1, 4, 8}) {
    GroupedTopkParams cfg = config(k, 8, 4, Scoring::sigmoid, &bias);
    cfg.renormalize = true;
    expect_cpu_matches_ref(g, cfg, &bias, "k=" + std::to_string(k));
  }
}

// The vector sigmoid of the fast path against ref::sigmoid_f32 on about a million f32 bit patterns:
// the error bound the fast path's certification assumes, |s' - s| <= 2 * kExpRelErr * s (+ 1e-30
// where exp underflows).
MOEKIT_CPU_AVX512 void sigmoid_approx_16(const float* x, float* out) {
  _mm512_storeu_ps(out, cpu::simd::sigmoid_approx(_mm512_loadu_ps(x)));
}

TEST(GroupedTopk, CpuVectorSigmoidMeetsItsErrorBound) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  double worst = 0;
  alignas(64) float x[16], y[16];
  int n = 0;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4099) {
    const uint32_t bits = uint32_t(u);
    std::memcpy(&x[n++], &bits, 4);
    if (n < 16) continue;
    n = 0;
    sigmoid_approx_16(x, y);
    for (int i = 0; i < 16; ++i) {
      const double want = ref::sigmoid_f32(x[i]);
      const double err = std::fabs(double(y[i]) - want);
      ASSERT_LE(err, 2.0 * cpu::simd::kExpRelErr * want + 1e-30) << "x=" << x[i] << " got " << y[i] << " want " << want;
      if (want > 1e-30) worst = std::max(worst, err / want);
    }
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
}

// A big call equals itself run to run (fixed partition; no dependence on scheduling).
TEST(GroupedTopk, CpuIsDeterministicRunToRun) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  const Buffer bias = random_bias(9, 256);
  GroupedTopkParams cfg = config(8, 8, 4, Scoring::sigmoid, &bias);
  const Buffer g = certified_logits(78, 1500, 256, cfg, DType::bf16);
  Call a(g, 8, 8, 4, Scoring::sigmoid, &bias, true, 2.5f), b(g, 8, 8, 4, Scoring::sigmoid, &bias, true, 2.5f);
  routing_test::expect_same_run_to_run(a, b, "grouped_topk_avx512", grouped_topk);
}

TEST(GroupedTopk, CpuPresetsMatchRef) {
  ROUTING_SKIP_IF(routing_test::cpu_unavailable());
  routing_test::expect_cpu_presets_pass(testing::check_grouped_topk);
}

}  // namespace cpu_cases

}  // namespace
}  // namespace moekit
