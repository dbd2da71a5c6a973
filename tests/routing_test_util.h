// Test helpers shared by the routing op tests (SPEC 1.1-1.3): tests/test_topk_softmax.cpp,
// tests/test_grouped_topk.cpp, tests/test_grouped_topk_avx512.cpp, tests/test_sigmoid_topk.cpp.
// Header-only.
//
// RoutingCall owns the poisoned [T, k] topk_weights / topk_ids outputs of one call and the params
// pointing at them; each test file derives its Call from it and sets the op's own parameters. The
// rest are the checks and case loops that more than one op's tests run; what differs between the
// ops (the logits generator, the Call, extra outputs) is passed in.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu_test_util.h"
#include "moekit/core/config.h"
#include "moekit/ops/routing.h"
#include "testing/harness.h"
#include "testing/oracle_routing.h"

namespace moekit::routing_test {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A routing op's check hook (testing::check_topk_softmax, ...) and bench problem builder.
using CheckFn = std::vector<testing::CaseResult> (*)(const testing::CheckRequest&);
using BenchFn = Status (*)(const testing::BenchRequest&, int64_t, const Kernel&,
                           std::unique_ptr<testing::BenchProblem>*);

// Outputs poisoned with 0xAB, and the params pointing at them: gating, k, topk_weights, topk_ids.
// Op is the front door that run() calls.
template <class Params, Status (*Op)(const Params&, const RunOptions&)>
struct RoutingCall {
  testing::Buffer w, ids;
  Params p;
  RoutingCall(const testing::Buffer& gating, int k)
      : w(DType::f32, {gating.view.shape[0], k}), ids(DType::i32, {gating.view.shape[0], k}) {
    w.fill_bytes(0xAB);
    ids.fill_bytes(0xAB);
    p.gating = gating.view;
    p.k = k;
    p.topk_weights = w.view;
    p.topk_ids = ids.view;
  }
  Status run() { return Op(p, RunOptions{}); }
  std::vector<int> row_ids(int64_t t) const {
    std::vector<int> v;
    for (int j = 0; j < p.k; ++j) v.push_back(ids.data<int32_t>()[t * p.k + j]);
    return v;
  }
  std::vector<float> row_w(int64_t t) const {
    std::vector<float> v;
    for (int j = 0; j < p.k; ++j) v.push_back(w.data<float>()[t * p.k + j]);
    return v;
  }
  // Compares the outputs with the oracle's: ids exactly, weights within kWeightAtol / kWeightRtol
  // and finite.
  void expect_outputs_match(const testing::RoutingExpect& e) const {
    const std::vector<int64_t> dims = {e.T, e.k};
    const testing::Metrics mi = testing::compare_exact(testing::to_ints(ids.view), e.ids, dims);
    EXPECT_EQ(mi.mismatches, 0) << mi.worst;
    const testing::Metrics mw = testing::compare_close(testing::to_doubles(w.view), e.weights, testing::kWeightAtol,
                                                       testing::kWeightRtol, dims);
    EXPECT_EQ(mw.mismatches, 0) << mw.worst;
    EXPECT_TRUE(mw.finite);
  }
  // The same against the outputs of `want`, a run of the same problem by the op's ref kernel.
  void expect_outputs_match(const RoutingCall& want) const {
    testing::RoutingExpect e;
    e.T = want.p.gating.shape[0];
    e.k = want.p.k;
    e.ids = testing::to_ints(want.ids.view);
    e.weights = testing::to_doubles(want.w.view);
    expect_outputs_match(e);
  }
  // This call and `other` wrote the same bytes: ids, then weights.
  void expect_same_outputs(const RoutingCall& other, const std::string& what = "") const {
    EXPECT_EQ(ids.bytes, other.ids.bytes) << what;
    EXPECT_EQ(w.bytes, other.w.bytes) << what;
  }
};

// Every byte of each buffer still holds the 0xAB poison: nothing was written there.
inline void expect_untouched(std::initializer_list<const testing::Buffer*> buffers) {
  for (const testing::Buffer* b : buffers) {
    for (unsigned char byte : b->bytes) EXPECT_EQ(byte, 0xAB);
  }
}

inline void expect_error(const Status& s, const std::string& needle) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos) << "message: " << s.message();
}

// The InvalidArgumentsNameTheArgument cases of one op: each spoils one argument of a fresh call (made
// by `fresh`, e.g. [&] { return Call(g, 2); }) and expects invalid_argument naming it (expect_error).
template <class Fresh>
class ArgumentErrors {
 public:
  explicit ArgumentErrors(Fresh fresh) : fresh_(std::move(fresh)) {}
  // spoil(p) changes the fresh call's params.
  template <class Spoil>
  void expect(Spoil spoil, const std::string& needle) const {
    SCOPED_TRACE(needle);
    auto c = fresh_();
    spoil(c.p);
    expect_error(c.run(), needle);
  }
  // Tensor argument `arg` replaced by a new `dtype` tensor of `shape`.
  template <class Params>
  void expect_replaced(TensorView Params::*arg, DType dtype, const std::vector<int64_t>& shape,
                       const std::string& needle) const {
    SCOPED_TRACE(needle);
    testing::Buffer b(dtype, shape);
    auto c = fresh_();
    c.p.*arg = b.view;
    expect_error(c.run(), needle);
  }

 private:
  Fresh fresh_;
};

// `c` with topk_ids one column too wide (validated last: every other argument of c is valid) fails
// and writes nothing: the outputs and the bad ids keep their 0xAB poison.
template <class Call>
void expect_bad_ids_leave_outputs_untouched(Call& c) {
  testing::Buffer bad_ids(DType::i32, {c.p.gating.shape[0], int64_t(c.p.k) + 1});
  bad_ids.fill_bytes(0xAB);
  c.p.topk_ids = bad_ids.view;
  EXPECT_FALSE(c.run().ok());
  expect_untouched({&c.w, &c.ids, &bad_ids});
}

// Kernel k, which accepts p, refuses it once its tensor `moved` lives on a CUDA device, naming that
// argument (`moved_name`).
template <class Params>
void expect_refuses_moved_tensor(const Kernel* k, Params p, TensorView Params::*moved, const char* moved_name) {
  (p.*moved).device = Device::cuda;
  const Status s = k->supports(&p);
  EXPECT_EQ(s.code(), StatusCode::unsupported);
  EXPECT_NE(s.message().find(moved_name), std::string::npos) << s.message();
}

// The ref kernel `name` of `op`: registered on the ref backend at priority 0, accepts the host
// problem p, and refuses p once its tensor `moved` lives on a CUDA device, naming `moved_name`.
template <class Params>
void expect_ref_kernel_registered(OpKind op, const char* name, const Params& p, TensorView Params::*moved,
                                  const char* moved_name) {
  const Kernel* k = registry().find(name);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->op, op);
  EXPECT_EQ(k->backend, Backend::ref);
  EXPECT_EQ(k->priority, 0);
  EXPECT_TRUE(k->supports(&p).ok());
  expect_refuses_moved_tensor(k, p, moved, moved_name);
}

// `a` was made by make(strided) on row-strided f32 logits whose values are exact in bf16 (and so in
// f16). Dense f32, bf16 and f16 copies of them, each run through make(copy), give the same bytes as
// a: the row stride and the gating dtype change nothing.
template <class Call, class MakeCall>
void expect_dense_copies_agree(const testing::Buffer& strided, Call& a, MakeCall make) {
  const int64_t T = strided.view.shape[0], E = strided.view.shape[1], ld = strided.view.stride[0];
  testing::Buffer dense(DType::f32, {T, E}), dbf(DType::bf16, {T, E}), df16(DType::f16, {T, E});
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      const float v = strided.get(t * ld + e);
      dense.set(t * E + e, v);
      dbf.set(t * E + e, v);
      df16.set(t * E + e, v);
      ASSERT_EQ(dbf.get(t * E + e), v);
    }
  }
  ASSERT_TRUE(a.run().ok());
  for (const testing::Buffer* other : {&dense, &dbf, &df16}) {
    Call b = make(*other);
    ASSERT_TRUE(b.run().ok());
    a.expect_same_outputs(b, dtype_name(other->view.dtype));
  }
}

// [T, E] `dtype` logits drawn uniformly (Rng seeded with `seed`) from NaN, +-inf and a few finite values.
inline testing::Buffer pool_logits(uint64_t seed, int64_t T, int64_t E, DType dtype) {
  testing::Rng rng(seed);
  testing::Buffer g(dtype, {T, E});
  const float pool[] = {kNaN, kInf, -kInf, 0.0f, 1.0f, -1.0f, 2.5f};
  for (int64_t i = 0; i < g.numel(); ++i) g.set(i, pool[rng.integer(0, 6)]);
  return g;
}

// One row's ids are distinct and in [0, E).
inline void expect_distinct_ids(std::vector<int> ids, int64_t E) {
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end());
  EXPECT_GE(ids.front(), 0);
  EXPECT_LT(ids.back(), E);
}

// A row of a table of routing problems: T tokens, E experts, top k, gating row stride (0: dense).
struct Shape {
  int64_t T, E;
  int k;
  int64_t stride = 0;
};

// "T=.. E=.. k=.." of a shape-table row (Shape or an op's own row with T, E and k).
template <class S>
std::string shape_name(const S& s) {
  return "T=" + std::to_string(s.T) + " E=" + std::to_string(s.E) + " k=" + std::to_string(s.k);
}

// The n-th dtype of the three-dtype rotation a, b, c of the case tables.
inline DType rotating_dtype(int n, DType a, DType b, DType c) { return n % 3 == 0 ? a : n % 3 == 1 ? b : c; }

// The random cases of topk_softmax and sigmoid_topk against the oracle: seeds 1..4 x `shapes` x
// bf16, f16, f32. run(seed, s, dtype, what) checks one case; `what` names it.
template <class Run>
void for_each_random_case(const std::vector<Shape>& shapes, Run run) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    for (const Shape& s : shapes) {
      for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
        run(seed, s, dt, "seed " + std::to_string(seed) + " " + shape_name(s) + " " + dtype_name(dt));
      }
    }
  }
}

// ------------------------------------------------------------------ the `moekit check` cases
// The check hook on each preset of `models` with every kernel, the edge cases on the first preset
// only (they do not depend on the preset): at least `min_results` cases each, all passing (and each
// with a detail when `require_detail`).
inline void expect_check_harness_passes(CheckFn check, std::initializer_list<const char*> models, size_t min_results,
                                        bool require_detail) {
  for (const char* model : models) {
    testing::CheckRequest req;
    req.shape.model = model;
    req.edge_cases = std::string(model) == *models.begin();
    const std::vector<testing::CaseResult> results = check(req);
    EXPECT_GE(results.size(), min_results) << model;
    for (const testing::CaseResult& r : results) {
      EXPECT_TRUE(r.ok) << model << " / " << r.kernel << " / " << r.name << ": " << r.detail;
      if (require_detail) {
        EXPECT_FALSE(r.detail.empty());
      }
    }
  }
}

// Builds the bench problem of preset `model` at T tokens for kernel `kernel` into *b and runs it once.
inline void build_and_run_bench_problem(BenchFn bench, const char* model, int64_t T, const char* kernel,
                                        std::unique_ptr<testing::BenchProblem>* b) {
  testing::BenchRequest req;
  req.shape.model = model;
  const Status s = bench(req, T, *registry().find(kernel), b);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const Status r = (*b)->run();
  EXPECT_TRUE(r.ok()) << r.to_string();
}

// The bench problem of preset `model` at T = 16 on the ref kernel `ref_kernel` builds and runs, moves
// bytes (and does flops when `with_flops`), and names `shape_part` in its shape string.
inline void expect_ref_bench_problem_runs(BenchFn bench, const char* model, const char* ref_kernel,
                                          const char* shape_part, bool with_flops) {
  std::unique_ptr<testing::BenchProblem> b;
  ASSERT_NO_FATAL_FAILURE(build_and_run_bench_problem(bench, model, 16, ref_kernel, &b));
  EXPECT_GT(b->bytes, 0);
  if (with_flops) {
    EXPECT_GT(b->flops, 0);
  }
  EXPECT_NE(b->shape.find(shape_part), std::string::npos) << b->shape;
}

// ------------------------------------------------------------------ CUDA kernels
// Why the CUDA backend cannot run here ("" when it can): the Cuda* tests GTEST_SKIP with it.
inline std::string cuda_unavailable() {
  const Status s = registry().backend_available(Backend::cuda);
  return s.ok() ? "" : "CUDA backend unavailable: " + s.to_string();
}

// Skips the test (GTEST_SKIP returns from it) with `reason` unless it is empty: ROUTING_SKIP_IF(
// routing_test::cuda_unavailable()) or cpu_unavailable().
#define ROUTING_SKIP_IF(reason)                                             \
  do {                                                                      \
    const std::string routing_skip_reason_ = (reason);                      \
    if (!routing_skip_reason_.empty()) GTEST_SKIP() << routing_skip_reason_; \
  } while (0)

// Runs a routing check hook restricted to backend b's kernels and expects every case to pass against
// the ref and to have actually run (the CUDA routing kernels accept every Eg <= 512, the CPU ones
// every host problem, so nothing may be skipped).
inline void expect_check_passes(Backend b, CheckFn check, testing::CheckRequest req, const std::string& what) {
  req.has_backend = true;
  req.backend = b;
  const std::vector<testing::CaseResult> results = check(req);
  EXPECT_FALSE(results.empty()) << what;
  for (const testing::CaseResult& r : results) {
    EXPECT_TRUE(r.ok) << what << " / " << r.kernel << " / " << r.name << ": " << r.detail;
    EXPECT_EQ(r.detail.rfind("skipped", 0), std::string::npos) << what << " / " << r.name << ": " << r.detail;
    EXPECT_EQ(r.reference, "ref") << r.name;
  }
}
inline void expect_cuda_check_passes(CheckFn check, testing::CheckRequest req, const std::string& what) {
  expect_check_passes(Backend::cuda, check, std::move(req), what);
}

// The check hook's edge cases on preset `model` at `tokens`, on backend b.
inline void expect_edge_cases_pass(Backend b, CheckFn check, const char* model, std::vector<int64_t> tokens) {
  testing::CheckRequest req;
  req.shape.model = model;
  req.tokens = std::move(tokens);
  expect_check_passes(b, check, req, "edge cases");
}

// The check hook on each preset of `models` at `tokens` (no edge cases), on backend b.
inline void expect_presets_pass(Backend b, CheckFn check, std::initializer_list<const char*> models,
                                const std::vector<int64_t>& tokens) {
  for (const char* model : models) {
    testing::CheckRequest req;
    req.shape.model = model;
    req.edge_cases = false;
    req.tokens = tokens;
    expect_check_passes(b, check, req, model);
  }
}

// The bench problem of preset `model` at T = 64 for kernel `kernel` builds and runs.
inline void expect_bench_problem_runs(BenchFn bench, const char* model, const char* kernel) {
  std::unique_ptr<testing::BenchProblem> b;
  build_and_run_bench_problem(bench, model, 64, kernel, &b);
}

// Runs `want` on the op's ref kernel and `got` on the CUDA kernel `kernel`, got's `inputs` mirrored to
// the device and its `outputs` copied back, and expects the same ids exactly and weights within the
// check hooks' tolerance.
template <class Call, class Params>
void expect_cuda_kernel_matches_ref(Call& got, Call& want, const char* kernel, const char* ref_kernel,
                                    Status (*op)(const Params&, const RunOptions&),
                                    std::initializer_list<TensorView Params::*> inputs,
                                    std::initializer_list<TensorView Params::*> outputs) {
  RunOptions ref_opts;
  ref_opts.kernel = ref_kernel;
  ASSERT_TRUE(op(want.p, ref_opts).ok());
  testing::DeviceMirror m(Backend::cuda);
  Params p = got.p;
  for (TensorView Params::*in : inputs) ASSERT_TRUE(m.input(&(p.*in)).ok());
  for (TensorView Params::*out : outputs) ASSERT_TRUE(m.output(&(p.*out)).ok());
  RunOptions opts;
  opts.kernel = kernel;
  const Status s = op(p, opts);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_TRUE(m.copy_back().ok());
  got.expect_outputs_match(want);
}

// Top-k sizes for the random CUDA shapes: 1, 8, 32 and Eg itself (small Eg), capped at Eg.
inline std::vector<int> cuda_ks(int64_t Eg) {
  std::vector<int> ks;
  for (int64_t k : {int64_t(1), int64_t(8), int64_t(32), Eg <= 64 ? Eg : int64_t(1)}) {
    const int kk = int(std::min(k, Eg));
    if (std::find(ks.begin(), ks.end(), kk) == ks.end()) ks.push_back(kk);
  }
  return ks;
}

// Eg in {1, 6, 8, 60, 128, 256, 257, 512} x the k above x T in {0, 1, 7, 4096} (4096 only for k <= 8,
// to keep the ref's O(k^2 Eg) selection fast), bf16 and f32, certified random logits.
inline void expect_cuda_random_shapes(std::vector<testing::CaseResult> (*check)(const testing::CheckRequest&)) {
  for (int64_t Eg : {1, 6, 8, 60, 128, 256, 257, 512}) {
    for (int k : cuda_ks(Eg)) {
      testing::CheckRequest req;
      req.shape.experts = Eg;
      req.shape.topk = k;
      req.shape.seed = uint64_t(Eg * 1000 + k);
      req.edge_cases = false;
      req.tokens = k <= 8 ? std::vector<int64_t>{0, 1, 7, 4096} : std::vector<int64_t>{1, 7};
      expect_cuda_check_passes(check, req, "Eg=" + std::to_string(Eg) + " k=" + std::to_string(k));
    }
  }
}

// Random logits with NaN / +-inf sprinkled in (about 1 in 8 entries), some rows all NaN, some all
// -inf, on a 1/4 grid (many exact ties): exact ties and non-finite values are what the contract
// fixes, and distinct finite values stay far apart, so ids must match the ref exactly.
inline testing::Buffer nonfinite_logits(uint64_t seed, int64_t T, int64_t E, DType dt) {
  testing::Rng rng(seed);
  testing::Buffer g = testing::random_logits(rng, T, E, dt, 2.0f, 0.25f);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t kind = rng.integer(0, 15);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r = rng.integer(0, 23);
      float v = g.get(t * E + e);
      if (kind == 0) v = kNaN;
      else if (kind == 1) v = -kInf;
      else if (r == 0) v = kNaN;
      else if (r == 1) v = -kInf;
      else if (r == 2 && kind == 2) v = kInf;
      g.set(t * E + e, v);
    }
  }
  return g;
}

// The non-finite / tied cases of topk_softmax and sigmoid_topk (CUDA and CPU): Eg in `egs` x k in
// {1, 4, min(Eg, 32)}; the n-th is nonfinite_logits(seed0 + n, rows(Eg, k), Eg, dtype), dtype rotating
// through f32, bf16, f16. run(g, k, n, dtype, what) checks one case; `what` names Eg and k.
template <class Rows, class Run>
void for_each_nonfinite_case(std::initializer_list<int64_t> egs, uint64_t seed0, Rows rows, Run run) {
  int n = 0;
  for (int64_t Eg : egs) {
    for (int k : {1, 4, int(std::min<int64_t>(Eg, 32))}) {
      const DType dt = rotating_dtype(n, DType::f32, DType::bf16, DType::f16);
      const testing::Buffer g = nonfinite_logits(seed0 + uint64_t(n), rows(Eg, k), Eg, dt);
      run(g, k, n, dt, "Eg=" + std::to_string(Eg) + " k=" + std::to_string(k));
      ++n;
    }
  }
}

// ------------------------------------------------------------------ CPU kernels (*_avx512)
// Why the CPU kernels (AVX-512 F/BW/VL) cannot run here ("" when they can): the Cpu* tests
// GTEST_SKIP with it. The backend probe accepts any x86-64, so this is cpu_test::avx512_unavailable().
inline std::string cpu_unavailable() { return cpu_test::avx512_unavailable(); }

// The CPU kernel `name` of `op`: registered on the cpu backend above the ref kernel `ref`, accepts
// the host problem p, is what the default dispatch picks, and refuses p once its tensor `moved`
// lives on a CUDA device, naming that argument (`moved_name`). Where the CPU lacks AVX-512: `name`
// is not registered and the default dispatch picks `ref`.
template <class Params>
void expect_cpu_kernel_registered(OpKind op, const char* name, const char* ref, Params p, TensorView Params::*moved,
                                  const char* moved_name) {
  if (!cpu_unavailable().empty()) {
    cpu_test::expect_not_registered_and_falls_back(op, name, ref, p);
    return;
  }
  const Kernel* k = registry().find(name);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->backend, Backend::cpu);
  EXPECT_GT(k->priority, registry().find(ref)->priority);
  EXPECT_TRUE(k->supports(&p).ok());
  const Kernel* chosen = nullptr;  // the default dispatch picks it on this CPU
  ASSERT_TRUE(registry().select_with(Config{}, op, MoeVariant::none, &p, RunOptions{}, "t", &chosen).ok());
  EXPECT_STREQ(chosen->name, name);
  expect_refuses_moved_tensor(k, p, moved, moved_name);
}

inline void expect_cpu_check_passes(CheckFn check, testing::CheckRequest req, const std::string& what) {
  expect_check_passes(Backend::cpu, check, std::move(req), what);
}

// Runs `call` (a RoutingCall) with kernel `kernel` and with the op's ref kernel and expects the same
// ids exactly and weights within the check hooks' tolerance.
template <class Call, class Params>
void expect_kernel_matches_ref(Call& got, Call& want, const char* kernel, const char* ref_kernel,
                               Status (*op)(const Params&, const RunOptions&)) {
  RunOptions ref_opts;
  ref_opts.kernel = ref_kernel;
  ASSERT_TRUE(op(want.p, ref_opts).ok());
  RunOptions opts;
  opts.kernel = kernel;
  const Status s = op(got.p, opts);
  ASSERT_TRUE(s.ok()) << s.to_string();
  got.expect_outputs_match(want);
}

// a and b, two calls of the same problem, run on kernel `kernel` write the same bytes (no dependence
// on scheduling).
template <class Call, class Params>
void expect_same_run_to_run(Call& a, Call& b, const char* kernel, Status (*op)(const Params&, const RunOptions&)) {
  RunOptions opts;
  opts.kernel = kernel;
  ASSERT_TRUE(op(a.p, opts).ok());
  ASSERT_TRUE(op(b.p, opts).ok());
  EXPECT_EQ(a.w.bytes, b.w.bytes);
  EXPECT_EQ(a.ids.bytes, b.ids.bytes);
}

// The CPU thread-split / vector-tail tables: run(s, n, dtype) checks the n-th row s of `shapes`,
// dtype rotating through bf16, f32, f16.
template <class S, class Run>
void for_each_cpu_shape(const std::vector<S>& shapes, Run run) {
  int n = 0;
  for (const S& s : shapes) {
    run(s, n, rotating_dtype(n, DType::bf16, DType::f32, DType::f16));
    ++n;
  }
}

// The check hook on every preset at T = 1, 63 and 600, on the CPU kernels.
inline void expect_cpu_presets_pass(CheckFn check) {
  expect_presets_pass(Backend::cpu, check, {"mixtral", "deepseek-v3", "llama4", "qwen3-moe"}, {1, 63, 600});
}

}  // namespace moekit::routing_test
