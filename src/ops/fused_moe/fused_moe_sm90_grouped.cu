// fused_moe_sm90_grouped (see fused_moe_sm90_grouped.h): routing into expert-contiguous rows, the
// two grouped GEMMs on tensor cores and the per-token reduction over k. 128-row M tiles: the
// persistent TMA + wgmma kernels (gemm1_ws_kernel / gemm2_ws_kernel below, mainloop in
// fused_moe_sm90_grouped_tma.cuh) after a gather of x rows into expert order; 64-row ones:
// mma.sync / HMMA (fused_moe_sm90_grouped_mma.cuh).
// SPEC 3.1, 3.4, 3.5. Deterministic by construction (no float atomics; the integer atomics of the
// routing kernel only order rows inside an expert, which changes no value: every row is computed
// independently and the sum over k runs per token in slot order).
// Tests: tests/test_fused_moe_sm90_grouped.cpp (suite FusedMoeSm90Grouped).
#include "ops/fused_moe/fused_moe_sm90_grouped.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/cuda_kernels.h"
#include "cuda/block_scan.cuh"
#include "cuda/cuda_utils.h"
#include "cuda/device_facts.h"
#include "cuda/sm90/tma_store_f32.cuh"
#include "ops/fused_moe/fused_moe_heuristic.h"
#include "ops/fused_moe/fused_moe_sm90_config.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_common.cuh"
#include "ops/fused_moe/fused_moe_sm90_grouped_mma.cuh"
#include "ops/fused_moe/fused_moe_sm90_grouped_tma.cuh"
#include "ops/fused_moe/fused_moe_sm90_grouped_wgmma.cuh"
#include "cuda/tensor_map.h"

namespace moekit::cuda {
namespace grouped {
namespace {

constexpr size_t kAlign = 256;

// ---------------------------------------------------------------- workspace layout
constexpr int kWsCounters = 2;  // after num_tiles: the work counters of the TMA gemms (gemm1, gemm2)
struct WsLayout {
  size_t local, offsets, row_entry, slot_row, tile_expert, tile_row0, num_tiles, xs, a, y, total;
  int64_t tk, tiles_max;
  int splits;  // gemm2 K ranges (fused_moe_sm90_grouped_gemm2_splits), y holds one [Tk, H] per range
};

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// c: a resolved config of the bf16 grouped tiles (64 x 256 mma or 128 x 256 ws).
WsLayout layout_of(const FusedMoeParams& p, const Sm90Config& c) {
  const MoeDims d = moe_dims(p);
  const int bm = c.tile_m;
  WsLayout l{};
  l.tk = d.T * d.k;
  l.tiles_max = fused_moe_sm90_grouped_tiles_max(l.tk, d.E, bm);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align_up(bytes);
    return at;
  };
  l.local = take(size_t(d.Eg) * 4);
  l.offsets = take(size_t(d.E + 1) * 4);
  l.row_entry = take(size_t(l.tk) * 4);
  l.slot_row = take(size_t(l.tk) * 4);
  l.tile_expert = take(size_t(l.tiles_max) * 4);
  l.tile_row0 = take(size_t(l.tiles_max) * 4);
  l.num_tiles = take(4 * (1 + kWsCounters));  // then the TMA gemms' work counters
  // The TMA path reads gemm1's A from x rows gathered into expert order (TMA copies boxes of
  // consecutive rows; Hopper's has no row gather).
  l.xs = take(fused_moe_sm90_grouped_uses_tma(bm) ? size_t(l.tk) * size_t(d.H) * 2 : 0);
  l.a = take(size_t(l.tk) * size_t(d.I) * 2);
  l.splits = c.gemm2_splits;
  l.y = take(size_t(l.splits) * size_t(l.tk) * size_t(d.H) * 4);
  l.total = off + kAlign;  // + kAlign: the caller's workspace need not be aligned
  return l;
}

template <class TT>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// ---------------------------------------------------------------- the mma.sync tiles (BM 64)
// Mainloop<BM> gives the accumulator type and the fragment geometry the epilogues index: kMT m16
// tiles x kNT n8 column blocks per warp (the 128-row tiles run the TMA kernels below).
template <int BM>
struct Mainloop {
  static constexpr int kMT = 4;
  static constexpr int kNT = Tile<BM>::kNT;
  using AccT = Acc<Tile<BM>::kNT>;
  static constexpr int kSmemBytes = Tile<BM>::kSmemBytes;  // dynamic shared memory: the stages
  static_assert(kSmemBytes + 2 * BM * 4 <= kSm90SmemOptinBytes, "fits the sm_90 shared memory of one CTA");
};

// ---------------------------------------------------------------- epilogues (both mainloops)
// A warp's accumulators v[MT][NT][4] in the m16n8 layout (row wrow + 16 mi + (lane >> 2) + 8 h,
// column 8 j + 2 (lane & 3) + q); rows >= nrows are padding. kColCheck: n8 block j is stored only
// while 8 j < ncols (the wgmma tiles, which span all 256 columns); otherwise the caller checked
// that every column of the warp is valid. Row half h's values through acc_pair (constant indices).
// GEMM 1: out (the tile's first row and the warp's first column of a, row stride ld) gets
// act(w g) * (w u) (g1u1: gate in j < NT / 2, up in j + NT / 2) or act(w g) (g1u0), w = row_w(rl).
template <class TT, bool G1U1, Activation A, int MT, int NT, bool kColCheck, class RowW>
__device__ __forceinline__ void store_gemm1(const float (&v)[MT][NT][4], int wrow, int nrows, int ncols, TT* out,
                                            int64_t ld, RowW row_w) {
  const int lane = threadIdx.x & 31;
  out += 2 * (lane & 3);
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rl = wrow + mi * 16 + (lane >> 2) + 8 * h;
      if (rl >= nrows) continue;
      const float w = row_w(rl);
      TT* orow = out + int64_t(rl) * ld;
      if constexpr (G1U1) {
#pragma unroll
        for (int j = 0; j < NT / 2; ++j) {
          if (kColCheck && 8 * j >= ncols) continue;
          const float2 g = acc_pair(v[mi][j], h), u = acc_pair(v[mi][j + NT / 2], h);
          const float a0 = act<A>(g.x * w) * (u.x * w);
          const float a1 = act<A>(g.y * w) * (u.y * w);
          *reinterpret_cast<uint32_t*>(orow + j * 8) = pack2<TT>(a0, a1);
        }
      } else {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          if (kColCheck && 8 * j >= ncols) continue;
          const float2 g = acc_pair(v[mi][j], h);
          *reinterpret_cast<uint32_t*>(orow + j * 8) = pack2<TT>(act<A>(g.x * w), act<A>(g.y * w));
        }
      }
    }
  }
}

// GEMM 2: y (the tile's first row and the warp's first column, row stride ld) gets the f32 sums.
template <int MT, int NT, bool kColCheck>
__device__ __forceinline__ void store_gemm2(const float (&v)[MT][NT][4], int wrow, int nrows, int ncols, float* y,
                                            int64_t ld) {
  const int lane = threadIdx.x & 31;
  y += 2 * (lane & 3);
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rl = wrow + mi * 16 + (lane >> 2) + 8 * h;
      if (rl >= nrows) continue;
      float* yrow = y + int64_t(rl) * ld;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (kColCheck && 8 * j >= ncols) continue;
        *reinterpret_cast<float2*>(yrow + j * 8) = acc_pair(v[mi][j], h);
      }
    }
  }
}

// ---------------------------------------------------------------- 2. gemm1 + activation
struct Gemm1Args {
  const void* x;              // [T, H] row stride xs
  int64_t xs;
  const void* w1;             // [E, N1, H]
  const float* weights;       // [T*k] router weights
  const int32_t* offsets;     // routing outputs
  const int32_t* row_entry;
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;   // M tiles in use (the TMA path's work list)
  void* a;                    // [Tk, I] out
  int H, I, k;
  bool weight_on_input;
  int* counter = nullptr;     // the TMA path: work counter of ws_run's dynamic schedule (zeroed by the routing)
};

// Grid (tiles_max, N tiles): blockIdx.x fastest so one wave shares the weight N tile across the M
// tiles (x, T x H, stays in L2). g1u1: an N tile is 128 gate rows [i0, i0+128) and the matching 128
// up rows [I+i0, ...), B rows 0..127 / 128..255; warp wn multiplies gate columns wn*GW.. and up
// columns 128+wn*GW.. (GW = kWarpCols / 2), so each thread holds g and u of the same i: gate in
// n8 tiles j < NT/2, up in j + NT/2. g1u0: 256 consecutive rows.
template <class TT, int BM, bool G1U1, Activation A>
__global__ void __launch_bounds__(kThreads, 1) gemm1_kernel(Gemm1Args p) {
  using Tl = Tile<BM>;
  using ML = Mainloop<BM>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ int s_entry[BM];
  __shared__ float s_win[BM];
  const int tile = blockIdx.x;
  const int e = p.tile_expert[tile];
  if (e < 0) return;
  const int row0 = p.tile_row0[tile], row_end = p.offsets[e + 1];
  const int tid = threadIdx.x, warp = tid >> 5, wm = warp / Tl::kWN, wn = warp % Tl::kWN;
  const int i0 = blockIdx.y * (G1U1 ? kBN / 2 : kBN);

  if (tid < BM) {
    const int r = row0 + tid;
    const int ent = r < row_end ? p.row_entry[r] : -1;
    s_entry[tid] = ent;
    s_win[tid] = (p.weight_on_input && ent >= 0) ? p.weights[ent] : 1.0f;
  }
  __syncthreads();

  const TT* x = static_cast<const TT*>(p.x);
  const TT* w1 = static_cast<const TT*>(p.w1) + int64_t(e) * (G1U1 ? 2 : 1) * p.I * p.H;
  TileSources<TT, BM> src;
  src.a_base = x;
  src.a_ld = p.xs;
#pragma unroll
  for (int i = 0; i < Tl::kLoadsA; ++i) {
    const int ent = s_entry[loader_row(tid, i)];
    src.a_row[i] = ent >= 0 ? ent / p.k : -1;  // gather: token = entry / k
  }
  // B row of load i: g1u1 gate i0 + r (i < 4) / up I + i0 + r - 128 (i >= 4), g1u0 i0 + r, with
  // r = loader_row(tid, i); valid while its column i0 + (r & 127) (g1u1) / i0 + r (g1u0) < I.
  const int r0 = loader_row(tid, 0);
  src.b_run[0] = w1 + int64_t(i0 + r0) * p.H;
  src.b_run[1] = w1 + int64_t(G1U1 ? p.I + i0 + r0 : i0 + r0 + kBN / 2) * p.H;
  src.b_step = int64_t(kThreads / 8) * p.H;
  // NOTE: I % 32 == 0 and r0 < 32, so i0 + r0 + 32 m < I <=> 32 m < I - i0: the same for every
  // thread of the CTA (uniform), which keeps the predicates out of per-thread registers.
  src.b_ok = 0;
#pragma unroll
  for (int i = 0; i < Tl::kLoadsB; ++i) {
    const int m = G1U1 ? i % (Tl::kLoadsB / 2) : i;  // 32-row block of the column
    src.b_ok |= uint32_t(32 * m < p.I - i0) << i;
  }
  constexpr int kGW = Tl::kWarpCols / 2;  // g1u1: gate (and up) columns per warp
  typename ML::AccT acc;
  mainloop_rows<TT, BM, G1U1 ? kBN / 2 : 8 * Tl::kNG>(smem_raw, src, p.H, G1U1 ? wn * kGW : wn * Tl::kWarpCols,
                                                      row_end - row0, acc);

  // A warp's columns lie in one 64-aligned block and I % 64 == 0 (supports), so they are all valid
  // or all past I: one check per warp, and the stores below use immediate offsets.
  const int ic = i0 + wn * (G1U1 ? kGW : Tl::kWarpCols);  // the warp's first column of a
  if (ic >= p.I) return;
  const int ncols = p.I - ic;
  const int wrow = wm * kWarpRows;  // the warp's first row in the tile
  store_gemm1<TT, G1U1, A, ML::kMT, ML::kNT, false>(acc.v, wrow, row_end - row0, ncols,
                                                    static_cast<TT*>(p.a) + int64_t(row0) * p.I + ic, p.I,
                                                    [&](int rl) { return s_win[rl]; });
}

// ---------------------------------------------------------------- 3. gemm2
struct Gemm2Args {
  const void* a;              // [Tk, I]
  const void* w2;             // [E, H, I]
  const int32_t* offsets;
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;
  float* y;                   // [splits, Tk, H] out: the partial sum of K range ks at y + ks * y_split
  int64_t y_split;
  int H, I;
  int splits;                 // K ranges (1 or 2; the TMA path only)
  int* counter = nullptr;     // as Gemm1Args::counter
};

template <class TT, int BM>
__global__ void __launch_bounds__(kThreads, 1) gemm2_kernel(Gemm2Args p) {
  using Tl = Tile<BM>;
  using ML = Mainloop<BM>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int tile = blockIdx.x;
  const int e = p.tile_expert[tile];
  if (e < 0) return;
  const int row0 = p.tile_row0[tile], row_end = p.offsets[e + 1];
  const int tid = threadIdx.x, warp = tid >> 5, wm = warp / Tl::kWN, wn = warp % Tl::kWN;
  const int h0 = blockIdx.y * kBN;

  const TT* a = static_cast<const TT*>(p.a);
  const TT* w2 = static_cast<const TT*>(p.w2) + int64_t(e) * p.H * p.I;
  TileSources<TT, BM> src;
  src.a_base = a;
  src.a_ld = p.I;
#pragma unroll
  for (int i = 0; i < Tl::kLoadsA; ++i) {
    const int row = row0 + loader_row(tid, i);
    src.a_row[i] = row < row_end ? row : -1;
  }
  const int r0 = loader_row(tid, 0);  // B rows h0 + r0 + 32 i, valid below H
  src.b_run[0] = w2 + int64_t(h0 + r0) * p.I;
  src.b_run[1] = w2 + int64_t(h0 + r0 + kBN / 2) * p.I;
  src.b_step = int64_t(kThreads / 8) * p.I;
  src.b_ok = 0;
#pragma unroll
  for (int i = 0; i < Tl::kLoadsB; ++i) src.b_ok |= uint32_t(h0 + loader_row(tid, i) < p.H) << i;
  typename ML::AccT acc;
  mainloop_rows<TT, BM, 8 * Tl::kNG>(smem_raw, src, p.I, wn * Tl::kWarpCols, row_end - row0, acc);

  // H % 64 == 0 (supports): the warp's columns are all valid or all past H; see gemm1.
  const int hc = h0 + wn * Tl::kWarpCols;
  if (hc >= p.H) return;
  const int ncols = p.H - hc;
  const int wrow = wm * kWarpRows;
  store_gemm2<ML::kMT, ML::kNT, false>(acc.v, wrow, row_end - row0, ncols, p.y + int64_t(row0) * p.H + hc, p.H);
}

// ---------------------------------------------------------------- 2'/3'. the TMA path (BM 128)
// x rows gathered into expert order for gemm1's A: xs[r] = x[row_entry[r] / k], rows < offsets[E].
template <class TT>
__global__ void __launch_bounds__(128) gather_kernel(const TT* x, int64_t ld, const int32_t* row_entry,
                                                     const int32_t* offsets, int E, int k, int H, TT* xs) {
  const int row = blockIdx.x;
  if (row >= offsets[E]) return;
  const uint4* src = reinterpret_cast<const uint4*>(x + int64_t(row_entry[row] / k) * ld);
  uint4* dst = reinterpret_cast<uint4*>(xs + int64_t(row) * H);
  for (int c = threadIdx.x; c < H / 8; c += 128) dst[c] = src[c];
}

// gemm1 over the work list (M tiles x N tiles of 128 gate + 128 up columns, or 256 for g1u0):
// ma = xs [Tk, H], mb = w1 as [E * N1, H]; epilogue as gemm1_kernel, w from row_entry.
template <class TT, bool G1U1, Activation A>
__global__ void __launch_bounds__(kWsThreads, 1)
    gemm1_ws_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb, Gemm1Args p,
                    int n_tiles) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const WsSmem sm = ws_setup(smem_raw, &ma, &mb);
  const int warp = threadIdx.x >> 5;
  const int n1 = G1U1 ? 2 * p.I : p.I, nb = G1U1 ? kBN / 2 : kBN;
  ws_run<TT>(
      sm, &ma, &mb, *p.num_tiles, n_tiles, 1, p.H / kBK, kBK,
      [&](const WsItem& it, int& row0, int& b0, int& b1) {
        const int e = p.tile_expert[it.m], i0 = it.n * nb;
        row0 = p.tile_row0[it.m];
        b0 = e * n1 + i0;
        b1 = G1U1 ? e * n1 + p.I + i0 : b0 + kBN / 2;
      },
      [&](const WsItem& it, const AccW& acc) {
        const int e = p.tile_expert[it.m], row0 = p.tile_row0[it.m], i0 = it.n * nb;
        const int* entry = p.row_entry + row0;
        store_gemm1<TT, G1U1, A, 1, kWgNT, true>(
            acc.v, warp * 16, p.offsets[e + 1] - row0, p.I - i0, static_cast<TT*>(p.a) + int64_t(row0) * p.I + i0,
            p.I, [&](int rl) { return p.weight_on_input ? p.weights[entry[rl]] : 1.0f; });
      },
      reinterpret_cast<uint32_t*>(ws_extra_smem(smem_raw)), p.counter);
}

// gemm2 over the work list (M tiles x H / 256 x p.splits K ranges; the K ranges of one tile are
// consecutive items): ma = a [Tk, I], mb = w2 as [E * H, I]. K range ks writes y + ks * y_split.
// my = y as [splits * Tk, H] f32 (32 x 64 boxes): a consumer warpgroup whose 64 rows are all the
// expert's stores them by TMA through shared memory (sm90::tma_store_f32_rows, kWsYStoreExtra), one
// with padding rows from registers (E124).
constexpr int kWsWords = kWsStages * 4;  // ws_run's item words, after the ring (ws_extra_smem)
// The words, then the two warpgroups' y staging buffers.
constexpr int kWsYStoreExtra =
    sm90::tma_store_f32_extra_smem<32>(kWsStages * int(kWsStageBytes + 16), kWsWords, 2);
static_assert(kWsSmemBytes + kWsYStoreExtra <= kSm90SmemOptinBytes, "fits one CTA's shared memory");
template <class TT>
__global__ void __launch_bounds__(kWsThreads, 1)
    gemm2_ws_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                    const __grid_constant__ CUtensorMap my, Gemm2Args p, int n_tiles) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const WsSmem sm = ws_setup(smem_raw, &ma, &mb);
  const int warp = threadIdx.x >> 5, wg = warp >> 2;
  const uint32_t ybuf = smem_addr(align_smem_1024(ws_extra_smem(smem_raw) + kWsWords)) +
                        uint32_t(wg & 1) * sm90::kF32StoreBytesPerWarpgroup<32>;
  ws_run<TT>(
      sm, &ma, &mb, *p.num_tiles, n_tiles, p.splits, p.I / kBK, kBK,
      [&](const WsItem& it, int& row0, int& b0, int& b1) {
        row0 = p.tile_row0[it.m];
        b0 = p.tile_expert[it.m] * p.H + it.n * kBN;
        b1 = b0 + kBN / 2;
      },
      [&](const WsItem& it, const AccW& acc) {
        const int e = p.tile_expert[it.m], row0 = p.tile_row0[it.m], h0 = it.n * kBN;
        const int nrows = p.offsets[e + 1] - row0;
        if (64 * wg + 64 <= nrows) {  // warpgroup-uniform; columns past H are clipped by the map
          const int row = it.ks * int(p.y_split / p.H) + row0 + 64 * wg;  // y_split = Tk H
          sm90::tma_store_f32_rows<kWgNT>(&my, ybuf, wg, row, h0, acc.v[0]);
        } else {
          store_gemm2<1, kWgNT, true>(acc.v, warp * 16, nrows, p.H - h0,
                                      p.y + it.ks * p.y_split + int64_t(row0) * p.H + h0, p.H);
        }
      },
      reinterpret_cast<uint32_t*>(ws_extra_smem(smem_raw)), p.counter);
  if (warp < kWsConsumerWarps) sm90::tma_store_f32_drain();
}

// ---------------------------------------------------------------- host side
template <class TT, int BM, bool G1U1>
Status launch_gemm1(Activation act_kind, dim3 grid, cudaStream_t s, const Gemm1Args& args) {
  auto pick = [&]() {
    switch (act_kind) {
      case Activation::gelu: return gemm1_kernel<TT, BM, G1U1, Activation::gelu>;
      case Activation::gelu_tanh: return gemm1_kernel<TT, BM, G1U1, Activation::gelu_tanh>;
      case Activation::silu: break;
    }
    return gemm1_kernel<TT, BM, G1U1, Activation::silu>;
  };
  auto* fn = pick();
  constexpr int kSmem = Mainloop<BM>::kSmemBytes;
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                                    "fused_moe_sm90_grouped gemm1: cudaFuncSetAttribute"));
  fn<<<grid, kThreads, kSmem, s>>>(args);
  return last_launch("fused_moe_sm90_grouped gemm1");
}

// The two grouped GEMMs with BM x 256 tiles (routing already ran with the same BM).
template <class TT, int BM>
Status launch_gemms(const FusedMoeParams& p, const Gemm1Args& g1, const Gemm2Args& g2, unsigned tiles,
                    cudaStream_t s) {
  const MoeDims d = moe_dims(p);
  const dim3 grid1(tiles, unsigned(ceil_div(d.I, d.g1u1 ? kBN / 2 : kBN)));
  if (d.g1u1) {
    MOEKIT_RETURN_IF_ERROR((launch_gemm1<TT, BM, true>(p.activation, grid1, s, g1)));
  } else {
    MOEKIT_RETURN_IF_ERROR((launch_gemm1<TT, BM, false>(p.activation, grid1, s, g1)));
  }
  constexpr int kSmem = Mainloop<BM>::kSmemBytes;
  const dim3 grid2(tiles, unsigned(ceil_div(d.H, kBN)));
  MOEKIT_RETURN_IF_ERROR(check_cuda(
      cudaFuncSetAttribute(gemm2_kernel<TT, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
      "fused_moe_sm90_grouped gemm2: cudaFuncSetAttribute"));
  gemm2_kernel<TT, BM><<<grid2, kThreads, kSmem, s>>>(g2);
  return last_launch("fused_moe_sm90_grouped gemm2");
}

// The TMA path: gather, then the persistent gemm1 / gemm2 (grid: one CTA per SM at most).
template <class TT>
Status launch_ws(const FusedMoeParams& p, const Gemm1Args& g1, const Gemm2Args& g2, const WsLayout& l, TT* xs,
                 cudaStream_t s) {
  const MoeDims d = moe_dims(p);
  constexpr bool kBf16 = std::is_same_v<TT, __nv_bfloat16>;
  gather_kernel<TT><<<unsigned(l.tk), 128, 0, s>>>(static_cast<const TT*>(p.x.data), p.x.stride[0], g1.row_entry,
                                                   g1.offsets, int(d.E), int(d.k), int(d.H), xs);
  MOEKIT_RETURN_IF_ERROR(last_launch("fused_moe_sm90_grouped gather"));
  const int64_t n1 = d.g1u1 ? 2 * d.I : d.I;
  CUtensorMap ma1, mb1, ma2, mb2;
  MOEKIT_RETURN_IF_ERROR(encode_tensor_map_2d(&ma1, xs, kBf16, uint64_t(l.tk), uint64_t(d.H), uint64_t(d.H), 128,
                                              "fused_moe_sm90_grouped xs"));
  MOEKIT_RETURN_IF_ERROR(encode_tensor_map_2d(&mb1, p.w1.data, kBf16, uint64_t(d.E * n1), uint64_t(d.H),
                                              uint64_t(d.H), 128, "fused_moe_sm90_grouped w1"));
  MOEKIT_RETURN_IF_ERROR(encode_tensor_map_2d(&ma2, g2.a, kBf16, uint64_t(l.tk), uint64_t(d.I), uint64_t(d.I), 128,
                                              "fused_moe_sm90_grouped a"));
  MOEKIT_RETURN_IF_ERROR(encode_tensor_map_2d(&mb2, p.w2.data, kBf16, uint64_t(d.E * d.H), uint64_t(d.I),
                                              uint64_t(d.I), 128, "fused_moe_sm90_grouped w2"));
  int sms = 0;
  MOEKIT_RETURN_IF_ERROR(device_sm_count(&sms, "fused_moe_sm90_grouped: SM count"));
  const int n_tiles1 = ceil_div(d.I, d.g1u1 ? kBN / 2 : kBN), n_tiles2 = ceil_div(d.H, kBN);
  auto grid = [&](int n_tiles) { return unsigned(std::min<int64_t>(sms, l.tiles_max * n_tiles)); };

  auto* fn1 = pick_gemm1(p.activation, d.g1u1, [](auto g1u1, auto act) {
    return gemm1_ws_kernel<TT, decltype(g1u1)::value, decltype(act)::value>;
  });
  MOEKIT_RETURN_IF_ERROR(launch_ws_kernel_extra(fn1, grid(n_tiles1), kWsWords, s, "fused_moe_sm90_grouped gemm1",
                                                ma1, mb1, g1, n_tiles1));
  CUtensorMap my;
  MOEKIT_RETURN_IF_ERROR(sm90::encode_f32_rows_map<32>(&my, g2.y, uint64_t(l.splits) * uint64_t(l.tk), uint64_t(d.H),
                                                        "fused_moe_sm90_grouped y"));
  return launch_ws_kernel_extra(gemm2_ws_kernel<TT>, grid(n_tiles2 * l.splits), kWsYStoreExtra, s,
                                "fused_moe_sm90_grouped gemm2", ma2, mb2, my, g2, n_tiles2);
}

template <class TT>
Status run_typed(const FusedMoeParams& p, const Sm90Config& c, const RunContext& ctx) {
  const MoeDims d = moe_dims(p);
  const WsLayout l = layout_of(p, c);
  const int bm = c.tile_m;
  auto* base = static_cast<unsigned char*>(ctx.workspace);
  base += (kAlign - reinterpret_cast<uintptr_t>(base) % kAlign) % kAlign;
  auto* local = reinterpret_cast<int32_t*>(base + l.local);
  auto* offsets = reinterpret_cast<int32_t*>(base + l.offsets);
  auto* row_entry = reinterpret_cast<int32_t*>(base + l.row_entry);
  auto* slot_row = reinterpret_cast<int32_t*>(base + l.slot_row);
  auto* tile_expert = reinterpret_cast<int32_t*>(base + l.tile_expert);
  auto* tile_row0 = reinterpret_cast<int32_t*>(base + l.tile_row0);
  auto* num_tiles = reinterpret_cast<int32_t*>(base + l.num_tiles);
  void* a = base + l.a;
  auto* y = reinterpret_cast<float*>(base + l.y);
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);

  // The routing also zeroes the TMA gemms' work counters, after num_tiles.
  MOEKIT_RETURN_IF_ERROR(launch_route(p,
                                      {local, offsets, row_entry, slot_row, tile_expert, tile_row0, num_tiles,
                                       num_tiles + 1, kWsCounters},
                                      l.tk, l.tiles_max, bm, s, "fused_moe_sm90_grouped route"));

  Gemm1Args g1{p.x.data, p.x.stride[0], p.w1.data, p.topk_weights.ptr<const float>(), offsets, row_entry,
               tile_expert, tile_row0, num_tiles, a, int(d.H), int(d.I), int(d.k), p.weight_on_input};
  Gemm2Args g2{a, p.w2.data, offsets, tile_expert, tile_row0, num_tiles, y, l.tk * d.H, int(d.H), int(d.I),
               l.splits};
  // The config's schedule per gemm: a work counter (dynamic) or the static order; the routing zeroes
  // both counters either way.
  g1.counter = c.sched[0] == Sm90Schedule::dynamic ? num_tiles + 1 : nullptr;
  g2.counter = c.sched[1] == Sm90Schedule::dynamic ? num_tiles + 2 : nullptr;
  if (bm == 64) {
    MOEKIT_RETURN_IF_ERROR((launch_gemms<TT, 64>(p, g1, g2, unsigned(l.tiles_max), s)));
  } else {
    MOEKIT_RETURN_IF_ERROR(launch_ws<TT>(p, g1, g2, l, reinterpret_cast<TT*>(base + l.xs), s));
  }

  ReduceArgs rd{y, l.tk * d.H, slot_row, p.topk_weights.ptr<const float>(), p.out.data, p.out.stride[0], int(d.H),
                int(d.k), l.splits, p.weight_on_input};
  return launch_reduce<TT>(rd, d.T, s, "fused_moe_sm90_grouped reduce");
}

}  // namespace
}  // namespace grouped

Status fused_moe_sm90_grouped_supports(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(require_device({{"x", &p.x}, {"w1", &p.w1}, {"w2", &p.w2}, {"topk_ids", &p.topk_ids},
                                         {"topk_weights", &p.topk_weights}, {"out", &p.out},
                                         {"expert_mask", &p.expert_mask}, {"expert_map", &p.expert_map}}));
  const MoeDims d = moe_dims(p);
  if (p.x.dtype != DType::bf16 && p.x.dtype != DType::f16) {
    return Unsupported("x: needs bf16 or f16 (tensor-core HMMA operands), got ", dtype_name(p.x.dtype));
  }
  if (p.w1.dtype != p.x.dtype) return Unsupported("w1: unquantized weights of x's dtype only, got ", dtype_name(p.w1.dtype));
  if (p.w1.layout != Layout::row_major) {
    return Unsupported("w1: needs layout row_major (K-contiguous rows for cp.async), got ", layout_name(p.w1.layout));
  }
  if (d.H % 64 != 0) return Unsupported("x: hidden size H must be a multiple of 64 (K slice), got ", d.H);
  if (d.I % 64 != 0) return Unsupported("w2: intermediate size I must be a multiple of 64 (K slice / N tile), got ", d.I);
  if (!p.round_intermediate) {
    return Unsupported("round_intermediate: must be true (the second GEMM reads a in x's dtype), got false");
  }
  return fused_moe_sm90_grouped_limits(p);
}

Status fused_moe_sm90_grouped_limits(const FusedMoeParams& p) {
  const MoeDims d = moe_dims(p);
  if (d.k > grouped::kMaxK) return Unsupported("topk_ids: k must be <= ", grouped::kMaxK, ", got ", d.k);
  if (d.E > grouped::kMaxE) return Unsupported("w1: local experts E must be <= ", grouped::kMaxE, ", got ", d.E);
  if (p.x.stride[0] % 8 != 0 || reinterpret_cast<uintptr_t>(p.x.data) % 16 != 0) {
    return Unsupported("x: rows must be 16-byte aligned (row stride % 8 elements), got stride ", p.x.stride[0]);
  }
  if (reinterpret_cast<uintptr_t>(p.w1.data) % 16 != 0 || reinterpret_cast<uintptr_t>(p.w2.data) % 16 != 0) {
    return Unsupported("w1/w2: data must be 16-byte aligned");
  }
  const int64_t tk = d.T * d.k;
  if (tk > (int64_t(1) << 30) || tk * std::max(d.H, d.I) > (int64_t(1) << 40)) {
    return Unsupported("x: T*k = ", tk, " too large for 32-bit row indices");
  }
  if (d.T > 0x7fffffff) return Unsupported("x: T too large for the grid, got ", d.T);
  if (d.E * d.N1 >= (int64_t(1) << 31) || d.E * d.H >= (int64_t(1) << 31)) {
    return Unsupported("w1/w2: E * N = ", d.E * d.N1, " / ", d.E * d.H, " weight rows exceed 32-bit TMA coordinates");
  }
  return Status::Ok();
}

size_t fused_moe_sm90_grouped_config_workspace_bytes(const FusedMoeParams& p, const Sm90Config& c) {
  return grouped::layout_of(p, c).total;
}

Status fused_moe_sm90_grouped_config_run(const FusedMoeParams& p, const Sm90Config& c, const RunContext& ctx) {
  const MoeDims d = moe_dims(p);
  if (d.T == 0) return Status::Ok();
  const size_t need = fused_moe_sm90_grouped_config_workspace_bytes(p, c);
  if (ctx.workspace == nullptr || ctx.workspace_bytes < need) {
    return InvalidArgument("workspace: fused_moe_sm90_grouped needs ", need, " device bytes, got ", ctx.workspace_bytes);
  }
  if (p.x.dtype == DType::bf16) return grouped::run_typed<__nv_bfloat16>(p, c, ctx);
  return grouped::run_typed<__half>(p, c, ctx);
}

}  // namespace moekit::cuda
