// sort_tokens check and bench hooks (SPEC 2; harness contract in src/testing/harness.h).
//
// check_sort_tokens: for every sort_tokens kernel (filtered by backend), the named edge cases and,
// for each requested token count, the request's shape (E and k from resolve_shape) over block_m in
// {1, 16, 64, 128}, both encodings and both expert-parallel forms. The ref kernel is compared with
// the oracle (src/testing/oracle_sort_tokens.cpp), every other kernel with the ref kernel. All
// outputs are compared exactly, every element (weights bit-exactly: they are copies).
// bench_sort_tokens: one random problem at block_m 64, packed encoding.
// Test: tests/test_sort_tokens.cpp (CheckHarness*).
#include <sstream>

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

// Runs `kernel` on a copy of the problem (outputs poisoned first, so unwritten elements show).
Status run_kernel(const SortTokensInput& in, const char* kernel, SortTokensOutput* out) {
  SortTokensBuffers b(in);
  b.poison(0xAB);
  RunOptions opts;
  opts.kernel = kernel;
  MOEKIT_RETURN_IF_ERROR(sort_tokens(b.params(), opts));
  *out = b.output();
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
  Rng rng(seed);
  const SortTokensInput in = random_sort_input(c.gen, rng);

  SortTokensOutput expected;
  if (is_ref) {
    expected = oracle_sort_tokens(in);
  } else {
    Status s = run_kernel(in, kRefKernel, &expected);
    if (!s.ok()) {
      r.detail = "reference kernel failed: " + s.to_string();
      return r;
    }
  }
  SortTokensOutput actual;
  Status s = run_kernel(in, k.name, &actual);
  if (!s.ok()) {
    r.detail = s.to_string();
    return r;
  }
  r.metrics = compare_sort_outputs(actual, expected);
  r.ok = r.metrics.mismatches == 0;
  r.detail = r.ok ? "exact: all elements of all outputs (weights bit-exact)" : r.metrics.worst;
  return r;
}

class SortTokensBench : public BenchProblem {
 public:
  SortTokensBench(const SortTokensInput& in, const char* kernel) : buffers_(in), kernel_(kernel) {}
  Status run() override {
    RunOptions opts;
    opts.kernel = kernel_;
    return sort_tokens(buffers_.params(), opts);
  }

 private:
  SortTokensBuffers buffers_;
  const char* kernel_;
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
  for (const Kernel* k : kernels_to_check(OpKind::sort_tokens, req)) {
    for (size_t i = 0; i < cases.size(); ++i) {
      results.push_back(check_one(*k, cases[i], req.shape.seed * 1000003u + i));
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
  auto problem = std::make_unique<SortTokensBench>(in, k.name);
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
