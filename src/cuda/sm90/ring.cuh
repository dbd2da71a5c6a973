// The producer / consumer stage ring of the warp-specialised TMA kernels: the shared-memory layout
// of kStages stages and their full / empty mbarriers, the barriers' setup, and a ring position.
// CUDA-only header: include only from .cu / .cuh files.
#pragma once

#include <cstdint>

#include "cuda/sm90/mbarrier.cuh"
#include "cuda/sm90/smem.cuh"
#include "cuda/sm90/wgmma_desc.h"

namespace moekit::cuda::sm90 {

// Shared-memory addresses of stage s and its barriers; `base` is the 1024-byte aligned start. A ring
// of kStages stages of kStageBytes each (A first, B kABytes after it), then 2 kStages mbarriers.
// full[s]: the producer's arrive.expect_tx + the TMA's complete_tx; empty[s]: the consumers' arrives.
template <int kStages_, uint32_t kStageBytes_, uint32_t kABytes_>
struct WsSmemT {
  static constexpr int kStages = kStages_;
  static constexpr uint32_t kStageBytes = kStageBytes_;
  uint32_t base;
  __device__ __forceinline__ uint32_t a(int s) const { return base + uint32_t(s) * kStageBytes; }
  __device__ __forceinline__ uint32_t b(int s) const { return a(s) + kABytes_; }
  __device__ __forceinline__ uint32_t full(int s) const { return base + kStages * kStageBytes + 8u * s; }
  __device__ __forceinline__ uint32_t empty(int s) const { return full(kStages) + 8u * s; }
};
// Dynamic shared memory of a ring: alignment slack + the stages + the barriers.
template <class Sm>
constexpr int ws_smem_bytes() {
  return int(kSw128AtomBytes + Sm::kStages * Sm::kStageBytes + 2 * Sm::kStages * 8);
}

// The dynamic shared memory after a ring's stages and barriers (8-byte aligned; Sm: a WsSmemT): the
// extra bytes a kernel asks for behind the ring, for its own use.
template <class Sm>
__device__ __forceinline__ unsigned char* ws_extra_smem_of(unsigned char* smem_raw) {
  return static_cast<unsigned char*>(align_smem_1024(smem_raw)) + Sm::kStages * Sm::kStageBytes + 2 * Sm::kStages * 8;
}

// One thread initialises the barriers (empty: one arrive per consumer warp); the caller then
// synchronises the CTA.
template <int kConsumerWarps, class Sm>
__device__ __forceinline__ void ws_init_barriers(const Sm& sm) {
#pragma unroll
  for (int s = 0; s < Sm::kStages; ++s) {
    mbar_init(sm.full(s), 1);
    mbar_init(sm.empty(s), kConsumerWarps);
  }
  mbar_init_fence();
}

// Position in a ring of kStages stages (stage index and the parity of its current phase).
template <int kStages>
struct WsRingT {
  int s = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void next() {
    if (++s == kStages) {
      s = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace moekit::cuda::sm90
