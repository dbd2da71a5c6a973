// The sm_90a wgmma pieces of the TMA + wgmma kernels: the accumulator layout, the fences and waits,
// and the m64n256k16 (bf16 / f16), m64n256k32, m64n128k32 and m64n64k32 (e4m3) instruction wrappers
// with A and B read from shared memory through matrix descriptors (wgmma_desc.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace moekit::cuda::sm90 {

// Accumulators (PTX ISA, wgmma .m64nNk16 D fragment): warp w of the CTA (w = 4 g + warp in group)
// owns rows 16 w .. 16 w + 15; d[j][q] of lane l is row 16 w + (l >> 2) + 8 (q >> 1), column
// 8 j + 2 (l & 3) + (q & 1), j < 32. That is the m16n8 layout of mma.sync with one m16 tile per
// warp, so AccW has the shape v[1][32][4] that the epilogues index like Acc<NT>.
constexpr int kWgN = 256;                 // columns per wgmma (m64n256k16)
constexpr int kWgNT = kWgN / 8;           // n8 column blocks per thread: 32
// Accumulators of one thread of a 64 x 256 wgmma (the (row, col) mapping above).
struct AccW {
  float v[1][kWgNT][4];
};

// The two accumulators of row half h (0: q[0], q[1]; 1: q[2], q[3]) of an m16n8-layout block q, read
// with constant indices: a &q[2 h] pointer made ptxas keep a whole accumulator array in local memory
// wherever the loop over h stayed rolled (scripts/check_lmem.sh).
__device__ __forceinline__ float2 acc_pair(const float (&q)[4], int h) {
  return h == 0 ? make_float2(q[0], q[1]) : make_float2(q[2], q[3]);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of the accumulators across wgmma fences / waits.
__device__ __forceinline__ void fence_acc(AccW& acc) {
#pragma unroll
  for (int j = 0; j < kWgNT; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) asm volatile("" : "+f"(acc.v[0][j][q])::"memory");
}
// The same for the 64 accumulators of one m64n128k32 (wgmma_fp8_n128) partial-sum buffer.
__device__ __forceinline__ void fence_regs(float (&d)[16][4]) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) asm volatile("" : "+f"(d[j][q])::"memory");
}

// The same for the 4 accumulators of one m64n8k32 (wgmma_fp8_n8).
__device__ __forceinline__ void fence_regs(float (&d)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) asm volatile("" : "+f"(d[q])::"memory");
}

#define MOEKIT_WG_D4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define MOEKIT_WG_REGS \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define MOEKIT_WG_OPERANDS \
  MOEKIT_WG_D4(0), MOEKIT_WG_D4(1), MOEKIT_WG_D4(2), MOEKIT_WG_D4(3), \
  MOEKIT_WG_D4(4), MOEKIT_WG_D4(5), MOEKIT_WG_D4(6), MOEKIT_WG_D4(7), \
  MOEKIT_WG_D4(8), MOEKIT_WG_D4(9), MOEKIT_WG_D4(10), MOEKIT_WG_D4(11), \
  MOEKIT_WG_D4(12), MOEKIT_WG_D4(13), MOEKIT_WG_D4(14), MOEKIT_WG_D4(15), \
  MOEKIT_WG_D4(16), MOEKIT_WG_D4(17), MOEKIT_WG_D4(18), MOEKIT_WG_D4(19), \
  MOEKIT_WG_D4(20), MOEKIT_WG_D4(21), MOEKIT_WG_D4(22), MOEKIT_WG_D4(23), \
  MOEKIT_WG_D4(24), MOEKIT_WG_D4(25), MOEKIT_WG_D4(26), MOEKIT_WG_D4(27), \
  MOEKIT_WG_D4(28), MOEKIT_WG_D4(29), MOEKIT_WG_D4(30), MOEKIT_WG_D4(31)

// D += A . B^T for one k16 step: A 64 x 16 and B 256 x 16 (K-major, descriptors da / db).
template <class TT>
struct WgmmaOp;
template <>
struct WgmmaOp<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&d)[kWgNT][4], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MOEKIT_WG_REGS
        "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : MOEKIT_WG_OPERANDS
        : "l"(da), "l"(db), "r"(1));
  }
};
template <>
struct WgmmaOp<__half> {
  __device__ __forceinline__ static void run(float (&d)[kWgNT][4], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" MOEKIT_WG_REGS
        "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : MOEKIT_WG_OPERANDS
        : "l"(da), "l"(db), "r"(1));
  }
};
// fp8: one k32 step (32 bytes of K, the same +32-byte descriptor advance as a bf16 k16 step): A 64 x
// 32 and B 256 x 32 e4m3fn codes, K-major (the only fp8 layout wgmma takes), f32 accumulation.
template <>
struct WgmmaOp<__nv_fp8_e4m3> {
  __device__ __forceinline__ static void run(float (&d)[kWgNT][4], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {" MOEKIT_WG_REGS
        "}, %128, %129, p, 1, 1;\n}\n"
        : MOEKIT_WG_OPERANDS
        : "l"(da), "l"(db), "r"(1));
  }
};
#undef MOEKIT_WG_OPERANDS
#undef MOEKIT_WG_REGS

// fp8 m64n128k32 (64 f32 accumulators per thread, d[j][q] as above with j < 16); `accumulate` = 0
// overwrites d (D = A . B^T), 1 adds. For the block-scaled kernel, which promotes each 128-wide K
// slice's partial sums into separate accumulators (fused_moe_sm90_grouped_fp8_block.cu).
#define MOEKIT_WG64_REGS \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MOEKIT_WG64_OPERANDS \
  MOEKIT_WG_D4(0), MOEKIT_WG_D4(1), MOEKIT_WG_D4(2), MOEKIT_WG_D4(3), \
  MOEKIT_WG_D4(4), MOEKIT_WG_D4(5), MOEKIT_WG_D4(6), MOEKIT_WG_D4(7), \
  MOEKIT_WG_D4(8), MOEKIT_WG_D4(9), MOEKIT_WG_D4(10), MOEKIT_WG_D4(11), \
  MOEKIT_WG_D4(12), MOEKIT_WG_D4(13), MOEKIT_WG_D4(14), MOEKIT_WG_D4(15)
__device__ __forceinline__ void wgmma_fp8_n128(float (&d)[16][4], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" MOEKIT_WG64_REGS
      "}, %64, %65, p, 1, 1;\n}\n"
      : MOEKIT_WG64_OPERANDS
      : "l"(da), "l"(db), "r"(accumulate));
}
#undef MOEKIT_WG64_OPERANDS
#undef MOEKIT_WG64_REGS

// fp8 m64n8k32 (4 f32 accumulators per thread: rows r and r + 8 of the warp's 16, columns 2 (lane % 4)
// and + 1), accumulate 0: d = A B. The one-launch decode's tiles: weights as A, <= 8 tokens as B
// (fused_moe_sm90_decode.cu).
__device__ __forceinline__ void wgmma_fp8_n8(float (&d)[4], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(accumulate));
}

// fp8 m64n64k32 (32 f32 accumulators per thread, d[j][q] with j < 8), accumulating: the gate / up
// halves of the 128 x 256 per-row gemm1's tail tiles (ws_consume_tail, fused_moe_sm90_grouped_tma.cuh).
__device__ __forceinline__ void wgmma_fp8_n64(float (&d)[8][4], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1;\n}\n"
      : MOEKIT_WG_D4(0), MOEKIT_WG_D4(1), MOEKIT_WG_D4(2), MOEKIT_WG_D4(3), MOEKIT_WG_D4(4), MOEKIT_WG_D4(5),
        MOEKIT_WG_D4(6), MOEKIT_WG_D4(7)
      : "l"(da), "l"(db), "r"(1));
}
#undef MOEKIT_WG_D4

}  // namespace moekit::cuda::sm90
