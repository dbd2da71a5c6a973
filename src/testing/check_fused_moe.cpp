// Harness hooks of fused_moe (src/testing/harness.h): check_fused_moe and bench_fused_moe.
//
// check: the named edge cases (small shapes, in the requested scheme / activation) and the
// requested shape for each token count (default {1, 5, 32}); every case runs each fused_moe kernel
// of the problem's variant: the ref kernel against the float64 oracle, every other kernel against
// the ref kernel, with the bounds of kMoeTolerances (docs/tolerances.md). Outputs are poisoned
// with NaN bytes before each run so an unwritten row fails. A kernel that refuses a problem
// (status unsupported) is reported ok with "skipped: <reason>". Kernels of a device backend run on
// device copies of the problem (DeviceMirror) with device workspace; when that backend is
// unavailable (e.g. no GPU) their cases are reported ok with "skipped: backend unavailable".
// Packed weights: after each bf16/f16 row_major case, every non-ref kernel also runs on the weights
// packed by pack_weight (cpu_vnni2_n32) against the ref kernel's output on the row_major weights
// (case name "... weights cpu_vnni2_n32 (packed)"; kernels that refuse packed weights: skipped).
// bench: one problem of the requested shape; flops = 2*T*k*H*N1 + 2*T*k*I*H, bytes = the weights
// and scales of the experts actually touched + x + out. For device kernels (cuda) the problem is
// made resident on the device in up to 4 rotating input sets (BenchProblem::launch, sets) and also
// offers the unfused cuBLAS baseline (BenchProblem::baseline); docs/cli.md says how both are timed.
// CPU kernels that accept packed weights are timed on weights packed once at setup (unless
// BenchRequest::row_major_weights); the shape line then says so.
// Tests: tests/test_fused_moe.cpp and tests/test_fused_moe_fp8.cpp call check_fused_moe.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "moekit/ops/layout.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit::testing {

Status mirror_fused_moe(DeviceMirror& dev, FusedMoeParams* p) {
  for (TensorView* t : {&p->x, &p->w1, &p->w2, &p->topk_ids, &p->topk_weights, &p->w1_scale, &p->w2_scale,
                        &p->a1_scale, &p->expert_mask, &p->expert_map}) {
    MOEKIT_RETURN_IF_ERROR(dev.input(t));
  }
  return dev.output(&p->out);
}

namespace {

const std::vector<int64_t> kDefaultTokens = {1, 5, 32};

bool is_fp8_scheme(Scheme s) {
  return s == Scheme::fp8_tensor || s == Scheme::fp8_channel || s == Scheme::fp8_block;
}

const Kernel* ref_kernel(MoeVariant v) {
  for (const Kernel* k : registry().candidates(OpKind::fused_moe, v)) {
    if (k->backend == Backend::ref) return k;
  }
  return nullptr;
}

CaseResult make_result(const Kernel* k, const std::string& name, const std::string& config = "") {
  CaseResult r;
  r.op = op_name(OpKind::fused_moe);
  r.kernel = k ? kernel_config_label(k->name, config) : "-";
  r.backend = k ? backend_name(k->backend) : "-";
  r.name = name;
  return r;
}

// Runs kernel k on the problem into its (poisoned) out; returns the status. Kernels of a device
// backend get device copies of every tensor (DeviceMirror) and device workspace of the size
// fused_moe_workspace_size reports; out is copied back after the run.
Status run_kernel(MoeProblem& prob, const Kernel& k, const std::string& config = "") {
  prob.out.fill_bytes(0xFF);  // NaN in bf16 / f16 / f32: rows a kernel forgets to write fail
  RunOptions opts;
  opts.kernel = k.name;
  opts.config = config.empty() ? nullptr : config.c_str();
  FusedMoeParams p = prob.params();
  DeviceMirror dev(k.backend);
  if (!dev.on_device()) return fused_moe(p, opts);
  MOEKIT_RETURN_IF_ERROR(mirror_fused_moe(dev, &p));
  size_t ws = 0;
  MOEKIT_RETURN_IF_ERROR(fused_moe_workspace_size(p, opts, &ws));
  MOEKIT_RETURN_IF_ERROR(dev.scratch(ws, &opts.workspace));
  opts.workspace_bytes = ws;
  MOEKIT_RETURN_IF_ERROR(fused_moe(p, opts));
  return dev.copy_back();
}

// The configs kernel k can run for the problem (fused_moe_configs on device copies for device
// kernels); empty when it refuses the problem.
std::vector<std::string> configs_of(MoeProblem& prob, const Kernel& k) {
  std::vector<std::string> names;
  RunOptions opts;
  opts.kernel = k.name;
  FusedMoeParams p = prob.params();
  DeviceMirror dev(k.backend);
  if (dev.on_device() && !mirror_fused_moe(dev, &p).ok()) return names;
  if (!fused_moe_configs(p, opts, &names).ok()) names.clear();
  return names;
}

// One run of a case: kernel k by its rules (config empty) or with an explicit config.
struct KernelRun {
  const Kernel* k;
  std::string config;
};

// The runs of a case: every kernel of the variant by its rules, and the variant's first kernel that
// takes configs also with each of `configs` (CheckRequest::configs; {"all"}: all it can run).
std::vector<KernelRun> runs_of(MoeProblem& prob, MoeVariant variant, const std::vector<const Kernel*>& kernels,
                               const std::vector<std::string>& configs) {
  std::vector<KernelRun> runs;
  bool expanded = configs.empty();
  for (const Kernel* k : kernels) {
    if (!k->serves(variant)) continue;
    runs.push_back({k, ""});
    if (expanded || k->configs == nullptr) continue;
    expanded = true;
    const bool all = configs.size() == 1 && configs[0] == "all";
    if (all && !registry().backend_available(k->backend).ok()) continue;  // the rules' run reports it
    for (const std::string& c : all ? configs_of(prob, *k) : configs) runs.push_back({k, c});
  }
  return runs;
}

// Every kernel of the problem's variant on one case.
void run_case(MoeProblem& prob, const std::string& name, const std::vector<const Kernel*>& kernels,
              const std::vector<std::string>& configs, std::vector<CaseResult>* results) {
  const FusedMoeParams p0 = prob.params();
  const MoeVariant variant = fused_moe_variant(p0);
  const int64_t T = prob.shape.T, H = prob.shape.H;
  std::vector<double> oracle, ref_out;
  bool have_ref = false;
  Status ref_status;
  int ran = 0;
  for (const KernelRun& run : runs_of(prob, variant, kernels, configs)) {
    const Kernel* k = run.k;
    ++ran;
    CaseResult r = make_result(k, name, run.config);
    const bool is_ref = k->backend == Backend::ref;
    r.reference = is_ref ? "oracle" : "ref";
    const Status avail = registry().backend_available(k->backend);
    if (!avail.ok()) {  // e.g. no CUDA device on this machine: reported, never a failure
      r.ok = true;
      r.detail = "skipped: backend unavailable: " + avail.message();
      results->push_back(r);
      continue;
    }
    if (T == 0) {  // contract: returns at once and writes nothing
      prob.out.fill_bytes(0xAB);
      const std::vector<unsigned char> before = prob.out.bytes;
      RunOptions opts;
      opts.kernel = k->name;
      opts.config = run.config.empty() ? nullptr : run.config.c_str();
      const Status st = fused_moe(prob.params(), opts);
      r.ok = st.ok() && prob.out.bytes == before;
      r.detail = !st.ok() ? st.to_string() : (r.ok ? "T=0: ok, out untouched" : "T=0: out was written");
      results->push_back(r);
      continue;
    }
    std::vector<double> expected;
    if (is_ref) {
      if (oracle.empty()) oracle = oracle_fused_moe(p0);
      expected = oracle;
    } else {
      if (!have_ref) {
        const Kernel* rk = ref_kernel(variant);
        ref_status = rk ? run_kernel(prob, *rk) : Internal("no reference kernel for ", variant_name(variant));
        if (ref_status.ok()) ref_out = read_out(prob.params().out);
        have_ref = true;
      }
      if (!ref_status.ok()) {
        r.detail = "reference kernel failed: " + ref_status.to_string();
        results->push_back(r);
        continue;
      }
      expected = ref_out;
    }
    const Status st = run_kernel(prob, *k, run.config);
    if (st.code() == StatusCode::unsupported) {
      r.ok = true;
      r.detail = "skipped: " + st.message();
      results->push_back(r);
      continue;
    }
    if (!st.ok()) {
      r.detail = st.to_string();
      results->push_back(r);
      continue;
    }
    const std::vector<double> actual = read_out(prob.params().out);
    const MoeTolerance& tol =
        moe_tolerance(variant, prob.x_dtype, is_ref ? MoeCompare::ref_vs_oracle : MoeCompare::kernel_vs_ref);
    r.ok = judge_moe(actual, expected, T, H, tol, &r.metrics, &r.detail);
    if (is_ref && variant != MoeVariant::unquantized) {
      // fp8: also against the oracle that emulates the activation quantization (pins the recipe).
      OracleOptions emu;
      emu.emulate_fp8_activations = true;
      Metrics m;
      std::string detail;
      const bool ok = judge_moe(actual, oracle_fused_moe(p0, emu), T, H,
                                moe_tolerance(variant, prob.x_dtype, MoeCompare::ref_vs_emulation), &m, &detail);
      r.ok = r.ok && ok;
      r.detail = "oracle: " + r.detail + "; emulated-quant oracle: " + detail;
    }
    results->push_back(r);
  }
  if (ran == 0) {  // e.g. --backend cpu with no cpu kernel of this variant: say so, do not hide it
    CaseResult r = make_result(nullptr, name);
    r.ok = true;
    r.detail = std::string("skipped: no kernel of variant ") + variant_name(variant) + " among the kernels checked";
    results->push_back(r);
  }
}

// A named edge case: a small shape plus generator options and an optional edit of the routing.
struct EdgeCase {
  std::string name;
  MoeShape shape;
  MoeProblemOptions opts;
  void (*edit)(MoeProblem*);
};

void edit_all_to_one(MoeProblem* p) {
  int32_t* ids = p->topk_ids.data<int32_t>();
  for (int64_t i = 0; i < p->topk_ids.numel(); ++i) ids[i] = 2;
}

void edit_minus_one(MoeProblem* p) {
  int32_t* ids = p->topk_ids.data<int32_t>();
  const int64_t k = p->shape.k;
  for (int64_t i = 0; i < p->topk_ids.numel(); ++i) {
    if (i % 3 == 1 || i / k == 0) ids[i] = -1;  // token 0: no expert at all -> zero row
  }
}

std::vector<EdgeCase> edge_cases(const MoeShape& base) {
  // Small problem in the requested scheme: E = 6 (not a power of two), H = 96 and I = 64 (not
  // multiples of 128; fp8_block gets partial blocks), k = 2.
  // With weight_on_input requested every case keeps it, and k = 1 (its contract).
  const bool on_input = base.weight_on_input;
  MoeShape s = base;
  s.label = "edge";
  s.E = 6;
  s.k = on_input ? 1 : 2;
  s.H = 96;
  s.I = 64;
  s.T = 7;
  s.renormalize = true;
  s.rsf = 1.0f;
  std::vector<EdgeCase> v;
  auto add = [&](const std::string& name, MoeShape sh, MoeProblemOptions o = {}, void (*edit)(MoeProblem*) = nullptr) {
    v.push_back(EdgeCase{"edge:" + name, sh, o, edit});
  };
  MoeShape t0 = s;
  t0.T = 0;
  add("T=0", t0);
  MoeShape t1 = s;
  t1.T = 1;
  add("T=1", t1);
  MoeShape k1 = s;
  k1.k = 1;
  add("k=1", k1);
  if (!on_input) {
    MoeShape kE = s;
    kE.k = s.E;
    add("k=E", kE);
  }
  MoeShape eGtT = s;
  eGtT.T = 3;
  add("E>T", eGtT);
  MoeShape one = s;
  one.k = 1;
  add("all tokens to expert 2", one, {}, edit_all_to_one);
  add("-1 ids (token 0 has none)", s, {}, edit_minus_one);
  MoeShape ep = s;
  ep.E = 8;
  MoeProblemOptions mask;
  mask.local_experts = 3;
  mask.ep = ExpertParallel::mask;
  add("expert_mask (3 of 8 local)", ep, mask);
  MoeProblemOptions map = mask;
  map.ep = ExpertParallel::map;
  add("expert_map (3 of 8 local)", ep, map);
  MoeShape odd = s;
  odd.H = 200;
  odd.I = 72;
  add("H=200 I=72", odd);
  MoeProblemOptions g1u0;
  g1u0.g1u1 = false;
  add("g1u0", s, g1u0);
  MoeProblemOptions shuf;
  shuf.shuffled = true;
  add("shuffled_16x16 weights", s, shuf);
  MoeProblemOptions pad;
  pad.row_pad = 5;
  add("row-strided x/out", s, pad);
  MoeShape woi = s;
  woi.k = 1;
  woi.weight_on_input = true;
  add("weight_on_input", woi);
  if (!is_fp8_scheme(s.scheme)) {
    MoeProblemOptions nr;
    nr.round_intermediate = false;
    add("round_intermediate=false", s, nr);
  } else if (s.scheme != Scheme::fp8_block) {
    MoeProblemOptions st;
    st.static_a1_scale = true;
    add("static a1_scale", s, st);
  }
  return v;
}

std::string scheme_label(const MoeShape& s) {
  std::ostringstream os;
  os << scheme_name(s.scheme) << ' ' << activation_name(s.activation);
  if (s.weight_on_input) os << " weight_on_input";
  return os.str();
}

}  // namespace

Status pack_moe_weights(MoeProblem* p) {
  Buffer packed[2];
  Buffer* w[2] = {&p->w1, &p->w2};
  for (int i = 0; i < 2; ++i) {
    const TensorView& v = w[i]->view;
    packed[i] = Buffer(v.dtype, std::vector<int64_t>(v.shape, v.shape + v.ndim));
    packed[i].view.layout = Layout::cpu_vnni2_n32;
    MOEKIT_RETURN_IF_ERROR(validate_pack_weight({v, packed[i].view}, /*inverse=*/false));
  }
  for (int i = 0; i < 2; ++i) {
    MOEKIT_RETURN_IF_ERROR(pack_weight({w[i]->view, packed[i].view}));
    *w[i] = std::move(packed[i]);
  }
  return Status::Ok();
}

namespace {

// The packed-weights case of one problem (bf16 / f16 weights, or fp8 per-row / per-tensor weights,
// whose shape packs): the ref kernel on
// the row_major weights is the reference; then the weights are packed (cpu_vnni2_n32) and every
// non-ref kernel of the variant runs on them. Kernels that refuse packed weights are reported as
// skipped; with only the ref kernel checked there is no packed case (tests/test_pack_weight.cpp
// pins the ref kernel on packed weights).
void run_packed_case(MoeProblem& prob, const std::string& name, const std::vector<const Kernel*>& kernels,
                     std::vector<CaseResult>* results) {
  const FusedMoeParams p0 = prob.params();
  const MoeVariant variant = fused_moe_variant(p0);
  const int64_t T = prob.shape.T, H = prob.shape.H;
  // bf16 / f16 weights of the unquantized variant, or fp8 weights of the per-row variants.
  const bool packs = (variant == MoeVariant::unquantized && dtype_size(p0.w1.dtype) == 2) ||
                     ((variant == MoeVariant::fp8_row || variant == MoeVariant::fp8_row_tkw1) && is_fp8(p0.w1.dtype));
  if (!packs || T == 0 || p0.w1.layout != Layout::row_major) return;
  if (p0.w1.shape[1] % kVnniPanelN != 0 || H % kVnniPanelN != 0) return;
  const Kernel* rk = ref_kernel(variant);
  const bool any = std::any_of(kernels.begin(), kernels.end(),
                               [&](const Kernel* k) { return k->serves(variant) && k->backend != Backend::ref; });
  if (rk == nullptr || !any) return;
  const std::string case_name = name + " weights cpu_vnni2_n32 (packed)";
  const Status rs = run_kernel(prob, *rk);  // reference: the row_major weights
  const std::vector<double> ref_out = rs.ok() ? read_out(prob.params().out) : std::vector<double>();
  const Status ps = rs.ok() ? pack_moe_weights(&prob) : rs;
  for (const Kernel* k : kernels) {
    if (!k->serves(variant) || k->backend == Backend::ref) continue;
    CaseResult r = make_result(k, case_name);
    r.reference = "ref (row_major weights)";
    if (!ps.ok()) {
      r.detail = "setup failed: " + ps.to_string();
      results->push_back(r);
      continue;
    }
    const Status avail = registry().backend_available(k->backend);
    const Status st = avail.ok() ? run_kernel(prob, *k) : avail;
    if (!avail.ok() || st.code() == StatusCode::unsupported) {
      r.ok = true;
      r.detail = "skipped: " + st.message();
    } else if (!st.ok()) {
      r.detail = st.to_string();
    } else {
      r.ok = judge_moe(read_out(prob.params().out), ref_out, T, H,
                       moe_tolerance(variant, prob.x_dtype, MoeCompare::kernel_vs_ref), &r.metrics, &r.detail);
    }
    results->push_back(r);
  }
}

}  // namespace

std::vector<CaseResult> check_fused_moe(const CheckRequest& req) {
  std::vector<CaseResult> results;
  const std::vector<const Kernel*> kernels = kernels_to_check(OpKind::fused_moe, req);
  if (req.edge_cases) {
    MoeShape base;
    const Status st = resolve_shape(req.shape, 1, &base);
    if (!st.ok()) {
      CaseResult r = make_result(nullptr, "edge cases");
      r.detail = st.to_string();
      results.push_back(r);
    } else {
      for (EdgeCase& ec : edge_cases(base)) {
        MoeProblem prob;
        Status gs = make_moe_problem(ec.shape, ec.opts, req.shape.seed, &prob);
        if (gs.ok() && ec.edit) {
          ec.edit(&prob);
          update_touched(&prob);
        }
        if (!gs.ok()) {
          CaseResult r = make_result(nullptr, ec.name);
          r.detail = gs.to_string();
          results.push_back(r);
          continue;
        }
        run_case(prob, ec.name + " " + scheme_label(ec.shape), kernels, req.configs, &results);
        run_packed_case(prob, ec.name + " " + scheme_label(ec.shape), kernels, &results);  // packs prob's weights
      }
    }
  }
  const std::vector<int64_t>& tokens = req.tokens.empty() ? kDefaultTokens : req.tokens;
  for (int64_t T : tokens) {
    MoeShape s;
    Status st = resolve_shape(req.shape, T, &s);
    MoeProblem prob;
    if (st.ok()) st = make_moe_problem(s, {}, req.shape.seed + uint64_t(T), &prob);
    std::ostringstream name;
    name << s.label << " E=" << s.E << " k=" << s.k << " H=" << s.H << " I=" << s.I << ' ' << scheme_label(s)
         << " T=" << T;
    if (!st.ok()) {
      CaseResult r = make_result(nullptr, name.str());
      r.detail = st.to_string();
      results.push_back(r);
      continue;
    }
    run_case(prob, name.str(), kernels, req.configs, &results);
    run_packed_case(prob, name.str(), kernels, &results);  // last: it packs prob's weights
  }
  return results;
}

}  // namespace moekit::testing

// The bench part (bench_fused_moe / bench_applies_fused_moe). Device problems also time the
// unfused cuBLAS baseline, which exists only in CUDA builds.
#if MOEKIT_WITH_CUDA
#include "cuda/bench_fill.h"
#include "cuda/moe_baseline_cublas.h"
#include "cuda/weight_stream.h"
#include "moekit/ops/quant.h"
#endif

namespace moekit::testing {

namespace {

// A host problem: run() calls fused_moe on the host buffers.
struct MoeBench : BenchProblem {
  MoeProblem prob;
  FusedMoeParams params;
  std::vector<unsigned char> workspace;
  std::string kernel_name;
  RunOptions opts;
  Status run() override { return fused_moe(params, opts); }
};

// A device problem: `sets` copies of the weights and inputs on the device of the kernel's backend
// (DeviceMirror), one shared device workspace; launch() enqueues the whole fused op (the kernel's
// sorting, both GEMMs, activation, sum over k; routing excluded: topk_ids / topk_weights are inputs).
struct DeviceMoeBench : BenchProblem {
  explicit DeviceMoeBench(Backend b) : mirror(b) {}
  DeviceMirror mirror;                 // owns every device allocation below
  std::vector<FusedMoeParams> dev;     // [sets] params viewing set s
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::string kernel_name;
#if MOEKIT_WITH_CUDA
  cuda::MoeBaselineRouting routing;    // from the host topk_ids, before the host weights are dropped
  Status routing_status;
#endif

  std::string config;  // RunOptions::config of launch() (set_config), empty: the kernel's rules

  Status set_config(const std::string& c) override {
    RunOptions o;
    o.kernel = kernel_name.c_str();
    o.config = c.empty() ? nullptr : c.c_str();
    size_t need = 0;
    MOEKIT_RETURN_IF_ERROR(fused_moe_workspace_size(dev[0], o, &need));
    if (need > workspace_bytes) {
      MOEKIT_RETURN_IF_ERROR(mirror.scratch(need, &workspace));
      workspace_bytes = need;
    }
    config = c;
    return Status::Ok();
  }
  Status launch(void* stream, int set) override {
    if (set < 0 || set >= int(dev.size())) return InvalidArgument("set: must be in [0, ", dev.size(), "), got ", set);
    RunOptions o;
    o.kernel = kernel_name.c_str();
    o.config = config.empty() ? nullptr : config.c_str();
    o.stream = stream;
    o.workspace = workspace;
    o.workspace_bytes = workspace_bytes;
    return fused_moe(dev[size_t(set)], o);
  }
  Status run() override {
    MOEKIT_RETURN_IF_ERROR(launch(nullptr, 0));
    return registry().device_ops(Backend::cuda)->synchronize();
  }
  Status baseline(int warmup, int iters, L2Flush l2, double* median_us) override {
#if MOEKIT_WITH_CUDA
    MOEKIT_RETURN_IF_ERROR(routing_status);
    return cuda::time_moe_baseline_cublas(dev, routing, warmup, iters, nullptr, median_us, l2);
#else
    (void)warmup;
    (void)iters;
    (void)l2;
    (void)median_us;
    return Unsupported("the cuBLAS baseline needs a CUDA build");
#endif
  }
  // Each set's touched experts (those the routing gives a row) as their w1 and w2 slabs.
  Status stream(int warmup, int iters, L2Flush l2, double* median_us) override {
#if MOEKIT_WITH_CUDA
    MOEKIT_RETURN_IF_ERROR(routing_status);
    std::vector<std::vector<cuda::DeviceBytes>> per_set;
    for (const FusedMoeParams& d : dev) {
      const size_t w = size_t(dtype_size(d.w1.dtype));
      const size_t b1 = size_t(d.w1.shape[1] * d.w1.shape[2]) * w, b2 = size_t(d.w2.shape[1] * d.w2.shape[2]) * w;
      std::vector<cuda::DeviceBytes> r;
      for (int64_t e = 0; e + 1 < int64_t(routing.expert_begin.size()); ++e) {
        if (routing.expert_begin[size_t(e + 1)] == routing.expert_begin[size_t(e)]) continue;
        r.push_back({static_cast<const char*>(d.w1.data) + size_t(e) * b1, b1});
        r.push_back({static_cast<const char*>(d.w2.data) + size_t(e) * b2, b2});
      }
      if (r.empty()) return Unsupported("no expert is touched: nothing to stream");
      per_set.push_back(std::move(r));
    }
    return cuda::time_weight_stream(per_set, warmup, iters, l2, median_us);
#else
    (void)warmup;
    (void)iters;
    (void)l2;
    (void)median_us;
    return Unsupported("the weight stream needs a CUDA build");
#endif
  }
};

// Device memory all input sets of one problem may take together; huge shapes get fewer sets.
constexpr double kDeviceSetBudgetBytes = 40e9;
constexpr int kMaxDeviceSets = 4;

// Device bytes of one input set of p (all E experts' weights are allocated, touched or not).
double set_bytes(const FusedMoeParams& p) {
  double b = 0;
  for (const TensorView* t : {&p.x, &p.w1, &p.w2, &p.topk_ids, &p.topk_weights, &p.out, &p.w1_scale, &p.w2_scale,
                              &p.a1_scale, &p.expert_mask, &p.expert_map}) {
    b += double(extent_bytes(*t));
  }
  return b;
}

// Copies the tensors of host params h into a fresh device set (out as an output); the weights too
// unless `weights` is false (then d's w1 / w2 still view the host).
Status mirror_set(DeviceMirror& m, FusedMoeParams h, bool weights, FusedMoeParams* d) {
  for (TensorView* t : {&h.x, &h.topk_ids, &h.topk_weights, &h.w1_scale, &h.w2_scale, &h.a1_scale, &h.expert_mask,
                        &h.expert_map}) {
    MOEKIT_RETURN_IF_ERROR(m.input(t));
  }
  if (weights) {
    MOEKIT_RETURN_IF_ERROR(m.input(&h.w1));
    MOEKIT_RETURN_IF_ERROR(m.input(&h.w2));
  }
  MOEKIT_RETURN_IF_ERROR(m.output(&h.out));
  *d = h;
  return Status::Ok();
}

}  // namespace

namespace {
// The variant SPEC 6 picks for a problem of this shape (what fused_moe_variant() returns for the
// params make_moe_problem builds from it).
MoeVariant variant_of(const MoeShape& s) {
  switch (s.scheme) {
    case Scheme::fp8_block: return MoeVariant::fp8_block;
    case Scheme::fp8_tensor:
    case Scheme::fp8_channel: return s.weight_on_input ? MoeVariant::fp8_row_tkw1 : MoeVariant::fp8_row;
    default: return MoeVariant::unquantized;
  }
}
}  // namespace

bool bench_applies_fused_moe(const BenchRequest& req, const Kernel& k) {
  MoeShape s;
  if (!resolve_shape(req.shape, 1, &s).ok()) return true;  // let prepare_bench report the error
  return k.op == OpKind::fused_moe && k.serves(variant_of(s));
}

namespace {

// f32 weight scales one expert of shape s carries (w1's and w2's; 0 unquantized), as
// make_moe_problem lays them out.
int64_t scale_floats_per_expert(const MoeShape& s, const MoeProblemOptions& o) {
  const int64_t N1 = o.g1u1 ? 2 * s.I : s.I;
  switch (s.scheme) {
    case Scheme::fp8_tensor: return 2;
    case Scheme::fp8_channel: return N1 + s.H;
    case Scheme::fp8_block: {
      const int64_t bn = o.block, bk = o.block_k > 0 ? o.block_k : o.block;
      auto cdiv = [](int64_t x, int64_t y) { return (x + y - 1) / y; };
      return cdiv(N1, bn) * cdiv(s.H, bk) + cdiv(s.H, bn) * cdiv(s.I, bk);
    }
    default: return 0;
  }
}

// flops, bytes and the shape line of problem p of shape s (s may have another I than p.shape: the
// device path generates p with I = 1 and the real weights on the device).
void describe_bench(const MoeShape& s, const MoeProblem& p, BenchProblem* b) {
  const double T = double(s.T), K = double(s.k), H = double(s.H), I = double(s.I);
  const double N1 = p.opts.g1u1 ? 2 * I : I;
  b->flops = 2 * T * K * H * N1 + 2 * T * K * I * H;
  const double w_elem = dtype_size(p.w1.view.dtype);
  const double per_expert = (N1 * H + H * I) * w_elem + double(scale_floats_per_expert(s, p.opts)) * 4.0;
  double touched = 0;
  for (bool t : p.touched) touched += t ? 1 : 0;
  b->bytes = touched * per_expert + 2 * T * H * dtype_size(p.x_dtype);
  std::ostringstream os;
  os << s.label << " T=" << s.T << " E=" << s.E << " k=" << s.k << " H=" << s.H << " I=" << s.I << ' '
     << scheme_label(s) << " (" << touched << " experts touched)";
  b->shape = os.str();
}

#if MOEKIT_WITH_CUDA
// One fp8 weight matrix [E, N, K] of shape s made ON THE DEVICE: normal values of std 1/sqrt(K) in
// bf16, `tmp_elems` at a time in `tmp` (whole experts), quantized by the library's CUDA quantize_fp8
// into `codes` (code_dtype) and `scale`, laid out as make_moe_problem lays them out for the scheme
// (per tensor [E], per row [E, N, 1], block [E, N / bn, K / bk]). Synchronous.
Status fill_fp8_weights_device(const MoeShape& s, const MoeProblemOptions& o, DType code_dtype, int64_t E, int64_t N,
                               int64_t K, void* codes, float* scale, uint16_t* tmp, int64_t tmp_elems, uint64_t seed) {
  const int64_t per = N * K, chunk = std::max<int64_t>(1, std::min<int64_t>(E, tmp_elems / per));
  const int64_t bn = o.block, bk = o.block_k > 0 ? o.block_k : o.block;
  const int64_t nb = (N + bn - 1) / bn, kb = (K + bk - 1) / bk;
  RunOptions ro;
  ro.kernel = "quantize_fp8_sm90";
  for (int64_t e0 = 0; e0 < E; e0 += chunk) {
    const int64_t c = std::min(chunk, E - e0);
    MOEKIT_RETURN_IF_ERROR(
        cuda::fill_normal_device(tmp, DType::bf16, c * per, 1.0f / std::sqrt(float(K)), seed ^ (uint64_t(e0) << 32)));
    auto* out = static_cast<uint8_t*>(codes) + e0 * per;
    QuantizeFp8Params q;
    if (s.scheme == Scheme::fp8_tensor) {  // one scale per expert: one call each
      q.granularity = QuantGranularity::per_tensor;
      for (int64_t e = 0; e < c; ++e) {
        q.in = TensorView::contiguous(tmp + e * per, DType::bf16, {N, K}, Device::cuda);
        q.out = TensorView::contiguous(out + e * per, code_dtype, {N, K}, Device::cuda);
        q.scale = TensorView::contiguous(scale + e0 + e, DType::f32, {1}, Device::cuda);
        MOEKIT_RETURN_IF_ERROR(quantize_fp8(q, ro));
      }
      continue;
    }
    q.in = TensorView::contiguous(tmp, DType::bf16, {c, N, K}, Device::cuda);
    q.out = TensorView::contiguous(out, code_dtype, {c, N, K}, Device::cuda);
    if (s.scheme == Scheme::fp8_channel) {
      q.granularity = QuantGranularity::per_row;
      q.scale = TensorView::contiguous(scale + e0 * N, DType::f32, {c, N, 1}, Device::cuda);
    } else {
      q.granularity = QuantGranularity::block;
      q.block_n = int(bn);
      q.group_k = int(bk);
      q.scale = TensorView::contiguous(scale + e0 * nb * kb, DType::f32, {c, nb, kb}, Device::cuda);
    }
    MOEKIT_RETURN_IF_ERROR(quantize_fp8(q, ro));
  }
  return registry().device_ops(Backend::cuda)->synchronize();
}
#endif

// The device path: up to kMaxDeviceSets input sets within kDeviceSetBudgetBytes.
// NOTE: the weights are generated ON THE DEVICE (cuda::fill_normal_device, a different seed per
// set, std 1/sqrt(H) for w1 and 1/sqrt(I) for w2; fp8 schemes then quantized there by the
// library's CUDA quantize_fp8, fill_fp8_weights_device): on the host, full-size weights take
// minutes (DeepSeek-V3: 11 G elements per set; docs/experiments.md E4). The host problem is then
// generated with I = 1 (same x, same routing, tiny weights).
constexpr int64_t kFp8GenTmpElems = int64_t(1) << 28;  // bf16 staging of fill_fp8_weights_device: 512 MiB

Status prepare_device(const MoeShape& s, uint64_t seed, const Kernel& k, std::unique_ptr<BenchProblem>* out) {
#if MOEKIT_WITH_CUDA
  const bool device_weights = true;
#else
  const bool device_weights = false;
#endif
  [[maybe_unused]] const bool fp8 = is_fp8_scheme(s.scheme);
  MoeShape gen = s;
  if (device_weights) gen.I = 1;
  MoeProblem prob;
  MOEKIT_RETURN_IF_ERROR(make_moe_problem(gen, {}, seed, &prob));
  auto b = std::make_unique<DeviceMoeBench>(k.backend);
  describe_bench(s, prob, b.get());
  const FusedMoeParams host = prob.params();
#if MOEKIT_WITH_CUDA
  b->routing_status = cuda::moe_baseline_routing(host, &b->routing);
#endif
  const int64_t E = prob.E, H = s.H, I = s.I, N1 = prob.opts.g1u1 ? 2 * I : I;
  const DType wd = prob.w1.view.dtype;
  const double weight_bytes = double(E) * (double(N1 * H + H * I) * dtype_size(wd) +
                                           double(scale_floats_per_expert(s, prob.opts)) * 4.0);
  const double per_set = set_bytes(host) + (device_weights ? weight_bytes : 0.0);
  const int sets = int(std::max(1.0, std::min(double(kMaxDeviceSets), std::floor(kDeviceSetBudgetBytes / per_set))));
  b->dev.resize(size_t(sets));
  [[maybe_unused]] uint16_t* fp8_tmp = nullptr;  // bf16 staging of the fp8 weights before quantization
#if MOEKIT_WITH_CUDA
  if (device_weights && fp8) {
    MOEKIT_RETURN_IF_ERROR(b->mirror.scratch(size_t(kFp8GenTmpElems) * 2, reinterpret_cast<void**>(&fp8_tmp)));
  }
#endif
  for (int i = 0; i < sets; ++i) {
    FusedMoeParams& d = b->dev[size_t(i)];
    MOEKIT_RETURN_IF_ERROR(mirror_set(b->mirror, host, !device_weights, &d));
#if MOEKIT_WITH_CUDA
    if (device_weights) {
      void* w1 = nullptr;
      void* w2 = nullptr;
      MOEKIT_RETURN_IF_ERROR(b->mirror.scratch(size_t(E * N1 * H) * size_t(dtype_size(wd)), &w1));
      MOEKIT_RETURN_IF_ERROR(b->mirror.scratch(size_t(E * H * I) * size_t(dtype_size(wd)), &w2));
      const uint64_t set_seed = seed * 1000003u + uint64_t(i) * 2u;
      if (fp8) {
        const MoeProblemOptions& o = prob.opts;
        const int64_t bn = o.block, bk = o.block_k > 0 ? o.block_k : o.block;
        auto cdiv = [](int64_t x, int64_t y) { return (x + y - 1) / y; };
        // The scale shapes of make_moe_problem (oracle_fused_moe.cpp) for the real I.
        std::vector<int64_t> s1{E}, s2{E};
        if (s.scheme == Scheme::fp8_channel) {
          s1 = {E, N1, 1};
          s2 = {E, H, 1};
        } else if (s.scheme == Scheme::fp8_block) {
          s1 = {E, cdiv(N1, bn), cdiv(H, bk)};
          s2 = {E, cdiv(H, bn), cdiv(I, bk)};
        }
        int64_t n1 = 1, n2 = 1;
        for (int64_t v : s1) n1 *= v;
        for (int64_t v : s2) n2 *= v;
        void* sc1 = nullptr;
        void* sc2 = nullptr;
        MOEKIT_RETURN_IF_ERROR(b->mirror.scratch(size_t(n1) * 4, &sc1));
        MOEKIT_RETURN_IF_ERROR(b->mirror.scratch(size_t(n2) * 4, &sc2));
        MOEKIT_RETURN_IF_ERROR(fill_fp8_weights_device(s, o, wd, E, N1, H, w1, static_cast<float*>(sc1), fp8_tmp,
                                                       kFp8GenTmpElems, set_seed));
        MOEKIT_RETURN_IF_ERROR(fill_fp8_weights_device(s, o, wd, E, H, I, w2, static_cast<float*>(sc2), fp8_tmp,
                                                       kFp8GenTmpElems, set_seed + 1));
        d.w1_scale = TensorView::contiguous(sc1, DType::f32, int(s1.size()), s1.data(), Device::cuda);
        d.w2_scale = TensorView::contiguous(sc2, DType::f32, int(s2.size()), s2.data(), Device::cuda);
      } else {
        MOEKIT_RETURN_IF_ERROR(cuda::fill_normal_device(w1, wd, E * N1 * H, 1.0f / std::sqrt(float(H)), set_seed));
        MOEKIT_RETURN_IF_ERROR(cuda::fill_normal_device(w2, wd, E * H * I, 1.0f / std::sqrt(float(I)), set_seed + 1));
      }
      d.w1 = TensorView::contiguous(w1, wd, {E, N1, H}, Device::cuda);
      d.w2 = TensorView::contiguous(w2, wd, {E, H, I}, Device::cuda);
    }
#endif
  }
  b->sets = sets;
  b->kernel_name = k.name;
  const Kernel* chosen = nullptr;  // what fused_moe picks by itself (SPEC 6 dispatch rule)
  if (registry().select(OpKind::fused_moe, fused_moe_variant(b->dev[0]), &b->dev[0], RunOptions{}, b->shape, &chosen)
          .ok() &&
      chosen != nullptr) {
    b->kernel_chosen = chosen->name;
  }
  RunOptions o;
  o.kernel = b->kernel_name.c_str();
  MOEKIT_RETURN_IF_ERROR(fused_moe_workspace_size(b->dev[0], o, &b->workspace_bytes));
  if (k.configs != nullptr) MOEKIT_RETURN_IF_ERROR(fused_moe_configs(b->dev[0], o, &b->configs));
  MOEKIT_RETURN_IF_ERROR(b->mirror.scratch(b->workspace_bytes, &b->workspace));
  *out = std::move(b);
  return Status::Ok();
}

}  // namespace

Status bench_fused_moe(const BenchRequest& req, int64_t tokens, const Kernel& k, std::unique_ptr<BenchProblem>* out) {
  MoeShape s;
  MOEKIT_RETURN_IF_ERROR(resolve_shape(req.shape, tokens, &s));
  const MoeVariant v = variant_of(s);
  if (k.op != OpKind::fused_moe || !k.serves(v)) {
    return Unsupported("kernel ", k.name, " implements ", op_name(k.op), "/", variant_name(k.variant),
                       ", the problem (scheme ", scheme_name(s.scheme), ") needs fused_moe/", variant_name(v));
  }
  if (registry().device_ops(k.backend) != nullptr) return prepare_device(s, req.shape.seed, k, out);
  auto b = std::make_unique<MoeBench>();
  MOEKIT_RETURN_IF_ERROR(make_moe_problem(s, {}, req.shape.seed, &b->prob));
  b->params = b->prob.params();
  if (fused_moe_variant(b->params) != v) return Internal("bench_fused_moe: variant_of() disagrees with fused_moe_variant()");
  // CPU kernels that take packed weights are timed on them: packed once here, like a model load.
  bool packed = false;
  if (!req.row_major_weights && k.backend == Backend::cpu &&
      ((v == MoeVariant::unquantized && dtype_size(b->params.w1.dtype) == 2) ||
       ((v == MoeVariant::fp8_row || v == MoeVariant::fp8_row_tkw1) && is_fp8(b->params.w1.dtype)))) {
    FusedMoeParams probe = b->params;
    probe.w1.layout = probe.w2.layout = Layout::cpu_vnni2_n32;
    if (k.supports(&probe).ok() && pack_moe_weights(&b->prob).ok()) {
      b->params = b->prob.params();
      packed = true;
    }
  }
  b->kernel_name = k.name;
  b->opts.kernel = b->kernel_name.c_str();
  size_t ws = 0;
  MOEKIT_RETURN_IF_ERROR(fused_moe_workspace_size(b->params, b->opts, &ws));
  b->workspace.resize(ws);
  b->opts.workspace = ws ? b->workspace.data() : nullptr;
  b->opts.workspace_bytes = ws;
  describe_bench(s, b->prob, b.get());
  if (packed) b->shape += " weights cpu_vnni2_n32 (packed at setup)";
  *out = std::move(b);
  return Status::Ok();
}

}  // namespace moekit::testing
