// fused_moe_sm90_bf16: the CUDA backend's default unquantized fused_moe kernel: fused_moe_sm90_small_m
// for decode, fused_moe_sm90_grouped for prefill, chosen per problem by choose_moe_strategy()
// (fused_moe_sm90_auto.h). Deterministic by construction (both strategies are).
// Test: tests/test_fused_moe_heuristic.cpp (heuristic), check_fused_moe (kernel).
#include "cuda/cuda_kernels.h"
#include "ops/fused_moe/fused_moe_sm90_auto.h"
#include "ops/fused_moe/fused_moe_sm90_grouped.h"
#include "ops/fused_moe/fused_moe_sm90_small_m.h"

namespace moekit::cuda {

namespace {

constexpr MoeStrategyKernel kSmallM = {fused_moe_small_m_supports, fused_moe_small_m_workspace_bytes,
                                       fused_moe_small_m_run, "fused_moe_sm90_small_m"};
constexpr MoeStrategyKernel kGrouped = {fused_moe_sm90_grouped_supports, fused_moe_sm90_grouped_workspace_bytes,
                                        fused_moe_sm90_grouped_run, "fused_moe_sm90_grouped"};
// The bf16 rule does not depend on H (fused_moe_heuristic.h).
MoeStrategyChoice rule(int64_t T, int64_t k, int64_t E, int64_t /*H*/, const DeviceFacts& /*dev*/) {
  return choose_moe_strategy(T, k, E);
}
using Auto = MoeAutoKernel<kSmallM, kGrouped, rule>;

Status run(const FusedMoeParams& p, const RunContext& ctx) { return Auto::run("fused_moe_sm90_bf16", p, ctx); }

}  // namespace

void register_fused_moe_sm90_bf16(Registry& r) {
  r.add({"fused_moe_sm90_bf16", OpKind::fused_moe, MoeVariant::unquantized, Backend::cuda,
         "x bf16|f16, w same, f32 accumulate; small_m or grouped GEMM by choose_moe_strategy()", 110,
         erase_supports<FusedMoeParams, Auto::supports>, erase_workspace<FusedMoeParams, Auto::workspace>,
         erase_run<FusedMoeParams, run>});
}

}  // namespace moekit::cuda
