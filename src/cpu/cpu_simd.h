// AVX-512 helpers shared by the CPU kernels of the small operators (routing, quantize_fp8):
// dtype-converting row loads, vector exp / sigmoid with a stated error bound, an fp8 encoder
// bit-identical to dtype.h's, and a top-k selector whose order and tie rule are those of the
// reference (ref/ref_topk.h: value descending, ties to the lower id).
//
// Everything here is compiled through target attributes (MOEKIT_CPU_AVX512), like the fused_moe
// kernels, so no translation unit needs -mavx512 flags; callers must carry the same attribute so
// the helpers inline. The backend probe (src/cpu/cpu_backend.cpp) keeps these kernels off CPUs
// without AVX-512. Users: src/ops/{topk_softmax,grouped_topk,sigmoid_topk,quantize_fp8}/*_avx512.cpp;
// tests: tests/test_{topk_softmax,grouped_topk,sigmoid_topk,quantize_fp8}.cpp (Cpu* cases).
#pragma once

// NOTE: GCC 12's AVX-512 intrinsics start many results from _mm512_undefined_*(), which trips a false
// -Wmaybe-uninitialized (or -Wuninitialized) inside the header once inlined; the warnings are
// silenced for the header's own lines only (this must be the translation unit's first include of it).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "moekit/core/dtype.h"
#include "moekit/core/status.h"
#include "moekit/core/tensor_view.h"

#define MOEKIT_CPU_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

namespace moekit::cpu {

// supports() of a CPU kernel: unsupported, naming the kernel and the first present tensor that is
// not in host memory.
inline Status require_host_tensors(const char* kernel,
                                   std::initializer_list<std::pair<const char*, const TensorView*>> tensors) {
  for (const auto& [name, t] : tensors) {
    if (t->present() && t->device != Device::cpu) {
      return Unsupported(kernel, ": needs host tensors; ", name, " is on ", device_name(t->device));
    }
  }
  return Status::Ok();
}

namespace simd {

// Lanes [0, n) set, n clamped to [0, 16].
MOEKIT_CPU_AVX512 inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n > 0 ? n : 0)) - 1u);
}

// Elements [i, i + 16) of a f32 / bf16 / f16 buffer as f32, lanes outside `m` zero. Exact (every
// bf16 / f16 value is a float; NaN stays NaN, inf stays inf).
MOEKIT_CPU_AVX512 inline __m512 load_f32(const void* p, DType d, int64_t i, __mmask16 m) {
  if (d == DType::f32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
  if (d == DType::f16) return _mm512_maskz_cvtph_ps(m, h);
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(m, _mm512_maskz_cvtepu16_epi32(m, h), 16));  // bf16
}

// Sum of the 16 lanes in a fixed order (deterministic; not the reference's element order).
MOEKIT_CPU_AVX512 inline float reduce_add(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0.0f;
  for (float x : t) s += x;
  return s;
}

// Largest lane (exact, so the order does not matter).
MOEKIT_CPU_AVX512 inline float reduce_max(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float m = t[0];
  for (int i = 1; i < 16; ++i) m = t[i] > m ? t[i] : m;
  return m;
}

// NaN lanes replaced by -inf (the routing ops' rule: a NaN logit counts as -inf).
MOEKIT_CPU_AVX512 inline __m512 nan_to_neg_inf(__m512 v) {
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(-__builtin_inff()));
}

// out[e] = element e of the row (NaN -> -inf) for e in [0, n); returns the row maximum (-inf when
// every element is NaN / -inf). The maximum is exact, so its order of evaluation does not matter.
MOEKIT_CPU_AVX512 inline float load_clean_row(const void* p, DType d, int64_t row, int64_t n, float* out) {
  __m512 mx = _mm512_set1_ps(-__builtin_inff());
  for (int64_t e = 0; e < n; e += 16) {
    const __mmask16 m = tail_mask(n - e);
    const __m512 v = nan_to_neg_inf(load_f32(p, d, row + e, m));
    _mm512_mask_storeu_ps(out + e, m, v);
    mx = _mm512_mask_max_ps(mx, m, mx, v);
  }
  return reduce_max(mx);
}

// exp(x) per lane, within about 1 ulp of the exact value (not bit-identical to libm: callers use it
// where a tolerance applies, or only with an error bound, see kExpRelErr). x <= -87.5 (and -inf)
// gives 0, x >= 88.5 gives 2^127.5-ish large finite values (callers pass x <= 0); NaN stays NaN.
// exp(x) = 2^n * e^r with n = round(x / ln2), r = x - n*ln2 in [-ln2/2, ln2/2] (two-part ln2, so r
// is accurate), e^r by its degree-7 Taylor polynomial (truncation < 1e-8 relative).
// The bound the routing kernels' certification assumes (tests/test_{topk_softmax,grouped_topk}.cpp
// check it), well above the error measured against float64 (docs/experiments.md E102).
constexpr float kExpRelErr = 1e-6f;
MOEKIT_CPU_AVX512 inline __m512 exp_approx(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.5f), _CMP_LE_OQ);
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.5f)), _mm512_set1_ps(88.5f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), xc);  // ln2 high part (exact n*hi)
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-6f), r);     // ln2 low part
  __m512 y = _mm512_set1_ps(1.0f / 5040.0f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 720.0f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 120.0f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 24.0f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 6.0f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0.5f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
  const __m512 e = _mm512_scalef_ps(y, n);
  return _mm512_mask_mov_ps(_mm512_mask_mov_ps(e, underflow, _mm512_setzero_ps()),
                            _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// sigmoid(x) per lane within kExpRelErr (relative) of the exact value; -inf -> 0, +inf -> 1, and
// NaN -> 0 like ref::sigmoid_f32. Only exp of -|x| is taken (no overflow): 1 / (1 + e) for x >= 0,
// e / (1 + e) below.
MOEKIT_CPU_AVX512 inline __m512 sigmoid_approx(__m512 x) {
  const __m512 neg_abs = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
  const __m512 e = exp_approx(neg_abs);
  const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), e);
  const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
  const __m512 s = _mm512_div_ps(_mm512_mask_mov_ps(e, pos, _mm512_set1_ps(1.0f)), d);
  return _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_setzero_ps());
}

// Encodes 16 floats as fp8 codes (one per 32-bit lane), bit-identical to f32_to_e4m3fn_bits /
// f32_to_e4m3fnuz_bits of moekit/core/dtype.h: round to nearest even, saturate to +-max (inf too),
// NaN -> the format's NaN, and no negative zero in e4m3fnuz.
MOEKIT_CPU_AVX512 inline __m512i encode_e4m3(__m512 v, bool fnuz) {
  const int bias = fnuz ? 8 : 7;
  const __m512i u = _mm512_castps_si512(v);
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
  const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512 amag = _mm512_castsi512_ps(mag);
  // Normal targets: keep 3 mantissa bits, RNE on the 20 dropped ones (the carry may bump the
  // exponent, which is the right result), then rebias from 127 to `bias`.
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(mag, 20), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(mag, _mm512_set1_epi32(0x7FFFF)), lsb), 20);
  __m512i code = _mm512_sub_epi32(rounded, _mm512_set1_epi32((127 - bias) << 3));
  // Subnormal targets (|v| < 2^(1 - bias)): units of 2^(-2 - bias); |v| * 2^(2 + bias) is exact and
  // the conversion rounds to nearest even (the MXCSR default).
  const float min_normal = fnuz ? 0.0078125f : 0.015625f;  // 2^-7, 2^-6
  const float sub_scale = fnuz ? 1024.0f : 512.0f;         // 2^10, 2^9
  const __mmask16 sub = _mm512_cmp_ps_mask(amag, _mm512_set1_ps(min_normal), _CMP_LT_OQ);
  code = _mm512_mask_mov_epi32(
      code, sub, _mm512_cvt_roundps_epi32(_mm512_mul_ps(amag, _mm512_set1_ps(sub_scale)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const int max_code = fnuz ? 0x7F : 0x7E;
  const float max_val = fnuz ? kFp8E4m3fnuzMax : kFp8E4m3fnMax;
  code = _mm512_min_epi32(code, _mm512_set1_epi32(max_code));
  const __mmask16 sat = _mm512_cmp_ps_mask(amag, _mm512_set1_ps(max_val), _CMP_GE_OQ);
  code = _mm512_mask_mov_epi32(code, sat, _mm512_set1_epi32(max_code));
  __m512i out = _mm512_or_si512(sign, code);
  if (fnuz) out = _mm512_mask_mov_epi32(out, _mm512_cmpeq_epi32_mask(code, _mm512_setzero_si512()), _mm512_setzero_si512());
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  const __m512i nan_code = fnuz ? _mm512_set1_epi32(0x80) : _mm512_or_si512(sign, _mm512_set1_epi32(0x7F));
  return _mm512_mask_mov_epi32(out, nan, nan_code);
}

// The k best of the (value, id) pairs offered, best first: larger value first, equal values in
// ascending id. Values must not be NaN (callers map NaN to -inf first) and must be offered in
// ascending id order, so an equal value never displaces an earlier pick. Storage is the caller's
// (k entries each).
struct TopK {
  int k = 0;
  int n = 0;          // picks held so far (<= k)
  float* val = nullptr;
  int* id = nullptr;

  TopK(int k_, float* val_, int* id_) : k(k_), val(val_), id(id_) {}
  bool full() const { return n == k; }
  // Value an offer must beat once full.
  float threshold() const { return val[k - 1]; }
  void offer(float v, int i) {
    int j;
    if (n < k) {
      j = n++;
    } else {
      if (!(v > val[k - 1])) return;
      j = k - 1;
    }
    while (j > 0 && val[j - 1] < v) {
      val[j] = val[j - 1];
      id[j] = id[j - 1];
      --j;
    }
    val[j] = v;
    id[j] = i;
  }
};

// Offers the lanes of x (elements id0 + i .. of `v`, lanes `m`) that can still enter `t`: at least
// `floor` while t is not full, above its threshold once it is.
MOEKIT_CPU_AVX512 inline void offer_lanes(const float* v, int64_t i, int id0, __m512 x, __mmask16 m, float floor,
                                          TopK& t) {
  uint32_t c = t.full() ? _mm512_mask_cmp_ps_mask(m, x, _mm512_set1_ps(t.threshold()), _CMP_GT_OQ)
                        : _mm512_mask_cmp_ps_mask(m, x, _mm512_set1_ps(floor), _CMP_GE_OQ);
  while (c != 0) {
    const int j = __builtin_ctz(c);
    t.offer(v[i + j], id0 + int(i) + j);
    c &= c - 1;
    if (t.full()) c &= _mm512_cmp_ps_mask(x, _mm512_set1_ps(t.threshold()), _CMP_GT_OQ);
  }
}

// Lane-wise maximum of v[0..n) folded into lm (lanes past n untouched).
MOEKIT_CPU_AVX512 inline void fold_lane_max(const float* v, int64_t n, __m512& lm) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    lm = _mm512_mask_max_ps(lm, m, lm, _mm512_maskz_loadu_ps(m, v + i));
  }
}

// The k-th largest (k <= 16) of the 16 lane maxima of a set of values: a lower bound of the set's
// own k-th largest value (those lanes hold k distinct elements), so only elements at or above it
// can be among the set's top k. The lane with fewer than k lanes above it and at least k at or
// above it.
MOEKIT_CPU_AVX512 inline float kth_lane(__m512 lm, int k) {
  alignas(64) float v[16];
  _mm512_store_ps(v, lm);
  for (int l = 0; l < 16; ++l) {
    const __m512 b = _mm512_set1_ps(v[l]);
    const int above = __builtin_popcount(_mm512_cmp_ps_mask(lm, b, _CMP_GT_OQ));
    const int at_or_above = __builtin_popcount(_mm512_cmp_ps_mask(lm, b, _CMP_GE_OQ));
    if (above < k && at_or_above >= k) return v[l];
  }
  return -__builtin_inff();
}

// Offers v[0..n) with ids id0.. to `t` (ascending ids): the elements at or above `floor` while t
// is not full, above its threshold once it is; only those lanes are looked at one by one.
MOEKIT_CPU_AVX512 inline void scan_from(const float* v, int64_t n, int id0, float floor, TopK& t) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    offer_lanes(v, i, id0, _mm512_maskz_loadu_ps(m, v + i), m, floor, t);
  }
}

// Offers v[0..n) with ids id0.. to `t`, in ascending id order. When t starts empty (k <= 16,
// n >= 32) a first pass finds the kth_lane() floor, so the second pass offers about k to 2k
// elements instead of every running improvement.
MOEKIT_CPU_AVX512 inline void topk_scan(const float* v, int64_t n, int id0, TopK& t) {
  float floor = -__builtin_inff();
  if (t.n == 0 && t.k <= 16 && n >= 32) {
    __m512 lm = _mm512_set1_ps(-__builtin_inff());
    fold_lane_max(v, n, lm);
    floor = kth_lane(lm, t.k);
  }
  scan_from(v, n, id0, floor, t);
}

}  // namespace simd
}  // namespace moekit::cpu
