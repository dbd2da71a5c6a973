// fused_moe reference kernel, unquantized variant (SPEC 3.1, 3.4, 3.5), plus the scalar helpers
// of fused_moe_ref.h and the registration of every fused_moe reference kernel.
//
// fused_moe_ref: x, w1, w2 in bf16 | f16 | f32, g1u1 or g1u0, silu / gelu / gelu_tanh. Per token:
//   for each slot j with a local expert e (ids of -1 and remote experts are skipped):
//     h = w1[e] . x_t (f32), a = act(g) * u (g1u0: act(h)), optionally rounded to x's dtype,
//     y += w_tj * (w2[e] . a)            (weight_on_input: g, u scaled by w_tj, no final weight)
//   out_t = round(y) once. Fixed loop order: deterministic by construction.
// Tests: tests/test_fused_moe.cpp (suite FusedMoe), against the float64 oracle of
// src/testing/oracle_fused_moe.cpp.
#include "ops/fused_moe/fused_moe_ref.h"

#include <algorithm>
#include <cmath>

#include "ref/ref_kernels.h"

namespace moekit::ref {

// ---------------------------------------------------------------- shared helpers
namespace moe {

namespace {
constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Piece sizes in elements, in carve order.
struct Sizes {
  int64_t xin, xscale, wrow, h, a, ascale, y, local;
};
Sizes sizes(const FusedMoeParams& p) {
  const MoeDims d = moe_dims(p);
  const int64_t bk = p.scale_block_k > 0 ? p.scale_block_k : std::max<int64_t>(std::max(d.H, d.I), 1);
  return Sizes{d.H, ceil_div(d.H, bk), std::max(d.H, d.I), d.N1, d.I, ceil_div(d.I, bk), d.H, d.Eg};
}
}  // namespace

size_t scratch_bytes(const FusedMoeParams& p) {
  const Sizes s = sizes(p);
  size_t n = 0;
  for (int64_t f : {s.xin, s.xscale, s.wrow, s.h, s.a, s.ascale, s.y}) n += align_up(size_t(f) * sizeof(float));
  // + kAlign: a caller's workspace need not be aligned; carve_scratch aligns its start.
  return n + align_up(size_t(s.local) * sizeof(int32_t)) + kAlign;
}

Scratch carve_scratch(const FusedMoeParams& p, void* workspace) {
  const Sizes s = sizes(p);
  auto* base = static_cast<unsigned char*>(workspace);
  size_t off = (kAlign - reinterpret_cast<uintptr_t>(base) % kAlign) % kAlign;
  auto take = [&](int64_t n, size_t elem) {
    unsigned char* q = base + off;
    off += align_up(size_t(n) * elem);
    return q;
  };
  Scratch sc;
  sc.xin = reinterpret_cast<float*>(take(s.xin, sizeof(float)));
  sc.xscale = reinterpret_cast<float*>(take(s.xscale, sizeof(float)));
  sc.wrow = reinterpret_cast<float*>(take(s.wrow, sizeof(float)));
  sc.h = reinterpret_cast<float*>(take(s.h, sizeof(float)));
  sc.a = reinterpret_cast<float*>(take(s.a, sizeof(float)));
  sc.ascale = reinterpret_cast<float*>(take(s.ascale, sizeof(float)));
  sc.y = reinterpret_cast<float*>(take(s.y, sizeof(float)));
  sc.local = reinterpret_cast<int32_t*>(take(s.local, sizeof(int32_t)));
  return sc;
}

void build_local_table(const FusedMoeParams& p, int32_t* local) {
  const MoeDims d = moe_dims(p);
  if (p.expert_mask.present()) {
    const int32_t* m = p.expert_mask.ptr<const int32_t>();
    int32_t next = 0;
    for (int64_t g = 0; g < d.Eg; ++g) local[g] = m[g] ? next++ : -1;
  } else if (p.expert_map.present()) {
    const int32_t* m = p.expert_map.ptr<const int32_t>();
    for (int64_t g = 0; g < d.Eg; ++g) local[g] = m[g];
  } else {
    for (int64_t g = 0; g < d.Eg; ++g) local[g] = int32_t(g);
  }
}

void load_weight_row(const TensorView& w, int64_t e, int64_t n, float* row) {
  const int64_t N = w.shape[1], K = w.shape[2];
  const int64_t base = e * N * K;
  if (w.layout == Layout::row_major) {
    for (int64_t c = 0; c < K; ++c) row[c] = load_as_f32(w.data, w.dtype, base + n * K + c);
  } else if (w.layout == Layout::cpu_vnni2_n32) {
    for (int64_t c = 0; c < K; ++c) row[c] = load_as_f32(w.data, w.dtype, base + vnni2_index(n, c, K));
  } else {
    const int eb = dtype_size(w.dtype);
    for (int64_t c = 0; c < K; ++c) row[c] = load_as_f32(w.data, w.dtype, base + shuffle_index(n, c, K, eb));
  }
}

void load_x_row(const TensorView& x, int64_t t, float* dst) {
  const int64_t H = x.shape[1], off = t * x.stride[0];
  for (int64_t c = 0; c < H; ++c) dst[c] = load_as_f32(x.data, x.dtype, off + c);
}

void store_out_row(const TensorView& out, int64_t t, const float* y) {
  const int64_t H = out.shape[1], off = t * out.stride[0];
  for (int64_t c = 0; c < H; ++c) store_from_f32(out.data, out.dtype, off + c, y[c]);
}

void quantize_row_fp8_static(const float* v, int64_t n, float s, float* q) {
  for (int64_t i = 0; i < n; ++i) q[i] = e4m3fn_bits_to_f32(f32_to_e4m3fn_bits(v[i] / s));
}

float quantize_row_fp8(const float* v, int64_t n, float* q) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(v[i]));
  const float s = std::fmax(amax, kFp8AmaxFloor) / kFp8E4m3fnMax;
  quantize_row_fp8_static(v, n, s, q);
  return s;
}

}  // namespace moe

// ---------------------------------------------------------------- unquantized kernel
namespace {

using moe::Scratch;

Status supports(const FusedMoeParams& p) {
  return require_host({{"x", &p.x}, {"w1", &p.w1}, {"w2", &p.w2}, {"topk_ids", &p.topk_ids},
                       {"topk_weights", &p.topk_weights}, {"out", &p.out}, {"expert_mask", &p.expert_mask},
                       {"expert_map", &p.expert_map}});
}

size_t workspace(const FusedMoeParams& p) { return moe::scratch_bytes(p); }

Status run(const FusedMoeParams& p, const RunContext& ctx) {
  const MoeDims d = moe_dims(p);
  Scratch sc = moe::carve_scratch(p, ctx.workspace);
  moe::build_local_table(p, sc.local);
  const int32_t* ids = p.topk_ids.ptr<const int32_t>();
  const float* wts = p.topk_weights.ptr<const float>();
  for (int64_t t = 0; t < d.T; ++t) {
    moe::load_x_row(p.x, t, sc.xin);
    std::fill(sc.y, sc.y + d.H, 0.0f);
    for (int64_t j = 0; j < d.k; ++j) {
      const int32_t e = moe::local_expert(sc.local, ids[t * d.k + j]);
      if (e < 0) continue;  // -1 id or remote expert
      const moe::SlotWeight w = moe::slot_weight(p, wts[t * d.k + j]);
      // Stage 1: h = w1[e] . x (f32), weight_on_input scales h (= g and u) by w.
      for (int64_t n = 0; n < d.N1; ++n) {
        moe::load_weight_row(p.w1, e, n, sc.wrow);
        sc.h[n] = moe::dot(sc.wrow, sc.xin, d.H) * w.in;
      }
      moe::act_and_mul(p.activation, d.g1u1, sc.h, d.I, sc.a);  // a = act(g) * u
      if (p.round_intermediate) {
        for (int64_t i = 0; i < d.I; ++i) sc.a[i] = round_to(p.x.dtype, sc.a[i]);
      }
      // Stage 2: y += w * (w2[e] . a) (no final weight with weight_on_input).
      for (int64_t hh = 0; hh < d.H; ++hh) {
        moe::load_weight_row(p.w2, e, hh, sc.wrow);
        sc.y[hh] += w.out * moe::dot(sc.wrow, sc.a, d.I);
      }
    }
    moe::store_out_row(p.out, t, sc.y);
  }
  return Status::Ok();
}

}  // namespace

void register_fused_moe(Registry& r) {
  r.add({"fused_moe_ref", OpKind::fused_moe, MoeVariant::unquantized, Backend::ref,
         "x/w bf16|f16|f32, f32 accumulate, a optionally rounded to x dtype", 0,
         erase_supports<FusedMoeParams, supports>, erase_workspace<FusedMoeParams, workspace>,
         erase_run<FusedMoeParams, run>});
  register_fused_moe_fp8(r);
}

}  // namespace moekit::ref
