// Test helpers shared by the routing op tests (SPEC 1.1-1.3): tests/test_topk_softmax.cpp,
// tests/test_grouped_topk.cpp, tests/test_sigmoid_topk.cpp. Header-only.
//
// RoutingCall owns the poisoned [T, k] topk_weights / topk_ids outputs of one call and the params
// pointing at them; each test file derives its Call from it and sets the op's own parameters.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "moekit/core/config.h"
#include "moekit/ops/routing.h"
#include "testing/harness.h"
#include "testing/oracle_routing.h"

namespace moekit::routing_test {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

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
};

inline void expect_error(const Status& s, const std::string& needle) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos) << "message: " << s.message();
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

// A routing op's check hook (testing::check_topk_softmax, ...) and bench problem builder.
using CheckFn = std::vector<testing::CaseResult> (*)(const testing::CheckRequest&);
using BenchFn = Status (*)(const testing::BenchRequest&, int64_t, const Kernel&,
                           std::unique_ptr<testing::BenchProblem>*);

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
  testing::BenchRequest req;
  req.shape.model = model;
  std::unique_ptr<testing::BenchProblem> b;
  const Status s = bench(req, 64, *registry().find(kernel), &b);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const Status r = b->run();
  EXPECT_TRUE(r.ok()) << r.to_string();
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

// ------------------------------------------------------------------ CPU kernels (*_avx512)
// Why the CPU backend cannot run here ("" when it can): the Cpu* tests GTEST_SKIP with it.
inline std::string cpu_unavailable() {
  const Status s = registry().backend_available(Backend::cpu);
  return s.ok() ? "" : "CPU backend unavailable: " + s.to_string();
}

// The CPU kernel `name` of `op`: registered on the cpu backend above the ref kernel `ref`, accepts
// the host problem p, is what the default dispatch picks where the CPU backend runs, and refuses p
// once its tensor `moved` lives on a CUDA device, naming that argument (`moved_name`).
template <class Params>
void expect_cpu_kernel_registered(OpKind op, const char* name, const char* ref, Params p, TensorView Params::*moved,
                                  const char* moved_name) {
  const Kernel* k = registry().find(name);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->backend, Backend::cpu);
  EXPECT_GT(k->priority, registry().find(ref)->priority);
  EXPECT_TRUE(k->supports(&p).ok());
  if (registry().backend_available(Backend::cpu).ok()) {  // the default dispatch picks it on this CPU
    const Kernel* chosen = nullptr;
    ASSERT_TRUE(registry().select_with(Config{}, op, MoeVariant::none, &p, RunOptions{}, "t", &chosen).ok());
    EXPECT_STREQ(chosen->name, name);
  }
  (p.*moved).device = Device::cuda;
  const Status s = k->supports(&p);
  EXPECT_EQ(s.code(), StatusCode::unsupported);
  EXPECT_NE(s.message().find(moved_name), std::string::npos) << s.message();
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

}  // namespace moekit::routing_test
