// fused_moe_sm90_grouped_fp8 (see fused_moe_sm90_grouped_fp8.h): fp8 W8A8 prefill on the persistent
// TMA + wgmma kernels of the bf16 path (fused_moe_sm90_grouped_tma.cuh) with e4m3 operands: a K slice
// is 128 codes (128 bytes, the same 128-byte swizzle rows), four wgmma m64n256k32 per slice. With few
// rows per expert (fused_moe_sm90_grouped_tile_m says 64, as for bf16) the M tiles are 64 rows on the
// cp.async + mma.sync mainloop of the bf16 BM 64 path instead (mma m16n8k32 e4m3, see E4m3x2). The
// activations are quantized exactly as the reference does (fused_moe_ref_fp8.cpp, run_row); the
// scales are applied in the epilogues (per row of A, per output column of the weights).
// SPEC 3.2, 3.4. Deterministic by construction (no float atomics).
// Tests: tests/test_fused_moe_sm90_grouped_fp8.cpp (suite FusedMoeSm90GroupedFp8).
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8.h"

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
#include "cuda/sm90/tma_store_f32.cuh"
#include "cuda/tensor_map.h"
#include "moekit/core/dtype.h"
#include "moekit/ops/quant.h"
#include "ops/fused_moe/fused_moe_heuristic.h"
#include "ops/fused_moe/fused_moe_sm90_grouped.h"
#include "ops/fused_moe/fused_moe_sm90_config.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_common.cuh"
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8_quant.cuh"
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8_ring.cuh"
#include "ops/fused_moe/fused_moe_sm90_grouped_mma_fp8.cuh"
#include "ops/fused_moe/fused_moe_sm90_grouped_tma.cuh"
#include "ops/fused_moe/fused_moe_sm90_small_m.h"
#include "ops/fused_moe/fused_moe_sm90_tiles.h"

namespace moekit::cuda {
namespace grouped {
namespace {

constexpr int kSliceCodes = 128;  // fp8 codes per 128-byte K slice

// The dynamic shared memory of every kernel below (each redeclares it), declared here first so that
// its 1024-byte alignment, which the TMA swizzle needs, is the one the compiler assumes in all of them
// (the first declaration's alignment wins; the mma.sync kernels ask for 128).
extern __shared__ __align__(1024) unsigned char smem_raw[];

// ---------------------------------------------------------------- workspace layout
// One scale per row for x and a; gemm2 in c.gemm2_splits K ranges; M tiles of c.tile_m rows.
Fp8Workspace fp8_layout_of(const FusedMoeParams& p, const Sm90Config& c) {
  return fp8_workspace(p, 1, 1, c.gemm2_splits, c.tile_m);
}

// ---------------------------------------------------------------- quantizers (as the reference)
// quant_rows_kernel, launch_quant_rows: fused_moe_sm90_grouped_fp8_quant.cuh.
// Between the gemms (every tile shape): a's expert-ordered rows (f32, I wide) -> codes aq and one
// scale per row in sa. amax_given: sa already holds each row's max |a| (the TMA gemm1s above kQuantFewRows rows).
Status launch_quant_a(const MoeDims& d, const Fp8Workspace& l, const int32_t* offsets, const float* a, uint8_t* aq,
                      float* sa, cudaStream_t s, bool amax_given = false) {
  return launch_quant_rows(a, int64_t(d.I), nullptr, 1, offsets, int(d.E), int(d.I), nullptr, aq, sa, l.tk, s,
                           "fused_moe_sm90_grouped_fp8 quant a", amax_given);
}

// ---------------------------------------------------------------- the two GEMMs
struct Fp8GemmArgs {
  const int32_t* offsets;      // routing outputs
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;
  const int32_t* row_entry;
  const float* weights;        // [T*k] router weights (weight_on_input only)
  const float* row_scale;      // [Tk] scale of each A row (s_x for gemm1, s_a for gemm2)
  const float* w_scale;        // [E] per tensor or [E, N] per row
  float* out;                  // gemm1: a [Tk, I]; gemm2: y [splits, Tk, H]
  int64_t y_split;             // gemm2: elements between the K-range partials
  int H, I, splits;
  bool w_rows;                 // w_scale is per row
  bool weight_on_input;
  float* amax = nullptr;       // gemm1: [Tk] zeroed by the routing; each row's max |a| (atomicMax on the
                               // f32 bits, exact in any order) for quant_rows_kernel's amax_given
  int* counter = nullptr;      // the TMA gemms: work counter of the dynamic schedule (ws_run),
                               // zeroed by the routing
};

// Adds the lane's max |a| of its row (m >= 0, never NaN: fmaxf chains) to amax[row]: the 4 lanes of a
// quad hold the same row (wgmma / mma accumulator layout) and all call this, or none of them does.
__device__ __forceinline__ void row_amax_add(float* amax, int row, float m, int lane) {
  const unsigned quad = 0xFu << (lane & 28);
  m = fmaxf(m, __shfl_xor_sync(quad, m, 1));
  m = fmaxf(m, __shfl_xor_sync(quad, m, 2));
  if ((lane & 3) == 0) atomicMax(reinterpret_cast<unsigned int*>(amax + row), __float_as_uint(m));
}

// The weight scales of columns n and n + 1 of expert e (N scales per expert when per row; ws_e,
// p.w_scale[e] loaded once by the caller, when per tensor). The BM 64 epilogues load theirs before
// any store (see stage_wscales for why).
__device__ __forceinline__ float2 wscale2(const Fp8GemmArgs& p, float ws_e, int e, int n, int N) {
  if (!p.w_rows) return make_float2(ws_e, ws_e);
  const float* s = p.w_scale + int64_t(e) * N + n;
  return make_float2(s[0], s[1]);
}
__device__ __forceinline__ float wscale_e(const Fp8GemmArgs& p, int e) { return p.w_rows ? 0.0f : p.w_scale[e]; }

// The weight scales of a 128-row tile's 256 columns, staged per consumer warp in shared memory
// (ws_extra_smem; per-row weight scales only): 256 floats per warp.
// NOTE: the epilogues used to load each column pair's scales from global memory next to the store
// of that pair: a load after a store through the float* output cannot be hoisted above it (they may
// alias), so every pair paid an L1 or L2 latency and fp8_channel ran well behind fp8_tensor
// (docs/experiments.md E37, E36). Shared-memory loads do not alias global stores, and the consumers
// have no registers to spare (168 at most, fused_moe_sm90_grouped_tma.cuh).
constexpr int kWsScaleCols = kBN;
template <class Shape = WsShape<2>>
constexpr int kWsScaleSmem = Shape::kConsumerWarps * kWsScaleCols * int(sizeof(float));
// The dynamic shared memory of a WS gemm of tile shape Shape: its ring, the staged scales and the
// item words of ws_run's dynamic schedule (one per stage).
template <class Shape>
constexpr int ws_gemm_smem_bytes() {
  return ws_smem_bytes<typename Shape::Smem>() + kWsScaleSmem<Shape> + Shape::kStages * int(sizeof(uint32_t));
}
template <class Shape>
__device__ __forceinline__ uint32_t* ws_item_words(unsigned char* smem_raw) {
  return reinterpret_cast<uint32_t*>(ws_extra_smem_of<typename Shape::Smem>(smem_raw) + kWsScaleSmem<Shape>);
}
// The tail tiles (ws_consume_tail) of the 128 x 256 gemms: M tiles of at most 64 real rows.
// NOTE: a K-split gemm2's tail item over the whole K in range 0 (other ranges skipped) measured
// slower at Mixtral (E58).
template <class Shape, WsTail kKind>
constexpr WsTail kFp8Tail = Shape::kWgs == 2 ? kKind : WsTail::none;
__device__ __forceinline__ bool fp8_tail_tile(const Fp8GemmArgs& p, int m) {
  return p.offsets[p.tile_expert[m] + 1] - p.tile_row0[m] <= 64;
}
static_assert(ws_gemm_smem_bytes<WsShape<3>>() <= kSm90SmemOptinBytes, "fits the sm_90 shared memory of one CTA");

// Warp-wide (every lane): lane l copies the scales of columns col(l) .. col(l) + 7 of expert e
// (N per expert) into dst[8 l ..] (zeros where col(l) >= N). The first __syncwarp keeps the copy
// behind the warp's reads of the previous tile's scales.
__device__ __forceinline__ void stage_wscales(float* dst, const float* w_scale, int e, int N, int col, int lane) {
  float v[8];
  const float* src = w_scale + int64_t(e) * N + col;
#pragma unroll
  for (int q = 0; q < 8; ++q) v[q] = col < N ? src[q] : 0.0f;  // N % 8 == 0
  __syncwarp();
#pragma unroll
  for (int q = 0; q < 8; ++q) dst[8 * lane + q] = v[q];
  __syncwarp();
}

// gemm1: ma = xq [Tk, H] codes, mb = w1 as [E * N1, H] codes; N tiles of 128 gate + 128 up columns
// (g1u1) or 256 (g1u0). a = act(g) * u (or act(g)) in f32, g = acc * s_x * w1_scale (* w).
// NOTE: a in bf16 gained at most 1-2% for some of a's codes one fp8 step off the reference: not kept
// (E59).
// Shape:
// the tile shape (WsShape<2>: 128 x 256, WsShape<3>: 192 x 256); consumer warp w takes rows 16 w ..
// 16 w + 15 of the tile.
template <bool G1U1, Activation A, class Shape = WsShape<2>>
__global__ void __launch_bounds__(Shape::kThreads, 1)
    gemm1_fp8_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb, Fp8GemmArgs p,
                     int n_tiles) {
  using Sm = typename Shape::Smem;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const Sm sm = ws_setup<Sm, Shape::kConsumerWarps>(smem_raw, &ma, &mb);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* wsm = reinterpret_cast<float*>(ws_extra_smem_of<Sm>(smem_raw)) + (warp % Shape::kConsumerWarps) * kWsScaleCols;
  const int n1 = G1U1 ? 2 * p.I : p.I, nb = G1U1 ? kBN / 2 : kBN;
  ws_run<__nv_fp8_e4m3, Shape, kFp8Tail<Shape, G1U1 ? WsTail::gate_up : WsTail::halves>>(
      sm, &ma, &mb, *p.num_tiles, n_tiles, 1, p.H / kSliceCodes, kSliceCodes,
      [&](const WsItem& it, int& row0, int& b0, int& b1) {
        const int e = p.tile_expert[it.m], i0 = it.n * nb;
        row0 = p.tile_row0[it.m];
        b0 = e * n1 + i0;
        b1 = G1U1 ? e * n1 + p.I + i0 : b0 + kBN / 2;
      },
      [&](const WsItem& it, const AccW& acc, bool tail = false) {
        const int e = p.tile_expert[it.m], row0 = p.tile_row0[it.m], i0 = it.n * nb;
        const int nrows = p.offsets[e + 1] - row0, c0 = 2 * (lane & 3);
        int rb, cw;  // the warp's first row and column (a tail tile: ws_consume_tail's layout)
        ws_warp_origin<G1U1 ? WsTail::gate_up : WsTail::halves>(warp, tail, rb, cw);
        if (rb >= nrows) return;  // no real row in the warp's 16
        // Per-row scales: the gate's 128 columns then the up's 128 (g1u1), or the 256 columns.
        const float ws_e = wscale_e(p, e);
        if (p.w_rows) {
          const int col = G1U1 ? (lane < 16 ? 0 : p.I) + i0 + 8 * (lane & 15) : i0 + 8 * lane;
          stage_wscales(wsm, p.w_scale, e, n1, col, lane);
        }
        auto ws = [&](int idx) {
          return p.w_rows ? *reinterpret_cast<const float2*>(wsm + idx) : make_float2(ws_e, ws_e);
        };
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int rl = rb + (lane >> 2) + 8 * h;
          if (rl >= nrows) continue;
          const int row = row0 + rl;
          const float sx = p.row_scale[row];
          const float w = p.weight_on_input ? p.weights[p.row_entry[row]] : 1.0f;
          float* orow = p.out + int64_t(row) * p.I + i0 + cw + c0;
          float m = 0.0f;  // max |a| of the lane's values of the row (p.amax)
          if constexpr (G1U1) {
#pragma unroll
            for (int j = 0; j < kWgNT / 2; ++j) {
              if (tail && j >= 8) break;
              const float2 g = acc_pair(acc.v[0][j], h), u = acc_pair(acc.v[0][j + kWgNT / 2], h);
              const float2 wg = ws(cw + 8 * j + c0), wu = ws(kWsScaleCols / 2 + cw + 8 * j + c0);
              const float g0 = g.x * sx * wg.x * w, g1 = g.y * sx * wg.y * w;
              const float u0 = u.x * sx * wu.x * w, u1 = u.y * sx * wu.y * w;
              const float2 v = make_float2(act<A>(g0) * u0, act<A>(g1) * u1);
              *reinterpret_cast<float2*>(orow + 8 * j) = v;
              m = fmaxf(m, fmaxf(fabsf(v.x), fabsf(v.y)));
            }
          } else {
#pragma unroll
            for (int j = 0; j < kWgNT; ++j) {
              if (tail && j >= kWgNT / 2) break;
              if (cw + 8 * j >= p.I - i0) continue;
              const float* g = &acc.v[0][j][2 * h];
              const float2 wg = ws(cw + 8 * j + c0);
              const float g0 = g[0] * sx * wg.x * w, g1 = g[1] * sx * wg.y * w;
              const float2 v = make_float2(act<A>(g0), act<A>(g1));
              *reinterpret_cast<float2*>(orow + 8 * j) = v;
              m = fmaxf(m, fmaxf(fabsf(v.x), fabsf(v.y)));
            }
          }
          if (p.amax != nullptr) row_amax_add(p.amax, row, m, lane);
        }
      },
      ws_item_words<Shape>(smem_raw), p.counter, [&](const WsItem& it) { return fp8_tail_tile(p, it.m); });
}

// gemm2's y by TMA (sm90::tma_store_f32_rows, E124) on 128 x 256 tiles: 16-column chunks, two 4 KiB
// buffers a warpgroup on the first 1024-byte boundary after the staged scales and item words (the
// 192 x 256 ring leaves no room for three warpgroups' buffers).
template <class Shape>
constexpr bool kFp8YByTma = Shape::kWgs == 2;
constexpr int kFp8YChunkCols = 16;
template <class Shape>
constexpr int fp8_gemm2_smem_bytes() {
  constexpr int ring = ws_gemm_smem_bytes<Shape>();  // with the 1024 bytes of alignment slack
  if constexpr (!kFp8YByTma<Shape>) {
    return ring;
  } else {
    return ring + sm90::tma_store_f32_extra_smem<kFp8YChunkCols>(ring - int(kSw128AtomBytes), 0, 2);
  }
}
static_assert(fp8_gemm2_smem_bytes<WsShape<2>>() <= kSm90SmemOptinBytes, "fits one CTA's shared memory");

// gemm2: ma = aq [Tk, I] codes, mb = w2 as [E * H, I] codes; y = acc * s_a * w2_scale in f32, K range
// ks -> y + ks * y_split. Shape as gemm1_fp8_kernel. kFp8YByTma: my = y as [splits * Tk, H] f32
// (16 x 64 boxes, 64-byte swizzle); a full tile's warpgroup whose 64 rows are all real stores them by
// TMA, tail tiles and warpgroups with padding rows from registers.
template <class Shape = WsShape<2>>
__global__ void __launch_bounds__(Shape::kThreads, 1)
    gemm2_fp8_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                     const __grid_constant__ CUtensorMap my, Fp8GemmArgs p, int n_tiles) {
  using Sm = typename Shape::Smem;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const Sm sm = ws_setup<Sm, Shape::kConsumerWarps>(smem_raw, &ma, &mb);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp >> 2;
  float* wsm = reinterpret_cast<float*>(ws_extra_smem_of<Sm>(smem_raw)) + (warp % Shape::kConsumerWarps) * kWsScaleCols;
  uint32_t ybuf = 0;
  if constexpr (kFp8YByTma<Shape>) {
    ybuf = smem_addr(align_smem_1024(reinterpret_cast<unsigned char*>(ws_item_words<Shape>(smem_raw) + Shape::kStages))) +
           uint32_t(wg & 1) * sm90::kF32StoreBytesPerWarpgroup<kFp8YChunkCols>;
  }
  ws_run<__nv_fp8_e4m3, Shape, kFp8Tail<Shape, WsTail::halves>>(
      sm, &ma, &mb, *p.num_tiles, n_tiles, p.splits, p.I / kSliceCodes, kSliceCodes,
      [&](const WsItem& it, int& row0, int& b0, int& b1) {
        row0 = p.tile_row0[it.m];
        b0 = p.tile_expert[it.m] * p.H + it.n * kBN;
        b1 = b0 + kBN / 2;
      },
      [&](const WsItem& it, const AccW& acc, bool tail = false) {
        const int e = p.tile_expert[it.m], row0 = p.tile_row0[it.m], h0 = it.n * kBN;
        const int nrows = p.offsets[e + 1] - row0, c0 = 2 * (lane & 3);
        int rb, cw;  // the warp's first row and column (a tail tile: ws_consume_tail's layout)
        ws_warp_origin<WsTail::halves>(warp, tail, rb, cw);
        const float ws_e = wscale_e(p, e);
        if (rb >= nrows) return;  // no real row in the warp's 16
        if (p.w_rows) stage_wscales(wsm, p.w_scale, e, p.H, h0 + 8 * lane, lane);
        if constexpr (kFp8YByTma<Shape>) {
          if (!tail && 64 * wg + 64 <= nrows) {  // warpgroup-uniform (every warp has real rows)
            const int r = row0 + rb + (lane >> 2);
            const float sa[2] = {p.row_scale[r], p.row_scale[r + 8]};
            sm90::tma_store_f32_rows<kWgNT, kFp8YChunkCols>(
                &my, ybuf, wg, it.ks * int(p.y_split / p.H) + row0 + 64 * wg, h0, [&](int j, int h) {
                  const float2 v = acc_pair(acc.v[0][j], h);
                  const float2 ws = p.w_rows ? *reinterpret_cast<const float2*>(wsm + 8 * j + c0) : make_float2(ws_e, ws_e);
                  return make_float2(v.x * sa[h] * ws.x, v.y * sa[h] * ws.y);
                });
            return;
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int rl = rb + (lane >> 2) + 8 * h;
          if (rl >= nrows) continue;
          const int row = row0 + rl;
          const float sa = p.row_scale[row];
          float* yrow = p.out + it.ks * p.y_split + int64_t(row) * p.H + h0 + cw + c0;
#pragma unroll
          for (int j = 0; j < kWgNT; ++j) {
            if (tail && j >= kWgNT / 2) break;
            if (cw + 8 * j >= p.H - h0) continue;
            const float2 v = acc_pair(acc.v[0][j], h);
            const float2 ws =
                p.w_rows ? *reinterpret_cast<const float2*>(wsm + cw + 8 * j + c0) : make_float2(ws_e, ws_e);
            *reinterpret_cast<float2*>(yrow + 8 * j) = make_float2(v.x * sa * ws.x, v.y * sa * ws.y);
          }
        }
      },
      ws_item_words<Shape>(smem_raw), p.counter, [&](const WsItem& it) { return fp8_tail_tile(p, it.m); });
  if constexpr (kFp8YByTma<Shape>) {
    if (warp < Shape::kConsumerWarps) sm90::tma_store_f32_drain();
  }
}

// ---------------------------------------------------------------- BM 64 tiles: mma.sync on e4m3
// (E4m3x2, mma_a_rows, launch_mma: fused_moe_sm90_grouped_mma_fp8.cuh)

// gemm1 on BM 64 tiles, grid (tiles_max, N tiles) as gemm1_kernel of the bf16 path: A = xq rows, B = w1
// codes; a = act(g) * u (or act(g)) in f32 with g = acc * s_x * w1_scale (* w), as gemm1_fp8_kernel.
template <bool G1U1, Activation A>
__global__ void __launch_bounds__(kThreads, 1)
    gemm1_fp8_mma_kernel(Fp8GemmArgs p, const uint8_t* xq, const uint8_t* w1) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  wait_for_predecessor();
  const int tile = blockIdx.x;
  const int e = p.tile_expert[tile];
  if (e < 0) return;
  const int row0 = p.tile_row0[tile], row_end = p.offsets[e + 1];
  const int tid = threadIdx.x, lane = tid & 31, wn = (tid >> 5) % MmaTile::kWN;  // BM 64: one warp row
  const int n1 = G1U1 ? 2 * p.I : p.I, k2 = p.H / 2;
  const int i0 = blockIdx.y * (G1U1 ? kBN / 2 : kBN);
  TileSources<E4m3x2, kMmaBM> src;
  mma_a_rows(src, xq, p.H, row0, row_end, tid);
  mma_w1_rows<G1U1>(src, w1, e, p.H, p.I, i0, tid);
  constexpr int kGW = MmaTile::kWarpCols / 2;
  constexpr int kNT = MmaTile::kNT;
  Acc<kNT> acc;
  mainloop_rows<E4m3x2, kMmaBM, G1U1 ? kBN / 2 : 8 * MmaTile::kNG>(
      smem_raw, src, k2, G1U1 ? wn * kGW : wn * MmaTile::kWarpCols, row_end - row0, acc);

  // The warp's columns lie in one 16-aligned block (g1u1; 32 for g1u0) and I % 32 == 0: all valid or
  // all past I.
  const int ic = i0 + wn * (G1U1 ? kGW : MmaTile::kWarpCols);
  if (ic >= p.I) return;
  const int nrows = row_end - row0, c0 = ic + 2 * (lane & 3);
  // The warp's column scales, loaded once before the stores (wscale2).
  constexpr int kJ = G1U1 ? kNT / 2 : kNT;
  const float ws_e = wscale_e(p, e);
  float2 wg[kJ], wu[G1U1 ? kJ : 1];
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    wg[j] = wscale2(p, ws_e, e, c0 + 8 * j, n1);
    if constexpr (G1U1) wu[j] = wscale2(p, ws_e, e, p.I + c0 + 8 * j, n1);
  }
  // The lane's row scales (and router weights) too, before the first store.
  float rs[4][2], rw[4][2];
  for_lane_rows(lane, nrows, [&](int mi, int h, int rl) {
    rs[mi][h] = p.row_scale[row0 + rl];
    rw[mi][h] = p.weight_on_input ? p.weights[p.row_entry[row0 + rl]] : 1.0f;
  });
  for_lane_rows(lane, nrows, [&](int mi, int h, int rl) {
    const int row = row0 + rl;
    const float sx = rs[mi][h], wt = rw[mi][h];
    float* orow = p.out + int64_t(row) * p.I;
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const int c = c0 + 8 * j;
      const float* g = &acc.v[mi][j][2 * h];
      const float g0 = g[0] * sx * wg[j].x * wt, g1 = g[1] * sx * wg[j].y * wt;
      if constexpr (G1U1) {
        const float* u = &acc.v[mi][j + kNT / 2][2 * h];
        const float u0 = u[0] * sx * wu[j].x * wt, u1 = u[1] * sx * wu[j].y * wt;
        *reinterpret_cast<float2*>(orow + c) = make_float2(act<A>(g0) * u0, act<A>(g1) * u1);
      } else {
        *reinterpret_cast<float2*>(orow + c) = make_float2(act<A>(g0), act<A>(g1));
      }
    }
  });
}

// gemm2 on BM 64 tiles, grid (tiles_max, H / 256): A = aq rows, B = w2 codes; y = acc * s_a * w2_scale.
__global__ void __launch_bounds__(kThreads, 1)
    gemm2_fp8_mma_kernel(Fp8GemmArgs p, const uint8_t* aq, const uint8_t* w2) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  wait_for_predecessor();
  const int tile = blockIdx.x;
  const int e = p.tile_expert[tile];
  if (e < 0) return;
  const int row0 = p.tile_row0[tile], row_end = p.offsets[e + 1];
  const int tid = threadIdx.x, lane = tid & 31, wn = (tid >> 5) % MmaTile::kWN;
  const int h0 = blockIdx.y * kBN, k2 = p.I / 2;
  TileSources<E4m3x2, kMmaBM> src;
  mma_a_rows(src, aq, p.I, row0, row_end, tid);
  mma_w2_rows(src, w2, e, p.H, p.I, h0, tid);
  constexpr int kNT = MmaTile::kNT;
  Acc<kNT> acc;
  mainloop_rows<E4m3x2, kMmaBM, 8 * MmaTile::kNG>(smem_raw, src, k2, wn * MmaTile::kWarpCols, row_end - row0, acc);

  const int hc = h0 + wn * MmaTile::kWarpCols;  // H % 32 == 0: the warp's 32 columns all valid or all past H
  if (hc >= p.H) return;
  const int nrows = row_end - row0, c0 = hc + 2 * (lane & 3);
  const float ws_e = wscale_e(p, e);
  float2 ws[kNT];  // the warp's column scales, loaded once before the stores (wscale2)
#pragma unroll
  for (int j = 0; j < kNT; ++j) ws[j] = wscale2(p, ws_e, e, c0 + 8 * j, p.H);
  float rs[4][2];  // the lane's row scales, before the first store
  for_lane_rows(lane, nrows, [&](int mi, int h, int rl) { rs[mi][h] = p.row_scale[row0 + rl]; });
  for_lane_rows(lane, nrows, [&](int mi, int h, int rl) {
    const int row = row0 + rl;
    const float sa = rs[mi][h];
    float* yrow = p.out + int64_t(row) * p.H;
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const int c = c0 + 8 * j;
      const float* v = &acc.v[mi][j][2 * h];
      *reinterpret_cast<float2*>(yrow + c) = make_float2(v[0] * sa * ws[j].x, v[1] * sa * ws[j].y);
    }
  });
}

// ---------------------------------------------------------------- 64 x 256 tiles: TMA + QGMMA
// fused_moe_sm90_grouped_fp8_row_tma64: the fp8 ring of fused_moe_sm90_grouped_fp8_ring.cuh with
// 64 x 256 tiles (Fp8Ring<64>: a 64-row A box and four 64-row B boxes per slice; warpgroup wg
// multiplies the 64 rows by boxes 2 wg and 2 wg + 1 with wgmma m64n128k32), for experts with few
// rows, in place of the 64-row mma.sync tiles (which sm_90 runs as emulated e4m3 MMAs). The
// epilogues are those of the BM 64 kernels: the warp's column scales and the lane's row scales in
// registers before the first store.
using Ring64 = Fp8Ring<64>;

// Consumer warpgroup wg: acc = its 64 rows x 128 columns of the tile over the KT slices, each
// slice's partial sums promoted into f32 (fp8_ring_consume_promoted: sm_90's e4m3 wgmma
// accumulates with fewer bits than f32; the unpromoted sums' measured error: E42).
__device__ __forceinline__ void row64_consume_tile(const Ring64::Smem& sm, Ring64::Ring& ring, int wg, int KT,
                                                   float (&acc)[16][4]) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[j][q] = 0.0f;
  fp8_ring_consume_promoted<64>(sm, ring, wg, KT, [&](const float(&cur)[16][4], auto, int) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[j][q] += cur[j][q];
  });
}

// The schedule of the 64 x 256 kernels (fp8_ring_run), each tile in `splits` K ranges:
// boxes(m, n, row0, b_rows) as there, epi(m, n, sp, wg, acc) with sp the K range.
template <class Boxes, class Epi>
__device__ __forceinline__ void row64_run(const Ring64::Smem& sm, const CUtensorMap* ma, const CUtensorMap* mb,
                                          const Fp8GemmArgs& p, int n_tiles, int K, int splits, Boxes boxes, Epi epi) {
  fp8_ring_run<64>(sm, ma, mb, *p.num_tiles, n_tiles, K / kSliceCodes, splits, boxes,
                   [&](const SplitTile& w, int wg, Ring64::Ring& ring) {
                     float acc[16][4];
                     row64_consume_tile(sm, ring, wg, w.kn, acc);
                     epi(w.m, w.n, w.sp, wg, acc);
                   });
}

// gemm1: N tiles of 128 gate + 128 up columns (g1u1; warpgroup wg: gate and up columns i0 + 64 wg ..)
// or 256 (g1u0; warpgroup wg: i0 + 128 wg ..); a as gemm1_fp8_kernel.
template <bool G1U1, Activation A>
__global__ void __launch_bounds__(kFp8RingThreads, 1)
    gemm1_fp8_row64_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                           Fp8GemmArgs p, int n_tiles) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const Ring64::Smem sm = ws_setup<Ring64::Smem>(smem_raw, &ma, &mb);
  wait_for_predecessor();  // launch_ws_kernel_pdl
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n1 = G1U1 ? 2 * p.I : p.I;
  constexpr int nb = G1U1 ? 128 : 256, wg_cols = nb / 2;  // gate columns of a tile, of a warpgroup
  row64_run(
      sm, &ma, &mb, p, n_tiles, p.H, 1,
      [&](int m, int n, int& row0, int (&b)[Ring64::kBoxes]) {
        row0 = p.tile_row0[m];
        fp8_gemm1_box_rows<Ring64::kBoxes, G1U1>(p.tile_expert[m], n1, p.I, n * nb, b);
      },
      [&](int m, int n, int, int wg, const float (&acc)[16][4]) {
        const int e = p.tile_expert[m], row0 = p.tile_row0[m], i0 = n * nb + wg * wg_cols;
        const int nrows = p.offsets[e + 1] - row0, c0 = 2 * (lane & 3), r0 = Ring64::row_of(warp, lane);
        if (r0 >= nrows) return;  // neither of the lane's rows is real
        const float ws_e = wscale_e(p, e);
        float2 wg_s[G1U1 ? 8 : 16], wu_s[G1U1 ? 8 : 1];  // column scales, loaded before the stores
#pragma unroll
        for (int j = 0; j < (G1U1 ? 8 : 16); ++j) wg_s[j] = wscale2(p, ws_e, e, i0 + 8 * j + c0, n1);
        if constexpr (G1U1) {
#pragma unroll
          for (int j = 0; j < 8; ++j) wu_s[j] = wscale2(p, ws_e, e, p.I + i0 + 8 * j + c0, n1);
        }
        float sx[2], wr[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row0 + r0 + 8 * h;
          const bool real = r0 + 8 * h < nrows;
          sx[h] = real ? p.row_scale[row] : 0.0f;
          wr[h] = real && p.weight_on_input ? p.weights[p.row_entry[row]] : 1.0f;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (r0 + 8 * h >= nrows) continue;
          const float s = sx[h], w = wr[h];
          float* orow = p.out + int64_t(row0 + r0 + 8 * h) * p.I + i0 + c0;
          float m = 0.0f;  // max |a| of the lane's values of the row (p.amax)
          if constexpr (G1U1) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              const float* g = &acc[j][2 * h];
              const float* u = &acc[j + 8][2 * h];
              const float g0 = g[0] * s * wg_s[j].x * w, g1 = g[1] * s * wg_s[j].y * w;
              const float u0 = u[0] * s * wu_s[j].x * w, u1 = u[1] * s * wu_s[j].y * w;
              const float2 v = make_float2(act<A>(g0) * u0, act<A>(g1) * u1);
              *reinterpret_cast<float2*>(orow + 8 * j) = v;
              m = fmaxf(m, fmaxf(fabsf(v.x), fabsf(v.y)));
            }
          } else {
#pragma unroll
            for (int j = 0; j < 16; ++j) {
              const float* g = &acc[j][2 * h];
              const float g0 = g[0] * s * wg_s[j].x * w, g1 = g[1] * s * wg_s[j].y * w;
              const float2 v = make_float2(act<A>(g0), act<A>(g1));
              *reinterpret_cast<float2*>(orow + 8 * j) = v;
              m = fmaxf(m, fmaxf(fabsf(v.x), fabsf(v.y)));
            }
          }
          if (p.amax != nullptr) row_amax_add(p.amax, row0 + r0 + 8 * h, m, lane);
        }
      });
}

// gemm2: N tiles of 256 rows of H (warpgroup wg: h0 + 128 wg ..) in p.splits K ranges; y (K range
// sp: its partial at p.out + sp * p.y_split) = acc * s_a * w2_scale in f32.
__global__ void __launch_bounds__(kFp8RingThreads, 1)
    gemm2_fp8_row64_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                           Fp8GemmArgs p, int n_tiles) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const Ring64::Smem sm = ws_setup<Ring64::Smem>(smem_raw, &ma, &mb);
  wait_for_predecessor();  // launch_ws_kernel_pdl
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  row64_run(
      sm, &ma, &mb, p, n_tiles, p.I, p.splits,
      [&](int m, int n, int& row0, int (&b)[Ring64::kBoxes]) {
        row0 = p.tile_row0[m];
        fp8_gemm2_box_rows(p.tile_expert[m], p.H, n * 256, b);
      },
      [&](int m, int n, int sp, int wg, const float (&acc)[16][4]) {
        const int e = p.tile_expert[m], row0 = p.tile_row0[m], h0 = n * 256 + wg * 128;
        const int nrows = p.offsets[e + 1] - row0, c0 = 2 * (lane & 3), r0 = Ring64::row_of(warp, lane);
        if (r0 >= nrows) return;
        const float ws_e = wscale_e(p, e);
        float2 ws[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) ws[j] = wscale2(p, ws_e, e, h0 + 8 * j + c0, p.H);
        float sa[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) sa[h] = r0 + 8 * h < nrows ? p.row_scale[row0 + r0 + 8 * h] : 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (r0 + 8 * h >= nrows) continue;
          float* yrow = p.out + sp * p.y_split + int64_t(row0 + r0 + 8 * h) * p.H + h0 + c0;
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            const float* v = &acc[j][2 * h];
            *reinterpret_cast<float2*>(yrow + 8 * j) = make_float2(v[0] * sa[h] * ws[j].x, v[1] * sa[h] * ws[j].y);
          }
        }
      });
}

// ---------------------------------------------------------------- host side
// The BM 128 gemms: persistent TMA + wgmma kernels (one CTA per SM at most), gemm2 in l.splits K
// ranges.
// NOTE: launched without programmatic dependent launch, unlike the 64 x 256 gemms: PDL made these
// persistent kernels slower at T=4096, with or without the early launch_dependents, and the block
// variant's gemms (its 64 x 256 tiles included) slower still, so none of them use it (E31).
// NOTE: two-CTA clusters multicasting the A rows (N tiles 2q, 2q + 1 of one M tile) ran slower: the
// pair waits on its slower CTA at every stage, and fewer A reads do not relieve the L2 (E54, E81).
// Shape: WsShape<2> (128 x 256 tiles) or WsShape<3> (192 x 256, fused_moe_sm90_grouped_fp8_row_m192).
template <class Shape>
Status run_fp8_tma(const FusedMoeParams& p, const Fp8Workspace& l, const Fp8GemmArgs& g1, const Fp8GemmArgs& g2,
                   uint8_t* xq, uint8_t* aq, float* a, float* sa, int n_tiles1, int n_tiles2, cudaStream_t s) {
  const MoeDims d = moe_dims(p);
  Fp8GemmMaps m;
  MOEKIT_RETURN_IF_ERROR(encode_fp8_gemm_maps(p, l.tk, xq, aq, Shape::kBM, 128, "fused_moe_sm90_grouped_fp8", &m));
  int sms = 0;
  MOEKIT_RETURN_IF_ERROR(device_sm_count(&sms, "fused_moe_sm90_grouped_fp8: SM count"));
  auto grid = [&](int64_t items) { return unsigned(std::min<int64_t>(sms, items)); };

  auto* fn1 = pick_gemm1(p.activation, d.g1u1, [](auto g1u1, auto act) {
    return gemm1_fp8_kernel<decltype(g1u1)::value, decltype(act)::value, Shape>;
  });
  constexpr int kSmem = ws_gemm_smem_bytes<Shape>();
  MOEKIT_RETURN_IF_ERROR(launch_ws_kernel_cfg(fn1, grid(l.tiles_max * n_tiles1), Shape::kThreads, kSmem, s,
                                              "fused_moe_sm90_grouped_fp8 gemm1", m.ma1, m.mb1, g1, n_tiles1));

  MOEKIT_RETURN_IF_ERROR(launch_quant_a(d, l, g1.offsets, a, aq, sa, s, g1.amax != nullptr));
  CUtensorMap my{};  // y for the TMA stores (kFp8YByTma)
  if constexpr (kFp8YByTma<Shape>) {
    MOEKIT_RETURN_IF_ERROR(sm90::encode_f32_rows_map<kFp8YChunkCols>(
        &my, g2.out, uint64_t(l.splits) * uint64_t(l.tk), uint64_t(d.H), "fused_moe_sm90_grouped_fp8 y"));
  }
  return launch_ws_kernel_cfg(gemm2_fp8_kernel<Shape>, grid(l.tiles_max * n_tiles2 * l.splits), Shape::kThreads,
                              fp8_gemm2_smem_bytes<Shape>(), s, "fused_moe_sm90_grouped_fp8 gemm2", m.ma2, m.mb2, my,
                              g2, n_tiles2);
}

// The 64 x 256 gemms (fused_moe_sm90_grouped_fp8_row_tma64) and the quantization of a between them.
// NOTE: measured slower than separate kernels:
// - the last CTA of each gemm1 M tile quantizing its rows of a and the last CTA of each gemm2 N tile
//   reducing over k (T <= 4): a fence, a counter and one CTA's serial pass cost more than the next
//   kernel's PDL launch they save (E53, E82);
// - the producer loading its first item's B boxes before griddepcontrol.wait (E52).
// Whole N tiles: H % 256 == 0, I % 128 (g1u1) or 256 (g1u0) == 0 (fused_moe_sm90_grouped_fp8_row_tma64's
// supports).
Status run_fp8_tma64(const FusedMoeParams& p, const Fp8Workspace& l, const Fp8GemmArgs& g1, const Fp8GemmArgs& g2,
                     uint8_t* xq, uint8_t* aq, float* a, float* sa, cudaStream_t s) {
  const MoeDims d = moe_dims(p);
  Fp8GemmMaps m;
  MOEKIT_RETURN_IF_ERROR(encode_fp8_gemm_maps(p, l.tk, xq, aq, 64, 64, "fused_moe_sm90_grouped_fp8 (tma64)", &m));
  int sms = 0;
  MOEKIT_RETURN_IF_ERROR(device_sm_count(&sms, "fused_moe_sm90_grouped_fp8: SM count"));
  auto grid = [&](int64_t items) { return unsigned(std::min<int64_t>(sms, items)); };
  const int n_tiles1 = int(d.I / (d.g1u1 ? 128 : 256)), n_tiles2 = int(d.H / 256);
  auto* fn1 = pick_gemm1(p.activation, d.g1u1, [](auto g1u1, auto act) {
    return gemm1_fp8_row64_kernel<decltype(g1u1)::value, decltype(act)::value>;
  });
  MOEKIT_RETURN_IF_ERROR(launch_ws_kernel_pdl(fn1, grid(l.tiles_max * n_tiles1), kFp8RingThreads, Ring64::kSmemBytes,
                                              s, "fused_moe_sm90_grouped_fp8 gemm1 (tma64)", m.ma1, m.mb1, g1,
                                              n_tiles1));
  MOEKIT_RETURN_IF_ERROR(launch_quant_a(d, l, g1.offsets, a, aq, sa, s, g1.amax != nullptr));
  return launch_ws_kernel_pdl(gemm2_fp8_row64_kernel, grid(l.tiles_max * n_tiles2 * l.splits), kFp8RingThreads,
                              Ring64::kSmemBytes, s, "fused_moe_sm90_grouped_fp8 gemm2 (tma64)", m.ma2, m.mb2, g2,
                              n_tiles2);
}

// c: a resolved fp8_row grouped config: 64 x 256 ring (tma64), 64 x 256 mma, 128 or 192 x 256 ws.
template <class TT>
Status run_fp8_typed(const FusedMoeParams& p, const Sm90Config& c, const RunContext& ctx) {
  const MoeDims d = moe_dims(p);
  const int bm = c.tile_m;
  const bool tma64 = c.mainloop == Sm90Mainloop::ring;
  const Fp8Workspace l = fp8_layout_of(p, c);
  auto* base = static_cast<unsigned char*>(ctx.workspace);
  base += (kFp8WsAlign - reinterpret_cast<uintptr_t>(base) % kFp8WsAlign) % kFp8WsAlign;
  auto at = [&](size_t off) { return reinterpret_cast<int32_t*>(base + off); };
  auto* xq = base + l.xq;
  auto* aq = base + l.aq;
  auto* sx = reinterpret_cast<float*>(base + l.sx);
  auto* sa = reinterpret_cast<float*>(base + l.sa);
  auto* a = reinterpret_cast<float*>(base + l.a);
  auto* y = reinterpret_cast<float*>(base + l.y);
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);

  // Where the quantizer of a takes the two-pass shape (more than kQuantFewRows rows), the TMA gemm1s
  // find each row's amax (Fp8GemmArgs::amax, in sa, zeroed by the routing) and it reads a once.
  const bool amax_in_gemm1 = (bm != kMmaBM || tma64) && l.tk > kQuantFewRows;
  // The TMA gemms' work counters (ws_run's dynamic schedule), right after sa's rows: the routing
  // zeroes them with the row amaxes.
  const bool counters = bm == 128 || bm == 192;
  int32_t* counter = at(l.counters);
  int32_t* zero = amax_in_gemm1 ? reinterpret_cast<int32_t*>(sa) : counters ? counter : nullptr;
  const int n_zero = (amax_in_gemm1 ? int(l.tk) : 0) + (counters ? kFp8WsCounters : 0);
  MOEKIT_RETURN_IF_ERROR(launch_route(p,
                                      {at(l.local), at(l.offsets), at(l.row_entry), at(l.slot_row), at(l.tile_expert),
                                       at(l.tile_row0), at(l.num_tiles), zero, n_zero},
                                      l.tk, l.tiles_max, bm, s, "fused_moe_sm90_grouped_fp8 route"));

  const float* fixed = p.a1_scale.present() ? p.a1_scale.ptr<const float>() : nullptr;
  MOEKIT_RETURN_IF_ERROR(launch_quant_x(static_cast<const TT*>(p.x.data), p.x.stride[0], at(l.slot_row),
                                        at(l.row_entry), int(d.T), int(d.k), at(l.offsets), int(d.E), int(d.H), false,
                                        fixed, xq, sx, l.tk, s, "fused_moe_sm90_grouped_fp8 quant x"));

  const bool w1_rows = p.w1_scale.ndim > 1, w2_rows = p.w2_scale.ndim > 1;
  Fp8GemmArgs g1{at(l.offsets), at(l.tile_expert), at(l.tile_row0), at(l.num_tiles), at(l.row_entry),
                 p.topk_weights.ptr<const float>(), sx, p.w1_scale.ptr<const float>(), a, 0, int(d.H), int(d.I), 1,
                 w1_rows, p.weight_on_input, amax_in_gemm1 ? sa : nullptr};
  Fp8GemmArgs g2{at(l.offsets), at(l.tile_expert), at(l.tile_row0), at(l.num_tiles), at(l.row_entry),
                 p.topk_weights.ptr<const float>(), sa, p.w2_scale.ptr<const float>(), y, l.tk * d.H, int(d.H),
                 int(d.I), l.splits, w2_rows, false};
  if (counters) {
    g1.counter = counter;
    g2.counter = counter + 1;
  }
  const int n_tiles1 = ceil_div(d.I, d.g1u1 ? kBN / 2 : kBN), n_tiles2 = ceil_div(d.H, kBN);
  if (bm == kMmaBM && tma64) {
    MOEKIT_RETURN_IF_ERROR(run_fp8_tma64(p, l, g1, g2, xq, aq, a, sa, s));
  } else if (bm == kMmaBM) {
    auto* fn1 = pick_gemm1(p.activation, d.g1u1, [](auto g1u1, auto act) {
      return gemm1_fp8_mma_kernel<decltype(g1u1)::value, decltype(act)::value>;
    });
    MOEKIT_RETURN_IF_ERROR(launch_mma(fn1, dim3(unsigned(l.tiles_max), unsigned(n_tiles1)), s,
                                      "fused_moe_sm90_grouped_fp8 gemm1 (BM 64)", g1, xq,
                                      static_cast<const uint8_t*>(p.w1.data)));
    MOEKIT_RETURN_IF_ERROR(launch_quant_a(d, l, at(l.offsets), a, aq, sa, s));
    MOEKIT_RETURN_IF_ERROR(launch_mma(gemm2_fp8_mma_kernel, dim3(unsigned(l.tiles_max), unsigned(n_tiles2)), s,
                                      "fused_moe_sm90_grouped_fp8 gemm2 (BM 64)", g2, aq,
                                      static_cast<const uint8_t*>(p.w2.data)));
  } else if (bm == WsShape<3>::kBM) {
    MOEKIT_RETURN_IF_ERROR(run_fp8_tma<WsShape<3>>(p, l, g1, g2, xq, aq, a, sa, n_tiles1, n_tiles2, s));
  } else {
    MOEKIT_RETURN_IF_ERROR(run_fp8_tma<WsShape<2>>(p, l, g1, g2, xq, aq, a, sa, n_tiles1, n_tiles2, s));
  }

  ReduceArgs rd{y, l.tk * d.H, at(l.slot_row), p.topk_weights.ptr<const float>(), p.out.data, p.out.stride[0],
                int(d.H), int(d.k), l.splits, p.weight_on_input};
  return launch_reduce<TT>(rd, d.T, s, "fused_moe_sm90_grouped_fp8 reduce");
}

}  // namespace
}  // namespace grouped

namespace {
// H and I multiples of m (`why`: what needs it), then fused_moe_sm90_grouped_limits.
Status grouped_fp8_sizes(const FusedMoeParams& p, int m, const char* why) {
  const MoeDims d = moe_dims(p);
  if (d.H % m != 0) return Unsupported("x: hidden size H must be a multiple of ", m, " (", why, "), got ", d.H);
  if (d.I % m != 0) return Unsupported("w2: intermediate size I must be a multiple of ", m, " (", why, "), got ", d.I);
  return fused_moe_sm90_grouped_limits(p);
}
}  // namespace

Status fused_moe_sm90_grouped_fp8_shape_supports(const FusedMoeParams& p) {
  return grouped_fp8_sizes(p, 128, "fp8 K slice");
}

Status fused_moe_sm90_grouped_fp8_supports(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(check_fp8_operands(p));
  if (p.scale_block_n != 0 || p.scale_block_k != 0) {
    return Unsupported("scale_block_n/k: block scales are not supported here, got ", p.scale_block_n, "x",
                       p.scale_block_k);
  }
  const MoeDims d = moe_dims(p);
  bool rows1 = false, rows2 = false;  // each scale per tensor or per row, independently
  MOEKIT_RETURN_IF_ERROR(check_fp8_weight_scale(p.w1_scale, "w1_scale", d.E, d.N1, &rows1));
  MOEKIT_RETURN_IF_ERROR(check_fp8_weight_scale(p.w2_scale, "w2_scale", d.E, d.H, &rows2));
  return grouped_fp8_sizes(p, kFp8RowMinMultiple, "fp8 per-row");
}

size_t fused_moe_sm90_grouped_fp8_config_workspace_bytes(const FusedMoeParams& p, const Sm90Config& c) {
  return grouped::fp8_layout_of(p, c).total;
}

Status fused_moe_sm90_grouped_fp8_config_run(const FusedMoeParams& p, const Sm90Config& c, const RunContext& ctx) {
  return grouped::run_fp8_entry(p, ctx, grouped::fp8_layout_of(p, c).total, "fused_moe_sm90_grouped_fp8",
                                [&](auto tt) { return grouped::run_fp8_typed<decltype(tt)>(p, c, ctx); });
}

}  // namespace moekit::cuda
