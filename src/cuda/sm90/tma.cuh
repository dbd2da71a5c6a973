// Device side of the sm_90 bulk tensor copy (TMA): tensor-map prefetch, the 2-D box load into
// shared memory that completes on an mbarrier (mbarrier.cuh) and the 2-D box store from it.
// Host-side encoding: cuda/tensor_map.h.
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

// Shared `src` -> box (c0 = first column, c1 = first row) of `map` (a bulk async store; the box's
// rows and columns past the tensor's bounds are not written). Completes in this thread's bulk group
// (tma_store_commit, tma_store_wait_read / tma_store_wait_all); src must be written before it and
// ordered by fence_proxy_async_smem and a barrier.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Until at most kPending of this thread's committed store groups still read their shared source.
template <int kPending>
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
// Until every committed store group of this thread has completed (its global writes done).
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// Orders this thread's generic-proxy writes before later async-proxy (TMA, wgmma) reads of them:
// of shared memory (a B tile written by threads, then read by wgmma) or of global memory (a
// workspace written in one phase of a kernel, read by TMA after a barrier).
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

}  // namespace moekit::cuda::sm90
