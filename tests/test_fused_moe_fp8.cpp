#include <gtest/gtest.h>
#include <cstdio>
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"
using namespace moekit;
using namespace moekit::testing;
TEST(FusedMoeExplore, Emu) {
  for (Scheme sc : {Scheme::fp8_tensor, Scheme::fp8_channel, Scheme::fp8_block}) {
    for (int seed = 1; seed < 4; ++seed) {
      for (int variant = 0; variant < 4; ++variant) {
      MoeShape s; s.E = 8; s.k = 2; s.H = 320; s.I = 200; s.T = 9; s.scheme = sc;
      MoeProblemOptions o;
      if (variant == 1) { s.k = 1; s.weight_on_input = true; }
      if (variant == 2) { o.static_a1_scale = true; }
      if (variant == 3) { o.block = 64; s.activation = Activation::gelu; }
      MoeProblem p; ASSERT_TRUE(make_moe_problem(s, o, seed, &p).ok());
      FusedMoeParams prm = p.params();
      Status st = fused_moe(prm);
      ASSERT_TRUE(st.ok()) << st.to_string();
      auto act = read_out(prm.out);
      OracleOptions oo; oo.emulate_fp8_activations = true;
      auto emu = oracle_fused_moe(prm, oo);
      auto ora = oracle_fused_moe(prm);
      MoeTolerance tol{MoeVariant::fp8_row, DType::f32, MoeCompare::kernel_vs_ref, 0, 0, 0, 0, 10};
      Metrics m1, m2; std::string d1, d2;
      judge_moe(act, emu, s.T, s.H, tol, &m1, &d1);
      judge_moe(act, ora, s.T, s.H, tol, &m2, &d2);
      double ss=0; for(double e: emu) ss+=e*e; double rms = std::sqrt(ss/emu.size());
      std::printf("%s v%d seed %d emu: 1-cos=%.3g rr-1=%.3g maxabs/rms=%.3g maxrel=%.3g | oracle: 1-cos=%.3g rr=%.4f\n", scheme_name(sc), variant, seed, 1-m1.cosine, m1.rms_ratio-1, m1.max_abs_err/rms, m1.max_rel_err, 1-m2.cosine, m2.rms_ratio);
      }
    }
  }
}
