// The tensor-core mainloop of fused_moe_sm90_grouped (SPEC 3.1): one BM x 256 output tile of
// C = A . B^T with A [rows, K] and B [N, K] both K-contiguous bf16 / f16, f32 accumulation.
//
// mma.sync.aligned.m16n8k16 (HMMA) fed by ldmatrix from a 4-stage cp.async pipeline over 64-wide K
// slices. 8 warps; every warp owns 64 rows (4 m16 tiles) and the columns its (warp) index gives:
//   Tile<128>: 2 (M) x 4 (N) warps, 64 x 64 per warp (4 x 8 mma tiles, 128 f32 accumulators),
//   Tile<64> : 1 (M) x 8 (N) warps, 64 x 32 per warp (4 x 4 mma tiles,  64 f32 accumulators).
// NOTE: the N tile is 256 wide for both so each k16 step issues 8 (resp. 6) ldmatrix.x4 for 32
// (resp. 16) HMMA per warp: shared-memory bandwidth, not the tensor pipe, bounds mma.sync on
// Hopper, so the MMA-per-ldmatrix ratio is what the tile shape buys. BM = 64 halves the padding
// waste of experts with few rows (see choose_tile_m in fused_moe_sm90_grouped.cu).
// The caller decides WHICH rows: it hands the mainloop one source pointer per A row this thread
// loads (the gather of x rows by token lives in the caller), the B rows, and where the warp's
// 16-column groups of B start (`nbase0`, `kSplit`: the g/u column pairing of GEMM 1).
// This mma.sync mainloop serves BM 64; the 128-row tiles run the TMA + wgmma kernels
// (fused_moe_sm90_grouped_tma.cuh).
//
// Shared memory: per stage A BM x 64 and B 256 x 64 elements, rows of 128 bytes whose eight
// 16-byte chunks are XOR-swizzled by (row & 7), so ldmatrix reads are conflict-free. Fragments of
// the next k16 step (also across stages) are loaded (ldmatrix) before the HMMAs of the current one
// are issued (register double buffering), so the tensor pipe does not wait on shared-memory
// latency with only 2 warps per scheduler.
// Resources (ptxas, nvcc 13.0, sm_90a): BM 128 gemm1 238-240 / gemm2 255 registers, BM 64
// 162-184, no spills; 1 CTA (8 warps) per SM.
// Requirements: K % 8 == 0 (16-byte chunks), every source row 16-byte aligned. Rows a caller marks
// invalid, and the chunks of the last K slice past K, are zero-filled (cp.async src-size 0) and
// never read from global memory.
// Tests: tests/test_fused_moe_sm90_grouped.cpp (suite FusedMoeSm90Grouped).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/device_facts.h"
#include "cuda/sm90/smem.cuh"

namespace moekit::cuda::grouped {

constexpr int kBN = 256;      // columns of an output tile (B rows)
constexpr int kBK = 64;       // K slice per pipeline stage
constexpr int kStages = 4;    // cp.async pipeline depth
constexpr int kThreads = 256; // 8 warps
constexpr int kWarpRows = 64; // rows of C per warp (4 m16 tiles)

// Compile-time facts of a BM x 256 tile (BM = 64 or 128).
template <int BM>
struct Tile {
  static_assert(BM == 64 || BM == 128, "BM is 64 or 128");
  static constexpr int kBM = BM;
  static constexpr int kWM = BM / kWarpRows;              // warps along M: 1 or 2
  static constexpr int kWN = (kThreads / 32) / kWM;       // warps along N: 8 or 4
  static constexpr int kWarpCols = kBN / kWN;             // 32 or 64
  static constexpr int kNT = kWarpCols / 8;               // n8 mma tiles per warp: 4 or 8
  static constexpr int kNG = kNT / 2;                     // 16-column groups per warp: 2 or 4
  static constexpr int kLoadsA = BM * (kBK / 8) / kThreads;   // 16-byte chunks of A per thread
  static constexpr int kLoadsB = kBN * (kBK / 8) / kThreads;  // ... of B: 8
  static constexpr int kStageElems = (BM + kBN) * kBK;
  static constexpr int kSmemBytes = kStages * kStageElems * 2;  // 160 KiB (64) / 192 KiB (128)
  static_assert(kLoadsA * kThreads == BM * kBK / 8, "whole A tile per stage");
  static_assert(kLoadsB * kThreads == kBN * kBK / 8, "whole B tile per stage");
  static_assert(kSmemBytes + 2 * BM * 4 <= kSm90SmemOptinBytes, "fits the sm_90 shared memory of one CTA");
};

// ---------------------------------------------------------------- PTX wrappers
using sm90::smem_addr;

// 16-byte global -> shared copy; zero-fills the destination when !valid (reads nothing then).
// NOTE: .L2::256B lets the L2 fetch the 256-byte sector pair around each copy: the next stage's 128
// bytes of the same weight row (a K slice is 128 bytes of a row) come from L2, not a second DRAM
// burst (docs/experiments.md E30).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <class TT>
struct MmaOp;
template <>
struct MmaOp<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct MmaOp<__half> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// Byte offset of (row, col) in a swizzled [rows][64] tile (col a multiple of 8 for 16-byte access).
__device__ __forceinline__ uint32_t swz_bytes(int row, int col) {
  return uint32_t(row * (kBK * 2) + ((((col >> 3) ^ (row & 7))) << 4) + (col & 7) * 2);
}

// Per-thread loader state. A: the rows this thread copies (row (tid >> 3) + 32 i, 16-byte chunk
// tid & 7) as row indices into a_base (gathered rows), -1 = invalid. B: rows (tid >> 3) + 32 i
// are two runs of equally spaced rows, i < kLoadsB / 2 from b_run[0] and the rest from b_run[1],
// b_step elements apart (GEMM 1 g1u1: the gate and the up half of the N tile); bit i of b_ok says
// row i is valid. Invalid chunks are zero-filled from a_base (read nothing).
// NOTE: rows are computed per stage, not stored as 12 pointers, to leave the registers to the
// 64 x 64 warp tile (128 accumulators + double-buffered fragments) without spilling.
template <class TT, int BM>
struct TileSources {
  const TT* a_base;
  int64_t a_ld;                   // elements between A rows
  int a_row[Tile<BM>::kLoadsA];
  const TT* b_run[2];
  int64_t b_step;
  uint32_t b_ok;
};
__device__ __forceinline__ int loader_row(int tid, int i) { return (tid >> 3) + i * (kThreads / 8); }

// Accumulators of one warp: 4 m16 tiles x NT n8 tiles x 4 floats. Element q of v[mi][j] is row
// wm*64 + mi*16 + (lane >> 2) + 8*(q >> 1) and column ncol(j) + 2*(lane & 3) + (q & 1), where
// ncol(j) = (first B row of 16-column group j >> 1, see mainloop) + 8*(j & 1).
template <int NT>
struct Acc {
  float v[4][NT][4];
};

// Calls f(mi, h, rl) for each accumulator row of this lane below nrows: rl = mi * 16 + lane / 4 +
// 8 h (elements 2 h and 2 h + 1 of v[mi][j]), the rows an epilogue writes.
template <class F>
__device__ __forceinline__ void for_lane_rows(int lane, int nrows, F&& f) {
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rl = mi * 16 + (lane >> 2) + 8 * h;
      if (rl < nrows) f(mi, h, rl);
    }
  }
}

// The K slice from k0 into `stage`; chunks at or past K (a last, partial slice) are zero-filled.
template <class TT, int BM>
__device__ __forceinline__ void load_stage(uint32_t stage, const TileSources<TT, BM>& src, int k0, int K, int tid,
                                           int64_t b_off = 0) {
  using Tl = Tile<BM>;
  const int ch = tid & 7;
  const bool in_k = k0 + ch * 8 < K;
  const uint32_t sb = stage + Tl::kBM * kBK * 2;
#pragma unroll
  for (int i = 0; i < Tl::kLoadsA; ++i) {
    const bool ok = in_k && src.a_row[i] >= 0;
    const TT* row = ok ? src.a_base + int64_t(src.a_row[i]) * src.a_ld + k0 : src.a_base;
    cp_async_16(stage + swz_bytes(loader_row(tid, i), ch * 8), row + ch * 8, ok);
  }
#pragma unroll
  for (int i = 0; i < Tl::kLoadsB; ++i) {
    constexpr int kHalf = Tl::kLoadsB / 2;
    const bool ok = in_k && ((src.b_ok >> i) & 1u);
    const TT* row = ok ? src.b_run[i / kHalf] + (i % kHalf) * src.b_step + b_off + k0 : src.a_base;
    cp_async_16(sb + swz_bytes(loader_row(tid, i), ch * 8), row + ch * 8, ok);
  }
}

// Fragments of one k16 step for one warp: 4 A m16 tiles, NT B n8 tiles.
template <int NT>
struct Frags {
  uint32_t a[4][4];
  uint32_t b[NT][2];
};

// This lane's ldmatrix addresses, without the stage base and the k16 step: the byte offset of its
// A row (wrow + (lane & 15)) and B row (nbase0 + (lane & 7) + 8 (lane >> 4)), and the pieces of the
// XOR swizzle. Every row a lane addresses is congruent to lane mod 8 (tiles of 16 rows), so the
// swizzled chunk of k16 step ks is ((2 ks + c) ^ (lane & 7)) with c the lane's 8-column half.
struct LaneAddr {
  uint32_t a_row, b_row;
  int l7, ca, cb;
};

// ldmatrix of k16 step ks of the stage at shared address sa (A) / sb (B). B 16-column group g
// starts at row nbase0 + 16 (g % (NG / 2)) + kSplit (g / (NG / 2)); all offsets but the swizzle
// are compile-time immediates.
template <int NG, int kSplit, int MA>
__device__ __forceinline__ void load_frags(Frags<2 * NG>& f, uint32_t sa, uint32_t sb, const LaneAddr& la, int ks) {
  const uint32_t a = sa + la.a_row + uint32_t(((2 * ks + la.ca) ^ la.l7) << 4);
#pragma unroll
  for (int mi = 0; mi < MA; ++mi) ldmatrix_x4(f.a[mi], a + mi * 16 * kBK * 2);
  const uint32_t b = sb + la.b_row + uint32_t(((2 * ks + la.cb) ^ la.l7) << 4);
#pragma unroll
  for (int p = 0; p < NG; ++p) {
    constexpr int kHalf = NG / 2;
    uint32_t r[4];
    ldmatrix_x4(r, b + ((p % kHalf) * 16 + (p / kHalf) * kSplit) * kBK * 2);
    f.b[2 * p][0] = r[0];
    f.b[2 * p][1] = r[1];
    f.b[2 * p + 1][0] = r[2];
    f.b[2 * p + 1][1] = r[3];
  }
}

// What the mainloop does after the MMAs of each K slice (the stage of kBK elements): nothing
// (NoSliceHook), or, for block-scaled fp8, a hook whose slice<MA>(kt, acc) promotes the slice's
// partial sums into its own accumulators and zeroes acc (fused_moe_sm90_grouped_fp8_block.cu).
struct NoSliceHook {
  static constexpr bool kActive = false;
};

// The mainloop's cp.async pipeline depth: Hook::kStages when the hook has one, else kStages (the
// shared memory then holds that many stages of Tile<BM>::kStageElems elements).
template <class H, class = void>
struct HookStages {
  static constexpr int value = kStages;
};
template <class H>
struct HookStages<H, std::void_t<decltype(H::kStages)>> {
  static constexpr int value = H::kStages;
};

template <class TT, int NT, int MA>
__device__ __forceinline__ void mma_step(Acc<NT>& acc, const Frags<NT>& f) {
#pragma unroll
  for (int mi = 0; mi < MA; ++mi)
#pragma unroll
    for (int j = 0; j < NT; ++j) MmaOp<TT>::run(acc.v[mi][j], f.a[mi], f.b[j][0], f.b[j][1]);
}

// acc = A . B^T over K (K % 8 == 0; a last slice of fewer than 64 is zero-padded). `smem` holds
// Tile<BM>::kSmemBytes (HookStages<Hook> stages of Tile<BM>::kStageElems elements when the hook sets
// its own depth); the warp's B 16-column groups start at rows nbase0 + 16 (g % (NG / 2)) + kSplit
// (g / (NG / 2)) (kSplit = 8 NG for consecutive groups; GEMM 1 g1u1 passes kBN / 2: gate groups,
// then the matching up groups). Ends with every cp.async drained and a barrier, so the caller may
// reuse shared memory.
// MA: the m16 tiles of each warp that are multiplied (4, or fewer when the caller knows the rows
// of the others are all invalid: their accumulators stay 0).
// Hook: NoSliceHook, or a type with kActive = true and slice<MA>(kt, acc), called after the last
// MMA of K slice kt.
// NOTE: two N tiles per CTA in one pipeline (the second one's first stages loading while the
// first one's epilogue runs) measured slower than one: the overlap does not pay for halving the
// CTAs (E66).
template <class TT, int BM, int kSplit, int MA = 4, class Hook = NoSliceHook>
__device__ __forceinline__ void mainloop(void* smem, const TileSources<TT, BM>& src, int K, int nbase0,
                                         Acc<Tile<BM>::kNT>& acc, Hook& hook) {
  using Tl = Tile<BM>;
  static_assert(MA >= 1 && MA <= 4, "1 to 4 m16 tiles per warp");
  constexpr int kStageBytes = Tl::kStageElems * 2;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wrow = (warp / Tl::kWN) * kWarpRows;
  const uint32_t s0 = smem_addr(smem);
  static_assert(kSplit % 16 == 0, "B groups of 16 rows");
  LaneAddr la;
  la.a_row = uint32_t((wrow + (lane & 15)) * kBK * 2);
  la.b_row = uint32_t((nbase0 + (lane & 7) + ((lane >> 4) << 3)) * kBK * 2);
  la.l7 = lane & 7;
  la.ca = lane >> 4;
  la.cb = (lane >> 3) & 1;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int j = 0; j < Tl::kNT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc.v[mi][j][q] = 0.0f;

  const int KT = (K + kBK - 1) / kBK;
  constexpr int kStages = HookStages<Hook>::value;
  static_assert(kStages * Tl::kStageElems * 2 <= kSm90SmemOptinBytes, "the stages fit one CTA's shared memory");
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage<TT, BM>(s0 + s * kStageBytes, src, s * kBK, K, tid);
    cp_async_commit();
  }
  cp_async_wait<kStages - 2>();
  __syncthreads();  // stage 0 landed for every thread
  Frags<Tl::kNT> f[2];
  load_frags<Tl::kNG, kSplit, MA>(f[0], s0, s0 + Tl::kBM * kBK * 2, la, 0);
  for (int kt = 0; kt < KT; ++kt) {
    // Slot (kt - 1) % kStages was last read before the barrier of the previous iteration.
    const int pf = kt + kStages - 1;
    if (pf < KT) load_stage<TT, BM>(s0 + (pf % kStages) * kStageBytes, src, pf * kBK, K, tid);
    cp_async_commit();

    const uint32_t sa = s0 + (kt % kStages) * kStageBytes;
    const uint32_t sb = sa + Tl::kBM * kBK * 2;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      if (ks + 1 < kBK / 16) {
        load_frags<Tl::kNG, kSplit, MA>(f[(ks + 1) & 1], sa, sb, la, ks + 1);
      } else {
        // NOTE: the wait + barrier sits before the last k16 step (CUTLASS sm80 multistage order):
        // stage kt + 1 has landed and every warp is done with the fragments of stage kt, whose
        // last ones are already in registers, so step 0 of the next stage is loaded while the
        // HMMAs of this last step run.
        cp_async_wait<kStages - 2>();
        __syncthreads();
        if (kt + 1 < KT) {
          const uint32_t na = s0 + ((kt + 1) % kStages) * kStageBytes;
          load_frags<Tl::kNG, kSplit, MA>(f[(ks + 1) & 1], na, na + Tl::kBM * kBK * 2, la, 0);
        }
      }
      mma_step<TT, Tl::kNT, MA>(acc, f[ks & 1]);
    }
    if constexpr (Hook::kActive) hook.template slice<MA>(kt, acc);
  }
  cp_async_wait<0>();
  __syncthreads();
}

// mainloop with only the m16 tiles that hold valid rows: `rows` valid rows from the tile's first
// (all warps must agree: BM 64 has one warp row, so rows <= 16 / 32 drop 3 / 2 of the 4 m16 tiles
// of every warp). NOTE: experts with few rows (DeepSeek-V3 / Qwen3 at small T: 4-32 rows) are
// where the padded MMA work dominated; BM 128 always runs all 4 (its tiles hold >= 64 rows on
// average) so its mainloop stays one straight-line block.
template <class TT, int BM, int kSplit, class Hook = NoSliceHook>
__device__ __forceinline__ void mainloop_rows(void* smem, const TileSources<TT, BM>& src, int K, int nbase0,
                                              int rows, Acc<Tile<BM>::kNT>& acc, Hook& hook) {
  if constexpr (Tile<BM>::kWM == 1) {
    if (rows <= 16) return mainloop<TT, BM, kSplit, 1>(smem, src, K, nbase0, acc, hook);
    if (rows <= 32) return mainloop<TT, BM, kSplit, 2>(smem, src, K, nbase0, acc, hook);
  }
  mainloop<TT, BM, kSplit, 4>(smem, src, K, nbase0, acc, hook);
}
template <class TT, int BM, int kSplit>
__device__ __forceinline__ void mainloop_rows(void* smem, const TileSources<TT, BM>& src, int K, int nbase0,
                                              int rows, Acc<Tile<BM>::kNT>& acc) {
  NoSliceHook none;
  mainloop_rows<TT, BM, kSplit>(smem, src, K, nbase0, rows, acc, none);
}

}  // namespace moekit::cuda::grouped
