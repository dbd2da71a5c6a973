// convert_fp8_avx512: the CPU backend's e4m3fn <-> e4m3fnuz checkpoint conversion (SPEC 5, contract
// moekit/ops/quant.h), 64 codes per AVX-512 BW instruction.
//
// Bit rules (the reference's, convert_fp8_ref.cpp): fn -> fnuz keeps every code except 0x80
// (-0 -> 0x00) and the NaNs 0x7F / 0xFF (-> 0x80); fnuz -> fn keeps every code except 0x80
// (NaN -> 0x00) and +-240 (0x7F / 0xFF -> 0x7E / 0xFE, counted in num_saturated). Scales x2 / x0.5
// (exact vector multiplies). Elementwise, so in == out (in place) is fine. Threads take fixed
// contiguous byte ranges; the saturation count is the sum of per-range counts (integers):
// deterministic. Test: tests/test_convert_fp8.cpp (Cpu* cases) and every case of
// src/testing/check_layout_quant.cpp (this kernel against convert_fp8_ref).
#include <algorithm>
#include <vector>

#include "cpu/cpu_simd.h"
#include "cpu/thread_pool.h"
#include "moekit/ops/quant.h"

namespace moekit::cpu {

void register_convert_fp8_avx512(Registry& r);

namespace {

// Codes below which the call stays on the calling thread (waking the pool costs more).
constexpr int64_t kSerialBytes = int64_t(1) << 18;

Status supports(const ConvertFp8Params& p) {
  return require_host_tensors("convert_fp8_avx512",
                              {{"in", &p.in}, {"out", &p.out}, {"scale_in", &p.scale_in}, {"scale_out", &p.scale_out}});
}

// Converts codes [b, e); returns how many were clamped (fnuz -> fn +-240).
MOEKIT_CPU_AVX512 int64_t convert_range(const uint8_t* in, uint8_t* out, int64_t b, int64_t e, bool to_fnuz) {
  const __m512i x80 = _mm512_set1_epi8(char(0x80)), x7f = _mm512_set1_epi8(0x7F);
  int64_t saturated = 0;
  for (int64_t i = b; i < e; i += 64) {
    const int64_t left = e - i;
    const __mmask64 m = left >= 64 ? ~__mmask64(0) : (__mmask64(1) << left) - 1;
    const __m512i c = _mm512_maskz_loadu_epi8(m, in + i);
    const __mmask64 neg_zero_or_nan = _mm512_cmpeq_epi8_mask(c, x80);              // 0x80
    const __mmask64 all_ones = _mm512_cmpeq_epi8_mask(_mm512_and_si512(c, x7f), x7f);  // S.1111.111
    __m512i o = _mm512_mask_mov_epi8(c, neg_zero_or_nan, _mm512_setzero_si512());
    if (to_fnuz) {
      o = _mm512_mask_mov_epi8(o, all_ones, x80);  // fn NaN -> fnuz NaN
    } else {
      o = _mm512_mask_mov_epi8(o, all_ones, _mm512_xor_si512(c, _mm512_set1_epi8(0x01)));  // 0x7F -> 0x7E
      saturated += __builtin_popcountll(all_ones & m);
    }
    _mm512_mask_storeu_epi8(out + i, m, o);
  }
  return saturated;
}

MOEKIT_CPU_AVX512 void scale_range(const float* in, float* out, int64_t n, float factor) {
  const __m512 f = _mm512_set1_ps(factor);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = simd::tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, in + i), f));
  }
}

Status run(const ConvertFp8Params& p, const RunContext&) {
  const bool to_fnuz = p.in.dtype == DType::fp8_e4m3fn;
  const auto* in = p.in.ptr<const uint8_t>();
  auto* out = p.out.ptr<uint8_t>();
  const int64_t n = p.in.numel();
  int64_t saturated = 0;
  if (n < kSerialBytes) {
    saturated = convert_range(in, out, 0, n, to_fnuz);
  } else {
    const int64_t parts = num_threads(), units = (n + 63) / 64;
    std::vector<int64_t> counts(static_cast<size_t>(parts), 0);
    parallel_for(parts, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t b = std::min(n, units * c / parts * 64), e = std::min(n, units * (c + 1) / parts * 64);
        counts[size_t(c)] = convert_range(in, out, b, e, to_fnuz);
      }
    });
    for (int64_t c : counts) saturated += c;
  }
  if (p.scale_in.present()) {
    scale_range(p.scale_in.ptr<const float>(), p.scale_out.ptr<float>(), p.scale_in.numel(), to_fnuz ? 2.0f : 0.5f);
  }
  if (p.num_saturated != nullptr) *p.num_saturated = saturated;
  return Status::Ok();
}

}  // namespace

void register_convert_fp8_avx512(Registry& r) {
  r.add({"convert_fp8_avx512", OpKind::convert_fp8, MoeVariant::none, Backend::cpu,
         "fp8 e4m3fn <-> e4m3fnuz bits + f32 scales x2 / x0.5; bit-identical to the ref", 50,
         erase_supports<ConvertFp8Params, supports>, nullptr, erase_run<ConvertFp8Params, run>});
}

}  // namespace moekit::cpu
