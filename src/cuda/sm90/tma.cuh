// Device side of the sm_90 bulk tensor copy (TMA): tensor-map prefetch and the 2-D box load into
// shared memory that completes on an mbarrier (mbarrier.cuh). Host-side encoding: cuda/tensor_map.h.
// CUDA-only header: include only from .cu / .cuh files.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace moekit::cuda::sm90 {

__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// Box (c0 = first column, c1 = first row) of `map` -> shared `dst`, completing on `bar`.
// NOTE: the weight (B) boxes with an L2 evict_first policy (.L2::cache_hint, createpolicy) measured
// slower nearly everywhere (E29).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// Orders this thread's generic-proxy writes before later async-proxy (TMA, wgmma) reads of them:
// of shared memory (a B tile written by threads, then read by wgmma) or of global memory (a
// workspace written in one phase of a kernel, read by TMA after a barrier).
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

}  // namespace moekit::cuda::sm90
