// Block-wide integer prefix sums for the one-CTA routing kernels of the CUDA backend (sort_tokens,
// fused_moe small_m / grouped). CUDA-only header.
#pragma once

namespace moekit::cuda {

// Inclusive sum of v over the 1024 threads of the block (32 warps; every thread must call it, in
// thread order). *total gets the block sum. The shared scratch is reused by the next call, hence the
// trailing barrier.
__device__ __forceinline__ int block_inclusive_sum_1024(int v, int* total) {
  __shared__ int s_warp[32];
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) s_warp[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = s_warp[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    s_warp[lane] = w;
  }
  __syncthreads();
  if (warp > 0) v += s_warp[warp - 1];
  *total = s_warp[31];
  __syncthreads();
  return v;
}

// Exclusive form of block_inclusive_sum_1024.
__device__ __forceinline__ int block_exclusive_sum_1024(int v) {
  int total;
  return block_inclusive_sum_1024(v, &total) - v;
}

}  // namespace moekit::cuda
