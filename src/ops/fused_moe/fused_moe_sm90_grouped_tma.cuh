// The persistent, warp-specialised wgmma mainloop of fused_moe_sm90_grouped (SPEC 3.1) for 128-row M
// tiles: C = A . B^T with A [rows, K] and B [N, K] both K-contiguous bf16 / f16, f32 accumulation,
// 128 x 256 output tiles, operands brought in by the bulk tensor copy engine (TMA).
//
// CTA = 9 warps: warps 0-7 are two consumer warpgroups (warpgroup g multiplies A rows 64 g .. 64 g
// + 63 of the tile by all 256 B rows with wgmma m64n256k16, 128 f32 accumulators per thread), warp
// 8 is the producer (one lane issues every TMA load). The CTAs are persistent: CTA b walks the
// work list t = b, b + gridDim.x, ... (t -> (M tile, N tile) by ws_tile below), or takes its items
// from a work counter; the producer tells the consumers each item (ws_run). The fp8 per-row gemms may
// multiply a tile of <= 64 rows at half cost (ws_run's kTail).
// kWsStages shared-memory stages of one 64-wide K slice (A 128 x 64 + B 256 x 64, 48 KiB) are
// handed over with mbarriers: full[s] (the producer's arrive.expect_tx + the TMA's complete_tx) and
// empty[s] (one arrive per consumer warp once the wgmma that read the stage completed). The producer
// runs up to kWsStages slices ahead, also into the next tile while the consumers run the epilogue of
// this one.
// Consumer per slice: wait full[s]; 4 x wgmma k16; commit; wait until <= 1 wgmma group is pending
// (so the tensor pipe always has the next group queued); release the stage of the previous slice.
// NOTE: with launch bounds (288, 1) ptxas gives every thread at most 168 registers (it spills at
// 168, not at 65536 / 288), so the consumers run close to their limit and the epilogues keep
// per-column data in shared memory, not registers. setmaxnreg lifts the limit (384 threads:
// fused_moe_sm90_grouped_fp8_block_tma.cuh).
// The tile layout in shared memory is what TMA writes with CU_TENSOR_MAP_SWIZZLE_128B for boxes of
// 64 x 128 (src/cuda/tensor_map.h): 8-row atoms of 1024 bytes, 16-byte chunks XOR (row % 8), the
// layout of wgmma_desc_sw128. Two 128-row B boxes side by side form the 256-row B tile.
// Requirements: K % 64 == 0; the dynamic shared memory base aligned by the caller to 1024 bytes.
// Tests: tests/test_fused_moe_sm90_grouped.cpp (suite FusedMoeSm90Grouped: every BM = 128 case).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/device_facts.h"
#include "cuda/cuda_utils.h"
#include "cuda/pdl.cuh"
#include "cuda/sm90/mbarrier.cuh"
#include "cuda/sm90/ring.cuh"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/warpgroup.cuh"
#include "moekit/ops/fused_moe.h"

#include "ops/fused_moe/fused_moe_sm90_grouped_wgmma.cuh"

namespace moekit::cuda::grouped {

// The sm_90a primitives of src/cuda/sm90/ (mbarrier, TMA, setmaxnreg, the stage ring) under the
// names this header and its includers use.
using sm90::mbar_arrive;
using sm90::mbar_arrive_expect_tx;
using sm90::mbar_init;
using sm90::mbar_init_fence;
using sm90::mbar_wait;
using sm90::setmaxnreg_dec;
using sm90::setmaxnreg_inc;
using sm90::tma_load_2d;
using sm90::tma_prefetch_desc;
using sm90::warpgroup_index;
using sm90::ws_extra_smem_of;
using sm90::ws_init_barriers;
using sm90::ws_smem_bytes;
using sm90::WsRingT;
using sm90::WsSmemT;

constexpr int kWsStages = 4;                       // K slices in flight
constexpr int kWsConsumerWarps = 8;                // two warpgroups
// (WsShape<3> below: three consumer warpgroups, each k32 step as two m64n128 wgmma, since a wgmma's
// operands must fit the launch budget of 512 threads.)
constexpr int kWsThreads = 32 * (kWsConsumerWarps + 1);
constexpr uint32_t kWsABytes = 128 * kBK * 2;      // 16 KiB
constexpr uint32_t kWsBHalfBytes = 128 * kBK * 2;  // one 128-row B box
constexpr uint32_t kWsStageBytes = kWsABytes + 2 * kWsBHalfBytes;  // 48 KiB
// Dynamic shared memory: alignment slack + the stages + 2 kWsStages mbarriers.
constexpr int kWsSmemBytes = int(kSw128AtomBytes + kWsStages * kWsStageBytes + 2 * kWsStages * 8);
static_assert(kWsSmemBytes <= kSm90SmemOptinBytes, "fits the sm_90 shared memory of one CTA");
// M tiles per raster group (ws_tile); a work list of at most kWsOneGroupM M tiles is one group.
// NOTE: groups of 16 for every list helped short lists but slowed long ones (docs/experiments.md
// E20); one group for a short list keeps an expert's M tiles in one group (E26); up to 32 gained
// nothing (E27).
constexpr int kWsGroupM = 8;
constexpr int kWsOneGroupM = 16;

// ---------------------------------------------------------------- schedule
// The work list: num_m used M tiles x n_tiles N tiles. Raster: groups of kWsGroupM consecutive M
// tiles (about one expert at large T); inside a group the M tile varies fastest, so the CTAs of one
// wave share the B (weight) tiles of a few N tiles and the A rows of a few M tiles in L2.
__device__ __forceinline__ void ws_tile(int t, int num_m, int n_tiles, int& m, int& n) {
  const int gm = num_m <= kWsOneGroupM ? num_m : kWsGroupM;
  const int per_group = gm * n_tiles;
  const int g = t / per_group, r = t - g * per_group;
  const int mg = min(gm, num_m - g * gm);
  m = g * gm + r % mg;
  n = r / mg;
}

// The ring (sm90::WsSmemT, WsRingT) of the 48 KiB stages of the 128 x 256 tiles; the 128 x 128
// tiles of the block-scaled fp8 kernels use 32 KiB stages and more of them (Fp8Ring,
// fused_moe_sm90_grouped_fp8_ring.cuh).
using WsSmem = WsSmemT<kWsStages, kWsStageBytes, kWsABytes>;
using WsRing = WsRingT<kWsStages>;
static_assert(ws_smem_bytes<WsSmem>() == kWsSmemBytes, "one formula");

// The dynamic shared memory after the stages and barriers of WsSmem: the extra_smem bytes of
// launch_ws_kernel_extra, for the kernel's own use (sm90::ws_extra_smem_of).
__device__ __forceinline__ unsigned char* ws_extra_smem(unsigned char* smem_raw) {
  return ws_extra_smem_of<WsSmem>(smem_raw);
}

// A barrier of the consumer warpgroups alone (named barrier 1; the producer warpgroup takes no part).
__device__ __forceinline__ void ws_consumers_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(32 * kWsConsumerWarps) : "memory");
}

// Shared prologue of the persistent kernels: barriers initialised, descriptors prefetched (by the
// producer's first thread, the one after the consumer warps).
template <class Sm = WsSmem, int kConsumerWarps = kWsConsumerWarps>
__device__ __forceinline__ Sm ws_setup(unsigned char* smem_raw, const CUtensorMap* ma, const CUtensorMap* mb) {
  const Sm sm{smem_addr(align_smem_1024(smem_raw))};
  if (threadIdx.x == 0) ws_init_barriers<kConsumerWarps>(sm);
  if (threadIdx.x == 32 * kConsumerWarps) {
    tma_prefetch_desc(ma);
    tma_prefetch_desc(mb);
  }
  __syncthreads();
  return sm;
}

// Producer (one thread): K slices [kt0, kt1) of A rows [row0, row0 + BM) (BM: the A map's box rows,
// 128 or 192) and of the two 128-row B boxes at b_row0 / b_row1, for one tile, into the ring. A slice
// is 128 bytes of K: `slice` elements (64 for bf16 / f16, 128 for fp8).
// words[s] = word (ws_run's item and its tail bit) for each stage s it fills, before the stage's full
// barrier is armed (the barrier's release orders it for the consumers).
template <class Sm, int kStages>
__device__ __forceinline__ void ws_produce_tile(const Sm& sm, WsRingT<kStages>& ring, const CUtensorMap* ma,
                                                const CUtensorMap* mb, int row0, int b_row0, int b_row1, int kt0,
                                                int kt1, int slice, uint32_t* words, uint32_t word) {
  for (int kt = kt0; kt < kt1; ++kt) {
    mbar_wait(sm.empty(ring.s), ring.phase ^ 1u);  // fresh barriers: parity 1 counts as completed
    words[ring.s] = word;
    const uint32_t full = sm.full(ring.s);
    mbar_arrive_expect_tx(full, Sm::kStageBytes);
    tma_load_2d(sm.a(ring.s), ma, kt * slice, row0, full);
    tma_load_2d(sm.b(ring.s), mb, kt * slice, b_row0, full);
    tma_load_2d(sm.b(ring.s) + kWsBHalfBytes, mb, kt * slice, b_row1, full);
    ring.next();
  }
}

// The consumer loop of a tile (zeroed accumulators, then per K slice: wait for the stage, issue(s)
// the slice's wgmma into acc, one group left in flight, the previous slice's stage released).
template <class Sm, int kStages, class Issue>
__device__ __forceinline__ void ws_consume_ring(const Sm& sm, WsRingT<kStages>& ring, int KT, AccW& acc, Issue issue) {
  const bool leader = (threadIdx.x & 31) == 0;
#pragma unroll
  for (int j = 0; j < kWgNT; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc.v[0][j][q] = 0.0f;
  int prev = -1;
  for (int kt = 0; kt < KT; ++kt) {
    mbar_wait(sm.full(ring.s), ring.phase);
    fence_acc(acc);
    wgmma_fence();
    issue(ring.s);
    wgmma_commit();
    wgmma_wait<1>();  // the group of slice kt - 1 completed: its stage can be refilled
    fence_acc(acc);
    if (prev >= 0 && leader) mbar_arrive(sm.empty(prev));
    prev = ring.s;
    ring.next();
  }
  wgmma_wait<0>();
  fence_acc(acc);
  if (prev >= 0 && leader) mbar_arrive(sm.empty(prev));
}

// Consumer warpgroup wg (0 .. BM / 64 - 1): acc = A rows 64 wg .. 64 wg + 63 of the tile . B^T over KT
// slices. kPairs (fp8 only): each k32 step as two wgmma m64n128k32 (B box 0, then box 1) into the two
// halves of acc, not one m64n256k32: a wgmma's registers must fit the kernel's launch budget (65536 /
// threads: 128 at 512 threads), which setmaxnreg does not raise, and m64n256k32 needs 154.
// NOTE: a warpgroup whose 64 rows are all padding still multiplies them: letting it skip its wgmma
// measured slower (E19). So did splitting the K slices of a tile with <= 64 rows between the two
// warpgroups (rows 0..63 each, sums added through shared memory): such a tile reads the same 48 KiB
// per slice for half the MMAs, and L2 -> SM traffic already limits (E22).
// The fp8 128 x 256 gemms now run such tiles with both warpgroups on the 64 rows, each on half of B
// (ws_consume_tail), on a dynamic schedule (E50).
template <class TT, bool kPairs = false, class Sm, int kStages>
__device__ __forceinline__ void ws_consume_tile(const Sm& sm, WsRingT<kStages>& ring, int wg, int KT, AccW& acc) {
  static_assert(!kPairs || std::is_same_v<TT, __nv_fp8_e4m3>, "n128 pairs: fp8 only");
  const uint32_t a_off = uint32_t(wg) * 64 * kBK * 2;
  ws_consume_ring(sm, ring, KT, acc, [&](int s) {
    const uint64_t da = wgmma_desc_sw128(sm.a(s) + a_off);
    const uint64_t db = wgmma_desc_sw128(sm.b(s));
    if constexpr (kPairs) {
      auto& lo = *reinterpret_cast<float(*)[kWgNT / 2][4]>(&acc.v[0][0][0]);
      auto& hi = *reinterpret_cast<float(*)[kWgNT / 2][4]>(&acc.v[0][kWgNT / 2][0]);
      const uint64_t db1 = wgmma_desc_sw128(sm.b(s) + kWsBHalfBytes);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        wgmma_fp8_n128(lo, da + uint64_t(2 * ks), db + uint64_t(2 * ks), 1);
        wgmma_fp8_n128(hi, da + uint64_t(2 * ks), db1 + uint64_t(2 * ks), 1);
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        // +32 bytes per k16 step = +2 in the start-address field (see cuda/sm90/wgmma_desc.h).
        WgmmaOp<TT>::run(acc.v[0], da + uint64_t(2 * ks), db + uint64_t(2 * ks));
      }
    }
  });
}

// Tail tiles of the fp8 128 x 256 gemms: an M tile with at most 64 real rows (an expert's last
// rows past a multiple of 128, or an expert of <= 64 rows) is multiplied as 64 x 256, both
// warpgroups on A rows 0..63, each on its own part of B, so it costs half the MMAs of a full tile
// for the same 48 KiB stages. WsTail::halves: warpgroup wg takes B box wg (columns 128 wg ..) as
// m64n128 into acc groups 0..15. WsTail::gate_up (gemm1 with gate and up boxes): warpgroup wg takes
// rows 64 wg .. 64 wg + 63 of both boxes as two m64n64, gate into acc groups 0..7, up into 16..23,
// so its epilogue pairs them as for a full tile.
enum class WsTail { none, halves, gate_up };
template <WsTail kTail, class Sm, int kStages>
__device__ __forceinline__ void ws_consume_tail(const Sm& sm, WsRingT<kStages>& ring, int wg, int KT, AccW& acc) {
  static_assert(kTail != WsTail::none, "a tail layout");
  ws_consume_ring(sm, ring, KT, acc, [&](int s) {
    const uint64_t da = wgmma_desc_sw128(sm.a(s));
    if constexpr (kTail == WsTail::halves) {
      auto& lo = *reinterpret_cast<float(*)[kWgNT / 2][4]>(&acc.v[0][0][0]);
      const uint64_t db = wgmma_desc_sw128(sm.b(s) + uint32_t(wg) * kWsBHalfBytes);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) wgmma_fp8_n128(lo, da + uint64_t(2 * ks), db + uint64_t(2 * ks), 1);
    } else {
      auto& g = *reinterpret_cast<float(*)[8][4]>(&acc.v[0][0][0]);
      auto& u = *reinterpret_cast<float(*)[8][4]>(&acc.v[0][kWgNT / 2][0]);
      const uint32_t r = uint32_t(wg) * 64 * 128;  // B rows 64 wg .. (128-byte rows, whole swizzle atoms)
      const uint64_t dg = wgmma_desc_sw128(sm.b(s) + r);
      const uint64_t du = wgmma_desc_sw128(sm.b(s) + kWsBHalfBytes + r);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        wgmma_fp8_n64(g, da + uint64_t(2 * ks), dg + uint64_t(2 * ks));
        wgmma_fp8_n64(u, da + uint64_t(2 * ks), du + uint64_t(2 * ks));
      }
    }
  });
}

// A consumer warp's first row and first column in its warpgroup's accumulators, relative to the
// tile's (per gate / up half for WsTail::gate_up): rows 16 warp .. of all columns for a full tile
// (ws_consume_tile); for a tail tile (ws_consume_tail<kTail>) rows 16 (warp & 3) .. and the
// columns of warpgroup warp / 4 (64 of each half for gate_up, 128 for halves).
template <WsTail kTail>
__device__ __forceinline__ void ws_warp_origin(int warp, bool tail, int& row, int& col) {
  row = tail ? (warp & 3) * 16 : warp * 16;
  col = tail ? (warp >> 2) * (kTail == WsTail::gate_up ? 64 : 128) : 0;
}

// One item of the work list: M tile m (of num_m), N tile n, K range ks (of `splits`) = K slices
// [kt0, kt1). The K ranges of one tile are consecutive items.
struct WsItem {
  int m, n, ks, kt0, kt1;
};
__device__ __forceinline__ WsItem ws_item(int t, int num_m, int n_tiles, int splits, int KT) {
  WsItem it;
  ws_tile(t / splits, num_m, n_tiles, it.m, it.n);
  it.ks = t % splits;
  it.kt0 = it.ks * KT / splits;
  it.kt1 = (it.ks + 1) * KT / splits;
  return it;
}
struct WsNoTail {
  __device__ bool operator()(const WsItem&) const { return false; }
};

// The tile shapes of the WS kernels: kWgs consumer warpgroups of 64 rows each (all 256 columns) over
// M tiles of 64 kWgs rows.
//   WsShape<2>: 128 x 256 (the default); a producer warp; 288 threads, at most 168 registers each.
//   WsShape<3>: 192 x 256 (the fp8 per-row gemms, fused_moe_sm90_grouped_fp8_row_m192): an expert of
//               129..192 rows in one M tile, so its weights pass through the SMs once, not twice, for
//               the same padded MMA work (3 x 64 rows against 2 x 128). A producer warpgroup gives its
//               registers to the consumers (setmaxnreg: 3 x 128 x 160 + 128 x 24 = 65536); 3 stages
//               of 56 KiB; each k32 step in two m64n128 wgmma (ws_consume_tile's kPairs).
template <int kWgs_>
struct WsShape {
  static_assert(kWgs_ == 2 || kWgs_ == 3, "128- or 192-row tiles");
  static constexpr int kWgs = kWgs_;
  static constexpr int kBM = 64 * kWgs;
  static constexpr int kConsumerWarps = 4 * kWgs;
  static constexpr bool kProducerWg = kWgs == 3;
  static constexpr bool kPairs = kWgs == 3;  // ws_consume_tile's m64n128 pairs (fp8)
  static constexpr int kThreads = 32 * kConsumerWarps + (kProducerWg ? 128 : 32);
  static constexpr int kProducerRegs = 24, kConsumerRegs = 160;
  static_assert(!kProducerWg || 32 * kConsumerWarps * kConsumerRegs + 128 * kProducerRegs <= 65536,
                "the register file of one SM");
  static constexpr uint32_t kABytes = uint32_t(kBM) * kBK * 2;
  static constexpr int kStages = kWgs == 2 ? kWsStages : 3;
  using Smem = WsSmemT<kStages, kABytes + 2 * kWsBHalfBytes, kABytes>;
  using Ring = WsRingT<kStages>;
};
static_assert(std::is_same_v<WsShape<2>::Smem, WsSmem> && WsShape<2>::kThreads == kWsThreads, "one formula");

// The persistent schedule shared by the WS kernels over num_m x n_tiles x splits items: lane 0 of
// the producer loads each item's K slices (boxes(it, row0, b0, b1) gives the A first row and the two
// B box rows), the Shape::kWgs consumer warpgroups multiply (WgmmaOp<TT>, `slice` elements per
// 128-byte K slice) and call epi(it, acc). The producer returns early; no CTA-wide barrier may follow.
// Which items a CTA runs: with a counter (zeroed by the routing kernel), item b, then the next
// unclaimed one (gridDim.x + atomicAdd(counter, 1)), which keeps the items in about list order (the M
// tiles of one expert stay neighbours in time and share B in L2) and the SMs evenly loaded; with none
// (counter == nullptr: the bf16 / f16 gemms where fused_moe_sm90_grouped_ws_dynamic says so,
// fused_moe_heuristic.h), the static order b, b + gridDim.x, ... The producer tells the consumers
// each item (and its tail bit) through words (kStages words of shared memory: the word of the stage
// of the item's first K slice); kWsNoItem ends their loop.
// kTail (fp8, 128 x 256 only): items with is_tail(it) (the producer asks) run as tail tiles
// (ws_consume_tail) and the epilogue is epi(it, acc, tail). A tail item costs half a full one, so
// those gemms take the counter.
constexpr uint32_t kWsTailBit = 1u << 31, kWsNoItem = ~0u;
template <class TT, class Shape = WsShape<2>, WsTail kTail = WsTail::none, class Boxes, class Epi,
          class IsTail = WsNoTail>
__device__ __forceinline__ void ws_run(const typename Shape::Smem& sm, const CUtensorMap* ma, const CUtensorMap* mb,
                                       int num_m, int n_tiles, int splits, int KT, int slice, Boxes boxes, Epi epi,
                                       uint32_t* words, int* counter, IsTail is_tail = {}) {
  static_assert(kTail == WsTail::none || (Shape::kWgs == 2 && std::is_same_v<TT, __nv_fp8_e4m3>),
                "tail tiles: fp8 128 x 256 only");
  const int warp = threadIdx.x >> 5;
  const int total = num_m * n_tiles * splits;
  typename Shape::Ring ring;
  if (Shape::kProducerWg ? warp >= Shape::kConsumerWarps : warp == Shape::kConsumerWarps) {  // producer
    if constexpr (Shape::kProducerWg) {
      setmaxnreg_dec<Shape::kProducerRegs>();
      if (warp != Shape::kConsumerWarps) return;
    }
    if (threadIdx.x % 32 != 0) return;
    for (int t = blockIdx.x; t < total;) {
      // Used after this item's loads; no counter: the static order (CTA b: items b + i gridDim.x).
      const int next = counter ? int(gridDim.x) + atomicAdd(counter, 1) : t + int(gridDim.x);
      const WsItem it = ws_item(t, num_m, n_tiles, splits, KT);
      int row0, b0, b1;
      boxes(it, row0, b0, b1);
      ws_produce_tile(sm, ring, ma, mb, row0, b0, b1, it.kt0, it.kt1, slice, words,
                      uint32_t(t) | (is_tail(it) ? kWsTailBit : 0u));
      t = next;
    }
    mbar_wait(sm.empty(ring.s), ring.phase ^ 1u);
    words[ring.s] = kWsNoItem;
    mbar_arrive(sm.full(ring.s));
    return;
  }
  if constexpr (Shape::kProducerWg) setmaxnreg_inc<Shape::kConsumerRegs>();
  // The warpgroup index broadcast from lane 0 (E120) where there are no tail tiles; with them, ptxas
  // serialized the gate/up wgmma of the per-row fp8 gemm1 (C7511, E126).
  const int wg = kTail == WsTail::none ? warpgroup_index() : warp >> 2;
  while (true) {
    mbar_wait(sm.full(ring.s), ring.phase);  // the item's first stage: its word is set
    // Read by the lane that later releases the stage (its arrive orders the read before the
    // producer's next write of the word), then broadcast.
    uint32_t f = 0;
    if ((threadIdx.x & 31) == 0) f = *static_cast<volatile uint32_t*>(words + ring.s);
    f = __shfl_sync(~0u, f, 0);
    if (f == kWsNoItem) break;
    const WsItem it = ws_item(int(f & ~kWsTailBit), num_m, n_tiles, splits, KT);
    AccW acc;
    if constexpr (kTail == WsTail::none) {
      ws_consume_tile<TT, Shape::kPairs>(sm, ring, wg, it.kt1 - it.kt0, acc);
      epi(it, acc);
    } else {
      const bool tail = (f & kWsTailBit) != 0;
      if (tail) {
        ws_consume_tail<kTail>(sm, ring, wg, it.kt1 - it.kt0, acc);
      } else {
        ws_consume_tile<TT, Shape::kPairs>(sm, ring, wg, it.kt1 - it.kt0, acc);
      }
      epi(it, acc, tail);
    }
  }
}

// ---------------------------------------------------------------- host side of the WS kernels
// Launches a persistent WS kernel on `grid` CTAs: _cfg with `threads` threads and `bytes` of dynamic
// shared memory, _extra with kWsThreads and kWsSmemBytes + extra_smem; errors name `what`.
template <class... P, class... A>
inline Status launch_ws_kernel_cfg(void (*fn)(P...), unsigned grid, int threads, int bytes, cudaStream_t s,
                                   const char* what, A&&... args) {
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what));
  fn<<<grid, threads, bytes, s>>>(std::forward<A>(args)...);
  return last_launch(what);
}
// As launch_ws_kernel_cfg, with programmatic dependent launch (launch_pdl): the kernel must call
// wait_for_predecessor() before its first global read or write (the fp8 gemms: right after
// ws_setup, whose barrier init and descriptor prefetch then overlap the predecessor's tail).
template <class... P, class... A>
inline Status launch_ws_kernel_pdl(void (*fn)(P...), unsigned grid, int threads, int bytes, cudaStream_t s,
                                   const char* what, A&&... args) {
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what));
  return launch_pdl(fn, dim3(grid), dim3(unsigned(threads)), size_t(bytes), s, what, std::forward<A>(args)...);
}
template <class... P, class... A>
inline Status launch_ws_kernel_extra(void (*fn)(P...), unsigned grid, int extra_smem, cudaStream_t s, const char* what,
                                     A&&... args) {
  return launch_ws_kernel_cfg(fn, grid, kWsThreads, kWsSmemBytes + extra_smem, s, what, std::forward<A>(args)...);
}
template <class... P, class... A>
inline Status launch_ws_kernel(void (*fn)(P...), unsigned grid, cudaStream_t s, const char* what, A&&... args) {
  return launch_ws_kernel_extra(fn, grid, 0, s, what, std::forward<A>(args)...);
}

// f(g1u1, act) instantiated for the runtime (activation, g1u1): g1u1 is std::bool_constant, act an
// integral_constant of Activation, so f can name a kernel template instance; returns what f returns.
template <class F>
inline auto pick_gemm1(Activation a, bool g1u1, F f) {
  auto by = [&](auto act) { return g1u1 ? f(std::true_type{}, act) : f(std::false_type{}, act); };
  switch (a) {
    case Activation::gelu: return by(std::integral_constant<Activation, Activation::gelu>{});
    case Activation::gelu_tanh: return by(std::integral_constant<Activation, Activation::gelu_tanh>{});
    case Activation::silu: break;
  }
  return by(std::integral_constant<Activation, Activation::silu>{});
}

}  // namespace moekit::cuda::grouped
