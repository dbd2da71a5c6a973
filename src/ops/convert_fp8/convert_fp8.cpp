// convert_fp8 front door (SPEC 5, e4m3fn <-> e4m3fnuz checkpoints): validate -> empty early
// return -> dispatch. The contract is in moekit/ops/quant.h. Test: tests/test_convert_fp8.cpp.
#include <sstream>
#include <vector>

#include "core/check.h"
#include "moekit/ops/quant.h"

namespace moekit {

namespace {

using check::Dims;
using check::dims_of;

// Exact aliasing (same start, same size) is allowed for elementwise ops; partial overlap is not.
Status no_partial_overlap(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name) {
  if (check::overlaps(a, b) && !(a.data == b.data && a.nbytes() == b.nbytes())) {
    return InvalidArgument(a_name, ": must be the same buffer as ", b_name, " or not overlap it");
  }
  return Status::Ok();
}

}  // namespace

Status validate_convert_fp8(const ConvertFp8Params& p) {
  MOEKIT_RETURN_IF_ERROR(check::present(p.in, "in"));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.in, "in", {DType::fp8_e4m3fn, DType::fp8_e4m3fnuz}));
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.in, "in"));
  MOEKIT_RETURN_IF_ERROR(check::present(p.out, "out"));
  const DType want = p.in.dtype == DType::fp8_e4m3fn ? DType::fp8_e4m3fnuz : DType::fp8_e4m3fn;
  if (p.out.dtype != want) {
    return InvalidArgument("out: dtype must be ", dtype_name(want), " (the other format of in's ",
                           dtype_name(p.in.dtype), "), got ", dtype_name(p.out.dtype));
  }
  if (dims_of(p.out) != dims_of(p.in)) {
    return InvalidArgument("out: shape must equal in's ", check::dims_str(dims_of(p.in)), ", got ", check::dims_str(dims_of(p.out)));
  }
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.out, "out"));
  MOEKIT_RETURN_IF_ERROR(check::same_device(p.in, "in", p.out, "out"));
  MOEKIT_RETURN_IF_ERROR(no_partial_overlap(p.out, "out", p.in, "in"));
  if (p.scale_in.present() != p.scale_out.present()) {
    return p.scale_in.present() ? InvalidArgument("scale_out: required when scale_in is given")
                                : InvalidArgument("scale_in: required when scale_out is given");
  }
  if (p.scale_in.present()) {
    MOEKIT_RETURN_IF_ERROR(check::well_formed(p.scale_in, "scale_in"));
    MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.scale_in, "scale_in", {DType::f32}));
    MOEKIT_RETURN_IF_ERROR(check::contiguous(p.scale_in, "scale_in"));
    MOEKIT_RETURN_IF_ERROR(check::well_formed(p.scale_out, "scale_out"));
    MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.scale_out, "scale_out", {DType::f32}));
    if (dims_of(p.scale_out) != dims_of(p.scale_in)) {
      return InvalidArgument("scale_out: shape must equal scale_in's ", check::dims_str(dims_of(p.scale_in)), ", got ",
                             check::dims_str(dims_of(p.scale_out)));
    }
    MOEKIT_RETURN_IF_ERROR(check::contiguous(p.scale_out, "scale_out"));
    MOEKIT_RETURN_IF_ERROR(check::same_device(p.in, "in", p.scale_in, "scale_in"));
    MOEKIT_RETURN_IF_ERROR(check::same_device(p.in, "in", p.scale_out, "scale_out"));
    MOEKIT_RETURN_IF_ERROR(no_partial_overlap(p.scale_out, "scale_out", p.scale_in, "scale_in"));
    for (const TensorView* s : {&p.scale_in, &p.scale_out}) {
      if (check::overlaps(*s, p.in) || check::overlaps(*s, p.out)) {
        return InvalidArgument(s == &p.scale_in ? "scale_in" : "scale_out", ": must not overlap in or out");
      }
    }
  }
  return Status::Ok();
}

Status convert_fp8(const ConvertFp8Params& p, const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(validate_convert_fp8(p));
  if (p.in.numel() == 0 && p.scale_in.numel() == 0) {  // nothing to convert
    if (p.num_saturated != nullptr) *p.num_saturated = 0;
    return Status::Ok();
  }
  std::ostringstream key;
  key << check::dims_str(dims_of(p.in)) << ' ' << dtype_name(p.in.dtype) << "->" << dtype_name(p.out.dtype)
      << " scales " << p.scale_in.numel();
  return dispatch(OpKind::convert_fp8, MoeVariant::none, &p, opts, key.str());
}

}  // namespace moekit
