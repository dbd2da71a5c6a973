// fused_moe_sm90_fp8_row / fused_moe_sm90_fp8_row_tkw1: the CUDA backend's default kernels for the fp8
// per-tensor / per-row W8A8 variants (router weight on the output, or on the input with k == 1):
// fused_moe_sm90_small_m_fp8_row for decode, fused_moe_sm90_grouped_fp8_row (QGMMA) for prefill,
// chosen per problem by choose_moe_strategy_fp8() (fused_moe_heuristic.h).
// Test: tests/test_fused_moe_sm90_grouped_fp8.cpp, check_fused_moe (kernels).
#include "cuda/cuda_kernels.h"
#include "ops/fused_moe/fused_moe_sm90_auto.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8.h"
#include "ops/fused_moe/fused_moe_sm90_small_m.h"

namespace moekit::cuda {

namespace {

constexpr MoeStrategyKernel kSmallM = {fused_moe_small_m_fp8_supports, fused_moe_small_m_fp8_workspace_bytes,
                                       fused_moe_small_m_fp8_run, "fused_moe_sm90_small_m_fp8_row"};
constexpr MoeStrategyKernel kGrouped = {fused_moe_sm90_grouped_fp8_supports,
                                        fused_moe_sm90_grouped_fp8_workspace_bytes, fused_moe_sm90_grouped_fp8_run,
                                        "fused_moe_sm90_grouped_fp8_row"};
using Auto = MoeAutoKernel<kSmallM, kGrouped, choose_moe_strategy_fp8>;

Status run_row(const FusedMoeParams& p, const RunContext& ctx) { return Auto::run("fused_moe_sm90_fp8_row", p, ctx); }
Status run_tkw1(const FusedMoeParams& p, const RunContext& ctx) {
  return Auto::run("fused_moe_sm90_fp8_row_tkw1", p, ctx);
}

}  // namespace

void register_fused_moe_sm90_fp8(Registry& r) {
  r.add({"fused_moe_sm90_fp8_row", OpKind::fused_moe, MoeVariant::fp8_row, Backend::cuda,
         "x bf16|f16, w e4m3fn per-tensor|per-row scales; small_m or QGMMA grouped GEMM by choose_moe_strategy()",
         110, erase_supports<FusedMoeParams, Auto::supports>, erase_workspace<FusedMoeParams, Auto::workspace>,
         erase_run<FusedMoeParams, run_row>});
  r.add({"fused_moe_sm90_fp8_row_tkw1", OpKind::fused_moe, MoeVariant::fp8_row_tkw1, Backend::cuda,
         "as fused_moe_sm90_fp8_row, k == 1, router weight on the expert input", 110,
         erase_supports<FusedMoeParams, Auto::supports>, erase_workspace<FusedMoeParams, Auto::workspace>,
         erase_run<FusedMoeParams, run_tkw1>});
}

}  // namespace moekit::cuda
