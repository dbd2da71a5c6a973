// shuffle_weight / unshuffle_weight front doors (SPEC 4): validate -> empty early return -> dispatch.
// The contract is in moekit/ops/layout.h. Test: tests/test_shuffle_weight.cpp.
#include <sstream>

#include "core/check.h"
#include "moekit/ops/layout.h"

namespace moekit {

namespace {

std::string dims_of(const TensorView& t) {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < t.ndim && i < kMaxDims; ++i) os << (i ? ", " : "") << t.shape[i];
  os << ']';
  return os.str();
}

std::string shape_key(const ShuffleWeightParams& p) {
  std::ostringstream os;
  os << dims_of(p.in) << ' ' << dtype_name(p.in.dtype);
  return os.str();
}

}  // namespace

Status validate_shuffle_weight(const ShuffleWeightParams& p, bool inverse) {
  MOEKIT_RETURN_IF_ERROR(check::present(p.in, "in"));
  if (p.in.ndim < 2) {
    return InvalidArgument("in: must have 2-4 dims [..., N, K], got ", p.in.ndim, "-D ", dims_of(p.in));
  }
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.in, "in"));
  const int64_t N = p.in.size(-2), K = p.in.size(-1);
  if (N % kShuffleTileN != 0) {
    return InvalidArgument("in: N (dim ", p.in.ndim - 2, ") must be a multiple of 16, got N=", N, " in ",
                           dims_of(p.in));
  }
  if (K % kShuffleTileK != 0) {
    return InvalidArgument("in: K (dim ", p.in.ndim - 1, ") must be a multiple of 32, got K=", K, " in ",
                           dims_of(p.in));
  }
  MOEKIT_RETURN_IF_ERROR(check::present(p.out, "out"));
  if (p.out.dtype != p.in.dtype) {
    return InvalidArgument("out: dtype must equal in's (", dtype_name(p.in.dtype), "), got ",
                           dtype_name(p.out.dtype));
  }
  bool same_shape = p.out.ndim == p.in.ndim;
  for (int i = 0; same_shape && i < p.in.ndim; ++i) same_shape = p.out.shape[i] == p.in.shape[i];
  if (!same_shape) {
    return InvalidArgument("out: shape must equal in's ", dims_of(p.in), ", got ", dims_of(p.out));
  }
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.out, "out"));
  MOEKIT_RETURN_IF_ERROR(check::same_device(p.in, "in", p.out, "out"));
  const Layout plain = Layout::row_major, shuffled = Layout::shuffled_16x16;
  MOEKIT_RETURN_IF_ERROR(check::layout_is(p.in, "in", inverse ? shuffled : plain));
  MOEKIT_RETURN_IF_ERROR(check::layout_is(p.out, "out", inverse ? plain : shuffled));
  if (check::overlaps(p.in, p.out)) {
    return InvalidArgument("out: must not overlap in (the permutation is not in-place), out=", p.out.data,
                           " in=", p.in.data, " (", p.in.nbytes(), " bytes)");
  }
  return Status::Ok();
}

Status shuffle_weight(const ShuffleWeightParams& p, const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(validate_shuffle_weight(p, /*inverse=*/false));
  if (p.in.numel() == 0) return Status::Ok();
  return dispatch(OpKind::shuffle_weight, MoeVariant::none, &p, opts, shape_key(p));
}

Status unshuffle_weight(const ShuffleWeightParams& p, const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(validate_shuffle_weight(p, /*inverse=*/true));
  if (p.in.numel() == 0) return Status::Ok();
  return dispatch(OpKind::unshuffle_weight, MoeVariant::none, &p, opts, shape_key(p));
}

}  // namespace moekit
