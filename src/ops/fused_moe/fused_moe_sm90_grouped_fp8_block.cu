// fused_moe_sm90_grouped_fp8_block: the fp8 128 x 128 block-scaled fused_moe (SPEC 3.3, DeepSeek-V3;
// with the router weight on the input too, k == 1) on sm_90a fp8 tensor cores, all token counts.
//
// Launches on ctx.stream, no host synchronisation, no allocation (CUDA-graph capturable):
//   1. route      the routing kernel of the grouped path (BM 128 tiles).
//   2. quant x    x quantized per 1 x 128 group with the reference's codes (s = max(amax, 1e-12) /
//                 448 per group, codes e4m3fn(v / s)): once per token, written to its k rows
//                 (quant_tokens_kernel; at few rows one block per row, launch_quant_x).
//   3. gemm1      persistent TMA + wgmma kernel (the stage ring and schedule of
//                 fused_moe_sm90_grouped_tma.cuh) on 128 x 128 tiles: per 128-wide K slice (= one
//                 scale block) each consumer warpgroup runs wgmma m64n128k32 into one of two
//                 temporary accumulator sets, and while the next slice's group runs into the other,
//                 promotes them into its f32 accumulators times a_scale[row, kb] * w_scale[e, nb, kb]
//                 (the reference's block_row_dot order). 384 threads: two consumer warpgroups with
//                 232 registers each (setmaxnreg) and a producer warpgroup. N tile: 64 gate + 64 up
//                 columns (g1u1) or 128 (g1u0); a = act(w g) * (w u) in f32 -> workspace.
//   4. quant a    a re-quantized per (row, 128-group) (in gemm1's epilogue on 128 x 256 and 64 x 256
//                 tiles).
//   5. gemm2      the same mainloop on a (N tile: 128 columns of H); y in f32.
//   6. reduce     out[t] = round(sum_j w_tj * y[row(t, j)]) in slot order.
// The TMA gemms (3 and 5) are in fused_moe_sm90_grouped_fp8_block_tma.cuh.
// fused_moe_sm90_grouped_fp8_block_tma64 routes into 64-row M tiles and runs the same gemms on 64 x
// 256 tiles (both consumer warpgroups on the 64 rows, 128 columns each; H % 256 == 0): for experts
// with up to 128 rows, where a 128-row tile is mostly padding.
// fused_moe_sm90_grouped_fp8_block_n256 runs them on 128 x 256 tiles (each consumer warpgroup's 256
// columns as two 128-column halves; H % 256 == 0); its gemm1 quantizes a itself (step 4 fused: a
// tile holds whole 128-groups of a; blk_quant_a_epilogue), so a never goes to memory in f32.
// fused_moe_sm90_grouped_fp8_block_bm64 routes into 64-row M tiles and runs gemm1 / gemm2 on the
// cp.async + mma.sync m16n8k32 e4m3 mainloop of the per-row BM 64 kernels (emulated on sm_90: two
// HMMA per MMA), promoting per K slice through the mainloop's slice hook (BlkPromote) from scales
// staged in shared memory: the 64-row tiles where the TMA ones do not take the shape.
// fused_moe_sm90_fp8_block picks among them by fp8_block_tiles (fused_moe_sm90_tiles.h).
// Deterministic by construction (no float atomics). Requirements: weights e4m3fn row_major with
// scale_block_n = scale_block_k = 128, H % 128 == 0, I % 128 == 0.
// Resources: 64 + 2 x 64 accumulators per consumer thread (no spills); a ring of 7 stages of 32 KiB
// (A 128 rows + two 64-row B boxes of 128 codes; Fp8Ring in fused_moe_sm90_grouped_fp8_ring.cuh; 64 x
// 256 tiles: 5 stages of 40 KiB). BM 64 (ptxas, nvcc 13.0): 255
// registers, gemm1 g1u0 no spills, g1u1 4 bytes (one activation), gemm2 32 bytes of spill stores
// (64 partial + 64 promoted accumulators and double-buffered fragments per thread); shared memory
// 160 or 200 KiB of stages + (64 + 2) * K / 128 floats of scales (fused_moe_sm90_grouped_fp8_block_bm64_max_k).
// Tests: tests/test_fused_moe_sm90_grouped_fp8_block.cpp (suite FusedMoeSm90GroupedFp8Block).
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8_block.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_utils.h"
#include "cuda/device_facts.h"
#include "cuda/fp8_encode.cuh"
#include "cuda/fp8_quotient.h"
#include "cuda/sm90/tma_store_f32.cuh"
#include "cuda/tensor_map.h"
#include "moekit/core/dtype.h"
#include "moekit/ops/quant.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_common.cuh"
#include "ops/fused_moe/fused_moe_heuristic.h"
#include "ops/fused_moe/fused_moe_sm90_config.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_mma_fp8.cuh"
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8_quant.cuh"
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8_ring.cuh"
#include "ops/fused_moe/fused_moe_sm90_grouped_tma.cuh"
#include "ops/fused_moe/fused_moe_sm90_small_m.h"
#include "ops/fused_moe/fused_moe_sm90_tiles.h"

namespace moekit::cuda {
namespace grouped {
namespace {

constexpr int kBlk = 128;                                  // scale block (N and K) = one K slice of codes

// ---------------------------------------------------------------- tiles and workspace layout
// The gemms' tiles: 128 x 128 TMA + QGMMA, 64-row mma.sync, 64 x 256 TMA + QGMMA, or 128 x 256 TMA +
// QGMMA; the routing cuts M tiles of blk_tile_rows rows for them.
using BlkTiles = Fp8BlockTiles;  // fused_moe_sm90_tiles.h
constexpr int blk_tile_rows(BlkTiles t) { return t == BlkTiles::tma128 || t == BlkTiles::tma128n256 ? 128 : kMmaBM; }
// Whether gemm1 quantizes a itself (blk_quant_a_epilogue, _64): the 256-column TMA tiles, whose N
// tiles hold whole 128-groups of a; their workspace has no f32 a.
constexpr bool blk_gemm1_quantizes_a(BlkTiles t) { return t == BlkTiles::tma64 || t == BlkTiles::tma128n256; }

// The tiles of a resolved fp8_block grouped config.
BlkTiles blk_tiles_of(const Sm90Config& c) {
  if (c.mainloop == Sm90Mainloop::mma) return BlkTiles::mma64;
  if (c.tile_m == 64) return BlkTiles::tma64;
  return c.tile_n == 256 ? BlkTiles::tma128n256 : BlkTiles::tma128;
}

// One scale per 128-group of x and a rows; M tiles of blk_tile_rows rows; gemm2 in c.gemm2_splits K
// ranges; no f32 a where blk_gemm1_quantizes_a.
Fp8Workspace blk_layout_of(const FusedMoeParams& p, const Sm90Config& c) {
  const MoeDims d = moe_dims(p);
  const BlkTiles t = blk_tiles_of(c);
  return fp8_workspace(p, d.H / kBlk, d.I / kBlk, c.gemm2_splits, blk_tile_rows(t), !blk_gemm1_quantizes_a(t));
}

// ---------------------------------------------------------------- per-group quantizer
// quant_groups_kernel, launch_quant_groups: fused_moe_sm90_grouped_fp8_quant.cuh.

// ---------------------------------------------------------------- gemm arguments
// Both tile shapes' gemms (the 128-row kernels of fused_moe_sm90_grouped_fp8_block_tma.cuh and the
// BM 64 ones below).
struct BlkArgs {
  const int32_t* offsets;   // routing outputs
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;
  const int32_t* row_entry;
  const float* weights;     // [T*k] router weights (weight_on_input only)
  const float* a_scale;     // [Tk, K / 128] group scales of A's rows
  const float* w_scale;     // [E, N / 128, K / 128]
  float* out;               // gemm1: a [Tk, I]; gemm2: y [splits, Tk, H]
  int H, I, tk;
  bool weight_on_input;
  int splits = 1;           // gemm2 of the 64 x 256 TMA tiles: K ranges (fused_moe_sm90_tma64_gemm2_splits)
  int64_t y_split = 0;      // elements between the K ranges' partials
  uint8_t* aq = nullptr;    // gemm1 of the 256-column TMA tiles: a's codes [Tk, I] and group scales
  float* sa = nullptr;      //   [Tk, I / 128], quantized in its epilogue (blk_gemm1_quantizes_a)
};

#include "ops/fused_moe/fused_moe_sm90_grouped_fp8_block_tma.cuh"

// ---------------------------------------------------------------- BM 64 tiles: mma.sync on e4m3
// For experts with few rows: the cp.async + mma.sync m16n8k32 mainloop of the per-row BM 64 kernels
// (fused_moe_sm90_grouped_mma_fp8.cuh), whose K slice per stage is 128 codes = one scale block.
// After each slice BlkPromote adds the slice's partial sums into its f32 sums times
// a_scale[row, kt] * w_scale[e, nb, kt] and restarts the partials from zero (the order of the
// reference's block_row_dot, as the wgmma consumer above). A warp's columns lie in one 128-column
// scale block (g1u0, gemm2: 32 columns; g1u1: 16 gate columns in block lo, the matching 16 up
// columns in block hi), so one weight scale per half per slice.
// The scales it reads are staged in shared memory behind the mainloop's stages before the K loop
// (stage_blk_scales): the tile's activation scales [KT][64] (row fastest, 0 past the tile's real
// rows, so padding rows need no mask) and two rows of KT weight scales.
// NOTE: read from global memory inside the hook, each slice's promotion waited on loads that all 8
// warps issue at the same point after the slice barrier (docs/experiments.md E62).
// kTwo: the warp's columns span two scale blocks (gemm1 g1u1: gate in lo, up in hi), else one (lo).
// kStages: the mainloop's pipeline depth (HookStages): 5 where the scales leave room, else 4.
template <int NT, bool kTwo, int kStages_ = grouped::kStages>
struct BlkPromote {
  static constexpr bool kActive = true;
  static constexpr int kStages = kStages_;
  Acc<NT> sum;
  const float* sa;  // shared: activation scales [KT][64], offset by this lane's row lane / 4
  const float* lo;  // shared: [KT] weight scales of the columns j < NT / 2 (all columns when !kTwo)
  const float* hi;  // shared: ... of the columns j >= NT / 2 (kTwo only)

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) sum.v[mi][j][q] = 0.0f;
  }
  template <int MA>
  __device__ __forceinline__ void slice(int kt, Acc<NT>& acc) {
    const float wl = lo[kt], wh = kTwo ? hi[kt] : wl;
#pragma unroll
    for (int mi = 0; mi < MA; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float s = sa[kt * kMmaBM + mi * 16 + 8 * h];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const float f = s * (j < NT / 2 ? wl : wh);
          sum.v[mi][j][2 * h] += acc.v[mi][j][2 * h] * f;
          sum.v[mi][j][2 * h + 1] += acc.v[mi][j][2 * h + 1] * f;
          acc.v[mi][j][2 * h] = 0.0f;
          acc.v[mi][j][2 * h + 1] = 0.0f;
        }
      }
    }
  }
};

// Shared bytes of the BM 64 mainloop's `stages` stages and of the staged scales behind them for KT K
// slices (two weight scale rows), and whether they fit one CTA's shared memory
// (fused_moe_sm90_grouped_fp8_block_bm64_max_k, the header).
constexpr int blk_stage_bytes(int stages) { return stages * MmaTile::kStageElems * 2; }
constexpr size_t blk_mma_scale_bytes(int64_t KT) { return size_t((kMmaBM + 2) * KT) * sizeof(float); }
static_assert(kFp8BlockBm64StageBytes == MmaTile::kStageElems * 2, "the header's copy of the stage bytes");
static_assert(blk_stage_bytes(4) + blk_mma_scale_bytes(fused_moe_sm90_grouped_fp8_block_bm64_max_k(4) / kBlk) <=
                  size_t(kFp8BlockBm64MaxSmem) &&
              blk_stage_bytes(5) + blk_mma_scale_bytes(fused_moe_sm90_grouped_fp8_block_bm64_max_k(5) / kBlk) <=
                  size_t(kFp8BlockBm64MaxSmem),
              "the header's K limits keep the stages and staged scales within one CTA's shared memory");

// Writes the scales of a 64-row tile at row0 (nrows real rows) into shared `s` (blk_mma_scale_bytes):
// activation scales [KT][64] from a_scale [Tk, KT] (0 for rows >= nrows), then two rows of KT
// weight scales, row r from w[r]. Every thread of the CTA takes part; the mainloop's first barrier
// publishes them.
__device__ __forceinline__ void stage_blk_scales(float* s, const float* a_scale, int row0, int nrows, int KT,
                                                 const float* const (&w)[2]) {
  for (int i = threadIdx.x; i < kMmaBM * KT; i += kThreads) {
    const int r = i / KT, kt = i - r * KT;  // kt fastest: coalesced reads of a_scale's rows
    s[kt * kMmaBM + r] = r < nrows ? a_scale[int64_t(row0 + r) * KT + kt] : 0.0f;
  }
  for (int i = threadIdx.x; i < 2 * KT; i += kThreads) s[kMmaBM * KT + i] = i < KT ? w[0][i] : w[1][i - KT];
}

// The promotion state of a warp whose weight scales are rows lo / hi (0 or 1) of the staged pair.
template <bool kTwo, int kStages>
__device__ __forceinline__ BlkPromote<MmaTile::kNT, kTwo, kStages> blk_promote(const float* s, int KT, int lo, int hi) {
  BlkPromote<MmaTile::kNT, kTwo, kStages> pr;
  pr.init();
  pr.sa = s + ((threadIdx.x & 31) >> 2);
  pr.lo = s + kMmaBM * KT + lo * KT;
  pr.hi = s + kMmaBM * KT + hi * KT;
  return pr;
}

// gemm1 on BM 64 tiles, grid (tiles_max, N tiles) as gemm1_fp8_mma_kernel: N tile = 128 gate + 128 up
// columns (g1u1) or 256 (g1u0); a = act(w g) * (w u) (or act(w g)) in f32 from the promoted sums.
template <bool G1U1, Activation A, int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    gemm1_blk_mma_kernel(BlkArgs p, const uint8_t* xq, const uint8_t* w1) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  wait_for_predecessor();
  const int tile = blockIdx.x;
  const int e = p.tile_expert[tile];
  if (e < 0) return;
  const int row0 = p.tile_row0[tile], row_end = p.offsets[e + 1], nrows = row_end - row0;
  const int tid = threadIdx.x, lane = tid & 31, wn = (tid >> 5) % MmaTile::kWN;
  const int n1 = G1U1 ? 2 * p.I : p.I, k2 = p.H / 2, KT = p.H / kBlk, NB = n1 / kBlk;
  constexpr int kTileN = G1U1 ? kBN / 2 : kBN;  // columns of I per N tile
  const int i0 = blockIdx.y * kTileN;
  TileSources<E4m3x2, kMmaBM> src;
  mma_a_rows(src, xq, p.H, row0, row_end, tid);
  mma_w1_rows<G1U1>(src, w1, e, p.H, p.I, i0, tid);
  constexpr int kGW = MmaTile::kWarpCols / 2;
  constexpr int kNT = MmaTile::kNT;
  // The CTA's weight scale rows: g1u1 the gate block and its up block; g1u0 the blocks of the tile's
  // two 128-column halves (clamped below NB).
  const int ic = i0 + wn * (G1U1 ? kGW : MmaTile::kWarpCols);
  const float* ws = p.w_scale + int64_t(e) * NB * KT;
  const int b0 = i0 / kBlk, b1 = G1U1 ? (p.I + i0) / kBlk : min(b0 + 1, NB - 1);
  const float* wrows[2] = {ws + int64_t(b0) * KT, ws + int64_t(b1) * KT};
  float* scales = reinterpret_cast<float*>(smem_raw + blk_stage_bytes(kStages));
  stage_blk_scales(scales, p.a_scale, row0, nrows, KT, wrows);
  const int wlo = G1U1 ? 0 : (wn * MmaTile::kWarpCols) / kBlk;
  auto pr = blk_promote<G1U1, kStages>(scales, KT, wlo, G1U1 ? 1 : wlo);
  Acc<kNT> acc;
  mainloop_rows<E4m3x2, kMmaBM, G1U1 ? kBN / 2 : 8 * MmaTile::kNG>(
      smem_raw, src, k2, G1U1 ? wn * kGW : wn * MmaTile::kWarpCols, nrows, acc, pr);

  // The warp's columns lie in one 32-aligned block and I % 128 == 0: all valid or all past I.
  if (ic >= p.I) return;
  const int c0 = ic + 2 * (lane & 3);
  for_lane_rows(lane, nrows, [&](int mi, int h, int rl) {
    const int row = row0 + rl;
    const float wt = p.weight_on_input ? p.weights[p.row_entry[row]] : 1.0f;
    float* orow = p.out + int64_t(row) * p.I;
    if constexpr (G1U1) {
#pragma unroll
      for (int jj = 0; jj < kNT / 2; ++jj) {
        const float* g = &pr.sum.v[mi][jj][2 * h];
        const float* u = &pr.sum.v[mi][jj + kNT / 2][2 * h];
        *reinterpret_cast<float2*>(orow + c0 + 8 * jj) =
            make_float2(act<A>(g[0] * wt) * (u[0] * wt), act<A>(g[1] * wt) * (u[1] * wt));
      }
    } else {
#pragma unroll
      for (int jj = 0; jj < kNT; ++jj) {
        const float* g = &pr.sum.v[mi][jj][2 * h];
        *reinterpret_cast<float2*>(orow + c0 + 8 * jj) = make_float2(act<A>(g[0] * wt), act<A>(g[1] * wt));
      }
    }
  });
}

// gemm2 on BM 64 tiles, grid (tiles_max, H / 256): A = aq rows, B = w2 codes, N tiles of 256 columns;
// y = the promoted sums.
template <int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    gemm2_blk_mma_kernel(BlkArgs p, const uint8_t* aq, const uint8_t* w2) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  wait_for_predecessor();
  const int tile = blockIdx.x;
  const int e = p.tile_expert[tile];
  if (e < 0) return;
  const int row0 = p.tile_row0[tile], row_end = p.offsets[e + 1], nrows = row_end - row0;
  const int tid = threadIdx.x, lane = tid & 31, wn = (tid >> 5) % MmaTile::kWN;
  const int h0 = blockIdx.y * kBN, k2 = p.I / 2, KT = p.I / kBlk, NB = p.H / kBlk;
  TileSources<E4m3x2, kMmaBM> src;
  mma_a_rows(src, aq, p.I, row0, row_end, tid);
  mma_w2_rows(src, w2, e, p.H, p.I, h0, tid);
  constexpr int kNT = MmaTile::kNT;
  const int hc = h0 + wn * MmaTile::kWarpCols;  // H % 128 == 0: the warp's 32 columns all valid or all past H
  const float* ws = p.w_scale + (int64_t(e) * NB) * KT;
  const int b0 = h0 / kBlk;  // the tile's two 128-column blocks (clamped below NB)
  const float* wrows[2] = {ws + int64_t(b0) * KT, ws + int64_t(min(b0 + 1, NB - 1)) * KT};
  float* scales = reinterpret_cast<float*>(smem_raw + blk_stage_bytes(kStages));
  stage_blk_scales(scales, p.a_scale, row0, nrows, KT, wrows);
  const int wlo = (wn * MmaTile::kWarpCols) / kBlk;
  auto pr = blk_promote<false, kStages>(scales, KT, wlo, wlo);
  Acc<kNT> acc;
  mainloop_rows<E4m3x2, kMmaBM, 8 * MmaTile::kNG>(smem_raw, src, k2, wn * MmaTile::kWarpCols, nrows, acc, pr);

  if (hc >= p.H) return;
  const int c0 = hc + 2 * (lane & 3);
  for_lane_rows(lane, nrows, [&](int mi, int h, int rl) {
    float* yrow = p.out + int64_t(row0 + rl) * p.H + c0;
#pragma unroll
    for (int jj = 0; jj < kNT; ++jj) {
      *reinterpret_cast<float2*>(yrow + 8 * jj) = make_float2(pr.sum.v[mi][jj][2 * h], pr.sum.v[mi][jj][2 * h + 1]);
    }
  });
}

// ---------------------------------------------------------------- host side
// Step 4 between the gemms: a (gemm1's f32 output) re-quantized per (row, 128-group) into the
// workspace's aq codes and sa scales.
Status quant_a_groups(const FusedMoeParams& p, const Fp8Workspace& l, const BlkArgs& g1, unsigned char* base,
                      cudaStream_t s, const char* what) {
  const MoeDims d = moe_dims(p);
  return launch_quant_groups(static_cast<const float*>(g1.out), int64_t(d.I), nullptr, 1, g1.offsets, int(d.E),
                             int(d.I), base + l.aq, reinterpret_cast<float*>(base + l.sa), l.tk, s, what);
}

// The TMA gemms (kTiles: tma128, tma64 or tma128n256; fused_moe_sm90_grouped_fp8_block_tma.cuh) and
// the quantization of a between them: persistent TMA + wgmma kernels (one CTA per SM at most).
template <BlkTiles kTiles>
Status run_blk_tma(const FusedMoeParams& p, const Fp8Workspace& l, const BlkArgs& g1, const BlkArgs& g2,
                   unsigned char* base, cudaStream_t s) {
  constexpr int kBM = blk_tile_rows(kTiles), kN = kTiles == BlkTiles::tma128 ? 128 : 256;
  using C = Fp8Ring<kBM, kN>;
  const MoeDims d = moe_dims(p);
  Fp8GemmMaps m;
  MOEKIT_RETURN_IF_ERROR(
      encode_fp8_gemm_maps(p, l.tk, base + l.xq, base + l.aq, kBM, 64, "fused_moe_sm90_grouped_fp8_block", &m));
  int sms = 0;
  MOEKIT_RETURN_IF_ERROR(device_sm_count(&sms, "fused_moe_sm90_grouped_fp8_block: SM count"));
  auto grid = [&](int64_t items) { return unsigned(std::min<int64_t>(sms, items)); };

  const int n_tiles1 = int(d.I / (d.g1u1 ? C::kNCols / 2 : C::kNCols)), n_tiles2 = int(d.H / C::kNCols);
  auto* fn1 = pick_gemm1(p.activation, d.g1u1, [](auto g1u1, auto act) {
    return gemm1_blk_kernel<decltype(g1u1)::value, decltype(act)::value, kBM, kN>;
  });
  // The 128 x 256 and 64 x 256 tiles' gemm1 writes a's codes and scales itself (a tile holds whole
  // 128-groups; the 64 x 256 one meets its warpgroups' amaxes in kBlkXchBytes of shared memory).
  constexpr bool kQuantA = blk_gemm1_quantizes_a(kTiles);
  BlkArgs g1t = g1;
  if constexpr (kQuantA) {
    g1t.aq = base + l.aq;
    g1t.sa = reinterpret_cast<float*>(base + l.sa);
    g1t.out = nullptr;  // no f32 a in its workspace (blk_layout_of)
  }
  const int smem1 = C::kSmemBytes + (kBM == 64 ? kBlkXchBytes : 0);
  MOEKIT_RETURN_IF_ERROR(launch_ws_kernel_cfg(fn1, grid(l.tiles_max * n_tiles1), kFp8RingThreads, smem1, s,
                                              "fused_moe_sm90_grouped_fp8_block gemm1", m.ma1, m.mb1, g1t, n_tiles1));
  if constexpr (!kQuantA) {
    MOEKIT_RETURN_IF_ERROR(quant_a_groups(p, l, g1, base, s, "fused_moe_sm90_grouped_fp8_block quant a"));
  }
  CUtensorMap my{};  // y for the TMA stores (kBlkYByTma)
  if constexpr (kBlkYByTma<kBM, kN>) {
    constexpr int kChunk = kBlkYChunkCols<kBM, kN>;
    MOEKIT_RETURN_IF_ERROR(sm90::encode_f32_rows_map<kChunk>(
        &my, g2.out, uint64_t(g2.splits) * uint64_t(l.tk), uint64_t(d.H), "fused_moe_sm90_grouped_fp8_block y"));
  }
  const int smem2 = C::kSmemBytes + kBlkYStoreBytes<kBM, kN>;
  return launch_ws_kernel_cfg(gemm2_blk_kernel<kBM, kN>, grid(l.tiles_max * n_tiles2 * g2.splits), kFp8RingThreads,
                              smem2, s, "fused_moe_sm90_grouped_fp8_block gemm2", m.ma2, m.mb2, my, g2, n_tiles2);
}

// The BM 64 gemms (mma.sync, grid (tiles_max, N tiles), pipelines kStages1 (gemm1) and kStages2
// (gemm2) deep) and the quantization of a between them.
template <int kStages1, int kStages2>
Status run_blk_mma(const FusedMoeParams& p, const Fp8Workspace& l, const BlkArgs& g1, const BlkArgs& g2,
                   unsigned char* base, cudaStream_t s) {
  const MoeDims d = moe_dims(p);
  const unsigned n_tiles1 = unsigned(ceil_div(d.I, d.g1u1 ? kBN / 2 : kBN)), n_tiles2 = unsigned(ceil_div(d.H, kBN));
  auto* fn1 = pick_gemm1(p.activation, d.g1u1, [](auto g1u1, auto act) {
    return gemm1_blk_mma_kernel<decltype(g1u1)::value, decltype(act)::value, kStages1>;
  });
  // Shared memory beyond launch_mma's 4 stages.
  const size_t more1 = size_t(blk_stage_bytes(kStages1)) - size_t(MmaTile::kSmemBytes);
  const size_t more2 = size_t(blk_stage_bytes(kStages2)) - size_t(MmaTile::kSmemBytes);
  MOEKIT_RETURN_IF_ERROR(launch_mma(fn1, dim3(unsigned(l.tiles_max), n_tiles1), s,
                                    "fused_moe_sm90_grouped_fp8_block gemm1 (BM 64)", g1, base + l.xq,
                                    static_cast<const uint8_t*>(p.w1.data),
                                    more1 + blk_mma_scale_bytes(d.H / kBlk)));
  MOEKIT_RETURN_IF_ERROR(quant_a_groups(p, l, g1, base, s, "fused_moe_sm90_grouped_fp8_block quant a (BM 64)"));
  return launch_mma(gemm2_blk_mma_kernel<kStages2>, dim3(unsigned(l.tiles_max), n_tiles2), s,
                    "fused_moe_sm90_grouped_fp8_block gemm2 (BM 64)", g2, static_cast<const uint8_t*>(base + l.aq),
                    static_cast<const uint8_t*>(p.w2.data), more2 + blk_mma_scale_bytes(d.I / kBlk));
}

// c: a resolved fp8_block grouped config (the mma64 gemms' depths in c.stages).
template <class TT>
Status run_blk_typed(const FusedMoeParams& p, const Sm90Config& c, const RunContext& ctx) {
  const MoeDims d = moe_dims(p);
  const BlkTiles tiles = blk_tiles_of(c);
  const int bm = blk_tile_rows(tiles);
  const Fp8Workspace l = blk_layout_of(p, c);
  auto* base = static_cast<unsigned char*>(ctx.workspace);
  base += (kFp8WsAlign - reinterpret_cast<uintptr_t>(base) % kFp8WsAlign) % kFp8WsAlign;
  auto at = [&](size_t off) { return reinterpret_cast<int32_t*>(base + off); };
  auto fat = [&](size_t off) { return reinterpret_cast<float*>(base + off); };
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);

  MOEKIT_RETURN_IF_ERROR(launch_route(p,
                                      {at(l.local), at(l.offsets), at(l.row_entry), at(l.slot_row), at(l.tile_expert),
                                       at(l.tile_row0), at(l.num_tiles)},
                                      l.tk, l.tiles_max, bm, s, "fused_moe_sm90_grouped_fp8_block route"));
  MOEKIT_RETURN_IF_ERROR(launch_quant_x(static_cast<const TT*>(p.x.data), p.x.stride[0], at(l.slot_row),
                                        at(l.row_entry), int(d.T), int(d.k), at(l.offsets), int(d.E), int(d.H), true,
                                        nullptr, base + l.xq, fat(l.sx), l.tk, s,
                                        "fused_moe_sm90_grouped_fp8_block quant x"));

  BlkArgs g1{at(l.offsets), at(l.tile_expert), at(l.tile_row0), at(l.num_tiles), at(l.row_entry),
             p.topk_weights.ptr<const float>(), fat(l.sx), p.w1_scale.ptr<const float>(), fat(l.a), int(d.H), int(d.I),
             int(l.tk), p.weight_on_input};
  BlkArgs g2{at(l.offsets), at(l.tile_expert), at(l.tile_row0), at(l.num_tiles), at(l.row_entry),
             p.topk_weights.ptr<const float>(), fat(l.sa), p.w2_scale.ptr<const float>(), fat(l.y), int(d.H), int(d.I),
             int(l.tk), false, l.splits, l.tk * d.H};
  const auto gemms = [&]() -> Status {
    if (tiles == BlkTiles::tma128) return run_blk_tma<BlkTiles::tma128>(p, l, g1, g2, base, s);
    if (tiles == BlkTiles::tma128n256) return run_blk_tma<BlkTiles::tma128n256>(p, l, g1, g2, base, s);
    if (tiles == BlkTiles::tma64) return run_blk_tma<BlkTiles::tma64>(p, l, g1, g2, base, s);
    static_assert(kBN == 256, "fp8_block_mma_gemm_stages counts N tiles of 256 columns");
    const bool five1 = c.stages[0] == 5, five2 = c.stages[1] == 5;
    if (five1) return five2 ? run_blk_mma<5, 5>(p, l, g1, g2, base, s) : run_blk_mma<5, 4>(p, l, g1, g2, base, s);
    return five2 ? run_blk_mma<4, 5>(p, l, g1, g2, base, s) : run_blk_mma<4, 4>(p, l, g1, g2, base, s);
  };
  MOEKIT_RETURN_IF_ERROR(gemms());

  ReduceArgs rd{fat(l.y), l.tk * d.H, at(l.slot_row), p.topk_weights.ptr<const float>(), p.out.data,
                p.out.stride[0], int(d.H), int(d.k), l.splits, p.weight_on_input};
  return launch_reduce<TT>(rd, d.T, s, "fused_moe_sm90_grouped_fp8_block reduce");
}

}  // namespace
}  // namespace grouped

Status fused_moe_sm90_grouped_fp8_block_supports(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(check_fp8_operands(p));
  if (p.scale_block_n != grouped::kBlk || p.scale_block_k != grouped::kBlk) {
    return Unsupported("scale_block_n/k: 128 x 128 block scales only, got ", p.scale_block_n, "x", p.scale_block_k);
  }
  MOEKIT_RETURN_IF_ERROR(fused_moe_sm90_grouped_fp8_shape_supports(p));
  const MoeDims d = moe_dims(p);
  MOEKIT_RETURN_IF_ERROR(check_fp8_block_scale(p.w1_scale, "w1_scale", d.E, d.N1, d.H));
  return check_fp8_block_scale(p.w2_scale, "w2_scale", d.E, d.H, d.I);
}

size_t fused_moe_sm90_grouped_fp8_block_config_workspace_bytes(const FusedMoeParams& p, const Sm90Config& c) {
  return grouped::blk_layout_of(p, c).total;
}

Status fused_moe_sm90_grouped_fp8_block_config_run(const FusedMoeParams& p, const Sm90Config& c,
                                                   const RunContext& ctx) {
  return grouped::run_fp8_entry(p, ctx, grouped::blk_layout_of(p, c).total, "fused_moe_sm90_grouped_fp8_block",
                                [&](auto tt) { return grouped::run_blk_typed<decltype(tt)>(p, c, ctx); });
}

}  // namespace moekit::cuda
