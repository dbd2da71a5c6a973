// Helpers shared by the tests of the CUDA fp8 W8A8 fused_moe kernels
// (tests/test_fused_moe_sm90_small_m_fp8.cpp, tests/test_fused_moe_sm90_grouped_fp8.cpp): one kernel
// on device copies of a problem against the fp8 ref kernel on the host, with the kernel_vs_ref rows
// of docs/tolerances.md. Header-only.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fused_moe_test_util.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit::testing::moe_test {

// A kernel under test is named by a label: "kernel" (its rules) or "kernel [config]" (an explicit
// config, kernel_config_label); label_options sets RunOptions::kernel / config from one (the strings
// live in *kernel / *config).
inline RunOptions label_options(const std::string& label, std::string* kernel, std::string* config) {
  split_kernel_label(label, kernel, config);
  RunOptions o;
  o.kernel = kernel->c_str();
  o.config = config->empty() ? nullptr : config->c_str();
  return o;
}

// The labels' configs in a check request (check_fused_moe runs them on the variant's first kernel
// that takes configs, besides every kernel's rules).
inline CheckRequest with_configs(CheckRequest req, const std::vector<std::string>& labels) {
  for (const std::string& l : labels) {
    std::string kernel, config;
    split_kernel_label(l, &kernel, &config);
    if (!config.empty() && std::find(req.configs.begin(), req.configs.end(), config) == req.configs.end()) {
      req.configs.push_back(config);
    }
  }
  return req;
}

// "" when the kernel of `label` is registered and the CUDA backend is available, else why not.
inline std::string cuda_kernel_unavailable(const std::string& label) {
  std::string kernel, config;
  split_kernel_label(label, &kernel, &config);
  if (registry().find(kernel) == nullptr) return kernel + " is not compiled in (MOEKIT_CUDA off)";
  const Status st = registry().backend_available(Backend::cuda);
  return st.ok() ? "" : "CUDA backend unavailable: " + st.to_string();
}

// GTEST_SKIPs the calling test with cuda_kernel_unavailable(kernel)'s reason, if any.
#define MOE_SKIP_WITHOUT_CUDA_KERNEL(kernel)                                                        \
  do {                                                                                              \
    const std::string moe_skip_why = ::moekit::testing::moe_test::cuda_kernel_unavailable(kernel); \
    if (!moe_skip_why.empty()) GTEST_SKIP() << moe_skip_why;                                        \
  } while (0)

// The fp8 reference kernel of p's variant (block scales, router weight on the input, per row).
inline const char* fp8_ref_kernel(const FusedMoeParams& p) {
  if (p.scale_block_n > 0) return "fused_moe_ref_fp8_block";
  return p.weight_on_input ? "fused_moe_ref_fp8_row_tkw1" : "fused_moe_ref_fp8_row";
}

// Runs p (host tensors) on the CUDA device through the kernel (and config) of `label`: inputs mirrored
// to the device, a workspace of the queried size, the output copied back into p's host tensor.
inline void run_cuda_label(FusedMoeParams& p, const std::string& label) {
  DeviceMirror dev(Backend::cuda);
  ASSERT_TRUE(mirror_fused_moe(dev, &p).ok());
  std::string kernel, config;
  RunOptions opts = label_options(label, &kernel, &config);
  size_t ws = 0;
  ASSERT_TRUE(fused_moe_workspace_size(p, opts, &ws).ok());
  ASSERT_TRUE(dev.scratch(ws, &opts.workspace).ok());
  opts.workspace_bytes = ws;
  const Status st = fused_moe(p, opts);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(dev.copy_back().ok());
}

// The CUDA kernel (row_kernel, or tkw1_kernel when the router weight is on the input of a per-row /
// per-tensor problem; block-scaled problems always run row_kernel) on device copies of prob's
// tensors against the fp8 ref kernel of the problem's variant on the host; outputs must be finite.
inline void expect_fp8_cuda_matches_ref(MoeProblem& prob, const std::string& row_kernel,
                                        const std::string& tkw1_kernel,
                                        MoeCompare compare = MoeCompare::kernel_vs_ref) {
  FusedMoeParams p = prob.params();
  const bool tkw1 = p.weight_on_input, block = p.scale_block_n > 0;
  RunOptions ro;
  ro.kernel = fp8_ref_kernel(p);
  prob.out.fill_bytes(0xFF);
  const Status rs = fused_moe(p, ro);
  ASSERT_TRUE(rs.ok()) << rs.to_string();
  const std::vector<double> expected = read_out(p.out);
  prob.out.fill_bytes(0xFF);
  run_cuda_label(p, tkw1 && !block ? tkw1_kernel : row_kernel);
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<double> actual = read_out(prob.params().out);
  for (double v : actual) ASSERT_TRUE(std::isfinite(v));
  Metrics m;
  std::string detail;
  const MoeVariant v = block ? MoeVariant::fp8_block : tkw1 ? MoeVariant::fp8_row_tkw1 : MoeVariant::fp8_row;
  EXPECT_TRUE(judge_moe(actual, expected, prob.shape.T, prob.shape.H,
                        moe_tolerance(v, prob.x_dtype, compare), &m, &detail))
      << detail << " | worst " << m.worst;
}

// Tokens 1 and 2 of prob (T >= 3) get an inf and a NaN in x; against the reference, the kernel `label`
// must give their output rows all NaN, as the reference does (the NaN code reaches every column of
// gemm1), and every other row finite and within 2% of the largest reference value: quantizers that
// encode such a row differently (fp8_quotient_finite) still give the same rows.
inline void expect_fp8_cuda_nonfinite_rows(MoeProblem& prob, const std::string& label) {
  const int64_t H = prob.shape.H;
  prob.x.set(1 * H + 5, std::numeric_limits<float>::infinity());
  prob.x.set(2 * H + H - 1, std::numeric_limits<float>::quiet_NaN());
  FusedMoeParams p = prob.params();
  RunOptions ro;
  ro.kernel = fp8_ref_kernel(p);
  ASSERT_TRUE(fused_moe(p, ro).ok());
  const std::vector<double> expected = read_out(p.out);
  prob.out.fill_bytes(0xFF);
  run_cuda_label(p, label);
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<double> actual = read_out(prob.params().out);
  double scale = 0.0;
  for (int64_t i = 3 * H; i < int64_t(expected.size()); ++i) scale = std::max(scale, std::fabs(expected[size_t(i)]));
  for (int64_t t = 0; t < prob.shape.T; ++t) {
    for (int64_t c = 0; c < H; ++c) {
      const size_t i = size_t(t * H + c);
      if (t == 1 || t == 2) {
        ASSERT_TRUE(std::isnan(expected[i]) && std::isnan(actual[i]))
            << "token " << t << " col " << c << ": ref " << expected[i] << ", kernel " << actual[i];
      } else {
        ASSERT_TRUE(std::isfinite(actual[i]) && std::fabs(actual[i] - expected[i]) <= 0.02 * scale)
            << "token " << t << " col " << c << ": ref " << expected[i] << ", kernel " << actual[i];
      }
    }
  }
}

// x and out of prob as f16 (x's values converted, out fresh): the fp8 kernels' f16 activation path
// (quantizers reading f16, the reduction writing f16).
inline void to_f16_activations(MoeProblem* prob) {
  Buffer x(DType::f16, {prob->shape.T, prob->shape.H}), out(DType::f16, {prob->shape.T, prob->shape.H});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, prob->x.get(i));
  prob->x = std::move(x);
  prob->out = std::move(out);
  prob->x_dtype = DType::f16;
}

// g1u0 with gelu over a 4-of-E expert map: the problem the fp8 kernels' G1U0GeluAndExpertMap use.
inline MoeProblem make_g1u0_gelu_expert_map(Scheme sc, int64_t T, int64_t E, int64_t k, int64_t H, int64_t I) {
  MoeShape s = small_shape(sc, T, E, k, H, I);
  s.activation = Activation::gelu;
  MoeProblemOptions o;
  o.g1u1 = false;
  o.local_experts = 4;
  o.ep = ExpertParallel::map;
  return make(s, o);
}

// Token 0 all zeros (the amax floor), token 3 large values (scaled, not saturated); T >= 4.
inline void set_zero_and_large_rows(MoeProblem* prob) {
  const int64_t H = prob->shape.H;
  for (int64_t c = 0; c < H; ++c) {
    prob->x.set(0 * H + c, 0.0f);
    prob->x.set(3 * H + c, 3.0e4f * float((c % 7) - 3));
  }
}

// Every case ok, and kernel a or b really ran in at least one; a case of theirs may be skipped only
// when may_skip(case name, detail) says the refusal is by design.
template <class MaySkip>
void expect_fp8_kernels_ran(const std::vector<CaseResult>& results, const std::string& a, const std::string& b,
                            MaySkip may_skip) {
  expect_all_ok(results);
  int ran = 0;
  for (const CaseResult& r : results) {
    if (r.kernel != a && r.kernel != b) continue;
    const bool skipped = r.detail.rfind("skipped", 0) == 0;
    EXPECT_TRUE(!skipped || may_skip(r.name, r.detail)) << r.kernel << " " << r.name << " | " << r.detail;
    ran += skipped ? 0 : 1;
  }
  EXPECT_GT(ran, 0) << a << " / " << b;
}

// The supports() of the kernel of `label` (with its config, as the front door passes it) on device
// copies of the random problem of shape s says `accepted` (a refusal then is about the shape, not
// about host tensors). Needs a CUDA device.
inline void expect_device_supports(const std::string& label, const MoeShape& s, bool accepted) {
  std::string kernel, config;
  split_kernel_label(label, &kernel, &config);
  const Kernel* k = registry().find(kernel);
  ASSERT_NE(k, nullptr) << kernel;
  MoeProblem prob = make(s);
  FusedMoeParams p = prob.params();
  p.config = config.empty() ? nullptr : config.c_str();
  DeviceMirror dev(Backend::cuda);
  ASSERT_TRUE(mirror_fused_moe(dev, &p).ok());
  const Status st = k->supports(&p);
  EXPECT_EQ(st.ok(), accepted) << label << " H=" << s.H << " I=" << s.I << ": " << st.to_string();
}

// The kernel of `label` refuses the random problem of shape s: on device copies of its tensors when
// it is a CUDA kernel and a device is present (so the refusal is about the shape or the scheme),
// else on the host tensors (every CUDA kernel refuses those; the check is then only that
// supports() fails cleanly).
inline void expect_refuses(const std::string& label, const MoeShape& s) {
  std::string kernel, config;
  split_kernel_label(label, &kernel, &config);
  const Kernel* k = registry().find(kernel);
  ASSERT_NE(k, nullptr) << kernel;
  if (k->backend == Backend::cuda && registry().backend_available(Backend::cuda).ok()) {
    expect_device_supports(label, s, false);
    return;
  }
  MoeProblem prob = make(s);
  FusedMoeParams p = prob.params();
  p.config = config.empty() ? nullptr : config.c_str();
  EXPECT_FALSE(k->supports(&p).ok()) << label << " accepted " << scheme_name(s.scheme) << " H=" << s.H << " I=" << s.I;
}

// The CUDA check request of the fp8 kernel tests: scheme sc on the cuda backend, the harness edge
// cases plus `tokens` (model empty), or a preset model's shape at `tokens` without edge cases.
inline CheckRequest fp8_cuda_request(Scheme sc, std::vector<int64_t> tokens, bool weight_on_input = false,
                                     const char* model = "") {
  CheckRequest req;
  req.shape.scheme = sc;
  req.shape.scheme_given = true;
  req.shape.weight_on_input = weight_on_input;
  if (weight_on_input) req.shape.topk = 1;
  if (*model != '\0') {
    req.shape.model = model;
    req.edge_cases = false;
  }
  req.tokens = std::move(tokens);
  req.has_backend = true;
  req.backend = Backend::cuda;
  return req;
}

// The refusals by design of the 128 x 128 block kernels: shuffled / CPU-packed weights, H or I not
// multiples of 128.
inline bool block_kernel_may_skip(const std::string& name, const std::string& detail) {
  return name.find("shuffled") != std::string::npos || name.find("(packed)") != std::string::npos ||
         detail.find("multiple of 128") != std::string::npos || detail.find("multiples of 128") != std::string::npos ||
         detail.find("128 x 128") != std::string::npos;
}

}  // namespace moekit::testing::moe_test
