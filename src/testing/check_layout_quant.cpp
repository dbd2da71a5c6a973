// Harness hooks (src/testing/harness.h) of the layout and fp8 helper ops: check_shuffle_weight,
// check_unshuffle_weight (SPEC 4), check_quantize_fp8 and check_convert_fp8 (SPEC 5).
//
// Each returns one CaseResult per (case, kernel): the named edge cases (req.edge_cases) and the
// weight / activation tensors of the requested model shape. The `ref` backend kernels are compared
// with the independent oracles of src/testing/oracle_layout_quant.cpp, every other kernel with
// the reference kernel. All these outputs are exact (raw bits, fp8 codes, f32 scales): any
// difference is a failure. Expected rejections (shapes the contract forbids) are cases too: they
// pass when the kernel refuses with invalid_argument. Token counts (req.tokens, default {1, 7, 64})
// only apply to quantize_fp8's activation cases; weight cases use min(E, 2) experts (layouts and
// scales are per expert) or one expert for the larger quantize / convert shapes.
// Used by `moekit check --op <op>` and by tests/test_{shuffle_weight,quantize_fp8,convert_fp8}.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "moekit/ops/layout.h"
#include "moekit/ops/quant.h"
#include "testing/harness.h"
#include "testing/oracle_layout_quant.h"

namespace moekit::testing {

namespace {

using Dims = std::vector<int64_t>;

std::string str(const Dims& d) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < d.size(); ++i) os << (i ? ", " : "") << d[i];
  os << ']';
  return os.str();
}

CaseResult new_result(OpKind op, const Kernel& k, const std::string& name) {
  CaseResult r;
  r.op = op_name(op);
  r.kernel = k.name;
  r.backend = backend_name(k.backend);
  r.name = name;
  r.reference = k.backend == Backend::ref ? "oracle" : "ref";
  return r;
}

// A result for a request that cannot even be set up (bad preset, ...).
CaseResult setup_failure(OpKind op, const Status& s) {
  CaseResult r;
  r.op = op_name(op);
  r.name = "setup";
  r.detail = s.to_string();
  return r;
}

// Elements of `bytes` (elem_bytes each, little-endian) as integers, for exact compares.
std::vector<int64_t> elements(const unsigned char* bytes, int64_t n, int elem_bytes) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = 0;
    std::memcpy(&u, bytes + i * elem_bytes, size_t(elem_bytes));
    v[size_t(i)] = int64_t(u);
  }
  return v;
}

// Folds the metrics of a second output (e.g. scales) into those of the first.
void merge(Metrics* m, const Metrics& other, const char* what) {
  m->count += other.count;
  if (other.mismatches > 0 && m->mismatches == 0) m->worst = std::string(what) + ": " + other.worst;
  m->mismatches += other.mismatches;
  m->max_abs_err = std::max(m->max_abs_err, other.max_abs_err);
}

void finish(CaseResult* r, const Status& s, const char* exact_what) {
  if (!s.ok()) {
    r->ok = false;
    r->detail = "kernel failed: " + s.to_string();
    return;
  }
  r->ok = r->metrics.mismatches == 0;
  r->detail = std::string("exact (") + exact_what + ")";
  if (!r->ok) r->detail += "; " + std::to_string(r->metrics.mismatches) + " mismatches, " + r->metrics.worst;
}

// The expected-rejection case: ok when the op returns invalid_argument.
void expect_rejection(CaseResult* r, const Status& s) {
  r->reference = "contract";
  r->ok = s.code() == StatusCode::invalid_argument;
  r->detail = s.ok() ? std::string("expected invalid_argument, got ok") : "rejected as expected: " + s.to_string();
}

// A device kernel whose backend is unavailable here (no CUDA device): reported ok, as skipped.
bool skip_unavailable(const Kernel& k, CaseResult* r) {
  const Status avail = registry().backend_available(k.backend);
  if (avail.ok()) return false;
  r->ok = true;
  r->detail = "skipped: backend " + std::string(backend_name(k.backend)) + " unavailable: " + avail.message();
  return true;
}

void fill_random_bytes(Buffer& b, Rng& rng) {
  for (unsigned char& c : b.bytes) c = static_cast<unsigned char>(rng.gen() & 0xFFu);
}

// The weight tensors of a request: w1 [E', 2I or I, H] and w2 [E', H, I] with E' = min(E, 2)
// experts (layouts and scales are per expert, so a couple of experts cover the shape).
struct WeightShape {
  std::string name;
  Dims dims;
};
Status weight_shapes(const CheckRequest& req, std::vector<WeightShape>* out, MoeShape* shape) {
  MOEKIT_RETURN_IF_ERROR(resolve_shape(req.shape, 1, shape));
  const int64_t E = std::min<int64_t>(shape->E, 2), I2 = shape->g1u1 ? 2 * shape->I : shape->I;
  *out = {{shape->label + " w1", {E, I2, shape->H}}, {shape->label + " w2", {E, shape->H, shape->I}}};
  return Status::Ok();
}

DType weight_dtype(Scheme s) {
  switch (s) {
    case Scheme::f16: return DType::f16;
    case Scheme::f32: return DType::f32;
    case Scheme::bf16: return DType::bf16;
    default: return DType::fp8_e4m3fn;
  }
}

// ================================================================ shuffle / unshuffle
struct ShuffleCase {
  std::string name;
  DType dtype;
  Dims dims;
};

std::vector<ShuffleCase> shuffle_cases(const CheckRequest& req, Status* setup) {
  std::vector<ShuffleCase> cases;
  if (req.edge_cases) {
    cases = {
        {"edge:fp8 [16, 32] one tile", DType::fp8_e4m3fn, {16, 32}},
        {"edge:bf16 [16, 32] one tile", DType::bf16, {16, 32}},
        {"edge:f32 [16, 32] one tile", DType::f32, {16, 32}},
        {"edge:f16 [48, 96]", DType::f16, {48, 96}},
        {"edge:fp8_e4m3fnuz [3, 32, 160] 3-D", DType::fp8_e4m3fnuz, {3, 32, 160}},
        {"edge:bf16 [2, 3, 16, 64] 4-D", DType::bf16, {2, 3, 16, 64}},
        {"edge:i32 [1, 64, 64]", DType::i32, {1, 64, 64}},
        {"edge:empty [0, 16, 32]", DType::bf16, {0, 16, 32}},
        {"edge:reject N=40 [40, 32]", DType::bf16, {40, 32}},
        {"edge:reject K=48 [16, 48]", DType::fp8_e4m3fn, {16, 48}},
        {"edge:reject 1-D [64]", DType::bf16, {64}},
    };
  }
  std::vector<WeightShape> ws;
  MoeShape shape;
  *setup = weight_shapes(req, &ws, &shape);
  if (setup->ok()) {
    const DType d = weight_dtype(shape.scheme);
    for (const WeightShape& w : ws) cases.push_back({w.name + " " + str(w.dims) + " " + dtype_name(d), d, w.dims});
  }
  return cases;
}

std::vector<CaseResult> check_shuffle_impl(const CheckRequest& req, bool inverse) {
  const OpKind op = inverse ? OpKind::unshuffle_weight : OpKind::shuffle_weight;
  const Layout from = inverse ? Layout::shuffled_16x16 : Layout::row_major;
  const Layout to = inverse ? Layout::row_major : Layout::shuffled_16x16;
  const char* ref_name = inverse ? "unshuffle_weight_ref" : "shuffle_weight_ref";
  auto run_op = [&](const ShuffleWeightParams& p, const char* kernel) {
    RunOptions o;
    o.kernel = kernel;
    return inverse ? unshuffle_weight(p, o) : shuffle_weight(p, o);
  };
  Status setup;
  const std::vector<ShuffleCase> cases = shuffle_cases(req, &setup);
  std::vector<CaseResult> results;
  if (!setup.ok()) results.push_back(setup_failure(op, setup));
  Rng rng(req.shape.seed);
  for (const ShuffleCase& c : cases) {
    Buffer in(c.dtype, c.dims), out(c.dtype, c.dims);
    fill_random_bytes(in, rng);  // raw bits: layouts must move NaN / denormal patterns untouched
    in.view.layout = from;
    out.view.layout = to;
    const bool valid = c.dims.size() >= 2 && c.dims[c.dims.size() - 2] % 16 == 0 && c.dims.back() % 32 == 0;
    const int eb = dtype_size(c.dtype);
    for (const Kernel* k : kernels_to_check(op, req)) {
      CaseResult r = new_result(op, *k, c.name);
      out.fill_bytes(0xAB);
      const Status s = run_op({in.view, out.view}, k->name);
      if (!valid) {
        expect_rejection(&r, s);
        results.push_back(r);
        continue;
      }
      std::vector<int64_t> want;
      if (k->backend == Backend::ref) {
        const std::vector<unsigned char> o = oracle_shuffle_weight(in.view, inverse);
        want = elements(o.data(), int64_t(o.size()) / eb, eb);
      } else {
        Buffer ref_out(c.dtype, c.dims);
        ref_out.view.layout = to;
        const Status rs = run_op({in.view, ref_out.view}, ref_name);
        if (!rs.ok()) {
          r.detail = "reference kernel failed: " + rs.to_string();
          results.push_back(r);
          continue;
        }
        want = elements(ref_out.bytes.data(), ref_out.numel(), eb);
      }
      r.metrics = compare_exact(elements(out.bytes.data(), out.numel(), eb), want, c.dims);
      finish(&r, s, "raw bits");
      results.push_back(r);
    }
  }
  return results;
}

// ================================================================ quantize_fp8
enum class Fill : uint8_t { normal, zeros, specials, tiny, huge };

struct QuantCase {
  std::string name;
  DType in_dtype;
  Dims dims;
  QuantGranularity g;
  int group_k = 128, block_n = 128;
  DType out_dtype = DType::fp8_e4m3fn;
  Fill fill = Fill::normal;
  float static_scale = 0.0f;  // > 0: per_tensor static scale
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

Dims quant_scale_dims(const QuantCase& c) {
  const int64_t K = c.dims.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < c.dims.size(); ++i) rows *= c.dims[i];
  switch (c.g) {
    case QuantGranularity::per_tensor: return {1};
    case QuantGranularity::per_row: return {rows};
    case QuantGranularity::per_token_group: return {rows, ceil_div(K, c.group_k)};
    case QuantGranularity::block: {
      Dims d(c.dims.begin(), c.dims.end() - 2);
      d.push_back(ceil_div(c.dims[c.dims.size() - 2], c.block_n));
      d.push_back(ceil_div(K, c.group_k));
      return d;
    }
  }
  return {1};
}

// Normal values with a per-row magnitude spread of 2^-8 .. 2^8, so groups get different scales.
void fill_quant_input(Buffer& b, Fill f, Rng& rng) {
  const int64_t n = b.numel(), K = b.view.size(-1) > 0 ? b.view.size(-1) : 1;
  float row_scale = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % K == 0) row_scale = std::ldexp(1.0f, int(rng.integer(-8, 8)));
    float v = rng.normal(0.0f, 1.0f) * row_scale;
    if (f == Fill::zeros) v = (i % 7 == 3) ? -0.0f : 0.0f;
    if (f == Fill::tiny) v *= 1e-30f;
    if (f == Fill::huge) v *= 1e30f;
    if (f == Fill::specials) {
      const int64_t r = rng.integer(0, 15);
      if (r == 0) v = NAN;
      if (r == 1) v = -INFINITY;
      if (r == 2) v = INFINITY;
    }
    b.set(i, v);
  }
}

std::vector<QuantCase> quant_cases(const CheckRequest& req, Status* setup) {
  using G = QuantGranularity;
  const DType bf = DType::bf16, f16 = DType::f16, f32 = DType::f32, fnuz = DType::fp8_e4m3fnuz;
  const DType fn = DType::fp8_e4m3fn;
  std::vector<QuantCase> cases;
  if (req.edge_cases) {
    cases = {
        {"edge:per_tensor zeros [4, 96]", bf, {4, 96}, G::per_tensor, 128, 128, fn, Fill::zeros},
        {"edge:per_row T=0 [0, 128]", bf, {0, 128}, G::per_row},
        {"edge:per_row T=1 [1, 1]", f32, {1, 1}, G::per_row},
        {"edge:per_row ragged f16 [7, 200]", f16, {7, 200}, G::per_row},
        {"edge:per_row 1-D [300]", f32, {300}, G::per_row},
        {"edge:per_tensor fnuz [3, 5, 64]", bf, {3, 5, 64}, G::per_tensor, 128, 128, fnuz},
        {"edge:per_tensor static 0.01 [8, 64]", f32, {8, 64}, G::per_tensor, 128, 128, fn, Fill::normal, 0.01f},
        {"edge:per_tensor static fnuz [8, 64]", bf, {8, 64}, G::per_tensor, 128, 128, fnuz, Fill::normal, 0.05f},
        {"edge:per_token_group 1x128 ragged [5, 300]", bf, {5, 300}, G::per_token_group},
        {"edge:per_token_group 1x32 fnuz [3, 2, 100]", f16, {3, 2, 100}, G::per_token_group, 32, 128, fnuz},
        {"edge:per_token_group 1x1 [2, 9]", f32, {2, 9}, G::per_token_group, 1},
        {"edge:per_token_group NaN/inf [4, 256]", f32, {4, 256}, G::per_token_group, 128, 128, fn, Fill::specials},
        {"edge:per_row NaN/inf fnuz [6, 100]", f32, {6, 100}, G::per_row, 128, 128, fnuz, Fill::specials},
        {"edge:per_row tiny (amax floor) [4, 64]", f32, {4, 64}, G::per_row, 128, 128, fn, Fill::tiny},
        {"edge:per_row huge 1e30 [4, 64]", f32, {4, 64}, G::per_row, 128, 128, fn, Fill::huge},
        {"edge:block 128x128 ragged [2, 200, 300]", bf, {2, 200, 300}, G::block},
        {"edge:block 16x32 fnuz [3, 40, 70]", f32, {3, 40, 70}, G::block, 32, 16, fnuz},
        {"edge:block 1x1 [5, 3]", f16, {5, 3}, G::block, 1, 1},
        {"edge:block zeros [256, 128]", bf, {256, 128}, G::block, 128, 128, fn, Fill::zeros},
        // Shapes that take each path of the CUDA kernel (quantize_fp8_sm90.cu): 16-element chunks
        // cached in registers (one / four per thread), two-pass groups of > 1024 chunks, 1-element
        // chunks (rows not a multiple of 16), per_tensor with a scalar tail, saturating static scale.
        {"edge:per_row 4 chunks/thread [3, 7168]", bf, {3, 7168}, G::per_row},
        {"edge:per_row two-pass f32 [2, 20480]", f32, {2, 20480}, G::per_row},
        {"edge:per_row unaligned rows fnuz [5, 7000]", f16, {5, 7000}, G::per_row, 128, 128, fnuz},
        {"edge:per_token_group 1x128 NaN/inf fnuz [9, 1024]", bf, {9, 1024}, G::per_token_group, 128, 128, fnuz,
         Fill::specials},
        {"edge:block 128x128 f32 ragged rows [2, 130, 384]", f32, {2, 130, 384}, G::block},
        {"edge:block 256x256 two-pass [300, 512]", bf, {300, 512}, G::block, 256, 256},
        {"edge:per_tensor tail f16 [7, 333]", f16, {7, 333}, G::per_tensor},
        {"edge:per_tensor NaN/inf [64, 1000]", f32, {64, 1000}, G::per_tensor, 128, 128, fn, Fill::specials},
        {"edge:per_tensor static saturating 1e-6 [16, 256]", bf, {16, 256}, G::per_tensor, 128, 128, fnuz,
         Fill::normal, 1e-6f},
    };
  }
  MoeShape shape;
  *setup = resolve_shape(req.shape, 1, &shape);
  if (setup->ok()) {
    std::vector<int64_t> tokens = req.tokens.empty() ? std::vector<int64_t>{1, 7, 64} : req.tokens;
    for (int64_t T : tokens) {
      const std::string x = shape.label + " x T=" + std::to_string(T);
      cases.push_back({x + " " + str({T, shape.H}) + " per_token_group 1x128", bf, {T, shape.H}, G::per_token_group});
      cases.push_back({x + " " + str({T, shape.H}) + " per_row (per-token)", bf, {T, shape.H}, G::per_row});
    }
    const int64_t I2 = shape.g1u1 ? 2 * shape.I : shape.I;
    const Dims w1 = {1, I2, shape.H}, w2 = {1, shape.H, shape.I};
    cases.push_back({shape.label + " w1 " + str(w1) + " block 128x128", bf, w1, G::block});
    cases.push_back({shape.label + " w2 " + str(w2) + " per_row (per-channel)", bf, w2, G::per_row});
    cases.push_back({shape.label + " w2 " + str(w2) + " per_tensor", bf, w2, G::per_tensor});
  }
  return cases;
}

}  // namespace

Status run_quantize_fp8_kernel(const QuantizeFp8Params& host, const Kernel& kernel, void* stream) {
  DeviceMirror m(kernel.backend);
  QuantizeFp8Params p = host;
  MOEKIT_RETURN_IF_ERROR(m.input(&p.in));
  MOEKIT_RETURN_IF_ERROR(m.output(&p.out));
  MOEKIT_RETURN_IF_ERROR(m.output(&p.scale));  // an input with static_scale: copied back unchanged
  RunOptions o;
  o.kernel = kernel.name;
  o.stream = stream;
  MOEKIT_RETURN_IF_ERROR(quantize_fp8(p, o));
  return m.copy_back();
}

Status run_convert_fp8_kernel(const ConvertFp8Params& host, const Kernel& kernel, void* stream) {
  DeviceMirror m(kernel.backend);
  ConvertFp8Params p = host;
  MOEKIT_RETURN_IF_ERROR(m.input(&p.in));
  MOEKIT_RETURN_IF_ERROR(m.output(&p.out));
  MOEKIT_RETURN_IF_ERROR(m.input(&p.scale_in));
  MOEKIT_RETURN_IF_ERROR(m.output(&p.scale_out));
  RunOptions o;
  o.kernel = kernel.name;
  o.stream = stream;
  MOEKIT_RETURN_IF_ERROR(convert_fp8(p, o));
  return m.copy_back();
}

std::vector<CaseResult> check_shuffle_weight(const CheckRequest& req) { return check_shuffle_impl(req, false); }
std::vector<CaseResult> check_unshuffle_weight(const CheckRequest& req) { return check_shuffle_impl(req, true); }

std::vector<CaseResult> check_quantize_fp8(const CheckRequest& req) {
  Status setup;
  const std::vector<QuantCase> cases = quant_cases(req, &setup);
  std::vector<CaseResult> results;
  if (!setup.ok()) results.push_back(setup_failure(OpKind::quantize_fp8, setup));
  Rng rng(req.shape.seed);
  for (const QuantCase& c : cases) {
    const Dims scale_dims = quant_scale_dims(c);
    Buffer in(c.in_dtype, c.dims), out(c.out_dtype, c.dims), scale(DType::f32, scale_dims);
    fill_quant_input(in, c.fill, rng);
    auto params = [&](Buffer& o, Buffer& s) {
      QuantizeFp8Params p;
      p.in = in.view;
      p.out = o.view;
      p.scale = s.view;
      p.granularity = c.g;
      p.group_k = c.group_k;
      p.block_n = c.block_n;
      p.static_scale = c.static_scale > 0.0f;
      if (p.static_scale) s.data<float>()[0] = c.static_scale;
      return p;
    };
    for (const Kernel* k : kernels_to_check(OpKind::quantize_fp8, req)) {
      CaseResult r = new_result(OpKind::quantize_fp8, *k, c.name);
      if (skip_unavailable(*k, &r)) {
        results.push_back(r);
        continue;
      }
      out.fill_bytes(0xAB);
      if (c.static_scale <= 0.0f) scale.fill_bytes(0xAB);
      const QuantizeFp8Params p = params(out, scale);
      const Status s = run_quantize_fp8_kernel(p, *k);
      // Expected codes and scale bits; an empty input writes no scale.
      const int64_t n_scales = c.dims.front() == 0 ? 0 : scale.numel();
      std::vector<int64_t> want_codes, want_scales;
      if (k->backend == Backend::ref) {
        const QuantizeOracleResult e = oracle_quantize_fp8(p);
        want_codes = elements(e.codes.data(), int64_t(e.codes.size()), 1);
        want_scales = elements(reinterpret_cast<const unsigned char*>(e.scales.data()), n_scales, 4);
      } else {
        Buffer ro(c.out_dtype, c.dims), rsc(DType::f32, scale_dims);
        RunOptions ref_opts;
        ref_opts.kernel = "quantize_fp8_ref";
        const Status rs = quantize_fp8(params(ro, rsc), ref_opts);
        if (!rs.ok()) {
          r.detail = "reference kernel failed: " + rs.to_string();
          results.push_back(r);
          continue;
        }
        want_codes = elements(ro.bytes.data(), ro.numel(), 1);
        want_scales = elements(rsc.bytes.data(), n_scales, 4);
      }
      r.metrics = compare_exact(elements(out.bytes.data(), out.numel(), 1), want_codes, c.dims);
      merge(&r.metrics, compare_exact(elements(scale.bytes.data(), n_scales, 4), want_scales, scale_dims),
            "scale");
      finish(&r, s, "fp8 codes and f32 scale bits");
      results.push_back(r);
    }
  }
  return results;
}

// ================================================================ convert_fp8
std::vector<CaseResult> check_convert_fp8(const CheckRequest& req) {
  struct ConvertCase {
    std::string name;
    DType in_dtype;
    Dims dims;
    Dims scale_dims;  // empty: no scales
    bool all_codes;   // in = 0..255 repeated instead of random bytes
  };
  const DType fn = DType::fp8_e4m3fn, fnuz = DType::fp8_e4m3fnuz;
  std::vector<ConvertCase> cases;
  if (req.edge_cases) {
    cases = {
        {"edge:fn->fnuz all 256 codes", fn, {256}, {1}, true},
        {"edge:fnuz->fn all 256 codes", fnuz, {256}, {1}, true},
        {"edge:fn->fnuz no scales [3, 5]", fn, {3, 5}, {}, false},
        {"edge:fnuz->fn no scales [2, 2, 64]", fnuz, {2, 2, 64}, {}, false},
        {"edge:fnuz->fn empty [0, 16] with scales", fnuz, {0, 16}, {4}, false},
        {"edge:fn->fnuz per-row scales [16, 8]", fn, {16, 8}, {16, 1}, false},
        {"edge:fnuz->fn 16-byte chunks + tail [37, 1001]", fnuz, {37, 1001}, {37}, false},
        {"edge:fn->fnuz every code x 4099 [4099, 256]", fn, {4099, 256}, {}, true},
    };
  }
  MoeShape shape;
  const Status setup = resolve_shape(req.shape, 1, &shape);
  std::vector<CaseResult> results;
  if (!setup.ok()) results.push_back(setup_failure(OpKind::convert_fp8, setup));
  if (setup.ok()) {
    const int64_t I2 = shape.g1u1 ? 2 * shape.I : shape.I;
    const Dims w = {1, I2, shape.H}, sd = {1, ceil_div(I2, 128), ceil_div(shape.H, 128)};
    cases.push_back({shape.label + " w1 " + str(w) + " fn->fnuz, block scales", fn, w, sd, false});
    cases.push_back({shape.label + " w1 " + str(w) + " fnuz->fn, block scales", fnuz, w, sd, false});
  }
  Rng rng(req.shape.seed);
  for (const ConvertCase& c : cases) {
    const DType od = c.in_dtype == fn ? fnuz : fn;
    Buffer in(c.in_dtype, c.dims), out(od, c.dims);
    if (c.all_codes) {
      for (int64_t i = 0; i < in.numel(); ++i) in.bytes[size_t(i)] = static_cast<unsigned char>(i & 0xFF);
    } else {
      fill_random_bytes(in, rng);
    }
    Buffer sin(DType::f32, c.scale_dims.empty() ? Dims{1} : c.scale_dims), sout = sin;
    for (int64_t i = 0; i < sin.numel(); ++i) sin.data<float>()[i] = rng.uniform(1e-4f, 1e-1f);
    auto params = [&](Buffer& o, Buffer& so, int64_t* sat) {
      ConvertFp8Params p;
      p.in = in.view;
      p.out = o.view;
      if (!c.scale_dims.empty()) {
        p.scale_in = sin.view;
        p.scale_out = so.view;
      }
      p.num_saturated = sat;
      return p;
    };
    for (const Kernel* k : kernels_to_check(OpKind::convert_fp8, req)) {
      CaseResult r = new_result(OpKind::convert_fp8, *k, c.name);
      if (skip_unavailable(*k, &r)) {
        results.push_back(r);
        continue;
      }
      out.fill_bytes(0xAB);
      sout.fill_bytes(0xAB);
      int64_t sat = -1;
      const ConvertFp8Params p = params(out, sout, &sat);
      const Status s = run_convert_fp8_kernel(p, *k);
      const int64_t n_scales = c.scale_dims.empty() ? 0 : sin.numel();
      std::vector<int64_t> want_codes, want_scales;
      int64_t want_sat = 0;
      if (k->backend == Backend::ref) {
        const ConvertOracleResult e = oracle_convert_fp8(p);
        want_codes = elements(e.codes.data(), int64_t(e.codes.size()), 1);
        want_scales = elements(reinterpret_cast<const unsigned char*>(e.scales.data()), n_scales, 4);
        want_sat = e.saturated;
      } else {
        Buffer ro(od, c.dims), rso = sin;
        RunOptions ref_opts;
        ref_opts.kernel = "convert_fp8_ref";
        const Status rs = convert_fp8(params(ro, rso, &want_sat), ref_opts);
        if (!rs.ok()) {
          r.detail = "reference kernel failed: " + rs.to_string();
          results.push_back(r);
          continue;
        }
        want_codes = elements(ro.bytes.data(), ro.numel(), 1);
        want_scales = elements(rso.bytes.data(), n_scales, 4);
      }
      r.metrics = compare_exact(elements(out.bytes.data(), out.numel(), 1), want_codes, c.dims);
      merge(&r.metrics, compare_exact(elements(sout.bytes.data(), n_scales, 4), want_scales), "scale_out");
      merge(&r.metrics, compare_exact({sat}, {want_sat}), "num_saturated");
      finish(&r, s, "fp8 codes, f32 scale bits, saturation count");
      results.push_back(r);
    }
  }
  return results;
}

}  // namespace moekit::testing
