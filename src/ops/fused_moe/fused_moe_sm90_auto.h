// The CUDA backend's default fused_moe kernels pick one of two strategies per problem:
// fused_moe_sm90_small_m (decode) or a grouped GEMM kernel (prefill), as the pure heuristic
// choose_moe_strategy() / choose_moe_strategy_fp8() (fused_moe_heuristic.h) say, falling back to
// the other one when the preferred kernel refuses the problem. Shared by fused_moe_sm90_bf16.cpp
// (unquantized) and fused_moe_sm90_fp8.cpp (fp8 per-tensor / per-row / block); both strategies
// stay registered under their own names (lower priority) so tests, benchmarks and
// MOEKIT_FORCE_KERNEL can pick either.
// Host-only C++. Test: tests/test_fused_moe_heuristic.cpp (heuristic), check_fused_moe (kernels).
#pragma once

#include <cstdio>
#include <mutex>
#include <set>
#include <string>

#include "cuda/device_facts.h"
#include "moekit/core/config.h"
#include "moekit/ops/fused_moe.h"
#include "ops/fused_moe/fused_moe_heuristic.h"

namespace moekit::cuda {

struct MoeStrategyKernel {
  Status (*supports)(const FusedMoeParams&);
  size_t (*workspace)(const FusedMoeParams&);
  Status (*run)(const FusedMoeParams&, const RunContext&);
  const char* name;
};

// The kernel to run for p: the heuristic's choice if it accepts p, else the other one if it does.
// Returns nullptr (with *why) when neither accepts.
// The rule sees the tokens T, slots per token k, local experts E, the hidden size H and the device.
using MoeStrategyRule = MoeStrategyChoice (*)(int64_t T, int64_t k, int64_t E, int64_t H, const DeviceFacts& dev);

inline const MoeStrategyKernel* pick_moe_strategy(const MoeStrategyKernel& small_m, const MoeStrategyKernel& grouped,
                                                  MoeStrategyRule rule, const FusedMoeParams& p, std::string* why) {
  const MoeDims d = moe_dims(p);
  const MoeStrategyChoice c = rule(d.T, d.k, d.E, d.H, current_device_facts_or_zero());
  const MoeStrategyKernel* first = c.strategy == MoeStrategy::small_m ? &small_m : &grouped;
  const MoeStrategyKernel* second = first == &small_m ? &grouped : &small_m;
  const Status s1 = first->supports(p);
  if (s1.ok()) {
    *why = c.reason;
    return first;
  }
  const Status s2 = second->supports(p);
  if (s2.ok()) {
    *why = std::string("preferred ") + first->name + " refuses (" + s1.message() + ")";
    return second;
  }
  *why = std::string(small_m.name) + ": " + (first == &small_m ? s1 : s2).message() + "; " + grouped.name + ": " +
         (first == &grouped ? s1 : s2).message();
  return nullptr;
}

// supports / workspace / run of an auto kernel named `self` over the two strategies.
template <const MoeStrategyKernel& kSmall, const MoeStrategyKernel& kGrouped, MoeStrategyRule kRule>
struct MoeAutoKernel {
  static Status supports(const FusedMoeParams& p) {
    std::string why;
    if (pick_moe_strategy(kSmall, kGrouped, kRule, p, &why) == nullptr) return Unsupported("neither strategy accepts: ", why);
    return Status::Ok();
  }
  static size_t workspace(const FusedMoeParams& p) {
    std::string why;
    const MoeStrategyKernel* s = pick_moe_strategy(kSmall, kGrouped, kRule, p, &why);
    return s ? s->workspace(p) : 0;
  }
  static Status run(const char* self, const FusedMoeParams& p, const RunContext& ctx) {
    std::string why;
    const MoeStrategyKernel* s = pick_moe_strategy(kSmall, kGrouped, kRule, p, &why);
    if (s == nullptr) return Unsupported("neither strategy accepts: ", why);
    if (config().print_dispatch) {
      static std::mutex mu;
      static std::set<std::string> seen;
      const MoeDims d = moe_dims(p);
      const std::string key = std::to_string(d.T) + "/" + std::to_string(d.E) + "/" + std::to_string(d.k) + "/" +
                              std::to_string(d.H) + "/" + std::to_string(d.I) + "/" + s->name;
      std::lock_guard<std::mutex> lock(mu);
      if (seen.insert(key).second) {
        std::fprintf(stderr, "moekit dispatch: %s [T=%lld E=%lld k=%lld] -> %s (%s)\n", self, (long long)d.T,
                     (long long)d.E, (long long)d.k, s->name, why.c_str());
      }
    }
    return s->run(p, ctx);
  }
};

}  // namespace moekit::cuda
