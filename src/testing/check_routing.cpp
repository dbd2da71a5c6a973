// check_* / bench_* hooks of the routing ops (SPEC 1; contract in src/testing/harness.h): named edge
// cases, then the requested shape for each token count, run on every kernel of the op. The ref
// kernel is compared with the float64 oracles of src/testing/oracle_routing.h, every other kernel
// with the ref kernel. ids (and token_expert_indices) must match exactly; weights within
// |a - b| <= kWeightAtol + kWeightRtol * |b|. Device kernels (the CUDA *_sm90 kernels) run on
// mirrored copies of each problem (DeviceMirror: inputs copied to the device, outputs copied back
// over the poisoned host buffers) and are reported skipped (ok) when their backend is unavailable.
// The bench problems keep their device copies alive and synchronise after each run. Used by
// `moekit check` / `moekit bench` and by tests/test_{topk_softmax,grouped_topk,sigmoid_topk}.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "moekit/ops/routing.h"
#include "testing/harness.h"
#include "testing/oracle_routing.h"

namespace moekit::testing {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Inputs and scalar arguments of one routing problem; each op reads the fields it has.
struct RoutingCase {
  std::string name;
  Buffer gating;                        // view: [T, E], possibly row-strided
  int k = 1;
  bool renormalize = false;             // topk_softmax, grouped_topk
  bool with_tei = false;                // topk_softmax: pass token_expert_indices
  Buffer bias;                          // grouped_topk: [E] f32 when has_bias
  bool has_bias = false;
  int n_group = 1, topk_group = 1;      // grouped_topk
  Scoring scoring = Scoring::softmax;   // grouped_topk
  float rsf = 1.0f;                     // grouped_topk
  int64_t T() const { return gating.view.shape[0]; }
  int64_t E() const { return gating.view.shape[1]; }
};

// Caller-allocated outputs, poisoned with 0xAB so unwritten elements show.
struct Outputs {
  Buffer weights, ids, tei;
  Outputs(int64_t T, int64_t k)
      : weights(DType::f32, {T, k}), ids(DType::i32, {T, k}), tei(DType::i32, {T, k}) {
    weights.fill_bytes(0xAB);
    ids.fill_bytes(0xAB);
    tei.fill_bytes(0xAB);
  }
  bool untouched() const {
    for (const Buffer* b : {&weights, &ids, &tei}) {
      for (unsigned char c : b->bytes) {
        if (c != 0xAB) return false;
      }
    }
    return true;
  }
};

TopkSoftmaxParams softmax_params(const RoutingCase& c, Outputs* o) {
  TopkSoftmaxParams p;
  p.gating = c.gating.view;
  p.k = c.k;
  p.renormalize = c.renormalize;
  if (o) {
    p.topk_weights = o->weights.view;
    p.topk_ids = o->ids.view;
    if (c.with_tei) p.token_expert_indices = o->tei.view;
  } else if (c.with_tei) {
    p.token_expert_indices = TensorView::contiguous(nullptr, DType::i32, {c.T(), c.k});
  }
  return p;
}

GroupedTopkParams grouped_params(const RoutingCase& c, Outputs* o) {
  GroupedTopkParams p;
  p.gating = c.gating.view;
  if (c.has_bias) p.correction_bias = c.bias.view;
  p.k = c.k;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.scoring = c.scoring;
  p.renormalize = c.renormalize;
  p.routed_scaling_factor = c.rsf;
  if (o) {
    p.topk_weights = o->weights.view;
    p.topk_ids = o->ids.view;
  }
  return p;
}

SigmoidTopkParams sigmoid_params(const RoutingCase& c, Outputs* o) {
  SigmoidTopkParams p;
  p.gating = c.gating.view;
  p.k = c.k;
  if (o) {
    p.topk_weights = o->weights.view;
    p.topk_ids = o->ids.view;
  }
  return p;
}

// The op's params for case c with outputs o, moved to the kernel's device by `m` (inputs mirrored,
// outputs mirrored and registered for copy_back; a no-op for host kernels).
struct MirroredParams {
  TopkSoftmaxParams softmax;
  GroupedTopkParams grouped;
  SigmoidTopkParams sigmoid;
};

Status mirror_params(OpKind op, const RoutingCase& c, Outputs* o, DeviceMirror& m, MirroredParams* mp) {
  switch (op) {
    case OpKind::topk_softmax: {
      TopkSoftmaxParams& p = mp->softmax = softmax_params(c, o);
      MOEKIT_RETURN_IF_ERROR(m.input(&p.gating));
      MOEKIT_RETURN_IF_ERROR(m.output(&p.topk_weights));
      MOEKIT_RETURN_IF_ERROR(m.output(&p.topk_ids));
      return m.output(&p.token_expert_indices);
    }
    case OpKind::grouped_topk: {
      GroupedTopkParams& p = mp->grouped = grouped_params(c, o);
      MOEKIT_RETURN_IF_ERROR(m.input(&p.gating));
      MOEKIT_RETURN_IF_ERROR(m.input(&p.correction_bias));
      MOEKIT_RETURN_IF_ERROR(m.output(&p.topk_weights));
      return m.output(&p.topk_ids);
    }
    default: {
      SigmoidTopkParams& p = mp->sigmoid = sigmoid_params(c, o);
      MOEKIT_RETURN_IF_ERROR(m.input(&p.gating));
      MOEKIT_RETURN_IF_ERROR(m.output(&p.topk_weights));
      return m.output(&p.topk_ids);
    }
  }
}

// The kernel's own supports() verdict on (mirrored) params.
Status params_supported(OpKind op, const MirroredParams& mp, const Kernel& kernel) {
  switch (op) {
    case OpKind::topk_softmax: return kernel.supports(&mp.softmax);
    case OpKind::grouped_topk: return kernel.supports(&mp.grouped);
    default: return kernel.supports(&mp.sigmoid);
  }
}

// Calls the op's front door on (mirrored) params with an explicit kernel (RunOptions::kernel).
Status call_op(OpKind op, const MirroredParams& mp, const char* kernel) {
  RunOptions opts;
  opts.kernel = kernel;
  switch (op) {
    case OpKind::topk_softmax: return topk_softmax(mp.softmax, opts);
    case OpKind::grouped_topk: return grouped_topk(mp.grouped, opts);
    default: return sigmoid_topk(mp.sigmoid, opts);
  }
}

// Runs case c on `kernel` (on its device, outputs copied back into o). *refused gets the kernel's
// supports() verdict when it refuses a T > 0 problem (nothing is run then).
Status invoke(OpKind op, const RoutingCase& c, Outputs* o, const Kernel& kernel, Status* refused = nullptr) {
  DeviceMirror m(kernel.backend);
  MirroredParams mp;
  MOEKIT_RETURN_IF_ERROR(mirror_params(op, c, o, m, &mp));
  if (refused && c.T() > 0) {
    *refused = params_supported(op, mp, kernel);
    if (!refused->ok()) return Status::Ok();
  }
  MOEKIT_RETURN_IF_ERROR(call_op(op, mp, kernel.name));
  return m.copy_back();
}

RoutingExpect oracle(OpKind op, const RoutingCase& c) {
  switch (op) {
    case OpKind::topk_softmax: return oracle_topk_softmax(softmax_params(c, nullptr));
    case OpKind::grouped_topk: return oracle_grouped_topk(grouped_params(c, nullptr));
    default: return oracle_sigmoid_topk(sigmoid_params(c, nullptr));
  }
}

RowCertifier certifier(OpKind op, const RoutingCase& c) {
  return [op, &c](const TensorView& g) {
    RoutingCase probe;
    probe.gating.view = g;
    probe.k = c.k;
    probe.renormalize = c.renormalize;
    probe.bias = c.bias;
    probe.has_bias = c.has_bias;
    probe.n_group = c.n_group;
    probe.topk_group = c.topk_group;
    probe.scoring = c.scoring;
    probe.rsf = c.rsf;
    return oracle(op, probe).min_rel_gap;
  };
}

std::string tolerance_text() {
  std::ostringstream os;
  os << "ids exact; weights |a-b| <= " << kWeightAtol << " + " << kWeightRtol << "*|b|";
  return os.str();
}

// Runs one case on one kernel and compares it with `expected`.
CaseResult run_case(OpKind op, const RoutingCase& c, const Kernel& kernel) {
  CaseResult r;
  r.op = op_name(op);
  r.kernel = kernel.name;
  r.backend = backend_name(kernel.backend);
  r.name = c.name;
  const bool is_ref = kernel.backend == Backend::ref;
  r.reference = is_ref ? "oracle" : "ref";
  const Status avail = registry().backend_available(kernel.backend);
  if (!avail.ok()) {  // e.g. no CUDA device on this machine: not a failure
    r.ok = true;
    r.detail = "skipped: backend " + std::string(backend_name(kernel.backend)) + " unavailable: " + avail.message();
    return r;
  }
  Outputs got(c.T(), c.k);
  Status sup;
  const Status s = invoke(op, c, &got, kernel, &sup);
  if (!s.ok()) {
    r.detail = s.to_string();
    return r;
  }
  if (!sup.ok()) {  // a kernel may refuse a problem (SPEC 3.6); that is not a failure
    r.ok = true;
    r.detail = "skipped: kernel refuses the problem: " + sup.message();
    return r;
  }
  if (c.T() == 0) {
    r.ok = got.untouched();
    r.detail = r.ok ? "T=0: returned ok, outputs untouched" : "T=0: an output was written";
    return r;
  }
  RoutingExpect exp;
  if (is_ref) {
    exp = oracle(op, c);
  } else {
    const Kernel* ref = registry().find(std::string(op_name(op)) + "_ref");
    Outputs want(c.T(), c.k);
    const Status rs = ref ? invoke(op, c, &want, *ref) : Internal("no ", op_name(op), "_ref kernel");
    if (!rs.ok()) {
      r.detail = "reference run failed: " + rs.to_string();
      return r;
    }
    exp.T = c.T();
    exp.k = c.k;
    exp.ids = to_ints(want.ids.view);
    exp.weights = to_doubles(want.weights.view);
    if (c.with_tei && op == OpKind::topk_softmax) exp.token_expert_indices = to_ints(want.tei.view);
  }
  const std::vector<int64_t> dims = {c.T(), c.k};
  const Metrics ids = compare_exact(to_ints(got.ids.view), exp.ids, dims);
  Metrics tei;
  if (!exp.token_expert_indices.empty()) tei = compare_exact(to_ints(got.tei.view), exp.token_expert_indices, dims);
  r.metrics = compare_close(to_doubles(got.weights.view), exp.weights, kWeightAtol, kWeightRtol, dims);
  const int64_t weight_bad = r.metrics.mismatches;
  r.metrics.count += ids.count + tei.count;
  r.metrics.mismatches += ids.mismatches + tei.mismatches;
  std::ostringstream detail;
  detail << tolerance_text();
  if (ids.mismatches) detail << "; topk_ids: " << ids.mismatches << " wrong, " << ids.worst;
  if (tei.mismatches) detail << "; token_expert_indices: " << tei.mismatches << " wrong, " << tei.worst;
  if (weight_bad) detail << "; topk_weights: " << weight_bad << " outside tolerance, worst " << r.metrics.worst;
  if (ids.mismatches) r.metrics.worst = "topk_ids " + ids.worst;
  r.ok = r.metrics.mismatches == 0 && r.metrics.finite;
  r.detail = detail.str();
  return r;
}

// ---------------------------------------------------------------- case builders
RoutingCase random_case(OpKind op, std::string name, Rng& rng, int64_t T, int64_t E, int k, DType dtype,
                        float grid = 1.0f / 256, int64_t row_stride = 0) {
  RoutingCase c;
  c.name = std::move(name);
  c.k = k;
  c.gating = random_logits(rng, T, E, dtype, 2.0f, grid, row_stride, certifier(op, c));
  return c;
}

// A case with grouping and scoring settings, then random logits certified for them.
RoutingCase random_grouped(std::string name, Rng& rng, int64_t T, int64_t E, int k, int n_group, int topk_group,
                           Scoring scoring, bool bias, bool renormalize, float rsf, DType dtype,
                           float grid = 1.0f / 256, int64_t row_stride = 0) {
  RoutingCase c;
  c.name = std::move(name);
  c.k = k;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.scoring = scoring;
  c.has_bias = bias;
  if (bias) c.bias = random_bias(rng, E);
  c.renormalize = renormalize;
  c.rsf = rsf;
  c.gating = random_logits(rng, T, E, dtype, 2.0f, grid, row_stride, certifier(OpKind::grouped_topk, c));
  return c;
}

// Rows with NaN / +-inf logits (E = 8), shared by the three ops' edge cases.
std::vector<std::vector<float>> nonfinite_rows() {
  return {
      {0.5f, kNaN, 2.0f, -1.0f, kNaN, 3.0f, 0.0f, kNaN},       // NaN among finite
      {kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN},         // all NaN
      {-kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf},  // all -inf
      {1.0f, kInf, 2.0f, kNaN, kInf, -kInf, 0.0f, 5.0f},        // two +inf share the mass
      {kNaN, -kInf, 1.0f, kNaN, -kInf, -2.0f, kNaN, -kInf},     // fewer finite than k may need
      {kInf, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN},         // one +inf, rest NaN
  };
}

std::vector<RoutingCase> softmax_edge_cases(uint64_t seed) {
  Rng rng(seed);
  const OpKind op = OpKind::topk_softmax;
  std::vector<RoutingCase> v;
  v.push_back(random_case(op, "edge:T=0", rng, 0, 8, 2, DType::bf16));
  v.push_back(random_case(op, "edge:T=1", rng, 1, 8, 2, DType::bf16));
  v.push_back(random_case(op, "edge:k=1", rng, 5, 16, 1, DType::f32));
  v.push_back(random_case(op, "edge:k=E=6", rng, 4, 6, 6, DType::f32));
  v.push_back(random_case(op, "edge:E=257 (not a power of two)", rng, 5, 257, 5, DType::bf16));
  v.push_back(random_case(op, "edge:E=60>T=3", rng, 3, 60, 4, DType::f32));
  v.push_back(random_case(op, "edge:ties (logits on a 0.5 grid)", rng, 16, 32, 6, DType::bf16, 0.5f));
  v.push_back(random_case(op, "edge:row-strided (stride E+13)", rng, 9, 40, 3, DType::f32, 1.0f / 256, 53));
  v.push_back(random_case(op, "edge:f16 gating", rng, 7, 24, 4, DType::f16));
  RoutingCase one = random_case(op, "edge:all tokens prefer expert 5", rng, 12, 10, 2, DType::f32);
  for (int64_t t = 0; t < one.T(); ++t) one.gating.set(t * 10 + 5, 20.0f);
  v.push_back(std::move(one));
  for (size_t i = 0; i < v.size(); ++i) v[i].renormalize = i % 2 == 0;  // both settings appear
  RoutingCase nf;
  nf.name = "edge:NaN/+-inf logits, all-NaN and all--inf rows";
  nf.gating = logits_from_rows(nonfinite_rows());
  nf.k = 3;
  nf.renormalize = true;
  v.push_back(nf);
  nf.name = "edge:NaN/+-inf logits, bf16, no renormalize";
  nf.gating = logits_from_rows(nonfinite_rows(), DType::bf16);
  nf.renormalize = false;
  v.push_back(nf);
  for (RoutingCase& c : v) c.with_tei = true;
  RoutingCase no_tei = random_case(op, "edge:token_expert_indices absent", rng, 6, 12, 3, DType::f32);
  no_tei.renormalize = true;
  v.push_back(std::move(no_tei));
  return v;
}

std::vector<RoutingCase> grouped_edge_cases(uint64_t seed) {
  Rng rng(seed);
  const Scoring sg = Scoring::sigmoid, sm = Scoring::softmax;
  std::vector<RoutingCase> v;
  v.push_back(random_grouped("edge:T=0", rng, 0, 256, 8, 8, 4, sg, true, true, 2.5f, DType::bf16));
  v.push_back(random_grouped("edge:T=1 deepseek-v3 routing", rng, 1, 256, 8, 8, 4, sg, true, true, 2.5f, DType::bf16));
  v.push_back(random_grouped("edge:k=1", rng, 5, 64, 1, 4, 2, sg, true, false, 1.0f, DType::f32));
  v.push_back(random_grouped("edge:k=topk_group*G (max)", rng, 5, 32, 16, 4, 2, sm, false, true, 1.0f, DType::f32));
  v.push_back(random_grouped("edge:E=6 n_group=3 (not a power of two)", rng, 6, 6, 3, 3, 2, sg, true, true, 2.5f,
                             DType::f32));
  v.push_back(random_grouped("edge:E=60 n_group=4 G=15", rng, 4, 60, 6, 4, 3, sm, true, false, 1.5f, DType::bf16));
  v.push_back(random_grouped("edge:group size 1 with bias", rng, 6, 8, 2, 8, 4, sg, true, true, 2.5f, DType::f32));
  v.push_back(random_grouped("edge:n_group=1 (plain top-k)", rng, 5, 24, 4, 1, 1, sm, false, false, 1.0f, DType::f32));
  v.push_back(random_grouped("edge:E=96>T=3", rng, 3, 96, 6, 8, 3, sg, false, true, 1.0f, DType::bf16));
  v.push_back(random_grouped("edge:ties (logits on a 0.5 grid)", rng, 16, 64, 6, 8, 4, sg, true, true, 2.5f,
                             DType::bf16, 0.5f));
  v.push_back(random_grouped("edge:row-strided (stride E+7)", rng, 7, 32, 4, 4, 2, sg, true, true, 2.5f, DType::f32,
                             1.0f / 256, 39));
  v.push_back(random_grouped("edge:f16 gating softmax", rng, 7, 32, 4, 4, 2, sm, false, true, 1.0f, DType::f16));
  // Kept experts all have negative biased scores: a masked group scored 0 instead of -inf would win.
  RoutingCase neg;
  neg.name = "edge:masked group is -inf, not 0 (negative biased scores)";
  neg.gating = logits_from_rows({{0.1f, 0.2f, 0.3f, 0.4f, 9.0f, 9.0f, 9.0f, 9.0f}});
  neg.bias = Buffer(DType::f32, {8});
  for (int e = 0; e < 8; ++e) neg.bias.set(e, e < 4 ? -2.0f : -4.0f);
  neg.has_bias = true;
  neg.k = 2;
  neg.n_group = 2;
  neg.topk_group = 1;
  neg.scoring = sg;
  v.push_back(neg);
  // Without bias: a kept group's -inf logits score exactly 0; masked experts (lower ids) must not
  // win that tie.
  RoutingCase zero;
  zero.name = "edge:masked group is -inf, not 0 (zero scores in the kept group)";
  zero.gating = logits_from_rows({{-kInf, -kInf, -kInf, -kInf, 5.0f, -kInf, -kInf, -kInf}});
  zero.k = 3;
  zero.n_group = 2;
  zero.topk_group = 1;
  zero.scoring = sm;
  v.push_back(zero);
  for (Scoring sc : {sm, sg}) {
    RoutingCase nf;
    nf.name = std::string("edge:NaN/+-inf logits, ") + scoring_name(sc) + " with bias";
    nf.gating = logits_from_rows(nonfinite_rows(), sc == sm ? DType::f32 : DType::bf16);
    nf.bias = random_bias(rng, 8);
    nf.has_bias = true;
    nf.k = 3;
    nf.n_group = 4;
    nf.topk_group = 2;
    nf.scoring = sc;
    nf.renormalize = true;
    nf.rsf = 2.5f;
    v.push_back(nf);
    nf.name = std::string("edge:NaN/+-inf logits, ") + scoring_name(sc) + " without bias";
    nf.has_bias = false;
    nf.renormalize = false;
    v.push_back(nf);
  }
  return v;
}

std::vector<RoutingCase> sigmoid_edge_cases(uint64_t seed) {
  Rng rng(seed);
  const OpKind op = OpKind::sigmoid_topk;
  std::vector<RoutingCase> v;
  v.push_back(random_case(op, "edge:T=0", rng, 0, 128, 1, DType::bf16));
  v.push_back(random_case(op, "edge:T=1 llama4 routing", rng, 1, 128, 1, DType::bf16));
  v.push_back(random_case(op, "edge:k=E=6", rng, 4, 6, 6, DType::f32));
  v.push_back(random_case(op, "edge:E=257 (not a power of two)", rng, 5, 257, 3, DType::bf16));
  v.push_back(random_case(op, "edge:E=60>T=3", rng, 3, 60, 2, DType::f32));
  v.push_back(random_case(op, "edge:ties (logits on a 0.5 grid)", rng, 16, 32, 4, DType::bf16, 0.5f));
  v.push_back(random_case(op, "edge:row-strided (stride E+3)", rng, 9, 16, 2, DType::f32, 1.0f / 256, 19));
  v.push_back(random_case(op, "edge:f16 gating", rng, 7, 24, 1, DType::f16));
  RoutingCase one = random_case(op, "edge:all tokens prefer expert 3", rng, 12, 10, 1, DType::f32);
  for (int64_t t = 0; t < one.T(); ++t) one.gating.set(t * 10 + 3, 20.0f);
  v.push_back(std::move(one));
  RoutingCase nf;
  nf.name = "edge:NaN/+-inf logits, all-NaN and all--inf rows";
  nf.gating = logits_from_rows(nonfinite_rows());
  nf.k = 3;
  v.push_back(nf);
  return v;
}

// Grouping for a shape: the preset's when it routes with grouped_topk, else the largest of
// 8, 4, 2, 1 groups dividing E with enough groups kept for k (at least half of them).
void pick_grouping(const MoeShape& s, int* n_group, int* topk_group) {
  if (s.routing == Routing::grouped_topk) {
    *n_group = s.n_group;
    *topk_group = s.topk_group;
    return;
  }
  int g = 1;
  for (int cand : {8, 4, 2}) {
    if (s.E % cand == 0) {
      g = cand;
      break;
    }
  }
  const int64_t group_size = s.E / g;
  const int64_t need = (s.k + group_size - 1) / group_size;
  *n_group = g;
  *topk_group = int(std::min<int64_t>(g, std::max<int64_t>(need, std::max(1, g / 2))));
}

std::vector<int64_t> token_counts(const CheckRequest& req) {
  return req.tokens.empty() ? std::vector<int64_t>{1, 7, 64} : req.tokens;
}

std::string dtype_label(DType d) { return dtype_name(d); }

std::vector<RoutingCase> shape_cases(OpKind op, const CheckRequest& req, Status* st) {
  std::vector<RoutingCase> v;
  Rng rng(req.shape.seed);
  for (int64_t T : token_counts(req)) {
    MoeShape s;
    *st = resolve_shape(req.shape, T, &s);
    if (!st->ok()) return {};
    const std::string base = s.label + " T=" + std::to_string(T) + " ";
    for (DType dt : {DType::bf16, DType::f32}) {
      if (op == OpKind::grouped_topk) {
        int n_group = 1, topk_group = 1;
        pick_grouping(s, &n_group, &topk_group);
        const std::string grouping = " groups " + std::to_string(topk_group) + "/" + std::to_string(n_group);
        const bool preset_grouped = s.routing == Routing::grouped_topk;
        v.push_back(random_grouped(base + dtype_label(dt) + " sigmoid+bias" + grouping, rng, T, s.E, int(s.k),
                                   n_group, topk_group, Scoring::sigmoid, true, s.renormalize,
                                   preset_grouped ? s.rsf : 2.5f, dt));
        v.push_back(random_grouped(base + dtype_label(dt) + " softmax" + grouping, rng, T, s.E, int(s.k), n_group,
                                   topk_group, Scoring::softmax, false, !s.renormalize, 1.0f, dt));
      } else {
        RoutingCase c;
        c.k = int(s.k);
        c.renormalize = s.renormalize;
        c.with_tei = dt == DType::bf16;
        c.name = base + dtype_label(dt);
        c.gating = random_logits(rng, T, s.E, dt, 2.0f, 1.0f / 256, 0, certifier(op, c));
        v.push_back(std::move(c));
      }
    }
  }
  return v;
}

// "[T=6 E=8 k=3 f32 groups 2/4 sigmoid+bias renorm rsf=2.5]": the problem behind an edge-case label.
std::string describe(OpKind op, const RoutingCase& c) {
  std::ostringstream os;
  os << "[T=" << c.T() << " E=" << c.E() << " k=" << c.k << ' ' << dtype_name(c.gating.view.dtype);
  if (c.T() > 1 && c.gating.view.stride[0] != c.E()) os << " row stride " << c.gating.view.stride[0];
  if (op == OpKind::grouped_topk) {
    os << " groups " << c.topk_group << '/' << c.n_group << ' ' << scoring_name(c.scoring) << (c.has_bias ? "+bias" : "")
       << " rsf=" << c.rsf;
  }
  if (op != OpKind::sigmoid_topk && c.renormalize) os << " renorm";
  os << ']';
  return os.str();
}

std::vector<CaseResult> check_op(OpKind op, const CheckRequest& req) {
  std::vector<RoutingCase> cases;
  if (req.edge_cases) {
    const uint64_t seed = req.shape.seed;
    cases = op == OpKind::topk_softmax   ? softmax_edge_cases(seed)
            : op == OpKind::grouped_topk ? grouped_edge_cases(seed)
                                         : sigmoid_edge_cases(seed);
  }
  for (RoutingCase& c : cases) c.name += " " + describe(op, c);
  Status st;
  std::vector<RoutingCase> shaped = shape_cases(op, req, &st);
  std::vector<CaseResult> out;
  if (!st.ok()) {
    CaseResult r;
    r.op = op_name(op);
    r.name = "shape";
    r.detail = st.to_string();
    out.push_back(r);
  }
  for (RoutingCase& c : shaped) cases.push_back(std::move(c));
  for (const Kernel* k : kernels_to_check(op, req)) {
    for (const RoutingCase& c : cases) out.push_back(run_case(op, c, *k));
  }
  return out;
}

// ---------------------------------------------------------------- bench
// One routing problem with bf16 logits, mirrored once to the kernel's device; run() calls the op
// once on the chosen kernel and, for a device kernel, waits for it (DeviceOps::synchronize) so host
// timing covers the work.
struct RoutingBench : BenchProblem {
  OpKind op = OpKind::topk_softmax;
  RoutingCase c;
  std::unique_ptr<Outputs> out;
  const Kernel* kernel = nullptr;
  std::unique_ptr<DeviceMirror> mirror;  // owns the device copies the params point at
  MirroredParams params;
  Status run() override {
    MOEKIT_RETURN_IF_ERROR(call_op(op, params, kernel->name));
    const DeviceOps* ops = registry().device_ops(kernel->backend);
    return ops ? ops->synchronize() : Status::Ok();
  }
};

Status prepare_bench(OpKind op, const BenchRequest& req, int64_t tokens, const Kernel& k,
                     std::unique_ptr<BenchProblem>* result) {
  MOEKIT_RETURN_IF_ERROR(registry().backend_available(k.backend));
  MoeShape s;
  MOEKIT_RETURN_IF_ERROR(resolve_shape(req.shape, tokens, &s));
  auto b = std::make_unique<RoutingBench>();
  b->op = op;
  b->kernel = &k;
  Rng rng(req.shape.seed);
  RoutingCase& c = b->c;
  c.k = int(s.k);
  c.renormalize = s.renormalize;
  c.with_tei = true;
  c.gating = random_logits(rng, tokens, s.E, DType::bf16, 2.0f, 1.0f / 256);
  const double T = double(tokens), E = double(s.E), K = double(s.k);
  std::ostringstream shape;
  shape << "T=" << tokens << " E=" << s.E << " k=" << s.k << " bf16";
  // flops: elementwise score math only (comparisons are not counted): softmax ~4 per logit (max,
  // exp, sum, divide); sigmoid + bias ~5 per logit; sigmoid_topk ~4 per pick.
  // bytes: the logits read once, the outputs written once.
  double out_bytes = T * K * 8.0;
  if (op == OpKind::topk_softmax) {
    b->flops = 4.0 * T * E;
    out_bytes += T * K * 4.0;  // token_expert_indices
  } else if (op == OpKind::grouped_topk) {
    pick_grouping(s, &c.n_group, &c.topk_group);
    c.scoring = Scoring::sigmoid;
    c.has_bias = true;
    c.bias = random_bias(rng, s.E);
    c.rsf = s.routing == Routing::grouped_topk ? s.rsf : 1.0f;
    shape << " groups " << c.topk_group << "/" << c.n_group << " sigmoid+bias";
    b->flops = 5.0 * T * E;
    out_bytes += E * 4.0;  // the bias
  } else {
    b->flops = 4.0 * T * K;
  }
  b->bytes = T * E * 2.0 + out_bytes;
  b->shape = shape.str();
  b->out = std::make_unique<Outputs>(tokens, s.k);
  b->mirror = std::make_unique<DeviceMirror>(k.backend);
  MOEKIT_RETURN_IF_ERROR(mirror_params(op, b->c, b->out.get(), *b->mirror, &b->params));
  *result = std::move(b);
  return Status::Ok();
}

}  // namespace

std::vector<CaseResult> check_topk_softmax(const CheckRequest& req) { return check_op(OpKind::topk_softmax, req); }
std::vector<CaseResult> check_grouped_topk(const CheckRequest& req) { return check_op(OpKind::grouped_topk, req); }
std::vector<CaseResult> check_sigmoid_topk(const CheckRequest& req) { return check_op(OpKind::sigmoid_topk, req); }

Status bench_topk_softmax(const BenchRequest& req, int64_t tokens, const Kernel& k,
                          std::unique_ptr<BenchProblem>* out) {
  return prepare_bench(OpKind::topk_softmax, req, tokens, k, out);
}
Status bench_grouped_topk(const BenchRequest& req, int64_t tokens, const Kernel& k,
                          std::unique_ptr<BenchProblem>* out) {
  return prepare_bench(OpKind::grouped_topk, req, tokens, k, out);
}
Status bench_sigmoid_topk(const BenchRequest& req, int64_t tokens, const Kernel& k,
                          std::unique_ptr<BenchProblem>* out) {
  return prepare_bench(OpKind::sigmoid_topk, req, tokens, k, out);
}

}  // namespace moekit::testing
