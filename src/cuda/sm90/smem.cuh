// Shared-memory addresses as the 32-bit operands of the sm_90a async instructions (mbarrier, TMA,
// wgmma descriptors), the 1024-byte alignment of 128-byte-swizzled tiles, and the async-proxy fence.
// CUDA-only header: include only from .cu / .cuh files.
#pragma once

#include <cstdint>

#include "ops/fused_moe/fused_moe_sm90_grouped_desc.h"

namespace moekit::cuda::sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The first byte at or after p (shared memory) on a 1024-byte boundary: where the stages start.
__device__ __forceinline__ void* align_smem_1024(unsigned char* p) {
  const uint32_t a = smem_addr(p);
  return p + ((grouped::kSw128AtomBytes - a % grouped::kSw128AtomBytes) % grouped::kSw128AtomBytes);
}

__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace moekit::cuda::sm90
