// The tensor-core mainloop of fused_moe_sm90_grouped (SPEC 3.1): one 128 x 128 output tile of
// C = A . B^T with A [rows, K] and B [N, K] both K-contiguous bf16 / f16, f32 accumulation.
//
// mma.sync.aligned.m16n8k16 (HMMA) fed by ldmatrix from a 4-stage cp.async pipeline over 64-wide K
// slices. 8 warps in a 2 (M) x 4 (N) grid; each warp owns 64 rows x 32 columns = 4 x 4 mma tiles
// (64 f32 accumulators per thread). The caller decides WHICH rows: it hands the mainloop one source
// pointer per A / B row this thread loads (the gather of x rows by token and the g/u column pairing
// of GEMM 1 live in the caller), plus the two 16-column groups of B each warp multiplies (`nbase`).
// NOTE: that split (gather + epilogue outside, pure K loop inside) is what lets a wgmma/TMA
// mainloop replace this one later without touching routing, epilogues or tile scheduling.
//
// Shared memory: per stage A 128 x 64 and B 128 x 64 elements (16 KiB each), rows of 128 bytes
// whose eight 16-byte chunks are XOR-swizzled by (row & 7), so ldmatrix reads are conflict-free.
// Requirements: K % 64 == 0, every source row 16-byte aligned. Rows a caller marks invalid are
// zero-filled (cp.async src-size 0) and never read from global memory.
// Tests: tests/test_fused_moe_sm90_grouped.cpp (suite FusedMoeSm90Grouped).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace moekit::cuda::grouped {

constexpr int kBM = 128;      // rows of an output tile
constexpr int kBN = 128;      // columns of an output tile (B rows)
constexpr int kBK = 64;       // K slice per pipeline stage
constexpr int kStages = 4;    // cp.async pipeline depth
constexpr int kThreads = 256; // 8 warps: 2 (M) x 4 (N)
constexpr int kLoadsPerThread = kBM * (kBK / 8) / kThreads;  // 16-byte chunks of A (and of B): 4
constexpr int kStageElems = (kBM + kBN) * kBK;
constexpr int kSmemBytes = kStages * kStageElems * 2;  // 128 KiB

static_assert(kBM == kBN, "the loader maps A and B rows the same way");
static_assert(kLoadsPerThread * kThreads == kBM * kBK / 8, "whole tile per stage");

// ---------------------------------------------------------------- PTX wrappers
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; zero-fills the destination when !valid (reads nothing then).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
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

// Element offset of (row, col) in a swizzled [128][64] tile (col a multiple of 8 for 16-byte access).
__device__ __forceinline__ int swz(int row, int col) {
  return row * kBK + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

// Per-thread loader state: the kLoadsPerThread A rows and B rows this thread copies (row
// (tid >> 3) + 32 i, 16-byte chunk tid & 7), with their validity.
template <class TT>
struct TileSources {
  const TT* a[kLoadsPerThread];
  const TT* b[kLoadsPerThread];
  bool a_ok[kLoadsPerThread];
  bool b_ok[kLoadsPerThread];
};
__device__ __forceinline__ int loader_row(int tid, int i) { return (tid >> 3) + i * (kThreads / 8); }

// Accumulators of one warp: 4 m16 tiles x 4 n8 tiles x 4 floats. Element q of acc[mi][j] is
// row wm*64 + mi*16 + (lane >> 2) + 8*(q >> 1) and column ncol(j) + 2*(lane & 3) + (q & 1), where
// ncol(j) = nbase[j >> 1] + 8*(j & 1).
struct Acc {
  float v[4][4][4];
};

template <class TT>
__device__ __forceinline__ void load_stage(TT* stage, const TileSources<TT>& src, int k0, int tid) {
  const int ch = tid & 7;
  TT* sa = stage;
  TT* sb = stage + kBM * kBK;
#pragma unroll
  for (int i = 0; i < kLoadsPerThread; ++i) {
    const int row = loader_row(tid, i);
    cp_async_16(smem_addr(sa + swz(row, ch * 8)), src.a[i] + k0 + ch * 8, src.a_ok[i]);
    cp_async_16(smem_addr(sb + swz(row, ch * 8)), src.b[i] + k0 + ch * 8, src.b_ok[i]);
  }
}

// acc = A . B^T over K (K % 64 == 0). `smem` holds kSmemBytes; nbase[2] are the first B rows of the
// warp's two 16-column groups. Ends with every cp.async drained and a barrier, so the caller may
// reuse shared memory.
template <class TT>
__device__ __forceinline__ void mainloop(TT* smem, const TileSources<TT>& src, int K, const int (&nbase)[2],
                                         Acc& acc) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2;  // 0..1: rows wm*64 .. +64
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc.v[mi][j][q] = 0.0f;

  const int KT = K / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage(smem + s * kStageElems, src, s * kBK, tid);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt-1 is no longer being read
    const int pf = kt + kStages - 1;
    if (pf < KT) load_stage(smem + (pf % kStages) * kStageElems, src, pf * kBK, tid);
    cp_async_commit();

    const TT* sa = smem + (kt % kStages) * kStageElems;
    const TT* sb = sa + kBM * kBK;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[4][4];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        const int row = wm * 64 + mi * 16 + (lane & 15);
        ldmatrix_x4(af[mi], smem_addr(sa + swz(row, kk + (lane >> 4) * 8)));
      }
      uint32_t bf[4][2];
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const int row = nbase[p] + (lane & 7) + ((lane >> 4) << 3);
        uint32_t r[4];
        ldmatrix_x4(r, smem_addr(sb + swz(row, kk + ((lane >> 3) & 1) * 8)));
        bf[2 * p][0] = r[0];
        bf[2 * p][1] = r[1];
        bf[2 * p + 1][0] = r[2];
        bf[2 * p + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int j = 0; j < 4; ++j) MmaOp<TT>::run(acc.v[mi][j], af[mi], bf[j][0], bf[j][1]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();
}

}  // namespace moekit::cuda::grouped
