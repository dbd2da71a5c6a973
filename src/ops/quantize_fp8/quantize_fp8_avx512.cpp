// quantize_fp8_avx512: the CPU backend's quantize_fp8 (SPEC 5, contract moekit/ops/quant.h): every
// granularity (per_tensor, static per_tensor, per_row, per_token_group, block), f32 / bf16 / f16 in,
// e4m3fn or e4m3fnuz out.
//
// Same block tiling as quantize_fp8_ref ([B, R, C] in blocks of bn x bk, scale index
// (b * ceil(R/bn) + rb) * ceil(C/bk) + cb). Per block, 16 lanes at a time: amax over the finite
// elements (max is exact, so the lane order does not matter), scale = max(amax, floor) / fp8_max
// (the same scalar f32 division), then q = fp8(x / scale) with a vector IEEE division and the
// vector encoder of cpu/cpu_simd.h, which is bit-identical to dtype.h's RNE / saturating encoder:
// codes and scales equal the reference's exactly. Threads take whole row blocks (b, rb) in fixed
// contiguous ranges; per_tensor splits the elements instead (a partial amax per range, combined by
// max, then the quantization). Deterministic.
// Test: tests/test_quantize_fp8.cpp (Cpu* cases) and every case of src/testing/check_layout_quant.cpp
// (this kernel against quantize_fp8_ref).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_simd.h"
#include "cpu/thread_pool.h"
#include "moekit/ops/quant.h"

namespace moekit::cpu {

void register_quantize_fp8_avx512(Registry& r);

namespace {

// Elements below which the call stays on the calling thread (waking the pool costs more).
constexpr int64_t kSerialElems = int64_t(1) << 15;

Status supports(const QuantizeFp8Params& p) {
  return require_host_tensors("quantize_fp8_avx512", {{"in", &p.in}, {"out", &p.out}, {"scale", &p.scale}});
}

struct Tiling {
  int64_t B, R, C, bn, bk;
};

Tiling tiling_of(const QuantizeFp8Params& p) {
  const int64_t numel = p.in.numel(), K = p.in.size(-1);
  switch (p.granularity) {
    case QuantGranularity::per_tensor: return {1, 1, numel, 1, numel};
    case QuantGranularity::per_row: return {1, numel / K, K, 1, K};
    case QuantGranularity::per_token_group: return {1, numel / K, K, 1, p.group_k};
    case QuantGranularity::block: {
      const int64_t N = p.in.size(-2);
      return {numel / (N * K), N, K, p.block_n, p.group_k};
    }
  }
  return {0, 0, 0, 1, 1};
}

// max |x| over the finite elements [i, i + n) of a D buffer (0 when there are none).
template <DType D>
MOEKIT_CPU_AVX512 float amax_span(const void* in, int64_t i, int64_t n) {
  const __m512 inf = _mm512_set1_ps(__builtin_inff());
  __m512 mx = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = simd::tail_mask(n - c);
    const __m512 a = _mm512_abs_ps(simd::load_f32(in, D, i + c, m));
    mx = _mm512_mask_max_ps(mx, _mm512_mask_cmp_ps_mask(m, a, inf, _CMP_LT_OQ), mx, a);  // NaN / inf fail
  }
  return simd::reduce_max(mx);
}

// out[i, i + n) = fp8(in / s), in of dtype D, out e4m3fnuz when kFnuz else e4m3fn.
// NOTE: 64 elements per step go out as ONE 64-byte store: the four 16-lane code vectors are packed
// to bytes (packus 32 -> 16 -> 8 bits, exact for codes 0..255) and a dword permutation undoes the
// packs' per-128-bit-lane interleave. A masked vpmovdb store per 16 lanes was the loop's bottleneck
// (docs/experiments.md E100).
template <DType D, bool kFnuz>
MOEKIT_CPU_AVX512 void quantize_span(const void* in, uint8_t* out, int64_t i, int64_t n, float s) {
  const __m512 vs = _mm512_set1_ps(s);
  const __mmask16 all = 0xFFFF;
  // After the packs, dword 4 * lane + q holds elements 4 * lane .. + 3 of vector q; put it at 4 * q + lane.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  int64_t c = 0;
  for (; c + 64 <= n; c += 64) {
    __m512i q[4];
    for (int v = 0; v < 4; ++v) {
      q[v] = simd::encode_e4m3(_mm512_div_ps(simd::load_f32(in, D, i + c + 16 * v, all), vs), kFnuz);
    }
    const __m512i bytes = _mm512_packus_epi16(_mm512_packus_epi32(q[0], q[1]), _mm512_packus_epi32(q[2], q[3]));
    _mm512_storeu_si512(out + i + c, _mm512_permutexvar_epi32(order, bytes));
  }
  for (; c < n; c += 16) {
    const __mmask16 m = simd::tail_mask(n - c);
    const __m512 q = _mm512_div_ps(simd::load_f32(in, D, i + c, m), vs);
    _mm512_mask_cvtepi32_storeu_epi8(out + i + c, m, simd::encode_e4m3(q, kFnuz));
  }
}

// The two span functions of one (input dtype, output format), chosen once per call so the inner
// loops carry no dtype branches.
struct Spans {
  float (*amax)(const void* in, int64_t i, int64_t n);
  void (*quantize)(const void* in, uint8_t* out, int64_t i, int64_t n, float s);
};

template <DType D>
Spans spans_for(bool fnuz) {
  return {amax_span<D>, fnuz ? quantize_span<D, true> : quantize_span<D, false>};
}

Spans spans_of(const QuantizeFp8Params& p) {
  const bool fnuz = p.out.dtype == DType::fp8_e4m3fnuz;
  switch (p.in.dtype) {
    case DType::bf16: return spans_for<DType::bf16>(fnuz);
    case DType::f16: return spans_for<DType::f16>(fnuz);
    default: return spans_for<DType::f32>(fnuz);
  }
}

// Row blocks [w0, w1) of the tiling (w = b * RB + rb): every column block of each.
void row_blocks(const QuantizeFp8Params& p, const Spans& f, const Tiling& t, int64_t w0, int64_t w1) {
  const float qmax = fp8_max(p.out.dtype);
  uint8_t* out = p.out.ptr<uint8_t>();
  const int64_t RB = (t.R + t.bn - 1) / t.bn, CB = (t.C + t.bk - 1) / t.bk;
  float* scale = p.scale.ptr<float>();
  for (int64_t w = w0; w < w1; ++w) {
    const int64_t b = w / RB, rb = w % RB;
    const int64_t r0 = rb * t.bn, r1 = std::min(t.R, r0 + t.bn);
    for (int64_t cb = 0; cb < CB; ++cb) {
      const int64_t c0 = cb * t.bk, n = std::min(t.C, c0 + t.bk) - c0;
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) amax = std::max(amax, f.amax(p.in.data, (b * t.R + r) * t.C + c0, n));
      const float s = std::max(amax, kFp8AmaxFloor) / qmax;
      scale[w * CB + cb] = s;
      for (int64_t r = r0; r < r1; ++r) f.quantize(p.in.data, out, (b * t.R + r) * t.C + c0, n, s);
    }
  }
}

// Range c of `parts` equal ranges of [0, n), boundaries on multiples of 64 elements.
void part(int64_t n, int64_t parts, int64_t c, int64_t* b, int64_t* e) {
  const int64_t units = (n + 63) / 64;
  *b = std::min(n, units * c / parts * 64);
  *e = std::min(n, units * (c + 1) / parts * 64);
}

Status per_tensor(const QuantizeFp8Params& p, const Spans& f) {
  const int64_t n = p.in.numel();
  float* scale = p.scale.ptr<float>();
  if (p.static_scale) {  // data-dependent check, before anything is written
    const float s = scale[0];
    if (!(std::isfinite(s) && s > 0.0f)) {
      return InvalidArgument("scale: static per-tensor scale must be finite and > 0, got ", s);
    }
  }
  const int64_t parts = n < kSerialElems ? 1 : num_threads();
  auto each_part = [&](const auto& fn) {
    if (parts == 1) {
      fn(int64_t(0));
      return;
    }
    parallel_for(parts, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) fn(c);
    });
  };
  float s = scale[0];
  if (!p.static_scale) {
    std::vector<float> partial(static_cast<size_t>(parts), 0.0f);
    each_part([&](int64_t c) {
      int64_t b, e;
      part(n, parts, c, &b, &e);
      partial[size_t(c)] = f.amax(p.in.data, b, e - b);
    });
    const float amax = *std::max_element(partial.begin(), partial.end());
    s = std::max(amax, kFp8AmaxFloor) / fp8_max(p.out.dtype);
    scale[0] = s;
  }
  each_part([&](int64_t c) {
    int64_t b, e;
    part(n, parts, c, &b, &e);
    f.quantize(p.in.data, p.out.ptr<uint8_t>(), b, e - b, s);
  });
  return Status::Ok();
}

Status run(const QuantizeFp8Params& p, const RunContext&) {
  const Spans f = spans_of(p);
  if (p.granularity == QuantGranularity::per_tensor) return per_tensor(p, f);
  const Tiling t = tiling_of(p);
  const int64_t blocks = t.B * ((t.R + t.bn - 1) / t.bn);
  parallel_for_if(p.in.numel() >= kSerialElems, blocks, [&](int64_t w0, int64_t w1) { row_blocks(p, f, t, w0, w1); });
  return Status::Ok();
}

}  // namespace

void register_quantize_fp8_avx512(Registry& r) {
  r.add({"quantize_fp8_avx512", OpKind::quantize_fp8, MoeVariant::none, Backend::cpu,
         "in f32|bf16|f16 -> fp8 e4m3fn|e4m3fnuz + f32 scales; codes and scales bit-identical to the ref", 50,
         erase_supports<QuantizeFp8Params, supports>, nullptr, erase_run<QuantizeFp8Params, run>});
}

}  // namespace moekit::cpu
