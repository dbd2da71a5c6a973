// Test helpers for the CPU backend's AVX-512 kernels (the routing / sorting / quantizer / shuffle
// *_avx512 kernels and fused_moe_avx512_*): why they cannot run on this CPU. Header-only.
//
// The backend probe accepts any x86-64 (the portable kernels serve it), so it says nothing about
// AVX-512: src/cpu/cpu_backend.cpp registers the op kernels and fused_moe_avx512_bf16 only where
// moe::require_avx512 passes, and the other fused_moe_avx512_* kernels refuse every problem in
// supports() without the features. The tests of those kernels GTEST_SKIP with avx512_unavailable()
// (CPU_SKIP_IF), or check the no-AVX-512 behaviour instead; on a CPU with the features it is "" and
// every test runs in full.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "cpu/cpu_features.h"
#include "moekit/core/config.h"
#include "moekit/registry.h"
#include "ops/fused_moe/fused_moe_cpu.h"

namespace moekit::cpu_test {

// The label cpu_backend.cpp passes to require_avx512 for the op kernels it registers only where they
// can run (topk_softmax / grouped_topk / sigmoid_topk / sort_tokens / quantize_fp8 / convert_fp8 /
// shuffle_weight / unshuffle_weight _avx512).
constexpr const char* kOpKernels = "cpu avx512 op kernels";

// Why `kernel` (AVX-512 F/BW/VL, and BF16 with need_bf16) cannot run here, "" when it can: the CPU
// backend's probe, then moe::require_avx512 on this CPU's features, whose message names the kernel,
// the missing feature and what the CPU has ("... : CPU lacks AVX-512 F/BW/VL (has: )").
inline std::string avx512_unavailable(const char* kernel = kOpKernels, bool need_bf16 = false) {
  const Status b = registry().backend_available(Backend::cpu);
  if (!b.ok()) return "CPU backend unavailable: " + b.to_string();
  const Status s = cpu::moe::require_avx512(kernel, cpu::cpu_features(), need_bf16);
  return s.ok() ? "" : s.to_string();
}

// Skips the test (GTEST_SKIP returns from it) with `reason` unless it is empty:
// CPU_SKIP_IF(cpu_test::avx512_unavailable()).
#define CPU_SKIP_IF(reason)                                         \
  do {                                                              \
    const std::string cpu_skip_reason_ = (reason);                  \
    if (!cpu_skip_reason_.empty()) GTEST_SKIP() << cpu_skip_reason_; \
  } while (0)

// Where the AVX-512 op kernels cannot run (avx512_unavailable() not empty): the op kernel `name` is
// not registered (cpu_backend.cpp), and the default dispatch of the host problem p picks `fallback`
// (the op's ref kernel) instead.
template <class Params>
void expect_not_registered_and_falls_back(OpKind op, const char* name, const char* fallback, const Params& p) {
  EXPECT_EQ(registry().find(name), nullptr) << name << " is registered on a CPU where " << avx512_unavailable();
  const Kernel* chosen = nullptr;
  const Status s = registry().select_with(Config{}, op, MoeVariant::none, &p, RunOptions{}, "t", &chosen);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_NE(chosen, nullptr);
  EXPECT_STREQ(chosen->name, fallback);
}

}  // namespace moekit::cpu_test
