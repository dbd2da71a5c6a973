// The facts of a GPU that kernel choices depend on, in one place: the rules (fused_moe_heuristic.h,
// the grouped kernels' split and stage rules) read a DeviceFacts instead of one GPU's numbers, and
// the CUDA backend fills it from the device at run time (src/cuda/device_facts.cu). Host-only C++,
// no CUDA, so host code and tests share it. docs/design/fused_moe_sm90.md (3.4).
#pragma once

#include <cstdint>

namespace moekit {

struct DeviceFacts {
  int sm_count = 0;          // streaming multiprocessors (cudaDevAttrMultiProcessorCount)
  int smem_optin_bytes = 0;  // shared memory one block may opt into (cudaDevAttrMaxSharedMemoryPerBlockOptin)
  int64_t l2_bytes = 0;      // L2 cache (cudaDevAttrL2CacheSize)
  int cc_major = 0, cc_minor = 0;
  bool cooperative_launch = false;  // kernels may be launched cooperatively (cudaDevAttrCooperativeLaunch)
};

// Shared memory one CTA may opt into on every sm_90 part (the architecture's limit): what the
// kernels' compile-time tile budgets are checked against.
inline constexpr int kSm90SmemOptinBytes = 227 * 1024;

// The H200 the rules were measured on (docs/experiments.md): what tests pass to the rules to pin
// today's choices, and what the rules assume when no device can be asked (sm_count 0 there means
// "unknown", which the rules treat as the smallest grid, so they never over-split).
inline constexpr DeviceFacts kH200Facts{132, kSm90SmemOptinBytes, int64_t(60) << 20, 9, 0, true};

}  // namespace moekit
