// Scalar helpers shared by the fused_moe reference kernels (fused_moe_ref.cpp: unquantized,
// fused_moe_ref_fp8.cpp: fp8_row, fp8_row_tkw1, fp8_block). Internal to the reference backend.
//
// Everything here is single-threaded f32 code over host tensors that validate_fused_moe accepted.
// The kernels allocate nothing: their scratch is carved out of the workspace declared through
// workspace_bytes (the front door hands host kernels a buffer when the caller gives none).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "moekit/ops/fused_moe.h"
#include "moekit/ops/layout.h"
#include "moekit/ops/quant.h"

namespace moekit::ref::moe {

// Per-call scratch (f32 vectors and the global -> local expert table), carved from the workspace.
struct Scratch {
  float* xin;      // [H]  the token's input as f32 (fp8 variants: its fp8 codes as values)
  float* xscale;   // [ceil(H / bk)] activation scales (fp8_row: 1 entry)
  float* wrow;     // [max(H, I)] one decoded weight row
  float* h;        // [N1] first GEMM output
  float* a;        // [I]  intermediate (fp8 variants: its fp8 codes as values)
  float* ascale;   // [ceil(I / bk)] intermediate scales
  float* y;        // [H]  f32 accumulator over k
  int32_t* local;  // [Eg] local expert of each global id, -1 = remote
};

// Bytes of scratch for p (same layout for every variant; 64-byte aligned pieces).
size_t scratch_bytes(const FusedMoeParams& p);
// Splits ctx.workspace (at least scratch_bytes(p)) into the pieces above.
Scratch carve_scratch(const FusedMoeParams& p, void* workspace);

// local[g] for g in [0, Eg): identity without mask/map; cumsum(mask)[g]-1 or -1; map[g].
void build_local_table(const FusedMoeParams& p, int32_t* local);

// act(z) in f32: silu z*sigmoid(z), gelu (erf form), gelu_tanh.
inline float activation(Activation act, float z) {
  switch (act) {
    case Activation::silu: return z / (1.0f + std::exp(-z));
    case Activation::gelu: return 0.5f * z * (1.0f + std::erf(z * 0.70710678118654752f));
    case Activation::gelu_tanh: {
      const float c = 0.79788456080286536f;  // sqrt(2 / pi)
      return 0.5f * z * (1.0f + std::tanh(c * (z + 0.044715f * z * z * z)));
    }
  }
  return z;
}

// g1u1: a[i] = act(h[i]) * h[I + i] (h = [g | u]); g1u0: a[i] = act(h[i]). i in [0, I).
inline void act_and_mul(Activation act, bool g1u1, const float* h, int64_t I, float* a) {
  for (int64_t i = 0; i < I; ++i) {
    const float g = activation(act, h[i]);
    a[i] = g1u1 ? g * h[I + i] : g;
  }
}

// f32 dot product of a[0..n) and b[0..n), summed in index order.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// The local expert of a routed global id: -1 for a -1 id (slot unused) or a remote expert.
inline int32_t local_expert(const int32_t* local, int32_t id) { return id < 0 ? -1 : local[id]; }

// Where a slot's router weight w goes: on the expert's output, y += w * (w2[e] . a), or with
// weight_on_input (SPEC 3.4) on its input, h = (w1[e] . x) * w; the other factor is 1.
// NOTE: multiplying by 1.0f is exact, so the side without the weight keeps its value bit for bit.
struct SlotWeight {
  float in, out;
};
inline SlotWeight slot_weight(const FusedMoeParams& p, float w) {
  return p.weight_on_input ? SlotWeight{w, 1.0f} : SlotWeight{1.0f, w};
}

// Decodes row n of expert e of a weight tensor [E, N, K] (any layout, any weight dtype; fp8 gives
// the code VALUES, unscaled) into row[0..K).
void load_weight_row(const TensorView& w, int64_t e, int64_t n, float* row);

// Loads x row t (x's dtype) into dst[0..H) as f32.
void load_x_row(const TensorView& x, int64_t t, float* dst);
// Rounds y[0..H) to out's dtype into out row t.
void store_out_row(const TensorView& out, int64_t t, const float* y);

// Dynamic fp8 (e4m3fn) quantization of v[0..n): returns s = max(amax, kFp8AmaxFloor) / 448 and
// writes q[i] = value of fp8(v[i] / s) (round to nearest even, saturating). Same formula as the
// quantize_fp8 op (SPEC 5).
float quantize_row_fp8(const float* v, int64_t n, float* q);
// Same with a given scale s (static activation scale).
void quantize_row_fp8_static(const float* v, int64_t n, float s, float* q);

// Per-row weight scale of expert e, row n, for a [E] (per-tensor) or [E, N(, 1)] (per-row) scale.
inline float row_scale(const TensorView& s, int64_t e, int64_t n, int64_t N) {
  const float* d = s.ptr<const float>();
  return s.ndim == 1 ? d[e] : d[e * N + n];
}

}  // namespace moekit::ref::moe

namespace moekit::ref {
// Registers fused_moe_ref_fp8_row, fused_moe_ref_fp8_row_tkw1 and fused_moe_ref_fp8_block
// (fused_moe_ref_fp8.cpp); called by register_fused_moe.
void register_fused_moe_fp8(Registry& r);
}  // namespace moekit::ref
