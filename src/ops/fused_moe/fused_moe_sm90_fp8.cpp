// fused_moe_sm90_fp8_row / fused_moe_sm90_fp8_row_tkw1: the CUDA backend's default kernels for the fp8
// per-tensor / per-row W8A8 variants (router weight on the output, or on the input with k == 1):
// fused_moe_sm90_small_m_fp8_row for decode, fused_moe_sm90_grouped_fp8_row (QGMMA) for prefill,
// chosen per problem by choose_moe_strategy_fp8_tma64() (fused_moe_heuristic.h; the grouped GEMM
// wherever H % 256 == 0, its tiles by fused_moe_sm90_grouped_fp8_tile_m).
// fused_moe_sm90_fp8_block: for the 128 x 128 block variant, fused_moe_sm90_small_m_fp8_block or
// fused_moe_sm90_grouped_fp8_block by choose_moe_strategy_fp8_tma64 (the grouped GEMM wherever
// H % 256 == 0), its tiles (64 x 256 QGMMA, 64-row mma.sync, or 128 x 256 QGMMA where H % 256 == 0,
// else 128 x 128) by fused_moe_sm90_grouped_fp8_block_tile_m.
// Test: tests/test_fused_moe_sm90_grouped_fp8.cpp, check_fused_moe (kernels).
#include "cuda/cuda_kernels.h"
#include "ops/fused_moe/fused_moe_sm90_auto.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8_block.h"
#include "ops/fused_moe/fused_moe_sm90_small_m.h"

namespace moekit::cuda {

namespace {

constexpr MoeStrategyKernel kSmallM = {fused_moe_small_m_fp8_supports, fused_moe_small_m_fp8_workspace_bytes,
                                       fused_moe_small_m_fp8_run, "fused_moe_sm90_small_m_fp8_row"};
constexpr MoeStrategyKernel kGrouped = {fused_moe_sm90_grouped_fp8_supports,
                                        fused_moe_sm90_grouped_fp8_tiled_workspace_bytes,
                                        fused_moe_sm90_grouped_fp8_tiled_run,
                                        "fused_moe_sm90_grouped_fp8_row"};  // tiles: fused_moe_sm90_grouped_fp8_tile_m
using Auto = MoeAutoKernel<kSmallM, kGrouped, choose_moe_strategy_fp8_tma64>;

constexpr MoeStrategyKernel kSmallMBlock = {fused_moe_small_m_fp8_block_supports, fused_moe_small_m_fp8_workspace_bytes,
                                            fused_moe_small_m_fp8_block_run, "fused_moe_sm90_small_m_fp8_block"};
constexpr MoeStrategyKernel kGroupedBlock = {
    fused_moe_sm90_grouped_fp8_block_supports, fused_moe_sm90_grouped_fp8_block_tiled_workspace_bytes,
    fused_moe_sm90_grouped_fp8_block_tiled_run,
    "fused_moe_sm90_grouped_fp8_block"};  // tiles: fused_moe_sm90_grouped_fp8_block_tile_m
using AutoBlock = MoeAutoKernel<kSmallMBlock, kGroupedBlock, choose_moe_strategy_fp8_tma64>;

Status run_row(const FusedMoeParams& p, const RunContext& ctx) { return Auto::run("fused_moe_sm90_fp8_row", p, ctx); }
Status run_tkw1(const FusedMoeParams& p, const RunContext& ctx) {
  return Auto::run("fused_moe_sm90_fp8_row_tkw1", p, ctx);
}
Status run_block(const FusedMoeParams& p, const RunContext& ctx) {
  return AutoBlock::run("fused_moe_sm90_fp8_block", p, ctx);
}

}  // namespace

void register_fused_moe_sm90_fp8(Registry& r) {
  r.add({"fused_moe_sm90_fp8_row", OpKind::fused_moe, MoeVariant::fp8_row, Backend::cuda,
         "x bf16|f16, w e4m3fn per-tensor|per-row scales; small_m or grouped GEMM (64- or 128-row tiles) by "
         "choose_moe_strategy_fp8_tma64()",
         110, erase_supports<FusedMoeParams, Auto::supports>, erase_workspace<FusedMoeParams, Auto::workspace>,
         erase_run<FusedMoeParams, run_row>});
  r.add({"fused_moe_sm90_fp8_row_tkw1", OpKind::fused_moe, MoeVariant::fp8_row_tkw1, Backend::cuda,
         "as fused_moe_sm90_fp8_row, k == 1, router weight on the expert input", 110,
         erase_supports<FusedMoeParams, Auto::supports>, erase_workspace<FusedMoeParams, Auto::workspace>,
         erase_run<FusedMoeParams, run_tkw1>});
  r.add({"fused_moe_sm90_fp8_block", OpKind::fused_moe, MoeVariant::fp8_block, Backend::cuda,
         "x bf16|f16, w e4m3fn 128x128 block scales; small_m or grouped GEMM (64- or 128-row tiles) by "
         "choose_moe_strategy_fp8_tma64()",
         110,
         erase_supports<FusedMoeParams, AutoBlock::supports>, erase_workspace<FusedMoeParams, AutoBlock::workspace>,
         erase_run<FusedMoeParams, run_block>});
}

}  // namespace moekit::cuda
