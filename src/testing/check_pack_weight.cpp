// Harness hooks of pack_weight / unpack_weight (moekit/ops/layout.h): check_pack_weight and
// check_unpack_weight, plus the independent oracle (src/testing/oracle_pack_weight.h).
//
// Cases: named edge cases (one panel, 3-D / 4-D batches, f16, empty, and shapes / dtypes the
// contract rejects), then the w1 / w2 shapes of the requested preset (2 experts, bf16; f16 for the
// f16 scheme). The ref kernels are compared bit-exactly against the oracle, any other kernel
// against the ref kernel. Used by `moekit check --op pack_weight|unpack_weight` and by
// tests/test_pack_weight.cpp.
#include <algorithm>
#include <cstring>
#include <sstream>

#include "moekit/ops/layout.h"
#include "testing/harness.h"
#include "testing/oracle_pack_weight.h"

namespace moekit::testing {

std::vector<uint16_t> oracle_pack_weight(const TensorView& in, bool inverse) {
  const int64_t N = in.size(-2), K = in.size(-1), total = in.numel();
  const int64_t matrices = N * K == 0 ? 0 : total / (N * K);
  const auto* bytes = in.ptr<const unsigned char>();
  const int64_t eb = dtype_size(in.dtype);  // 2 (bf16, f16) or 1 (fp8)
  auto src = [&](int64_t i) {
    uint16_t v = 0;
    std::memcpy(&v, bytes + i * eb, size_t(eb));
    return v;
  };
  std::vector<uint16_t> out(static_cast<size_t>(total));
  int64_t packed = 0;  // position in the packed tensor, advancing one element per step
  for (int64_t b = 0; b < matrices; ++b) {
    for (int64_t panel = 0; panel < N / 32; ++panel) {
      for (int64_t pair = 0; pair < K / 2; ++pair) {
        for (int64_t row = 0; row < 32; ++row) {
          for (int64_t half = 0; half < 2; ++half, ++packed) {
            const int64_t plain = b * N * K + (panel * 32 + row) * K + pair * 2 + half;
            if (inverse) {
              out[size_t(plain)] = src(packed);
            } else {
              out[size_t(packed)] = src(plain);
            }
          }
        }
      }
    }
  }
  return out;
}

namespace {

using Dims = std::vector<int64_t>;

struct PackCase {
  std::string name;
  DType dtype;
  Dims dims;
};

std::string str(const Dims& d) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < d.size(); ++i) os << (i ? ", " : "") << d[i];
  os << ']';
  return os.str();
}

std::vector<int64_t> as_ints(const unsigned char* bytes, int64_t n, int64_t eb) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint16_t u = 0;
    std::memcpy(&u, bytes + eb * i, size_t(eb));
    v[size_t(i)] = u;
  }
  return v;
}

std::vector<PackCase> pack_cases(const CheckRequest& req, Status* setup) {
  std::vector<PackCase> cases;
  if (req.edge_cases) {
    cases = {
        {"edge:bf16 [32, 2] one panel, one pair", DType::bf16, {32, 2}},
        {"edge:bf16 [32, 64] one panel", DType::bf16, {32, 64}},
        {"edge:f16 [96, 6] three panels", DType::f16, {96, 6}},
        {"edge:bf16 [3, 64, 160] 3-D", DType::bf16, {3, 64, 160}},
        {"edge:bf16 [2, 2, 32, 34] 4-D", DType::bf16, {2, 2, 32, 34}},
        {"edge:empty [0, 32, 32]", DType::bf16, {0, 32, 32}},
        {"edge:reject N=48 [48, 32]", DType::bf16, {48, 32}},
        {"edge:reject K=33 [32, 33]", DType::bf16, {32, 33}},
        {"edge:reject f32 [32, 32]", DType::f32, {32, 32}},
        {"edge:fp8_e4m3fn [2, 64, 70] two panels", DType::fp8_e4m3fn, {2, 64, 70}},
        {"edge:fp8_e4m3fnuz [32, 2] one pair", DType::fp8_e4m3fnuz, {32, 2}},
        {"edge:reject i32 [32, 32]", DType::i32, {32, 32}},
        {"edge:reject 1-D [64]", DType::bf16, {64}},
    };
  }
  MoeShape s;
  *setup = resolve_shape(req.shape, 1, &s);
  if (setup->ok()) {
    const int64_t E = std::min<int64_t>(s.E, 2), N1 = s.g1u1 ? 2 * s.I : s.I;
    const DType d = s.scheme == Scheme::f16 ? DType::f16 : DType::bf16;
    for (const auto& [what, dims] : {std::pair<const char*, Dims>{" w1 ", {E, N1, s.H}}, {" w2 ", {E, s.H, s.I}}}) {
      cases.push_back({s.label + what + str(dims) + " " + dtype_name(d), d, dims});
    }
  }
  return cases;
}

bool packable(const PackCase& c) {
  const size_t n = c.dims.size();
  const bool elem = c.dtype == DType::bf16 || c.dtype == DType::f16 || is_fp8(c.dtype);
  return n >= 2 && elem && c.dims[n - 2] % 32 == 0 && c.dims[n - 1] % 2 == 0;
}

std::vector<CaseResult> check_pack_impl(const CheckRequest& req, bool inverse) {
  const OpKind op = inverse ? OpKind::unpack_weight : OpKind::pack_weight;
  const Layout from = inverse ? Layout::cpu_vnni2_n32 : Layout::row_major;
  const Layout to = inverse ? Layout::row_major : Layout::cpu_vnni2_n32;
  const char* ref_name = inverse ? "unpack_weight_ref" : "pack_weight_ref";
  auto run_op = [&](const PackWeightParams& p, const char* kernel) {
    RunOptions o;
    o.kernel = kernel;
    return inverse ? unpack_weight(p, o) : pack_weight(p, o);
  };
  Status setup;
  const std::vector<PackCase> cases = pack_cases(req, &setup);
  std::vector<CaseResult> results;
  if (!setup.ok()) {
    CaseResult r;
    r.op = op_name(op);
    r.name = "setup";
    r.detail = setup.to_string();
    results.push_back(r);
  }
  Rng rng(req.shape.seed);
  for (const PackCase& c : cases) {
    Buffer in(c.dtype, c.dims), out(c.dtype, c.dims);
    for (unsigned char& b : in.bytes) b = static_cast<unsigned char>(rng.gen() & 0xFFu);  // raw bits, NaNs too
    in.view.layout = from;
    out.view.layout = to;
    for (const Kernel* k : kernels_to_check(op, req)) {
      CaseResult r;
      r.op = op_name(op);
      r.kernel = k->name;
      r.backend = backend_name(k->backend);
      r.name = c.name;
      r.reference = k->backend == Backend::ref ? "oracle" : "ref";
      out.fill_bytes(0xAB);
      const Status s = run_op({in.view, out.view}, k->name);
      if (!packable(c)) {
        r.reference = "contract";
        r.ok = s.code() == StatusCode::invalid_argument;
        r.detail = s.ok() ? std::string("expected invalid_argument, got ok") : "rejected as expected: " + s.to_string();
        results.push_back(r);
        continue;
      }
      std::vector<int64_t> want;
      if (k->backend == Backend::ref) {
        const std::vector<uint16_t> o = oracle_pack_weight(in.view, inverse);
        want.assign(o.begin(), o.end());
      } else {
        Buffer ref_out(c.dtype, c.dims);
        ref_out.view.layout = to;
        const Status rs = run_op({in.view, ref_out.view}, ref_name);
        if (!rs.ok()) {
          r.detail = "reference kernel failed: " + rs.to_string();
          results.push_back(r);
          continue;
        }
        want = as_ints(ref_out.bytes.data(), ref_out.numel(), dtype_size(c.dtype));
      }
      if (!s.ok()) {
        r.detail = "kernel failed: " + s.to_string();
        results.push_back(r);
        continue;
      }
      r.metrics = compare_exact(as_ints(out.bytes.data(), out.numel(), dtype_size(c.dtype)), want, c.dims);
      r.ok = r.metrics.mismatches == 0;
      r.detail = "exact (raw bits)";
      if (!r.ok) r.detail += "; " + std::to_string(r.metrics.mismatches) + " mismatches, " + r.metrics.worst;
      results.push_back(r);
    }
  }
  return results;
}

}  // namespace

std::vector<CaseResult> check_pack_weight(const CheckRequest& req) { return check_pack_impl(req, false); }
std::vector<CaseResult> check_unpack_weight(const CheckRequest& req) { return check_pack_impl(req, true); }

}  // namespace moekit::testing
