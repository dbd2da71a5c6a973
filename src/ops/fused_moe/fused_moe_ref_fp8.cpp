// fused_moe reference kernels, fp8 W8A8 variants (SPEC 3.2, 3.3, 3.4): scalar, f32, single-threaded.
//
// fused_moe_ref_fp8_row (SPEC 3.2) and fused_moe_ref_fp8_row_tkw1 (SPEC 3.4, k == 1):
//   s_t = max(amax(x_t), kFp8AmaxFloor) / 448 (or the static a1_scale), xq = fp8(x_t / s_t);
//   h[n] = (xq . w1q[e, n]) * s_t * w1_scale[e, n]          (per-tensor [E] scales broadcast)
//   a = act(g) * u in f32, re-quantized per (token, slot) row: s_a, aq = fp8(a / s_a);
//   y += w * (aq . w2q[e, c]) * s_a * w2_scale[e, c]        (tkw1: h *= w, no final weight)
// fused_moe_ref_fp8_block (SPEC 3.3): bn x bk weight blocks and 1 x bk activation groups; each
// group's partial dot is computed in f32 and promoted with (activation group scale x weight block
// scale) before it joins the f32 row sum, as the DeepGEMM-style kernels do. x is quantized per
// (token, bk-group), the intermediate per (token, slot, bk-group). H and I need not be multiples
// of the block (the last group / block is partial). weight_on_input is supported (k == 1).
// Every fp8 code is e4m3fn, rounded to nearest even and saturated to +-448 (dtype.h).
// Tests: tests/test_fused_moe_fp8.cpp (suite FusedMoeFp8), against the float64 oracle.
#include <algorithm>

#include "ops/fused_moe/fused_moe_ref.h"
#include "ref/ref_kernels.h"

namespace moekit::ref {

namespace {

using moe::dot;
using moe::Scratch;

Status supports(const FusedMoeParams& p) {
  return require_host({{"x", &p.x}, {"w1", &p.w1}, {"w2", &p.w2}, {"topk_ids", &p.topk_ids},
                       {"topk_weights", &p.topk_weights}, {"out", &p.out}, {"w1_scale", &p.w1_scale},
                       {"w2_scale", &p.w2_scale}, {"a1_scale", &p.a1_scale}, {"expert_mask", &p.expert_mask},
                       {"expert_map", &p.expert_map}});
}

size_t workspace(const FusedMoeParams& p) { return moe::scratch_bytes(p); }

// fp8_row and fp8_row_tkw1 (weight_on_input decides).
Status run_row(const FusedMoeParams& p, const RunContext& ctx) {
  const MoeDims d = moe_dims(p);
  Scratch sc = moe::carve_scratch(p, ctx.workspace);
  moe::build_local_table(p, sc.local);
  const int32_t* ids = p.topk_ids.ptr<const int32_t>();
  const float* wts = p.topk_weights.ptr<const float>();
  for (int64_t t = 0; t < d.T; ++t) {
    // Activation quant of x_t (y holds the raw row until the accumulation starts).
    moe::load_x_row(p.x, t, sc.y);
    float s_x;
    if (p.a1_scale.present()) {
      s_x = p.a1_scale.ptr<const float>()[0];
      moe::quantize_row_fp8_static(sc.y, d.H, s_x, sc.xin);
    } else {
      s_x = moe::quantize_row_fp8(sc.y, d.H, sc.xin);
    }
    std::fill(sc.y, sc.y + d.H, 0.0f);
    for (int64_t j = 0; j < d.k; ++j) {
      const int32_t e = moe::local_expert(sc.local, ids[t * d.k + j]);
      if (e < 0) continue;  // -1 id or remote expert
      const moe::SlotWeight w = moe::slot_weight(p, wts[t * d.k + j]);
      for (int64_t n = 0; n < d.N1; ++n) {
        moe::load_weight_row(p.w1, e, n, sc.wrow);
        const float h = dot(sc.wrow, sc.xin, d.H) * s_x * moe::row_scale(p.w1_scale, e, n, d.N1);
        sc.h[n] = h * w.in;
      }
      moe::act_and_mul(p.activation, d.g1u1, sc.h, d.I, sc.a);  // a = act(g) * u
      const float s_a = moe::quantize_row_fp8(sc.a, d.I, sc.a);  // in place: amax is read first
      for (int64_t c = 0; c < d.H; ++c) {
        moe::load_weight_row(p.w2, e, c, sc.wrow);
        sc.y[c] += w.out * (dot(sc.wrow, sc.a, d.I) * s_a * moe::row_scale(p.w2_scale, e, c, d.H));
      }
    }
    moe::store_out_row(p.out, t, sc.y);
  }
  return Status::Ok();
}

// Quantizes v[0..n) per group of bk: scale[g] and q (code values).
void quantize_groups(const float* v, int64_t n, int64_t bk, float* q, float* scale) {
  for (int64_t g = 0; g * bk < n; ++g) {
    const int64_t c0 = g * bk, len = std::min(bk, n - c0);
    scale[g] = moe::quantize_row_fp8(v + c0, len, q + c0);
  }
}

// Row n of expert e of a block-scaled GEMM: sum over k-blocks of (partial dot) * a_scale * w_scale.
float block_row_dot(const float* wrow, const float* q, const float* qscale, const TensorView& ws, int64_t e,
                    int64_t n, int64_t N, int64_t K, int64_t bn, int64_t bk) {
  const int64_t nb = (N + bn - 1) / bn, kb = (K + bk - 1) / bk;
  const float* s = ws.ptr<const float>() + (e * nb + n / bn) * kb;
  float acc = 0.0f;
  for (int64_t b = 0; b < kb; ++b) {
    const int64_t c0 = b * bk, len = std::min(bk, K - c0);
    acc += dot(wrow + c0, q + c0, len) * (qscale[b] * s[b]);
  }
  return acc;
}

Status run_block(const FusedMoeParams& p, const RunContext& ctx) {
  const MoeDims d = moe_dims(p);
  const int64_t bn = p.scale_block_n, bk = p.scale_block_k;
  Scratch sc = moe::carve_scratch(p, ctx.workspace);
  moe::build_local_table(p, sc.local);
  const int32_t* ids = p.topk_ids.ptr<const int32_t>();
  const float* wts = p.topk_weights.ptr<const float>();
  for (int64_t t = 0; t < d.T; ++t) {
    moe::load_x_row(p.x, t, sc.y);
    quantize_groups(sc.y, d.H, bk, sc.xin, sc.xscale);
    std::fill(sc.y, sc.y + d.H, 0.0f);
    for (int64_t j = 0; j < d.k; ++j) {
      const int32_t e = moe::local_expert(sc.local, ids[t * d.k + j]);
      if (e < 0) continue;  // -1 id or remote expert
      const moe::SlotWeight w = moe::slot_weight(p, wts[t * d.k + j]);
      for (int64_t n = 0; n < d.N1; ++n) {
        moe::load_weight_row(p.w1, e, n, sc.wrow);
        const float h = block_row_dot(sc.wrow, sc.xin, sc.xscale, p.w1_scale, e, n, d.N1, d.H, bn, bk);
        sc.h[n] = h * w.in;
      }
      moe::act_and_mul(p.activation, d.g1u1, sc.h, d.I, sc.a);  // a = act(g) * u
      quantize_groups(sc.a, d.I, bk, sc.a, sc.ascale);
      for (int64_t c = 0; c < d.H; ++c) {
        moe::load_weight_row(p.w2, e, c, sc.wrow);
        sc.y[c] += w.out * block_row_dot(sc.wrow, sc.a, sc.ascale, p.w2_scale, e, c, d.H, d.I, bn, bk);
      }
    }
    moe::store_out_row(p.out, t, sc.y);
  }
  return Status::Ok();
}

}  // namespace

void register_fused_moe_fp8(Registry& r) {
  r.add({"fused_moe_ref_fp8_row", OpKind::fused_moe, MoeVariant::fp8_row, Backend::ref,
         "w fp8_e4m3fn + per-row/per-tensor f32 scales, dynamic per-token fp8 activations, f32 accumulate", 0,
         erase_supports<FusedMoeParams, supports>, erase_workspace<FusedMoeParams, workspace>,
         erase_run<FusedMoeParams, run_row>});
  r.add({"fused_moe_ref_fp8_row_tkw1", OpKind::fused_moe, MoeVariant::fp8_row_tkw1, Backend::ref,
         "as fp8_row, k == 1, router weight on the expert input", 0, erase_supports<FusedMoeParams, supports>,
         erase_workspace<FusedMoeParams, workspace>, erase_run<FusedMoeParams, run_row>});
  r.add({"fused_moe_ref_fp8_block", OpKind::fused_moe, MoeVariant::fp8_block, Backend::ref,
         "w fp8_e4m3fn + bn x bk block f32 scales, 1 x bk dynamic fp8 activation groups, f32 accumulate", 0,
         erase_supports<FusedMoeParams, supports>, erase_workspace<FusedMoeParams, workspace>,
         erase_run<FusedMoeParams, run_block>});
}

}  // namespace moekit::ref
