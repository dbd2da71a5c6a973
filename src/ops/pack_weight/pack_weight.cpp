// pack_weight / unpack_weight front doors (moekit/ops/layout.h): validate -> empty early return ->
// dispatch. Packed layouts: cpu_vnni2_n32 (the AVX-512 BF16 fused_moe kernel's VNNI-2 panels).
// Test: tests/test_pack_weight.cpp.
#include <sstream>

#include "core/check.h"
#include "moekit/ops/layout.h"

namespace moekit {

namespace {

std::string shape_key(const PackWeightParams& p, bool inverse) {
  std::ostringstream os;
  os << check::dims_str(check::dims_of(p.in)) << ' ' << dtype_name(p.in.dtype) << ' '
     << layout_name(inverse ? p.in.layout : p.out.layout);
  return os.str();
}

}  // namespace

Status validate_pack_weight(const PackWeightParams& p, bool inverse) {
  MOEKIT_RETURN_IF_ERROR(check::present(p.in, "in"));
  const std::string in_dims = check::dims_str(check::dims_of(p.in));
  if (p.in.ndim < 2) return InvalidArgument("in: must have 2-4 dims [..., N, K], got ", p.in.ndim, "-D ", in_dims);
  MOEKIT_RETURN_IF_ERROR(
      check::dtype_in(p.in, "in", {DType::bf16, DType::f16, DType::fp8_e4m3fn, DType::fp8_e4m3fnuz}));
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.in, "in"));
  MOEKIT_RETURN_IF_ERROR(check::present(p.out, "out"));
  if (p.out.dtype != p.in.dtype) {
    return InvalidArgument("out: dtype must equal in's (", dtype_name(p.in.dtype), "), got ", dtype_name(p.out.dtype));
  }
  if (check::dims_of(p.out) != check::dims_of(p.in)) {
    return InvalidArgument("out: shape must equal in's ", in_dims, ", got ", check::dims_str(check::dims_of(p.out)));
  }
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.out, "out"));
  MOEKIT_RETURN_IF_ERROR(check::same_device(p.in, "in", p.out, "out"));
  // The plain side must be row_major; the packed side names the target.
  const TensorView& plain = inverse ? p.out : p.in;
  const TensorView& packed = inverse ? p.in : p.out;
  const char* plain_name = inverse ? "out" : "in";
  const char* packed_name = inverse ? "in" : "out";
  MOEKIT_RETURN_IF_ERROR(check::layout_is(plain, plain_name, Layout::row_major));
  if (packed.layout != Layout::cpu_vnni2_n32) {
    return InvalidArgument(packed_name, ": layout must be a packed layout (cpu_vnni2_n32), got ",
                           layout_name(packed.layout));
  }
  const int64_t N = p.in.size(-2), K = p.in.size(-1);
  if (N % kVnniPanelN != 0 || K % kVnniPairK != 0) {
    return InvalidArgument(packed_name, ": layout cpu_vnni2_n32 needs N % 32 == 0 and K % 2 == 0, got [N, K] = [", N,
                           ", ", K, "] in ", in_dims);
  }
  if (check::overlaps(p.in, p.out)) {
    return InvalidArgument("out: must not overlap in (the permutation is not in-place), out=", p.out.data,
                           " in=", p.in.data, " (", p.in.nbytes(), " bytes)");
  }
  return Status::Ok();
}

Status pack_weight(const PackWeightParams& p, const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(validate_pack_weight(p, /*inverse=*/false));
  if (p.in.numel() == 0) return Status::Ok();
  return dispatch(OpKind::pack_weight, MoeVariant::none, &p, opts, shape_key(p, false));
}

Status unpack_weight(const PackWeightParams& p, const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(validate_pack_weight(p, /*inverse=*/true));
  if (p.in.numel() == 0) return Status::Ok();
  return dispatch(OpKind::unpack_weight, MoeVariant::none, &p, opts, shape_key(p, true));
}

}  // namespace moekit
