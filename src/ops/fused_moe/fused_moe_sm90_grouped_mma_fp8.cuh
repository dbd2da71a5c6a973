// The e4m3 side of the mma.sync mainloop (fused_moe_sm90_grouped_mma.cuh) for 64-row M tiles, shared
// by the per-row fp8 kernels (fused_moe_sm90_grouped_fp8.cu, fused_moe_sm90_grouped_fp8_row_bm64) and
// the block-scaled ones (fused_moe_sm90_grouped_fp8_block.cu, fused_moe_sm90_grouped_fp8_block_bm64).
// The loader, swizzled shared layout and ldmatrix addressing of the mainloop work on 16-bit
// elements; two e4m3 codes make one (E4m3x2), so a 64-element K slice there is 128 codes (one
// 128-wide scale block of the block variant). mma.sync m16n8k32 e4m3 takes its fragments in the
// registers m16n8k16 bf16 does: A rows g and g+8 at bytes 4t..4t+3 and 16+4t..16+4t+3 of a 32-byte
// K step, B the same along K, C the same (g = lane / 4, t = lane % 4), so only the instruction
// differs.
// NOTE: on sm_90 mma.sync on e4m3 is no native instruction: ptxas (CUDA 13.0) emits two HMMA
// m16n8k16 per MMA and decodes both operands with F2FP every time, which keeps the ALU pipe busy
// (docs/experiments.md E79). Native fp8 on Hopper is wgmma (QGMMA).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_common.cuh"
#include "ops/fused_moe/fused_moe_sm90_grouped_mma.cuh"

namespace moekit::cuda::grouped {

struct E4m3x2 {
  uint16_t bits;
};
constexpr int kMmaBM = 64;
using MmaTile = Tile<kMmaBM>;


template <>
struct MmaOp<E4m3x2> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// The A rows of a 64-row M tile: expert-ordered rows row0.. of a codes buffer [Tk, K] (K codes).
__device__ __forceinline__ void mma_a_rows(TileSources<E4m3x2, kMmaBM>& src, const uint8_t* q, int k_codes, int row0,
                                           int row_end, int tid) {
  src.a_base = reinterpret_cast<const E4m3x2*>(q);
  src.a_ld = k_codes / 2;
#pragma unroll
  for (int i = 0; i < MmaTile::kLoadsA; ++i) {
    const int row = row0 + loader_row(tid, i);
    src.a_row[i] = row < row_end ? row : -1;
  }
}

// The B rows of gemm1's N tile at column i0 of expert e's w1 codes [E, N1, H] (N1 = 2I for g1u1,
// I for g1u0): g1u1 gate rows i0.. and up rows I + i0.. (128 each), g1u0 rows i0..i0 + 255; a row
// is valid below I (I % 128 == 0, so a thread's rows are all in or out per 32-row group).
template <bool G1U1>
__device__ __forceinline__ void mma_w1_rows(TileSources<E4m3x2, kMmaBM>& src, const uint8_t* w1, int e, int H, int I,
                                            int i0, int tid) {
  const int n1 = G1U1 ? 2 * I : I, k2 = H / 2;
  const E4m3x2* w = reinterpret_cast<const E4m3x2*>(w1) + int64_t(e) * n1 * k2;
  const int r0 = loader_row(tid, 0);
  src.b_run[0] = w + int64_t(i0 + r0) * k2;
  src.b_run[1] = w + int64_t(G1U1 ? I + i0 + r0 : i0 + r0 + kBN / 2) * k2;
  src.b_step = int64_t(kThreads / 8) * k2;
  src.b_ok = 0;
#pragma unroll
  for (int i = 0; i < MmaTile::kLoadsB; ++i) {
    const int m = G1U1 ? i % (MmaTile::kLoadsB / 2) : i;
    src.b_ok |= uint32_t(32 * m < I - i0) << i;
  }
}

// The B rows of gemm2's N tile at column h0 of expert e's w2 codes [E, H, I]: rows h0..h0 + 255,
// valid below H.
__device__ __forceinline__ void mma_w2_rows(TileSources<E4m3x2, kMmaBM>& src, const uint8_t* w2, int e, int H, int I,
                                            int h0, int tid) {
  const int k2 = I / 2;
  const E4m3x2* w = reinterpret_cast<const E4m3x2*>(w2) + int64_t(e) * H * k2;
  const int r0 = loader_row(tid, 0);
  src.b_run[0] = w + int64_t(h0 + r0) * k2;
  src.b_run[1] = w + int64_t(h0 + r0 + kBN / 2) * k2;
  src.b_step = int64_t(kThreads / 8) * k2;
  src.b_ok = 0;
#pragma unroll
  for (int i = 0; i < MmaTile::kLoadsB; ++i) src.b_ok |= uint32_t(h0 + loader_row(tid, i) < H) << i;
}

// Launches a BM 64 kernel fn(args, a, b) with its dynamic shared memory: the 4-stage cp.async
// pipeline and extra_smem bytes behind it (the block kernels' staged scales), with the PDL
// attribute (the kernels start with wait_for_predecessor, fused_moe_sm90_grouped_common.cuh).
template <class Args>
inline Status launch_mma(void (*fn)(Args, const uint8_t*, const uint8_t*), dim3 grid, cudaStream_t s,
                         const char* what, const Args& args, const uint8_t* a, const uint8_t* b,
                         size_t extra_smem = 0) {
  const int smem = int(MmaTile::kSmemBytes + extra_smem);
  MOEKIT_RETURN_IF_ERROR(
      check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what));
  return launch_pdl(fn, grid, dim3(kThreads), size_t(smem), s, what, args, a, b);
}

}  // namespace moekit::cuda::grouped
