// The fp8 TMA stage ring of the grouped QGMMA kernels with 128-code K slices and 64-row B boxes:
// the block-scaled gemms (fused_moe_sm90_grouped_fp8_block_tma.cuh: 128 x 128 and 64 x 256 tiles)
// and the per-row 64 x 256 gemms (fused_moe_sm90_grouped_fp8.cu, fused_moe_sm90_grouped_fp8_row_tma64).
// Fp8Ring<kBM> is a tile shape's ring and warpgroup layout, fp8_ring_produce its producer; the
// barriers are those of src/cuda/sm90/ring.cuh (WsSmemT, WsRingT), the schedule that of
// fused_moe_sm90_grouped_tma.cuh (ws_tile).
//   kBM = 128: 128 x 128 tiles; consumer warpgroup wg takes rows 64 wg.. and all 128 columns (both
//              read the stage's two 64-row B boxes);
//   kBM = 64:  64 x 256 tiles; both warpgroups take the 64 rows, warpgroup wg the columns of B boxes
//              2 wg and 2 wg + 1 (of four): a 64-row tile reads half the padding rows of A.
//   kBM = 128, kN = 256 (Fp8Ring<128, 256>, block-scaled gemms only): 128 x 256 tiles; warpgroup wg
//              takes rows 64 wg.. and all 256 columns in two halves of 128 (B boxes 0-1, then 2-3),
//              one after the other into one partial-sum buffer (fp8_ring_consume_halves): a slice
//              loads 48 KiB for twice the MMA work of a 128 x 128 slice's 32 KiB.
// Tests: tests/test_fused_moe_sm90_grouped_fp8_block.cpp, tests/test_fused_moe_sm90_grouped_fp8.cpp.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/device_facts.h"
#include "cuda/tensor_map.h"
#include "moekit/ops/fused_moe.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_tma.cuh"

namespace moekit::cuda::grouped {

constexpr int kFp8Slice = 128;                  // codes per K slice (128 bytes: one swizzle row)
constexpr uint32_t kFp8BoxBytes = 64 * kFp8Slice;  // one 64-row B box of a slice
// Two consumer warpgroups and a producer warpgroup (one lane of it issues the TMA loads).
// setmaxnreg moves registers from the producer (kFp8RingProducerRegs) to the consumers
// (kFp8RingConsumerRegs; a consumer holds its promoted sums and two partial-sum buffers,
// fp8_ring_consume_promoted), in fp8_ring_run.
constexpr int kFp8RingThreads = 32 * kWsConsumerWarps + 128;
constexpr int kFp8RingProducerRegs = 40, kFp8RingConsumerRegs = 232;
static_assert(32 * kWsConsumerWarps * kFp8RingConsumerRegs + 128 * kFp8RingProducerRegs <= 65536,
              "the register file of one SM");
// The stage ring of a tile shape: kBM = 128: 7 stages of 32 KiB (A 128 x 128 codes + two 64-row B
// boxes), in the shared memory that holds 4 of the 48 KiB stages of the 128 x 256 kernels; kBM = 64:
// 5 stages of 40 KiB (A 64 x 128 + four B boxes).
// NOTE: a slice of a 128 x 128 tile is half the MMA work of a 128 x 256 one, and each consumer
// warpgroup holds two stages (double-buffered partial sums): with the 48 KiB ring's 4 stages the
// producer ran only 2 slices ahead of the consumers, less than a TMA load's latency under load
// (docs/experiments.md E68).
template <int kBM>
constexpr int kFp8RingN = kBM == 128 ? 128 : 256;  // a tile shape's default columns
template <int kBM, int kN = kFp8RingN<kBM>>
struct Fp8Ring {
  static_assert(kBM == 128 || kBM == 64, "128- or 64-row tiles");
  static_assert(kN == kFp8RingN<kBM> || (kBM == 128 && kN == 256), "128 x 128, 64 x 256 or 128 x 256 tiles");
  static constexpr bool kHalves = kBM == 128 && kN == 256;             // fp8_ring_consume_halves
  static constexpr int kBoxes = kN / 64;                                // 64-row B boxes per stage
  static constexpr uint32_t kABytes = uint32_t(kBM) * kFp8Slice;          // A: kBM rows of 128 codes
  static constexpr uint32_t kStageBytes = kABytes + kBoxes * kFp8BoxBytes;
  static constexpr int kStages = kBM == 64 ? 5 : (kN == 128 ? 7 : 4);
  using Smem = WsSmemT<kStages, kStageBytes, kABytes>;
  using Ring = WsRingT<kStages>;
  static constexpr int kSmemBytes = ws_smem_bytes<Smem>();
  static_assert(kSmemBytes <= kSm90SmemOptinBytes, "fits the sm_90 shared memory of one CTA");
  static constexpr int kNCols = kN;  // output columns of a tile
  // Warpgroup wg's first A row and B byte offset in a stage.
  __device__ __forceinline__ static uint32_t a_off(int wg) { return kBM == 128 ? uint32_t(wg) * 64 * kFp8Slice : 0u; }
  __device__ __forceinline__ static uint32_t b_off(int wg) { return kBM == 128 ? 0u : uint32_t(wg) * 2 * kFp8BoxBytes; }
  // A consumer thread's first tile row (rows r and r + 8 are its accumulator rows).
  __device__ __forceinline__ static int row_of(int warp, int lane) {
    return (kBM == 128 ? warp : warp & 3) * 16 + (lane >> 2);
  }
};

// Consumer warpgroup wg of an Fp8Ring<kBM> tile (its 64 rows and 128 columns: A rows a_off(wg), B
// boxes b_off(wg)): each of the KT slices' wgmma m64n128k32 partial sums, in one of two buffers,
// handed to fold(cur, buf, kt) (buf: std::integral_constant 0 or 1, the buffer; kt: the slice) once
// its group retired and its stage went back to the producer. fold promotes them into the caller's
// f32 accumulators (times the slice's scales for the block-scaled gemms).
// Two buffers: slice kt + 1's group is issued into one before slice kt's partial sums in the other
// are folded, so the tensor cores work while this warpgroup promotes (2 x 64 accumulators; the
// caller's own 64: the consumers' 232 registers of kFp8RingThreads, setmaxnreg).
// NOTE: sm_90's e4m3 wgmma keeps fewer accumulator bits than f32 (the DeepSeek-V3 report; DeepGEMM
// and CUTLASS's non-"FastAccum" fp8 kernels promote for the same reason): summed over all of a long
// K in the tensor cores, outputs fall outside the kernel-vs-reference bound; promoted every slice,
// none do (E42; FusedMoeSm90GroupedFp8Tma64.LongGateUpK).
// NOTE: with one buffer the warpgroup waited for every slice's group and then promoted with the
// tensor cores idle but for the other warpgroup's group, well behind the per-row kernel (E67).
template <int kBM, class Fold>
__device__ __forceinline__ void fp8_ring_consume_promoted(const typename Fp8Ring<kBM>::Smem& sm,
                                                          typename Fp8Ring<kBM>::Ring& ring, int wg, int KT, Fold fold) {
  using Zero = std::integral_constant<int, 0>;
  using One = std::integral_constant<int, 1>;
  const bool leader = (threadIdx.x & 31) == 0;
  const uint32_t a_off = Fp8Ring<kBM>::a_off(wg), b_off = Fp8Ring<kBM>::b_off(wg);
  // Not initialised: each group's first wgmma ignores them (scale-d 0). NOTE: zeroing them let the
  // compiler share one zero register between an operand of the first group and later copies, which
  // read it while the group was in flight (ptxas then serializes with an injected wait).
  float ta[16][4], tb[16][4];
  // Issues the next slice's wgmma group (the ring's current stage) into t; returns its stage.
  auto issue = [&](float (&t)[16][4]) {
    const int st = ring.s;
    mbar_wait(sm.full(st), ring.phase);
    const uint64_t da = wgmma_desc_sw128(sm.a(st) + a_off);
    const uint64_t db = wgmma_desc_sw128(sm.b(st) + b_off);
    fence_regs(t);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) wgmma_fp8_n128(t, da + uint64_t(2 * ks), db + uint64_t(2 * ks), ks > 0);
    wgmma_commit();  // t stays untouched until the wait that retires this group (fence_regs there)
    ring.next();
    return st;
  };
  // The group of t (stage st) retired: the stage goes back to the producer, then t is folded.
  auto retire = [&](float (&t)[16][4], int st, auto buf, int kt) {
    fence_regs(t);
    if (leader) mbar_arrive(sm.empty(st));
    fold(t, buf, kt);
  };
  // NOTE: every exit of the loop follows a wait<0>, and at its head exactly ta's group is pending:
  // ptxas tracks the groups per path and otherwise injects waits that serialize the wgmma.
  int kt = 0, sa = issue(ta), sb = 0;
  while (true) {
    if (kt + 1 >= KT) {
      wgmma_wait<0>();
      retire(ta, sa, Zero{}, kt);
      break;
    }
    sb = issue(tb);
    wgmma_wait<1>();  // ta's group (the older one) retired
    retire(ta, sa, Zero{}, kt);
    ++kt;
    if (kt + 1 >= KT) {
      wgmma_wait<0>();
      retire(tb, sb, One{}, kt);
      break;
    }
    sa = issue(ta);
    wgmma_wait<1>();
    retire(tb, sb, One{}, kt);
    ++kt;
  }
}

// Consumer warpgroup wg of an Fp8Ring<128, 256> tile (its 64 rows, A rows a_off(wg), and the 256
// columns): per K slice, the wgmma m64n128k32 partial sums of columns 0..127 (B boxes 0-1), then of
// 128..255 (boxes 2-3), each in the one buffer and handed to fold(cur, half, kt) (half:
// std::integral_constant 0 or 1) once its group retired; the stage goes back to the producer after
// the second; ahead(kt) runs while slice kt's second group is in flight (the caller's loads for a
// later slice, E113). A warpgroup's folds leave the tensor cores to the other warpgroup's group: one
// buffer (64) and the caller's two halves of f32 sums (128) fit the consumers' 232 registers, where
// two buffers would not.
// NOTE: the tensor pipe idles in each warpgroup's drain and fold while shared memory, L2 and DRAM
// are far from their limits (E83). Measured no faster: quarter groups into two 32-register buffers
// (E76); the two warpgroups' groups issued in turn through named barriers (E77); two-CTA clusters
// with the B boxes multicast (E75); A from registers, wgmma RS (E78); the next slice's full wait and
// descriptors taken while the second group runs (E114).
template <int kBM, int kN, class Fold, class Ahead>
__device__ __forceinline__ void fp8_ring_consume_halves(const typename Fp8Ring<kBM, kN>::Smem& sm,
                                                        typename Fp8Ring<kBM, kN>::Ring& ring, int wg, int KT,
                                                        Fold fold, Ahead ahead) {
  static_assert(Fp8Ring<kBM, kN>::kHalves, "128 x 256 tiles");
  const bool leader = (threadIdx.x & 31) == 0;
  const uint32_t a_off = Fp8Ring<kBM, kN>::a_off(wg);
  float t[16][4];  // not initialised: each group's first wgmma ignores it (scale-d 0)
  auto issue = [&](uint64_t da, uint64_t db) {
    fence_regs(t);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) wgmma_fp8_n128(t, da + uint64_t(2 * ks), db + uint64_t(2 * ks), ks > 0);
    wgmma_commit();
  };
  auto retire = [&] {
    wgmma_wait<0>();
    fence_regs(t);
  };
  for (int kt = 0; kt < KT; ++kt) {
    const int st = ring.s;
    mbar_wait(sm.full(st), ring.phase);
    const uint64_t da = wgmma_desc_sw128(sm.a(st) + a_off);
    issue(da, wgmma_desc_sw128(sm.b(st)));
    retire();
    fold(t, std::integral_constant<int, 0>{}, kt);
    issue(da, wgmma_desc_sw128(sm.b(st) + 2 * kFp8BoxBytes));
    ahead(kt);  // while the second group runs
    retire();
    if (leader) mbar_arrive(sm.empty(st));
    ring.next();
    fold(t, std::integral_constant<int, 1>{}, kt);
  }
}

// Work item t of a persistent schedule over num_m x n_tiles tiles, each in `splits` K ranges of
// the KT slices (range sp: slices kt0 .. kt0 + kn - 1, balanced to within one slice); the ranges
// of a tile are num_m x n_tiles items apart, so they run on different CTAs.
struct SplitTile {
  int m, n, sp, kt0, kn;
};
__device__ __forceinline__ SplitTile split_tile(int t, int num_m, int n_tiles, int splits, int KT) {
  const int per = num_m * n_tiles, sp = t / per;
  SplitTile r;
  ws_tile(t - sp * per, num_m, n_tiles, r.m, r.n);
  r.sp = sp;
  r.kt0 = sp * KT / splits;
  r.kn = (sp + 1) * KT / splits - r.kt0;
  return r;
}

// Producer (one thread): K slices kt0 .. kt0 + KT - 1 of A rows [row0, row0 + kBM) and of the
// 64-row B boxes at rows b_rows[0 .. kBoxes), for one tile (or one K range of it).
template <int kBM, int kN = kFp8RingN<kBM>>
__device__ __forceinline__ void fp8_ring_produce(const typename Fp8Ring<kBM, kN>::Smem& sm,
                                                 typename Fp8Ring<kBM, kN>::Ring& ring, const CUtensorMap* ma,
                                                 const CUtensorMap* mb, int row0,
                                                 const int (&b_rows)[Fp8Ring<kBM, kN>::kBoxes], int KT, int kt0 = 0) {
  using C = Fp8Ring<kBM, kN>;
  for (int kt = kt0; kt < kt0 + KT; ++kt) {
    mbar_wait(sm.empty(ring.s), ring.phase ^ 1u);
    const uint32_t full = sm.full(ring.s);
    mbar_arrive_expect_tx(full, C::kStageBytes);
    tma_load_2d(sm.a(ring.s), ma, kt * kFp8Slice, row0, full);
#pragma unroll
    for (int b = 0; b < C::kBoxes; ++b) tma_load_2d(sm.b(ring.s) + b * kFp8BoxBytes, mb, kt * kFp8Slice, b_rows[b], full);
    ring.next();
  }
}

// The B box rows of a gemm1 N tile of expert e (n1 rows per expert in w1) whose gate columns start at
// i0: g1u1 gate, up, gate, up (64 columns each: kBoxes = 2 gives one gate and one up box), g1u0
// consecutive.
template <int kBoxes, bool G1U1>
__device__ __forceinline__ void fp8_gemm1_box_rows(int e, int n1, int I, int i0, int (&b)[kBoxes]) {
#pragma unroll
  for (int k = 0; k < kBoxes; ++k) b[k] = e * n1 + (G1U1 ? (k % 2) * I + (k / 2) * 64 + i0 : i0 + 64 * k);
}
// The B box rows of a gemm2 N tile of expert e starting at row h0 of its H rows in w2.
template <int kBoxes>
__device__ __forceinline__ void fp8_gemm2_box_rows(int e, int H, int h0, int (&b)[kBoxes]) {
#pragma unroll
  for (int k = 0; k < kBoxes; ++k) b[k] = e * H + h0 + 64 * k;
}

// The persistent schedule of the Fp8Ring<kBM> gemms over num_m x n_tiles tiles, each in `splits` K
// ranges of the KT slices (split_tile): boxes(m, n, row0, b_rows) -> the A first row and the kBoxes B
// box rows for the producer; tile(w, wg, ring) consumes work item w as consumer warpgroup wg.
// setmaxnreg moves registers from the producer warpgroup to the consumers (their two partial-sum
// buffers, fp8_ring_consume_promoted). The producer returns early; no CTA-wide barrier may follow.
template <int kBM, int kN = kFp8RingN<kBM>, class Boxes, class Tile>
__device__ __forceinline__ void fp8_ring_run(const typename Fp8Ring<kBM, kN>::Smem& sm, const CUtensorMap* ma,
                                             const CUtensorMap* mb, int num_m, int n_tiles, int KT, int splits,
                                             Boxes boxes, Tile tile) {
  using C = Fp8Ring<kBM, kN>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int total = num_m * n_tiles * splits;
  typename C::Ring ring;
  if (warp >= kWsConsumerWarps) {  // the producer warpgroup: one lane of its first warp
    setmaxnreg_dec<kFp8RingProducerRegs>();
    if (warp != kWsConsumerWarps || lane != 0) return;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
      const SplitTile w = split_tile(t, num_m, n_tiles, splits, KT);
      int row0, b_rows[C::kBoxes];
      boxes(w.m, w.n, row0, b_rows);
      fp8_ring_produce<kBM, kN>(sm, ring, ma, mb, row0, b_rows, w.kn, w.kt0);
    }
    return;
  }
  setmaxnreg_inc<kFp8RingConsumerRegs>();
  const int wg = warpgroup_index();
  for (int t = blockIdx.x; t < total; t += gridDim.x) {
    const SplitTile w = split_tile(t, num_m, n_tiles, splits, KT);
    tile(w, wg, ring);
  }
}

// The four TMA maps of the fp8 gemms, over one-byte codes: the A operands xq [tk, H] and aq [tk, I]
// in boxes of a_rows rows, the B operands w1 [E * N1, H] and w2 [E * H, I] in boxes of b_rows rows.
// Errors name `what` and the operand.
struct Fp8GemmMaps {
  CUtensorMap ma1, mb1, ma2, mb2;
};
inline Status encode_fp8_gemm_maps(const FusedMoeParams& p, int64_t tk, const void* xq, const void* aq,
                                   uint32_t a_rows, uint32_t b_rows, const char* what, Fp8GemmMaps* m) {
  const MoeDims d = moe_dims(p);
  constexpr CUtensorMapDataType kU8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const std::string w = what;
  const uint64_t T = uint64_t(tk), H = uint64_t(d.H), I = uint64_t(d.I);
  MOEKIT_RETURN_IF_ERROR(encode_tensor_map_2d(&m->ma1, xq, kU8, 1, T, H, H, a_rows, (w + " xq").c_str()));
  MOEKIT_RETURN_IF_ERROR(
      encode_tensor_map_2d(&m->mb1, p.w1.data, kU8, 1, uint64_t(d.E * d.N1), H, H, b_rows, (w + " w1").c_str()));
  MOEKIT_RETURN_IF_ERROR(encode_tensor_map_2d(&m->ma2, aq, kU8, 1, T, I, I, a_rows, (w + " aq").c_str()));
  return encode_tensor_map_2d(&m->mb2, p.w2.data, kU8, 1, uint64_t(d.E * d.H), I, I, b_rows, (w + " w2").c_str());
}

}  // namespace moekit::cuda::grouped
