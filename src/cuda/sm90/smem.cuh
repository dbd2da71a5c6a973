// Shared-memory addresses as the 32-bit operands of the sm_90a async instructions (mbarrier, TMA,
// wgmma descriptors) and the 1024-byte alignment of 128-byte-swizzled tiles.
// CUDA-only header: include only from .cu / .cuh files.
#pragma once

#include <cstdint>

#include "cuda/sm90/wgmma_desc.h"

namespace moekit::cuda::sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The first byte at or after p (shared memory) on a 1024-byte boundary: where the stages start.
__device__ __forceinline__ void* align_smem_1024(unsigned char* p) {
  const uint32_t a = smem_addr(p);
  return p + ((kSw128AtomBytes - a % kSw128AtomBytes) % kSw128AtomBytes);
}

}  // namespace moekit::cuda::sm90
