// The tiles the grouped fp8 kernels' auto path runs for a problem (fused_moe_sm90_fp8_row /
// _fp8_block pick the grouped strategy, then these): pure host functions of the routed entries,
// the experts and what the shape admits, so host code and tests can see and pin them
// (tests/test_fused_moe_sm90_tiles.cpp; docs/design/fused_moe_sm90.md, step M2). The launch code
// (fused_moe_sm90_grouped_fp8.cu, _fp8_block.cu) computes the admissions and calls these.
#pragma once

#include <cstdint>

#include "ops/fused_moe/fused_moe_heuristic.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8_block.h"

namespace moekit {

// fp8 per-tensor / per-row: 64 x 256 TMA + QGMMA, 64-row mma.sync, 192 x 256 or 128 x 256 QGMMA.
enum class Fp8RowTiles : uint8_t { tma128, mma64, tma64, m192 };
// fp8 128 x 128 blocks: 128 x 128, 64-row mma.sync, 64 x 256 or 128 x 256 TMA + QGMMA.
enum class Fp8BlockTiles : uint8_t { tma128, mma64, tma64, tma128n256 };

// Whether the 256-column TMA tiles take the shape: whole N tiles in both gemms (gemm1's N tile
// covers 128 gate + 128 up columns when g1u1).
constexpr bool fp8_tma256_takes(int64_t H, int64_t I, bool g1u1) {
  return H % 256 == 0 && I % (g1u1 ? 128 : 256) == 0;
}

// Whether the block variant's 64-row mma.sync tiles fit: their K / 128 scales stage in shared memory
// beside 4 cp.async stages, for K = H (gemm1) and K = I (gemm2).
constexpr bool fp8_block_mma64_fits(int64_t H, int64_t I) {
  return (H > I ? H : I) / 128 * 128 <= cuda::fused_moe_sm90_grouped_fp8_block_bm64_max_k();
}

// The pipeline depth of a block mma gemm over K (H for gemm1, I for gemm2) on `ctas` CTAs: 5 stages
// for long K loops on large grids (at least 6 CTAs per SM) where the K / 128 scales still fit
// beside them (K <= 13312), else 4; force5: 5 wherever they fit (what an explicit 5-stage config
// may ask for). 5 won on a
// long K over many CTAs and lost on few CTAs or a short K; the thresholds sit between those points
// (docs/experiments.md E64, E65; the fit: E63).
constexpr int64_t kBlk5StagesMinK = 6144, kBlk5StagesMinWaves = 6;
constexpr int fp8_block_mma_stages(int64_t K, int64_t ctas, bool force5, int sm_count) {
  if (K / 128 * 128 > cuda::fused_moe_sm90_grouped_fp8_block_bm64_max_k(5)) return 4;
  return force5 || (K >= kBlk5StagesMinK && ctas >= kBlk5StagesMinWaves * sm_count) ? 5 : 4;
}

// Both gemms' depths for the block mma tiles on `tiles` M tiles of 64 rows: gemm1 over K = H on N
// tiles of 128 gate + 128 up columns (g1u1) or 256, gemm2 over K = I on N tiles of 256.
struct Fp8BlockMmaStages {
  int gemm1, gemm2;
};
constexpr Fp8BlockMmaStages fp8_block_mma_gemm_stages(int64_t tiles, int64_t H, int64_t I, bool g1u1, bool force5,
                                                      int sm_count) {
  const int64_t n1 = g1u1 ? (I + 127) / 128 : (I + 255) / 256, n2 = (H + 255) / 256;
  return {fp8_block_mma_stages(H, tiles * n1, force5, sm_count), fp8_block_mma_stages(I, tiles * n2, force5, sm_count)};
}

// tk routed entries over E local experts; tma256: the 256-column tiles take the shape (and the
// operands). 64 x 256 up to kGroupedFp8Tma64MaxRows rows per touched expert, else 64-row mma.sync
// tiles up to kGroupedFp8Bm64MaxRows, else 192 x 256 where they pad fewer rows, else 128 x 256.
inline Fp8RowTiles fp8_row_tiles(int64_t tk, int64_t E, bool tma256) {
  if (tma256 && fused_moe_sm90_grouped_fp8_tile_m(tk, E, true) == 64) return Fp8RowTiles::tma64;
  if (fused_moe_sm90_grouped_fp8_tile_m(tk, E) == 64) return Fp8RowTiles::mma64;
  return fused_moe_sm90_grouped_fp8_m192(tk, E) ? Fp8RowTiles::m192 : Fp8RowTiles::tma128;
}

// mma64_fits: the 64-row mma.sync tiles' K / 128 scales fit in shared memory beside the stages.
// Where the 256-column tiles take the shape: 128 x 256 or 64 x 256 by their expected padding
// (fused_moe_sm90_fp8_block_n256_128rows). Elsewhere 64-row mma.sync tiles up to
// kGroupedFp8BlockBm64MaxRows rows per touched expert (where they fit), else 128 x 128 (E73).
inline Fp8BlockTiles fp8_block_tiles(int64_t tk, int64_t E, bool tma256, bool mma64_fits) {
  if (tma256) return fused_moe_sm90_fp8_block_n256_128rows(tk, E) ? Fp8BlockTiles::tma128n256 : Fp8BlockTiles::tma64;
  if (mma64_fits && fused_moe_sm90_grouped_fp8_block_tile_m(tk, E) == 64) return Fp8BlockTiles::mma64;
  return Fp8BlockTiles::tma128;
}

inline const char* fp8_row_tiles_name(Fp8RowTiles t) {
  switch (t) {
    case Fp8RowTiles::tma64: return "64x256";
    case Fp8RowTiles::mma64: return "64x256.mma";
    case Fp8RowTiles::m192: return "192x256";
    case Fp8RowTiles::tma128: break;
  }
  return "128x256";
}

inline const char* fp8_block_tiles_name(Fp8BlockTiles t) {
  switch (t) {
    case Fp8BlockTiles::tma64: return "64x256";
    case Fp8BlockTiles::mma64: return "64x256.mma";
    case Fp8BlockTiles::tma128n256: return "128x256";
    case Fp8BlockTiles::tma128: break;
  }
  return "128x128";
}

}  // namespace moekit
