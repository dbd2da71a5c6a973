// Independent oracles for shuffle_weight, quantize_fp8 and convert_fp8 (see oracle_layout_quant.h
// for how each differs from the reference kernel it judges). Used by src/testing/check_layout_quant.cpp
// and tests/test_{shuffle_weight,quantize_fp8,convert_fp8}.cpp.
#include "testing/oracle_layout_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace moekit::testing {

// ---------------------------------------------------------------- layout
std::vector<unsigned char> oracle_permute(const void* src, int elem_bytes, const std::vector<int64_t>& shape,
                                          const std::vector<int>& perm) {
  const size_t nd = shape.size();
  std::vector<int64_t> in_stride(nd, 1);
  for (size_t i = nd - 1; i > 0; --i) in_stride[i - 1] = in_stride[i] * shape[i];
  std::vector<int64_t> out_shape(nd), step(nd);
  int64_t total = 1;
  for (size_t i = 0; i < nd; ++i) {
    out_shape[i] = shape[size_t(perm[i])];
    step[i] = in_stride[size_t(perm[i])];
    total *= out_shape[i];
  }
  std::vector<unsigned char> out(size_t(total * elem_bytes));
  std::vector<int64_t> idx(nd, 0);  // odometer over the OUTPUT dims, last dim fastest
  const auto* s = static_cast<const unsigned char*>(src);
  for (int64_t o = 0; o < total; ++o) {
    int64_t from = 0;
    for (size_t i = 0; i < nd; ++i) from += idx[i] * step[i];
    std::memcpy(out.data() + o * elem_bytes, s + from * elem_bytes, size_t(elem_bytes));
    for (size_t i = nd; i-- > 0;) {
      if (++idx[i] < out_shape[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

std::vector<unsigned char> oracle_shuffle_weight(const TensorView& in, bool inverse) {
  const int eb = dtype_size(in.dtype);
  const int64_t V = 16 / eb, N = in.size(-2), K = in.size(-1);
  const int64_t M = N * K > 0 ? in.numel() / (N * K) : 0;
  if (!inverse) {
    // plain [M, N/16, 16, K/32, 32/V, V] -> [M, N/16, K/32, 32/V, 16, V]
    return oracle_permute(in.data, eb, {M, N / 16, 16, K / 32, 32 / V, V}, {0, 1, 3, 4, 2, 5});
  }
  // shuffled [M, N/16, K/32, 32/V, 16, V] -> plain [M, N/16, 16, K/32, 32/V, V]
  return oracle_permute(in.data, eb, {M, N / 16, K / 32, 32 / V, 16, V}, {0, 1, 4, 2, 3, 5});
}

// ---------------------------------------------------------------- fp8 by value
namespace {

struct Fp8Format {
  int bias;
  int max_mag_code;  // largest finite magnitude code: 0x7E (fn, 0x7F is NaN) or 0x7F (fnuz)
  bool fnuz;
};

Fp8Format format_of(DType d) { return d == DType::fp8_e4m3fn ? Fp8Format{7, 0x7E, false} : Fp8Format{8, 0x7F, true}; }

// Magnitude of the positive-half code m (0..0x7F) by the format definition.
double magnitude(int m, const Fp8Format& f) {
  const int e = m >> 3, mant = m & 7;
  if (e == 0) return std::ldexp(double(mant) / 8.0, 1 - f.bias);  // subnormal
  return std::ldexp(1.0 + double(mant) / 8.0, e - f.bias);
}

// Table of magnitude(m) for m = 0 .. max_mag_code, in code order (which is ascending value).
const std::vector<double>& magnitudes(const Fp8Format& f) {
  static const auto build = [](const Fp8Format& g) {
    std::vector<double> t(size_t(g.max_mag_code + 1));
    for (int m = 0; m <= g.max_mag_code; ++m) t[size_t(m)] = magnitude(m, g);
    return t;
  };
  static const std::vector<double> fn = build(format_of(DType::fp8_e4m3fn));
  static const std::vector<double> fnuz = build(format_of(DType::fp8_e4m3fnuz));
  return f.fnuz ? fnuz : fn;
}

}  // namespace

double oracle_fp8_value(uint8_t code, DType fp8) {
  const Fp8Format f = format_of(fp8);
  const int m = code & 0x7F;
  const bool neg = (code & 0x80) != 0;
  if (f.fnuz ? code == 0x80 : m == 0x7F) return std::numeric_limits<double>::quiet_NaN();
  const double v = magnitude(m, f);
  return neg ? -v : v;
}

uint8_t oracle_fp8_code(double v, DType fp8) {
  const Fp8Format f = format_of(fp8);
  const bool neg = std::signbit(v);
  if (std::isnan(v)) return f.fnuz ? uint8_t(0x80) : uint8_t(neg ? 0xFF : 0x7F);
  const double a = std::fabs(v);
  int best = f.max_mag_code;  // also the answer for |v| beyond the range, incl. inf
  if (std::isfinite(a)) {
    // Magnitudes rise with the code, so the nearest one is beside the first magnitude >= a.
    const std::vector<double>& mags = magnitudes(f);
    const int hi = int(std::lower_bound(mags.begin(), mags.end(), a) - mags.begin());
    if (hi == 0) {
      best = 0;
    } else if (hi <= f.max_mag_code) {
      const double d_lo = a - mags[size_t(hi - 1)], d_hi = mags[size_t(hi)] - a;
      best = d_lo < d_hi ? hi - 1 : (d_hi < d_lo ? hi : ((hi & 1) == 0 ? hi : hi - 1));  // tie: even
    }
  }
  if (best == 0 && f.fnuz) return 0x00;  // the only zero of e4m3fnuz
  return uint8_t((neg ? 0x80 : 0x00) | best);
}

// ---------------------------------------------------------------- quantize_fp8
QuantizeOracleResult oracle_quantize_fp8(const QuantizeFp8Params& p) {
  const int64_t numel = p.in.numel(), K = p.in.size(-1);
  const int64_t gk = p.group_k, G = (K + gk - 1) / gk;
  const int64_t N = p.in.ndim >= 2 ? p.in.size(-2) : 1;
  const int64_t NB = (N + p.block_n - 1) / p.block_n;
  // The group (= scale index) of flat element i, written per granularity.
  auto group_of = [&](int64_t i) -> int64_t {
    switch (p.granularity) {
      case QuantGranularity::per_tensor: return 0;
      case QuantGranularity::per_row: return i / K;
      case QuantGranularity::per_token_group: return (i / K) * G + (i % K) / gk;
      case QuantGranularity::block: {
        const int64_t matrix = i / (N * K), n = (i / K) % N, c = i % K;
        return (matrix * NB + n / p.block_n) * G + c / gk;
      }
    }
    return 0;
  };
  const double qmax = p.out.dtype == DType::fp8_e4m3fn ? 448.0 : 240.0;
  const int64_t groups = p.scale.numel();
  QuantizeOracleResult r;
  r.scales.assign(size_t(groups), 0.0f);
  if (p.static_scale) {
    r.scales[0] = p.scale.ptr<const float>()[0];
  } else {
    std::vector<double> amax(size_t(groups), 0.0);
    for (int64_t i = 0; i < numel; ++i) {
      const double x = load_as_f32(p.in.data, p.in.dtype, i);
      if (std::isfinite(x)) amax[size_t(group_of(i))] = std::max(amax[size_t(group_of(i))], std::fabs(x));
    }
    // NOTE: amax is an f32 value, so rounding the float64 quotient once to f32 gives exactly the
    // IEEE f32 division the contract specifies (53 >= 2 * 24 + 2 bits: no double-rounding error).
    for (int64_t g = 0; g < groups; ++g) {
      r.scales[size_t(g)] = float(std::max(amax[size_t(g)], double(kFp8AmaxFloor)) / qmax);
    }
  }
  r.codes.resize(size_t(numel));
  for (int64_t i = 0; i < numel; ++i) {
    const double x = load_as_f32(p.in.data, p.in.dtype, i);
    const double s = p.static_scale ? r.scales[0] : r.scales[size_t(group_of(i))];
    // The contract's quotient is an f32 division (same argument as above), then rounded by value.
    const float q = std::isnan(x) ? float(x) : float(x / s);
    r.codes[size_t(i)] = oracle_fp8_code(double(q), p.out.dtype);
  }
  return r;
}

// ---------------------------------------------------------------- convert_fp8
ConvertOracleResult oracle_convert_fp8(const ConvertFp8Params& p) {
  const bool to_fnuz = p.in.dtype == DType::fp8_e4m3fn;
  // decode(out) * scale_out == decode(in) * scale_in with scale_out = scale_in * factor.
  const double factor = to_fnuz ? 2.0 : 0.5;
  const DType od = to_fnuz ? DType::fp8_e4m3fnuz : DType::fp8_e4m3fn;
  ConvertOracleResult r;
  const int64_t n = p.in.numel();
  r.codes.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const double v = oracle_fp8_value(p.in.ptr<const uint8_t>()[i], p.in.dtype);
    if (std::isnan(v)) {  // NaN: fn -> fnuz keeps NaN (0x80); fnuz -> fn gives 0 (SPEC 5)
      r.codes[size_t(i)] = to_fnuz ? 0x80 : 0x00;
      continue;
    }
    const double target = v / factor;
    const uint8_t c = oracle_fp8_code(target, od);
    if (oracle_fp8_value(c, od) != target) ++r.saturated;
    r.codes[size_t(i)] = c;
  }
  if (p.scale_in.present()) {
    r.scales.resize(size_t(p.scale_in.numel()));
    for (int64_t i = 0; i < p.scale_in.numel(); ++i) {
      r.scales[size_t(i)] = float(double(p.scale_in.ptr<const float>()[i]) * factor);
    }
  }
  return r;
}

}  // namespace moekit::testing
