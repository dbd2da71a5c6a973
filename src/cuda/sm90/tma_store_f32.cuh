// A warpgroup's f32 wgmma accumulators (64 rows) to global memory through shared memory and TMA
// stores: the rows are staged in chunks of kChunkCols columns (32: 128-byte rows, 16: 64-byte rows;
// one swizzle row, the box of a tensor map from encode_tensor_map_2d over f32 with swizzle_bytes =
// 4 kChunkCols) in two buffers of the warpgroup, and one thread stores each chunk while the
// warpgroup writes the next. The consumers then leave the tile after a few shared-memory stores
// instead of queueing row-strided global stores (docs/experiments.md E124).
// CUDA-only header: include only from .cu / .cuh files.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/sm90/smem.cuh"
#include "cuda/sm90/tma.cuh"
#include "cuda/tensor_map.h"

namespace moekit::cuda::sm90 {

// A warpgroup's two buffers of 64 rows x kChunkCols f32.
template <int kChunkCols>
constexpr uint32_t kF32StoreBytesPerWarpgroup = 2 * 64 * kChunkCols * 4;

// Dynamic shared memory a kernel asks for beyond its ring (ring_end bytes from the 1024-byte aligned
// base) for `before` bytes of its own and then nwg warpgroups' buffers on the next 1024-byte boundary,
// where align_smem_1024(ring end + before) puts them; kChunkCols as in tma_store_f32_rows.
template <int kChunkCols>
constexpr int tma_store_f32_extra_smem(int ring_end, int before, int nwg) {
  constexpr int kAlign = int(kSw128AtomBytes);
  return (ring_end + before + kAlign - 1) / kAlign * kAlign - ring_end +
         nwg * int(kF32StoreBytesPerWarpgroup<kChunkCols>);
}

// Host side: the map tma_store_f32_rows<kJ, kChunkCols> stores through, y as a row-major [rows, cols]
// f32 matrix in boxes of kChunkCols columns x 64 rows, swizzled at 4 kChunkCols bytes.
template <int kChunkCols>
inline Status encode_f32_rows_map(CUtensorMap* map, float* y, uint64_t rows, uint64_t cols, const char* what) {
  return encode_tensor_map_2d(map, y, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, rows, cols, cols, 64, what, 4 * kChunkCols);
}

// Barrier of the 128 threads of warpgroup wg (named barrier 2 + wg; 1 is the consumers' barrier).
__device__ __forceinline__ void warpgroup_sync(int wg) {
  asm volatile("bar.sync %0, 128;" ::"r"(2 + wg) : "memory");
}
__device__ __forceinline__ void st_shared_f32x2(uint32_t a, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(a), "f"(x), "f"(y) : "memory");
}

// Warpgroup wg's rows [row, row + 64) of columns [col, col + 8 kJ) -> `map` (f32, kChunkCols x 64
// boxes swizzled at 4 kChunkCols bytes). acc[j][q]: the wgmma m64nN accumulator layout (thread: rows
// 16 (warp & 3) + lane / 4 and + 8, columns 8 j + 2 (lane & 3) + {0, 1}; q = 2 h + c). buf: the
// warpgroup's kF32StoreBytesPerWarpgroup<kChunkCols>, 1024-byte aligned. Every thread of the
// warpgroup calls it; the store issued last may still run: tma_store_f32_drain before the kernel
// exits. Buffer reuse: before the barrier that ends chunk c's writes, the storing thread waits until
// chunk c - 1's store has read its buffer, which chunk c + 1 writes after that barrier.
// Swizzle: the 16-byte unit u of row r (row bytes RB) sits at unit u ^ ((r RB / 128) mod (RB / 16)),
// the TMA's 128-byte (r mod 8) and 64-byte ((r / 2) mod 4) patterns; a warp's store of 8 rows x 32
// bytes then takes the minimum two shared-memory wavefronts.
// get(j, h) -> float2: the values this thread stores at its row h (0: r, 1: r + 8), columns
// 8 j + 2 (lane & 3) + {0, 1} (the overload below: the accumulators themselves).
template <int kJ, int kChunkCols = 32, class Get>
__device__ __forceinline__ void tma_store_f32_rows(const CUtensorMap* map, uint32_t buf, int wg, int row, int col,
                                                   Get get) {
  static_assert(kChunkCols == 32 || kChunkCols == 16, "128- or 64-byte rows");
  constexpr int kRowBytes = 4 * kChunkCols, kUnits = kRowBytes / 16, kJPerChunk = kChunkCols / 8;
  constexpr uint32_t kChunkBytes = 64u * kRowBytes;
  constexpr int kChunks = kJ / kJPerChunk;
  static_assert(kJ % kJPerChunk == 0 && kChunks % 2 == 0,
                "an even number of whole chunks: every call starts in the first buffer");
  const int lane = threadIdx.x & 31, r0 = ((threadIdx.x >> 5) & 3) * 16 + (lane >> 2);
  const bool storer = (threadIdx.x & 127) == 0;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const uint32_t b = buf + uint32_t(c & 1) * kChunkBytes;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      const uint32_t sw = uint32_t((r * kRowBytes) >> 7) & uint32_t(kUnits - 1);
#pragma unroll
      for (int jj = 0; jj < kJPerChunk; ++jj) {
        const uint32_t unit = uint32_t(2 * jj + ((lane & 3) >> 1)) ^ sw;
        const float2 v = get(kJPerChunk * c + jj, h);
        st_shared_f32x2(b + uint32_t(r * kRowBytes) + (unit << 4) + 8u * uint32_t(lane & 1), v.x, v.y);
      }
    }
    fence_proxy_async_smem();
    if (storer) tma_store_wait_read<0>();
    warpgroup_sync(wg);
    if (storer) {
      tma_store_2d(map, b, col + c * kChunkCols, row);
      tma_store_commit();
    }
  }
}
template <int kJ, int kChunkCols = 32>
__device__ __forceinline__ void tma_store_f32_rows(const CUtensorMap* map, uint32_t buf, int wg, int row, int col,
                                                   const float (&acc)[kJ][4]) {
  tma_store_f32_rows<kJ, kChunkCols>(map, buf, wg, row, col,
                                     [&](int j, int h) { return make_float2(acc[j][2 * h], acc[j][2 * h + 1]); });
}
// The stores of tma_store_f32_rows complete (by the thread that issued them) before it exits.
__device__ __forceinline__ void tma_store_f32_drain() {
  if ((threadIdx.x & 127) == 0) tma_store_wait_all();
}

}  // namespace moekit::cuda::sm90
