// quantize_fp8 front door (SPEC 5): validate -> empty early return -> dispatch.
// The contract (granularities, scale shapes, NaN policy) is in moekit/ops/quant.h.
// Test: tests/test_quantize_fp8.cpp.
#include <sstream>
#include <vector>

#include "core/check.h"
#include "moekit/ops/quant.h"

namespace moekit {

const char* granularity_name(QuantGranularity g) {
  switch (g) {
    case QuantGranularity::per_tensor: return "per_tensor";
    case QuantGranularity::per_row: return "per_row";
    case QuantGranularity::per_token_group: return "per_token_group";
    case QuantGranularity::block: return "block";
  }
  return "?";
}

namespace {

using check::Dims;
using check::dims_of;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The scale shapes a granularity accepts for `in` (first = canonical).
std::vector<Dims> accepted_scale_shapes(const QuantizeFp8Params& p) {
  const Dims in = dims_of(p.in);
  const Dims lead(in.begin(), in.end() - 1);
  int64_t rows = 1;
  for (int64_t d : lead) rows *= d;
  const int64_t K = in.back();
  std::vector<Dims> out;
  auto with_lead = [&](int64_t last) {
    Dims d = lead;
    d.push_back(last);
    return d;
  };
  switch (p.granularity) {
    case QuantGranularity::per_tensor: out = {{1}}; break;
    case QuantGranularity::per_row: out = {{rows}, with_lead(1)}; break;
    case QuantGranularity::per_token_group: {
      const int64_t G = ceil_div(K, p.group_k);
      out = {{rows, G}, with_lead(G)};
      break;
    }
    case QuantGranularity::block: {
      Dims d(in.begin(), in.end() - 2);
      d.push_back(ceil_div(in[in.size() - 2], p.block_n));
      d.push_back(ceil_div(K, p.group_k));
      out = {d};
      break;
    }
  }
  if (out.size() == 2 && out[0] == out[1]) out.pop_back();  // the two forms coincide for 2-D in
  return out;
}

}  // namespace

Status validate_quantize_fp8(const QuantizeFp8Params& p) {
  MOEKIT_RETURN_IF_ERROR(check::present(p.in, "in"));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.in, "in", {DType::f32, DType::bf16, DType::f16}));
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.in, "in"));
  MOEKIT_RETURN_IF_ERROR(check::present(p.out, "out"));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.out, "out", {DType::fp8_e4m3fn, DType::fp8_e4m3fnuz}));
  if (dims_of(p.out) != dims_of(p.in)) {
    return InvalidArgument("out: shape must equal in's ", check::dims_str(dims_of(p.in)), ", got ", check::dims_str(dims_of(p.out)));
  }
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.out, "out"));
  MOEKIT_RETURN_IF_ERROR(check::same_device(p.in, "in", p.out, "out"));
  if (check::overlaps(p.in, p.out)) return InvalidArgument("out: must not overlap in");

  const QuantGranularity g = p.granularity;
  if (g != QuantGranularity::per_tensor && g != QuantGranularity::per_row &&
      g != QuantGranularity::per_token_group && g != QuantGranularity::block) {
    return InvalidArgument("granularity: unknown value ", int(g));
  }
  if ((g == QuantGranularity::per_token_group || g == QuantGranularity::block) && p.group_k < 1) {
    return InvalidArgument("group_k: must be >= 1, got ", p.group_k);
  }
  if (g == QuantGranularity::block) {
    if (p.block_n < 1) return InvalidArgument("block_n: must be >= 1, got ", p.block_n);
    if (p.in.ndim < 2) {
      return InvalidArgument("in: block granularity needs [..., N, K] (>= 2 dims), got ", check::dims_str(dims_of(p.in)));
    }
  }
  if (p.static_scale && g != QuantGranularity::per_tensor) {
    return InvalidArgument("static_scale: only supported with per_tensor granularity, got ", granularity_name(g));
  }

  MOEKIT_RETURN_IF_ERROR(check::present(p.scale, "scale"));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.scale, "scale", {DType::f32}));
  const std::vector<Dims> shapes = accepted_scale_shapes(p);
  bool shape_ok = false;
  for (const Dims& d : shapes) shape_ok = shape_ok || d == dims_of(p.scale);
  if (!shape_ok) {
    std::string want;
    for (const Dims& d : shapes) want += (want.empty() ? "" : " or ") + check::dims_str(d);
    return InvalidArgument("scale: shape must be ", want, " for ", granularity_name(g), " of in ",
                           check::dims_str(dims_of(p.in)), ", got ", check::dims_str(dims_of(p.scale)));
  }
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.scale, "scale"));
  MOEKIT_RETURN_IF_ERROR(check::same_device(p.in, "in", p.scale, "scale"));
  if (check::overlaps(p.scale, p.in) || check::overlaps(p.scale, p.out)) {
    return InvalidArgument("scale: must not overlap in or out");
  }
  return Status::Ok();
}

Status quantize_fp8(const QuantizeFp8Params& p, const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(validate_quantize_fp8(p));
  if (p.in.numel() == 0) return Status::Ok();  // nothing to quantize: out and scale untouched
  std::ostringstream key;
  key << check::dims_str(dims_of(p.in)) << ' ' << dtype_name(p.in.dtype) << "->" << dtype_name(p.out.dtype) << ' '
      << granularity_name(p.granularity);
  if (p.granularity == QuantGranularity::per_token_group) key << " 1x" << p.group_k;
  if (p.granularity == QuantGranularity::block) key << ' ' << p.block_n << 'x' << p.group_k;
  if (p.static_scale) key << " static";
  return dispatch(OpKind::quantize_fp8, MoeVariant::none, &p, opts, key.str());
}

}  // namespace moekit
