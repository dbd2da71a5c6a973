// sort_tokens check and bench hooks (SPEC 2; harness contract in src/testing/harness.h).
//
// check_sort_tokens: for every sort_tokens kernel (filtered by backend), the named edge cases and,
// for each requested token count, the request's shape (E and k from resolve_shape) over block_m in
// {1, 16, 64, 128}, both encodings and both expert-parallel forms. The ref kernel is compared with
// the oracle (src/testing/oracle_sort_tokens.cpp), every other kernel with the ref kernel. All
// outputs are compared exactly, every element (weights bit-exactly: they are copies).
// Device kernels (e.g. sort_tokens_sm90) run on mirrored copies of the problem (DeviceMirror, device
// workspace from sort_tokens_workspace_size) and are reported skipped when their backend is
// unavailable; they also get one case with invalid ids, which they must skip and count in
// error_count (expected: the ref's outputs with those ids replaced by -1).
// bench_sort_tokens: one random problem at block_m 64, packed encoding, on the kernel's device.
// Test: tests/test_sort_tokens.cpp (CheckHarness*).
#include <cstdint>
#include <sstream>
#include <string>

#include "moekit/ops/sorting.h"
#include "testing/harness.h"
#include "testing/oracle_sort_tokens.h"

namespace moekit::testing {

namespace {

constexpr const char* kRefKernel = "sort_tokens_ref";
constexpr int64_t kBenchBlockM = 64;

struct NamedCase {
  std::string name;
  SortTokensGen gen;
};

std::string describe(const SortTokensGen& g) {
  std::ostringstream os;
  os << "T=" << g.T << " k=" << g.k << " Eg=" << g.Eg << " block_m=" << g.block_m << ' '
     << sort_encoding_name(g.encoding);
  if (g.ep == SortEp::mask) os << " mask";
  if (g.ep == SortEp::map) os << " map";
  if (g.skip_prob > 0) os << " skip=" << g.skip_prob;
  if (!g.distinct) os << " duplicates";
  return os.str();
}

// Named edge cases on the request's E and k (each in both encodings where the encoding can hold it).
std::vector<NamedCase> edge_cases(const MoeShape& s) {
  SortTokensGen base;
  base.Eg = s.E;
  base.k = s.k;
  base.T = 7;
  base.block_m = 16;
  std::vector<NamedCase> cases;
  auto add = [&](const std::string& name, SortTokensGen g) {
    for (SortEncoding enc : {SortEncoding::packed, SortEncoding::flat}) {
      if (enc == SortEncoding::packed && g.k > kSortPackedMaxTopk) continue;  // refused by contract
      g.encoding = enc;
      cases.push_back({"edge:" + name + " " + sort_encoding_name(enc), g});
    }
  };
  SortTokensGen g = base;
  g.T = 0;
  add("T=0", g);
  g = base;
  g.T = 1;
  add("T=1", g);
  g = base;
  g.hot_expert = s.E - 1;
  add("all tokens to one expert", g);
  g = base;
  g.T = 2;  // at most 2*k of the E experts are used: the rest must get no block
  add("empty experts", g);
  g = base;
  g.k = 1;
  add("k=1", g);
  g = base;
  g.T = 3;
  g.k = s.E;  // every token on every expert (flat only when E > 127: packed holds k <= 127)
  add("k=E", g);
  g = base;
  g.ep = SortEp::mask;
  g.E_local = s.E / 2 + 1;  // uneven expert parallelism: 5 of 8, 129 of 256 local experts
  if (g.E_local > s.E) g.E_local = s.E;
  add("E not a power of two", g);
  g = base;
  g.block_m = 1;
  add("block_m=1", g);
  g = base;
  g.T = 1;
  g.block_m = 128;
  add("block_m > T*k", g);
  g = base;
  g.skip_prob = 0.3;
  add("some ids -1", g);
  g = base;
  g.skip_prob = 1.0;
  add("all ids -1", g);
  g = base;
  g.distinct = false;
  add("duplicate ids in a row", g);
  g = base;
  g.ep = SortEp::mask;
  add("expert_mask", g);
  g = base;
  g.ep = SortEp::map;
  add("expert_map", g);
  return cases;
}

// Cases of the requested shape at T tokens.
std::vector<NamedCase> shape_cases(const MoeShape& s) {
  std::vector<NamedCase> cases;
  SortTokensGen base;
  base.T = s.T;
  base.Eg = s.E;
  base.k = s.k;
  for (int64_t bm : {1, 16, 64, 128}) {
    for (SortEncoding enc : {SortEncoding::packed, SortEncoding::flat}) {
      SortTokensGen g = base;
      g.block_m = bm;
      g.encoding = enc;
      cases.push_back({"", g});
    }
  }
  SortTokensGen g = base;
  g.ep = SortEp::mask;
  cases.push_back({"", g});
  g = base;
  g.ep = SortEp::map;
  g.block_m = 64;
  g.encoding = SortEncoding::flat;
  cases.push_back({"", g});
  g = base;
  g.skip_prob = 0.25;
  cases.push_back({"", g});
  for (NamedCase& c : cases) c.name = s.label + " " + describe(c.gen);
  return cases;
}

// Mirrors a problem's tensors to the device of `m` and gives it device workspace for `kernel`.
Status mirror_problem(SortTokensParams* p, DeviceMirror& m, const char* kernel, RunOptions* opts) {
  for (TensorView* t : {&p->topk_ids, &p->topk_weights, &p->expert_mask, &p->expert_map}) {
    MOEKIT_RETURN_IF_ERROR(m.input(t));
  }
  for (TensorView* t : {&p->sorted_token_ids, &p->sorted_weights, &p->sorted_expert_ids, &p->num_valid,
                        &p->error_count}) {
    MOEKIT_RETURN_IF_ERROR(m.output(t));
  }
  opts->kernel = kernel;
  size_t bytes = 0;
  MOEKIT_RETURN_IF_ERROR(sort_tokens_workspace_size(*p, *opts, &bytes));
  if (m.on_device()) {
    MOEKIT_RETURN_IF_ERROR(m.scratch(bytes, &opts->workspace));
    opts->workspace_bytes = bytes;
  }
  return Status::Ok();
}

const Kernel& ref_kernel() { return *registry().find(kRefKernel); }

}  // namespace

Status run_sort_tokens_kernel(const SortTokensInput& in, const Kernel& kernel, SortTokensOutput* out,
                              int32_t* error_count) {
  SortTokensBuffers b(in);
  b.poison(0xAB);
  Buffer err(DType::i32, {1});
  err.fill_bytes(0xAB);
  SortTokensParams p = b.params();
  p.error_count = err.view;
  DeviceMirror m(kernel.backend);
  RunOptions opts;
  MOEKIT_RETURN_IF_ERROR(mirror_problem(&p, m, kernel.name, &opts));
  MOEKIT_RETURN_IF_ERROR(sort_tokens(p, opts));
  MOEKIT_RETURN_IF_ERROR(m.copy_back());
  *out = b.output();
  if (error_count) *error_count = err.data<int32_t>()[0];
  return Status::Ok();
}

namespace {

Status run_kernel(const SortTokensInput& in, const Kernel& kernel, SortTokensOutput* out) {
  int32_t errors = 0;
  MOEKIT_RETURN_IF_ERROR(run_sort_tokens_kernel(in, kernel, out, &errors));
  if (errors != 0) return Internal(kernel.name, ": error_count = ", errors, " on valid ids");
  return Status::Ok();
}

CaseResult check_one(const Kernel& k, const NamedCase& c, uint64_t seed) {
  CaseResult r;
  r.op = op_name(OpKind::sort_tokens);
  r.kernel = k.name;
  r.backend = backend_name(k.backend);
  r.name = c.name;
  const bool is_ref = std::string(k.name) == kRefKernel;
  r.reference = is_ref ? "oracle" : "ref";
  const Status avail = registry().backend_available(k.backend);
  if (!avail.ok()) {  // e.g. no CUDA device on this machine: not a failure
    r.ok = true;
    r.detail = "skipped: backend " + std::string(backend_name(k.backend)) + " unavailable: " + avail.message();
    return r;
  }
  Rng rng(seed);
  const SortTokensInput in = random_sort_input(c.gen, rng);

  SortTokensOutput expected;
  if (is_ref) {
    expected = oracle_sort_tokens(in);
  } else {
    Status s = run_kernel(in, ref_kernel(), &expected);
    if (!s.ok()) {
      r.detail = "reference kernel failed: " + s.to_string();
      return r;
    }
  }
  SortTokensOutput actual;
  Status s = run_kernel(in, k, &actual);
  if (!s.ok()) {
    r.detail = s.to_string();
    return r;
  }
  r.metrics = compare_sort_outputs(actual, expected);
  r.ok = r.metrics.mismatches == 0;
  r.detail = r.ok ? "exact: all elements of all outputs (weights bit-exact)" : r.metrics.worst;
  return r;
}

// Device kernels only (host kernels reject bad ids before writing): ids outside [-1, Eg) are
// skipped and counted. Expected: the ref's outputs with those ids replaced by -1.
CaseResult check_bad_ids(const Kernel& k, const MoeShape& s, uint64_t seed) {
  CaseResult r;
  r.op = op_name(OpKind::sort_tokens);
  r.kernel = k.name;
  r.backend = backend_name(k.backend);
  r.reference = "ref";
  SortTokensGen g;
  g.T = 9;
  g.Eg = s.E;
  g.k = s.k;
  g.block_m = 16;
  r.name = "edge:invalid ids counted in error_count " + describe(g);
  const Status avail = registry().backend_available(k.backend);
  if (!avail.ok()) {
    r.ok = true;
    r.detail = "skipped: backend " + std::string(backend_name(k.backend)) + " unavailable: " + avail.message();
    return r;
  }
  Rng rng(seed);
  SortTokensInput bad = random_sort_input(g, rng);
  SortTokensInput clean = bad;
  const int32_t wrong[] = {int32_t(s.E), -2, int32_t(s.E) + 1000, INT32_MIN};
  int32_t n_bad = 0;
  for (size_t i = 0; i < bad.topk_ids.size(); i += 5) {
    bad.topk_ids[i] = wrong[n_bad % 4];
    clean.topk_ids[i] = -1;
    ++n_bad;
  }
  SortTokensOutput expected, actual;
  Status st = run_kernel(clean, ref_kernel(), &expected);
  if (!st.ok()) {
    r.detail = "reference kernel failed: " + st.to_string();
    return r;
  }
  int32_t errors = -1;
  st = run_sort_tokens_kernel(bad, k, &actual, &errors);
  if (!st.ok()) {
    r.detail = st.to_string();
    return r;
  }
  r.metrics = compare_sort_outputs(actual, expected);
  r.metrics.count += 1;
  if (errors != n_bad) {
    r.metrics.mismatches += 1;
    r.metrics.worst = "error_count " + std::to_string(errors) + ", want " + std::to_string(n_bad);
  }
  r.ok = r.metrics.mismatches == 0;
  r.detail = r.ok ? "exact, error_count = " + std::to_string(n_bad) : r.metrics.worst;
  return r;
}

// The problem mirrored once to the kernel's device (workspace included); run() sorts once and, for
// a device kernel, waits for it (DeviceOps::synchronize) so host timing covers the work.
class SortTokensBench : public BenchProblem {
 public:
  SortTokensBench(const SortTokensInput& in, const Kernel& kernel)
      : buffers_(in), mirror_(kernel.backend), kernel_(kernel) {}
  Status prepare() {
    params_ = buffers_.params();
    return mirror_problem(&params_, mirror_, kernel_.name, &opts_);
  }
  Status run() override {
    MOEKIT_RETURN_IF_ERROR(sort_tokens(params_, opts_));
    const DeviceOps* ops = registry().device_ops(kernel_.backend);
    return ops ? ops->synchronize() : Status::Ok();
  }

 private:
  SortTokensBuffers buffers_;
  DeviceMirror mirror_;
  const Kernel& kernel_;
  SortTokensParams params_;
  RunOptions opts_;
};

}  // namespace

std::vector<CaseResult> check_sort_tokens(const CheckRequest& req) {
  std::vector<CaseResult> results;
  const std::vector<int64_t> tokens = req.tokens.empty() ? std::vector<int64_t>{1, 7, 64} : req.tokens;
  std::vector<NamedCase> cases;
  if (req.edge_cases) {
    MoeShape s;
    Status st = resolve_shape(req.shape, 1, &s);
    if (!st.ok()) {
      CaseResult r;
      r.op = op_name(OpKind::sort_tokens);
      r.name = "shape";
      r.detail = st.to_string();
      return {r};
    }
    cases = edge_cases(s);
  }
  for (int64_t T : tokens) {
    MoeShape s;
    Status st = resolve_shape(req.shape, T, &s);
    if (!st.ok()) {
      CaseResult r;
      r.op = op_name(OpKind::sort_tokens);
      r.name = "shape T=" + std::to_string(T);
      r.detail = st.to_string();
      results.push_back(r);
      continue;
    }
    for (NamedCase& c : shape_cases(s)) cases.push_back(std::move(c));
  }
  MoeShape bad_shape;
  const bool bad_ok = req.edge_cases && resolve_shape(req.shape, 1, &bad_shape).ok();
  for (const Kernel* k : kernels_to_check(OpKind::sort_tokens, req)) {
    for (size_t i = 0; i < cases.size(); ++i) {
      results.push_back(check_one(*k, cases[i], req.shape.seed * 1000003u + i));
    }
    if (bad_ok && registry().device_ops(k->backend) != nullptr) {
      results.push_back(check_bad_ids(*k, bad_shape, req.shape.seed * 1000003u + cases.size()));
    }
  }
  return results;
}

Status bench_sort_tokens(const BenchRequest& req, int64_t tokens, const Kernel& k,
                         std::unique_ptr<BenchProblem>* out) {
  MoeShape s;
  MOEKIT_RETURN_IF_ERROR(resolve_shape(req.shape, tokens, &s));
  SortTokensGen g;
  g.T = s.T;
  g.k = s.k;
  g.Eg = s.E;
  g.block_m = kBenchBlockM;
  Rng rng(req.shape.seed);
  const SortTokensInput in = random_sort_input(g, rng);
  MOEKIT_RETURN_IF_ERROR(registry().backend_available(k.backend));
  auto problem = std::make_unique<SortTokensBench>(in, k);
  MOEKIT_RETURN_IF_ERROR(problem->prepare());
  const int64_t max_padded = sort_tokens_max_padded(in.T, in.k, in.E, in.block_m);
  const int64_t max_blocks = sort_tokens_max_blocks(in.T, in.k, in.E, in.block_m);
  problem->shape = s.label + " " + describe(g);
  problem->flops = 0;
  // Ids and weights in; both padded arrays, the block owners and num_valid out (all written).
  problem->bytes = double(in.T * in.k) * 8.0 + double(max_padded) * 8.0 + double(max_blocks) * 4.0 + 4.0;
  *out = std::move(problem);
  return Status::Ok();
}

}  // namespace moekit::testing
