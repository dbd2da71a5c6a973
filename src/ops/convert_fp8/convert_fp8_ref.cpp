// convert_fp8_ref (SPEC 5): e4m3fn <-> e4m3fnuz checkpoint conversion, scalar, host-only.
//
// Bit-level rules (moekit/ops/quant.h): fn -> fnuz keeps every code except 0x80 (-0 -> 0x00) and
// the NaNs 0x7F/0xFF (-> 0x80), scales x2; fnuz -> fn keeps every code except 0x80 (NaN -> 0x00)
// and +-240 (0x7F/0xFF -> 0x7E/0xFE, counted), scales x0.5. The independent oracle
// (src/testing/oracle_layout_quant.cpp) works on decoded values instead. Test:
// tests/test_convert_fp8.cpp.
#include "moekit/ops/quant.h"
#include "ref/ref_kernels.h"

namespace moekit::ref {

namespace {

Status supports(const ConvertFp8Params& p) {
  return require_host({{"in", &p.in}, {"out", &p.out}, {"scale_in", &p.scale_in}, {"scale_out", &p.scale_out}});
}

Status run(const ConvertFp8Params& p, const RunContext&) {
  const bool to_fnuz = p.in.dtype == DType::fp8_e4m3fn;
  const auto* in = p.in.ptr<const uint8_t>();
  auto* out = p.out.ptr<uint8_t>();
  int64_t saturated = 0;
  for (int64_t i = 0; i < p.in.numel(); ++i) {
    const uint8_t c = in[i];
    uint8_t o = c;
    if (to_fnuz) {
      if (c == 0x80u) o = 0x00u;                     // -0: fnuz has no negative zero
      else if ((c & 0x7Fu) == 0x7Fu) o = 0x80u;      // NaN
    } else {
      if (c == 0x80u) {
        o = 0x00u;                                   // NaN -> 0 (SPEC 5)
      } else if ((c & 0x7Fu) == 0x7Fu) {
        o = uint8_t((c & 0x80u) | 0x7Eu);            // +-240 would read as NaN in fn: clamp
        ++saturated;
      }
    }
    out[i] = o;
  }
  if (p.scale_in.present()) {
    const float factor = to_fnuz ? 2.0f : 0.5f;
    const float* si = p.scale_in.ptr<const float>();
    float* so = p.scale_out.ptr<float>();
    for (int64_t i = 0; i < p.scale_in.numel(); ++i) so[i] = si[i] * factor;
  }
  if (p.num_saturated != nullptr) *p.num_saturated = saturated;
  return Status::Ok();
}

}  // namespace

void register_convert_fp8(Registry& r) {
  r.add({"convert_fp8_ref", OpKind::convert_fp8, MoeVariant::none, Backend::ref,
         "fp8 e4m3fn <-> e4m3fnuz bits + f32 scales x2 / x0.5", 0,
         erase_supports<ConvertFp8Params, supports>, nullptr, erase_run<ConvertFp8Params, run>});
}

}  // namespace moekit::ref
