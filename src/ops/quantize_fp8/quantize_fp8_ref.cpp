// quantize_fp8_ref (SPEC 5): scalar, single-threaded, f32 reference of every granularity.
//
// Every granularity is a block tiling of `in` seen as [B, R, C] with blocks of (bn x bk):
//   per_tensor      B = 1, R = 1,    C = numel, bn = 1,       bk = numel
//   per_row         B = 1, R = rows, C = K,     bn = 1,       bk = K
//   per_token_group B = 1, R = rows, C = K,     bn = 1,       bk = group_k
//   block           B = lead, R = N, C = K,     bn = block_n, bk = group_k
// and the scale of block (b, rb, cb) is scale[(b * ceil(R/bn) + rb) * ceil(C/bk) + cb], which is the
// row-major order of every accepted scale shape (moekit/ops/quant.h). Per block: amax over the
// finite elements, scale = max(amax, floor) / fp8_max, q = fp8(x / scale), all in f32.
// The independent oracle is src/testing/oracle_layout_quant.cpp. Test: tests/test_quantize_fp8.cpp.
#include <algorithm>
#include <cmath>

#include "moekit/ops/quant.h"
#include "ref/ref_kernels.h"

namespace moekit::ref {

namespace {

Status supports(const QuantizeFp8Params& p) {
  return require_host({{"in", &p.in}, {"out", &p.out}, {"scale", &p.scale}});
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

Status run(const QuantizeFp8Params& p, const RunContext&) {
  const DType od = p.out.dtype;
  const float qmax = fp8_max(od);
  float* scale = p.scale.ptr<float>();
  if (p.static_scale) {  // data-dependent check, before anything is written
    const float s = scale[0];
    if (!(std::isfinite(s) && s > 0.0f)) {
      return InvalidArgument("scale: static per-tensor scale must be finite and > 0, got ", s);
    }
  }
  const Tiling t = tiling_of(p);
  const int64_t RB = (t.R + t.bn - 1) / t.bn, CB = (t.C + t.bk - 1) / t.bk;
  for (int64_t b = 0; b < t.B; ++b) {
    for (int64_t rb = 0; rb < RB; ++rb) {
      for (int64_t cb = 0; cb < CB; ++cb) {
        const int64_t r0 = rb * t.bn, r1 = std::min(t.R, r0 + t.bn);
        const int64_t c0 = cb * t.bk, c1 = std::min(t.C, c0 + t.bk);
        const int64_t si = (b * RB + rb) * CB + cb;
        float s;
        if (p.static_scale) {
          s = scale[0];
        } else {
          float amax = 0.0f;
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t c = c0; c < c1; ++c) {
              const float x = load_as_f32(p.in.data, p.in.dtype, (b * t.R + r) * t.C + c);
              if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
            }
          }
          s = std::max(amax, kFp8AmaxFloor) / qmax;
          scale[si] = s;
        }
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t c = c0; c < c1; ++c) {
            const int64_t i = (b * t.R + r) * t.C + c;
            store_from_f32(p.out.data, od, i, load_as_f32(p.in.data, p.in.dtype, i) / s);
          }
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace

void register_quantize_fp8(Registry& r) {
  r.add({"quantize_fp8_ref", OpKind::quantize_fp8, MoeVariant::none, Backend::ref,
         "in f32|bf16|f16 -> fp8 e4m3fn|e4m3fnuz + f32 scales; f32 math", 0,
         erase_supports<QuantizeFp8Params, supports>, nullptr, erase_run<QuantizeFp8Params, run>});
}

}  // namespace moekit::ref
