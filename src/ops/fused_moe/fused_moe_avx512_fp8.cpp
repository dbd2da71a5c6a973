// fused_moe_avx512_fp8_row (+ _tkw1): the CPU backend's fp8 W8A8 per-row fused_moe (SPEC 3.2, 3.4),
// and fused_moe_avx512_fma: the same f32-FMA kernel on unquantized bf16 / f16 / f32 weights (SPEC
// 3.1, 3.4) -- the path for f16 and f32 problems, and for bf16 ones the vdpbf16ps kernel refuses.
//
// Same math as the reference run_row (fused_moe_ref_fp8.cpp) / run (fused_moe_ref.cpp), same
// staging as the bf16 kernel (fused_moe_avx512.cpp):
//   stage 0  (calling thread): group the (token, slot) entries by local expert, stable order;
//            then (threads over tokens) x_t -> f32; fp8: s_t = max(amax, floor)/448 (or the static
//            a1_scale), xq = fp8 code VALUES of x_t / s_t, into a [T, H] f32 scratch.
//   stage 1  (threads over experts x blocks of 16 intermediate rows): g, u = (xq . w1q row) * s_t *
//            row_scale (unquantized: x . w1 row), x w for weight_on_input, a = act(g) * u in f32
//            into [T*k, I] (unquantized with round_intermediate: rounded to x's dtype).
//   stage 1b (fp8, threads over slots): a re-quantized per (token, slot) row, in place, scale s_a.
//   stage 2  (threads over experts x blocks of 16 hidden rows): y[slot, h] = (aq . w2q[e][h]) *
//            s_a * row_scale (unquantized: a . w2 row).
//   stage 3  (threads over tokens): out[t] = sum_j w_tj * y[t*k + j] in slot order, one rounding.
// fp8 on CPUs with AVX-512 BF16: the dots run on vdpbf16ps instead (dot_rows_fp8_dp: codes turned
// into bf16 in registers, activation codes staged as bf16; half the instructions per weight).
// Otherwise weights are widened to f32 in registers 16 at a time and never expanded in memory (a WeightKind
// below per dtype): fp8 e4m3fn as code value x 2^-120 (moe::decode16_fp8, fused_moe_avx512_fp8.h),
// the 2^-120 undone once per dot product (x 2^120, exact), NaN codes to NaN as in the reference;
// f16 by vcvtph2ps; bf16 by a 16-bit shift; f32 as is. Each weight row is software-prefetched
// kPrefetch bytes ahead into L2: with 1-byte weights the out-of-order window covers half the bytes
// it covers for bf16, and the hardware prefetchers alone left the one-token case short of the
// DRAM bandwidth (docs/experiments.md E90; the distance: E93).
// Deterministic: fixed partition (src/cpu/thread_pool.h), each output element from one thread in
// a fixed order. AVX-512 through target attributes: no special flags for this file; supports()
// refuses CPUs without AVX-512 F/BW/VL (moe::require_avx512).
// Tests: tests/test_fused_moe_avx512_fp8.cpp (suite FusedMoeAvx512Fp8), the fma kernel in
// tests/test_fused_moe_cpu_generic.cpp (FusedMoeCpuGeneric); `moekit check --backend cpu`.
#include "ops/fused_moe/fused_moe_avx512_fp8.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "cpu/thread_pool.h"
#include "moekit/ops/fused_moe.h"
#include "moekit/ops/layout.h"
#include "ops/fused_moe/fused_moe_cpu.h"
#include "ops/fused_moe/fused_moe_ref.h"

namespace moekit::cpu {

void register_fused_moe_avx512_fp8(Registry& r);

namespace {

constexpr const char* kRow = "fused_moe_avx512_fp8_row";
constexpr const char* kFma = "fused_moe_avx512_fma";
constexpr int64_t kRowBlock = 16;    // output rows per task
constexpr int kTok = 4;              // entries per register block
constexpr int64_t kPrefetch = 2048;  // bytes ahead along a weight row (best of 0/1024/2048/4096 here)

// Scratch carved from the workspace: the expert groups plus this kernel's buffers.
struct Scratch : moe::ExpertGroups {
  float* xq;  // [T, H] x in f32 (fp8: code values of the quantized tokens)
  float* xs;  // [T] activation scale of each token (fp8)
  float* a;   // [T*k, I] intermediate in f32 (fp8: then its code values, stage 1b)
  float* as;  // [T*k] intermediate scale of each slot (fp8)
  float* y;   // [T*k, H] per-slot expert output
  // fp8 with AVX-512 BF16 (dp): the code values of xq / a as bf16 times 2^119 (dot_rows_fp8_dp).
  uint16_t* xb;  // [T, H]
  uint16_t* ab;  // [T*k, I]
  bool dp = false;
};

size_t workspace_bytes(const FusedMoeParams& p) {
  const MoeDims d = moe_dims(p);
  const size_t slots = size_t(d.T * d.k), T = size_t(d.T);
  return moe::expert_groups_bytes(d) + moe::align64(T * size_t(d.H) * 4) + moe::align64(T * 4) +
         moe::align64(slots * size_t(d.I) * 4) + moe::align64(slots * 4) + moe::align64(slots * size_t(d.H) * 4) +
         moe::align64(T * size_t(d.H) * 2) + moe::align64(slots * size_t(d.I) * 2) + 64;
}

Scratch carve(const FusedMoeParams& p, void* ws) {
  const MoeDims d = moe_dims(p);
  const size_t slots = size_t(d.T * d.k), T = size_t(d.T);
  moe::Carver c(ws);
  Scratch s;
  moe::carve_expert_groups(d, c, &s);
  s.xq = c.take<float>(T * size_t(d.H));
  s.xs = c.take<float>(T);
  s.a = c.take<float>(slots * size_t(d.I));
  s.as = c.take<float>(slots);
  s.y = c.take<float>(slots * size_t(d.H));
  s.xb = c.take<uint16_t>(T * size_t(d.H));
  s.ab = c.take<uint16_t>(slots * size_t(d.I));
  return s;
}

// What both kernels need: the CPU, host tensors, row_major weights, H and I multiples of 16.
Status supports_common(const char* name, const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(moe::require_avx512(name, cpu_features(), false));
  MOEKIT_RETURN_IF_ERROR(moe::require_host(p));
  if (p.x.dtype != DType::bf16 && p.x.dtype != DType::f16 && p.x.dtype != DType::f32) {
    return Unsupported(name, ": x must be bf16, f16 or f32, got ", dtype_name(p.x.dtype));
  }
  const bool packed = p.w1.layout == Layout::cpu_vnni2_n32 && p.w2.layout == Layout::cpu_vnni2_n32 &&
                      std::string(name) == kRow;
  if (!packed && (p.w1.layout != Layout::row_major || p.w2.layout != Layout::row_major)) {
    return Unsupported(name, ": weights must be row_major", std::string(name) == kRow ? " or cpu_vnni2_n32" : "",
                       ", got ", layout_name(p.w1.layout));
  }
  if (packed) {
    MOEKIT_RETURN_IF_ERROR(moe::require_avx512(name, cpu_features(), true));  // the packed path is vdpbf16ps
    const MoeDims d = moe_dims(p);
    if (d.I % kVnniPanelN != 0 || d.H % kVnniPanelN != 0) {
      return Unsupported(name, ": packed weights need H and I multiples of 32, got H=", d.H, " I=", d.I);
    }
  }
  const MoeDims d = moe_dims(p);
  if (d.H % 16 != 0 || d.I % 16 != 0) {
    return Unsupported(name, ": H and I must be multiples of 16, got H=", d.H, " I=", d.I);
  }
  return Status::Ok();
}

Status supports_row(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(supports_common(kRow, p));
  if (p.w1.dtype != DType::fp8_e4m3fn || p.w2.dtype != DType::fp8_e4m3fn) {
    return Unsupported(kRow, ": weights must be fp8_e4m3fn, got w1 ", dtype_name(p.w1.dtype), ", w2 ",
                       dtype_name(p.w2.dtype));
  }
  if (p.scale_block_n != 0) {
    return Unsupported(kRow, ": block scales are not supported, got scale_block_n=", p.scale_block_n);
  }
  return Status::Ok();
}

Status supports_fma(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(supports_common(kFma, p));
  for (DType t : {p.w1.dtype, p.w2.dtype}) {
    if (t != DType::bf16 && t != DType::f16 && t != DType::f32) {
      return Unsupported(kFma, ": weights must be bf16, f16 or f32, got ", dtype_name(t));
    }
  }
  return Status::Ok();
}

// How a weight dtype is widened: T the storage type, load(w) 16 elements at w as f32 (fp8: times
// 2^-120), kUnscale the factor that undoes load's scaling once per dot product, kQuant whether the
// weights are fp8 (scales, activation quantization). NOTE: the maskz intrinsics with a full mask
// avoid _mm512_undefined_*, which trips a false -Wmaybe-uninitialized in GCC 12's headers.
struct Fp8Weights {
  using T = uint8_t;
  static constexpr float kUnscale = 0x1p120f;
  static constexpr bool kQuant = true;
  __attribute__((target("avx512f,avx512bw,avx512vl"))) static __m512 load(const T* w) { return moe::decode16_fp8(w); }
};
struct F16Weights {
  using T = uint16_t;
  static constexpr float kUnscale = 1.0f;
  static constexpr bool kQuant = false;
  __attribute__((target("avx512f"))) static __m512 load(const T* w) {
    return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  }
};
struct Bf16Weights {
  using T = uint16_t;
  static constexpr float kUnscale = 1.0f;
  static constexpr bool kQuant = false;
  __attribute__((target("avx512f"))) static __m512 load(const T* w) {
    const __m512i v = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, v, 16));
  }
};
struct F32Weights {
  using T = float;
  static constexpr float kUnscale = 1.0f;
  static constexpr bool kQuant = false;
  __attribute__((target("avx512f"))) static __m512 load(const T* w) { return _mm512_loadu_ps(w); }
};

// dots[r][q] = w row r . v[q] over K (K % 16 == 0) for R weight rows and NT activation rows.
// R x NT independent accumulators hide the FMA latency at one token.
template <class W, int R, int NT>
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline void dot_rows(const typename W::T* const* w,
                                                                          const float* const* v, int64_t K,
                                                                          float (*dots)[kTok]) {
  constexpr int64_t kLine = 64 / sizeof(typename W::T);  // elements per cache line
  __m512 acc[R][NT];
  for (int r = 0; r < R; ++r) {
    for (int q = 0; q < NT; ++q) acc[r][q] = _mm512_setzero_ps();
  }
  for (int64_t kk = 0; kk < K; kk += 16) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      if ((kk & (kLine - 1)) == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + kk) + kPrefetch, _MM_HINT_T1);
      }
      const __m512 vw = W::load(w[r] + kk);
#pragma GCC unroll 4
      for (int q = 0; q < NT; ++q) acc[r][q] = _mm512_fmadd_ps(vw, _mm512_loadu_ps(v[q] + kk), acc[r][q]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int q = 0; q < NT; ++q) dots[r][q] = moe::hsum16(acc[r][q]) * W::kUnscale;
  }
}

// fp8 dots on the bf16 dot-product unit: dots[r][q] = w row r . x row q over K (K % 16 == 0), with
// w e4m3fn codes and v the bf16 of the activation code values times 2^119 (Scratch::xb / ab).
// A code becomes the bf16 of its value times 2^-120 in two instructions: the sign-extended byte
// shifted left by 4 puts the 4 exponent + 3 mantissa bits at the bottom of the bf16 exponent /
// top of its mantissa and copies of the sign at bits 11..15, of which the mask keeps bit 15. So
// each dot is (x_q . w_q) * 2^-1, undone here. Per 32 weights: a sign-extending load, a shift, an
// and and one vdpbf16ps, against 8 instructions for the f32 decode + FMA of dot_rows.
// NOTE: vdpbf16ps reads denormals as zero, so the e4m3fn subnormal weight codes (|w_q| < 2^-6,
// under 2^-6 / 448 of a row's scale) count as 0; x_q >= 2^-9 stays normal (x 2^119). NaN weight
// codes decode to a finite value (weights come from saturating quantization).
template <int R, int NT>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void dot_rows_fp8_dp(
    const uint8_t* const* w, const uint16_t* const* v, int64_t K, float (*dots)[kTok]) {
  __m512 acc[R][NT];
  for (int r = 0; r < R; ++r) {
    for (int q = 0; q < NT; ++q) acc[r][q] = _mm512_setzero_ps();
  }
  const __m512i keep = _mm512_set1_epi16(int16_t(0x87F0));
  int64_t kk = 0;
  for (; kk + 32 <= K; kk += 32) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      if ((kk & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(w[r] + kk) + kPrefetch, _MM_HINT_T1);
      const __m512i c = _mm512_maskz_cvtepi8_epi16(0xFFFFFFFFu, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + kk)));
      const __m512i b = _mm512_and_si512(_mm512_maskz_slli_epi16(0xFFFFFFFFu, c, 4), keep);
#pragma GCC unroll 4
      for (int q = 0; q < NT; ++q) {
        acc[r][q] = _mm512_dpbf16_ps(acc[r][q], (__m512bh)b, (__m512bh)_mm512_loadu_si512(v[q] + kk));
      }
    }
  }
  if (kk < K) {  // the last 16 (K % 32 == 16)
    for (int r = 0; r < R; ++r) {
      const __m512i c = _mm512_maskz_cvtepi8_epi16(
          0x0000FFFFu, _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[r] + kk))));
      const __m512i b = _mm512_and_si512(_mm512_maskz_slli_epi16(0xFFFFFFFFu, c, 4), keep);
      for (int q = 0; q < NT; ++q) {
        acc[r][q] = _mm512_dpbf16_ps(acc[r][q], (__m512bh)b, (__m512bh)_mm512_maskz_loadu_epi16(0x0000FFFFu, v[q] + kk));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int q = 0; q < NT; ++q) dots[r][q] = moe::hsum16(acc[r][q]) * 2.0f;
  }
}

// Row v (n code values, f32) -> bf16 of v * 2^119 (exact: every e4m3fn value times a power of two).
void stage_bf16_codes(const float* v, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16_bits(v[i] * 0x1p119f);
}

// The fp8 dots of one block: on the bf16 dot unit when the CPU has it (s.dp), else f32 FMA.
template <class W, int R, int NT>
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline void dot_rows_any(const Scratch& s,
                                                                              const typename W::T* const* w,
                                                                              const float* const* v,
                                                                              const uint16_t* const* vb, int64_t K,
                                                                              float (*dots)[kTok]) {
  if constexpr (W::kQuant) {
    if (s.dp) {
      dot_rows_fp8_dp<R, NT>(w, vb, K, dots);
      return;
    }
  }
  dot_rows<W, R, NT>(w, v, K, dots);
}

// Stage 1 for expert e, intermediate rows [i0, i1) (an even count), NT entries from ent.
template <class W, int NT>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void gate_up_rows(const FusedMoeParams& p, const MoeDims& d,
                                                                       const Scratch& s, int32_t e, const int32_t* ent,
                                                                       int64_t i0, int64_t i1) {
  using T = typename W::T;
  const T* w1 = p.w1.ptr<const T>() + int64_t(e) * d.N1 * d.H;
  const float* tw = p.topk_weights.ptr<const float>();
  const float* xr[kTok];
  const uint16_t* xbr[kTok];
  for (int q = 0; q < NT; ++q) {
    xr[q] = s.xq + int64_t(ent[q] / d.k) * d.H;
    xbr[q] = s.xb + int64_t(ent[q] / d.k) * d.H;
  }
  for (int64_t i = i0; i < i1; i += 2) {
    float dots[4][kTok];
    if (d.g1u1) {
      const T* w[4] = {w1 + i * d.H, w1 + (i + 1) * d.H, w1 + (d.I + i) * d.H, w1 + (d.I + i + 1) * d.H};
      dot_rows_any<W, 4, NT>(s, w, xr, xbr, d.H, dots);
    } else {
      const T* w[2] = {w1 + i * d.H, w1 + (i + 1) * d.H};
      dot_rows_any<W, 2, NT>(s, w, xr, xbr, d.H, dots);
    }
    for (int r = 0; r < 2; ++r) {
      const int64_t n = i + r;
      for (int q = 0; q < NT; ++q) {
        const int32_t slot = ent[q];
        const float win = ref::moe::slot_weight(p, tw[slot]).in;
        float g = dots[r][q], u = d.g1u1 ? dots[2 + r][q] : 0.0f;
        if constexpr (W::kQuant) {  // the reference's order: dot * s_t * row_scale
          const float sx = s.xs[slot / d.k];
          g = g * sx * ref::moe::row_scale(p.w1_scale, e, n, d.N1);
          if (d.g1u1) u = u * sx * ref::moe::row_scale(p.w1_scale, e, d.I + n, d.N1);
        }
        float v = ref::moe::activation(p.activation, g * win);
        if (d.g1u1) v *= u * win;
        if (!W::kQuant && p.round_intermediate) v = round_to(p.x.dtype, v);
        s.a[int64_t(slot) * d.I + n] = v;
      }
    }
  }
}

// Stage 2 for expert e, hidden rows [h0, h1) (a multiple of 4), NT entries from ent.
template <class W, int NT>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void down_rows(const FusedMoeParams& p, const MoeDims& d,
                                                                    const Scratch& s, int32_t e, const int32_t* ent,
                                                                    int64_t h0, int64_t h1) {
  using T = typename W::T;
  const T* w2 = p.w2.ptr<const T>() + int64_t(e) * d.H * d.I;
  const float* ar[kTok];
  const uint16_t* abr[kTok];
  for (int q = 0; q < NT; ++q) {
    ar[q] = s.a + int64_t(ent[q]) * d.I;
    abr[q] = s.ab + int64_t(ent[q]) * d.I;
  }
  for (int64_t h = h0; h < h1; h += 4) {
    float dots[4][kTok];
    const T* w[4] = {w2 + h * d.I, w2 + (h + 1) * d.I, w2 + (h + 2) * d.I, w2 + (h + 3) * d.I};
    dot_rows_any<W, 4, NT>(s, w, ar, abr, d.I, dots);
    for (int r = 0; r < 4; ++r) {
      for (int q = 0; q < NT; ++q) {
        float y = dots[r][q];
        if constexpr (W::kQuant) y = y * s.as[ent[q]] * ref::moe::row_scale(p.w2_scale, e, h + r, d.H);
        s.y[int64_t(ent[q]) * d.H + h + r] = y;
      }
    }
  }
}

// ---------------------------------------------------------------- packed (cpu_vnni2_n32) weights
// One 32-row panel of packed fp8 codes is [K/2][32][2] bytes: K-pair q of rows 0..31 is the 64-byte
// line q. Per line: two 32-byte halves (rows 0-15, 16-31) sign-extended to words and turned into
// bf16 bits (code value x 2^-120, as dot_rows_fp8_dp), then one vdpbf16ps per half and token with
// the token's activation pair (bf16 x 2^119) broadcast: the 16 lanes are 16 output rows, so no
// horizontal sums, and each panel is read as one sequential stream (row_major weights are read as
// R interleaved rows, which streamed worse on this machine: E95, E94).
// out[p][t][j] = (panel p row j) . (token t) for P panels (P <= 2), NT tokens (2 P NT <= 16 zmm).
template <int P, int NT>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void panel_dots_fp8(
    const uint8_t* const* panel, const uint16_t* const* xb, int64_t K, float (*out)[kTok][kVnniPanelN]) {
  __m512 acc[P][NT][2];
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < NT; ++t) acc[p][t][0] = acc[p][t][1] = _mm512_setzero_ps();
  }
  const __m512i keep = _mm512_set1_epi16(int16_t(0x87F0));
  for (int64_t q = 0; q < K / 2; ++q) {
    __m512i xpair[NT];
    for (int t = 0; t < NT; ++t) {
      uint32_t v;
      std::memcpy(&v, xb[t] + 2 * q, 4);
      xpair[t] = _mm512_set1_epi32(int32_t(v));
    }
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) {
      const uint8_t* line = panel[p] + q * 64;
      _mm_prefetch(reinterpret_cast<const char*>(line) + kPrefetch, _MM_HINT_T1);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i c =
            _mm512_maskz_cvtepi8_epi16(0xFFFFFFFFu, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32 * h)));
        const __m512i b = _mm512_and_si512(_mm512_maskz_slli_epi16(0xFFFFFFFFu, c, 4), keep);
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) acc[p][t][h] = _mm512_dpbf16_ps(acc[p][t][h], (__m512bh)b, (__m512bh)xpair[t]);
      }
    }
  }
  const __m512 two = _mm512_set1_ps(2.0f);  // undoes 2^119 x 2^-120
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < NT; ++t) {
      _mm512_storeu_ps(out[p][t], _mm512_mul_ps(acc[p][t][0], two));
      _mm512_storeu_ps(out[p][t] + 16, _mm512_mul_ps(acc[p][t][1], two));
    }
  }
}

// Stage 1, packed: a[slot, n] for the 32 intermediate columns of gate panel cb (g1u1: with up
// panel I/32 + cb), NT entries from ent.
template <int NT>
void gate_up_packed(const FusedMoeParams& p, const MoeDims& d, const Scratch& s, int32_t e, const int32_t* ent,
                    int64_t cb) {
  const auto* w1 = p.w1.ptr<const uint8_t>() + int64_t(e) * d.N1 * d.H;
  const int64_t panel_bytes = kVnniPanelN * d.H;
  const uint8_t* panels[2] = {w1 + cb * panel_bytes, w1 + (d.I / kVnniPanelN + cb) * panel_bytes};
  const uint16_t* xb[kTok];
  for (int q = 0; q < NT; ++q) xb[q] = s.xb + int64_t(ent[q] / d.k) * d.H;
  float dots[2][kTok][kVnniPanelN];
  if (d.g1u1) {
    panel_dots_fp8<2, NT>(panels, xb, d.H, dots);
  } else {
    panel_dots_fp8<1, NT>(panels, xb, d.H, dots);
  }
  const float* tw = p.topk_weights.ptr<const float>();
  for (int q = 0; q < NT; ++q) {
    const int32_t slot = ent[q];
    const float win = ref::moe::slot_weight(p, tw[slot]).in;
    const float sx = s.xs[slot / d.k];
    for (int64_t j = 0; j < kVnniPanelN; ++j) {
      const int64_t n = cb * kVnniPanelN + j;
      float g = dots[0][q][j] * sx * ref::moe::row_scale(p.w1_scale, e, n, d.N1);
      float v = ref::moe::activation(p.activation, g * win);
      if (d.g1u1) v *= dots[1][q][j] * sx * ref::moe::row_scale(p.w1_scale, e, d.I + n, d.N1) * win;
      s.a[int64_t(slot) * d.I + n] = v;
    }
  }
}

// Stage 2, packed: y[slot, h] for the 32 hidden rows of w2 panel cb, NT entries from ent.
template <int NT>
void down_packed(const FusedMoeParams& p, const MoeDims& d, const Scratch& s, int32_t e, const int32_t* ent,
                 int64_t cb) {
  const uint8_t* panels[1] = {p.w2.ptr<const uint8_t>() + int64_t(e) * d.H * d.I + cb * kVnniPanelN * d.I};
  const uint16_t* ab[kTok];
  for (int q = 0; q < NT; ++q) ab[q] = s.ab + int64_t(ent[q]) * d.I;
  float dots[1][kTok][kVnniPanelN];
  panel_dots_fp8<1, NT>(panels, ab, d.I, dots);
  for (int q = 0; q < NT; ++q) {
    const int32_t slot = ent[q];
    for (int64_t j = 0; j < kVnniPanelN; ++j) {
      const int64_t h = cb * kVnniPanelN + j;
      s.y[int64_t(slot) * d.H + h] = dots[0][q][j] * s.as[slot] * ref::moe::row_scale(p.w2_scale, e, h, d.H);
    }
  }
}

// Runs fn<NT>(ent) over expert e's entries in chunks of up to kTok.
template <typename F>
void for_entry_chunks(const Scratch& s, int32_t e, F&& fn) {
  const int32_t* ent = s.entry + s.offset[e];
  const int64_t n = s.offset[e + 1] - s.offset[e];
  for (int64_t c = 0; c < n; c += kTok) {
    switch (std::min<int64_t>(kTok, n - c)) {
      case 1: fn(std::integral_constant<int, 1>{}, ent + c); break;
      case 2: fn(std::integral_constant<int, 2>{}, ent + c); break;
      case 3: fn(std::integral_constant<int, 3>{}, ent + c); break;
      default: fn(std::integral_constant<int, 4>{}, ent + c); break;
    }
  }
}

template <class W>
Status run(const FusedMoeParams& p, const RunContext& ctx) {
  const MoeDims d = moe_dims(p);
  if (d.T == 0) return Status::Ok();
  Scratch s = carve(p, ctx.workspace);
  s.dp = W::kQuant && cpu_features().avx512bf16;
  moe::group_entries(p, d, &s);  // stage 0a
  // Stage 0b: x in f32; fp8: per-token activation quantization (in place: the amax is read first).
  parallel_for(d.T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* xq = s.xq + t * d.H;
      ref::moe::load_x_row(p.x, t, xq);
      if (!W::kQuant) continue;
      if (p.a1_scale.present()) {
        s.xs[t] = p.a1_scale.ptr<const float>()[0];
        ref::moe::quantize_row_fp8_static(xq, d.H, s.xs[t], xq);
      } else {
        s.xs[t] = ref::moe::quantize_row_fp8(xq, d.H, xq);
      }
      if (s.dp) stage_bf16_codes(xq, d.H, s.xb + t * d.H);
    }
  });
  // Stages 1 and 2: tasks = active experts x (packed fp8: 32-row panels; else blocks of kRowBlock
  // rows). NOTE: supports() let packed weights through only with AVX-512 BF16, so then s.dp.
  const bool packed = W::kQuant && p.w1.layout == Layout::cpu_vnni2_n32;
  if (packed) {
    const int64_t gp = d.I / kVnniPanelN;
    parallel_for(s.n_active * gp, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int32_t ex = s.active[t / gp];
        for_entry_chunks(s, ex, [&](auto nt, const int32_t* ent) {
          gate_up_packed<decltype(nt)::value>(p, d, s, ex, ent, t % gp);
        });
      }
    });
  } else {
    const int64_t nbi = (d.I + kRowBlock - 1) / kRowBlock;
    parallel_for(s.n_active * nbi, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int32_t ex = s.active[t / nbi];
        const int64_t i0 = (t % nbi) * kRowBlock, i1 = std::min(d.I, i0 + kRowBlock);
        for_entry_chunks(
            s, ex, [&](auto nt, const int32_t* ent) { gate_up_rows<W, decltype(nt)::value>(p, d, s, ex, ent, i0, i1); });
      }
    });
  }
  // Stage 1b (fp8): per (token, slot) re-quantization of a.
  if (W::kQuant) {
    parallel_for(d.T * d.k, [&](int64_t b, int64_t e) {
      for (int64_t q = b; q < e; ++q) {
        if (!s.valid[q]) continue;
        s.as[q] = ref::moe::quantize_row_fp8(s.a + q * d.I, d.I, s.a + q * d.I);
        if (s.dp) stage_bf16_codes(s.a + q * d.I, d.I, s.ab + q * d.I);
      }
    });
  }
  if (packed) {
    const int64_t hp = d.H / kVnniPanelN;
    parallel_for(s.n_active * hp, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int32_t ex = s.active[t / hp];
        for_entry_chunks(s, ex, [&](auto nt, const int32_t* ent) {
          down_packed<decltype(nt)::value>(p, d, s, ex, ent, t % hp);
        });
      }
    });
  } else {
    const int64_t nbh = (d.H + kRowBlock - 1) / kRowBlock;
    parallel_for(s.n_active * nbh, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int32_t ex = s.active[t / nbh];
        const int64_t h0 = (t % nbh) * kRowBlock, h1 = std::min(d.H, h0 + kRowBlock);
        for_entry_chunks(
            s, ex, [&](auto nt, const int32_t* ent) { down_rows<W, decltype(nt)::value>(p, d, s, ex, ent, h0, h1); });
      }
    });
  }
  moe::combine_slots(p, d, s, s.y);  // stage 3
  return Status::Ok();
}

// The unquantized kernel: the weight dtype picks the widening (supports_fma accepted it).
Status run_fma(const FusedMoeParams& p, const RunContext& ctx) {
  switch (p.w1.dtype) {
    case DType::f16: return run<F16Weights>(p, ctx);
    case DType::bf16: return run<Bf16Weights>(p, ctx);
    default: return run<F32Weights>(p, ctx);
  }
}

}  // namespace

void register_fused_moe_avx512_fp8(Registry& r) {
  r.add({kRow, OpKind::fused_moe, MoeVariant::fp8_row, Backend::cpu,
         "w fp8_e4m3fn row_major decoded on the fly, per-row/per-tensor scales, dynamic fp8 activations, "
         "vdpbf16ps on the codes (f32 FMA without AVX-512 BF16); H, I % 16 == 0",
         50, erase_supports<FusedMoeParams, supports_row>, erase_workspace<FusedMoeParams, workspace_bytes>,
         erase_run<FusedMoeParams, run<Fp8Weights>>});
  r.add({"fused_moe_avx512_fp8_row_tkw1", OpKind::fused_moe, MoeVariant::fp8_row_tkw1, Backend::cpu,
         "as fused_moe_avx512_fp8_row, k == 1, router weight on the expert input", 50,
         erase_supports<FusedMoeParams, supports_row>, erase_workspace<FusedMoeParams, workspace_bytes>,
         erase_run<FusedMoeParams, run<Fp8Weights>>});
  // NOTE: priority 40, below fused_moe_avx512_bf16 (50), which keeps the bf16 problems it accepts.
  r.add({kFma, OpKind::fused_moe, MoeVariant::unquantized, Backend::cpu,
         "x/w bf16|f16|f32 row_major, weights widened to f32 in registers (f16: vcvtph2ps), f32 FMA, a optionally "
         "rounded to x dtype; H, I % 16 == 0",
         40, erase_supports<FusedMoeParams, supports_fma>, erase_workspace<FusedMoeParams, workspace_bytes>,
         erase_run<FusedMoeParams, run_fma>});
}

}  // namespace moekit::cpu
