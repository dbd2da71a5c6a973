// The 64-bit shared-memory matrix descriptor of sm_90a wgmma (PTX ISA "Matrix Descriptor Format"),
// for the one layout the fused_moe grouped kernels use: K-major tiles whose rows are 64 16-bit elements
// (128 bytes), 16-byte chunks XOR-swizzled by (row % 8) (the 128-byte swizzle), 8-row groups
// 1024 bytes apart, every tile based at a 1024-byte aligned shared address.
//   bits  0-13  start address >> 4          bits 32-45  stride byte offset >> 4 (8-row groups)
//   bits 16-29  leading byte offset >> 4    bits 49-51  base offset (0: 1024-byte aligned atoms)
//   bits 62-63  swizzle mode (1 = 128B, 2 = 64B, 3 = 32B, 0 = none)
// NOTE: for K-major swizzled layouts whose K extent is one swizzle atom (64 elements here) the
// leading byte offset is unused; it is set to 1 (16 bytes), as CUTLASS does. Within the atom the
// k16 steps advance the start address by 32 bytes: the hardware applies the XOR on address bits,
// which is why the atoms must be 1024-byte aligned.
// Pure and constexpr (host and device). Tests: tests/test_fused_moe_sm90_grouped.cpp
// (FusedMoeSm90Grouped.WgmmaDescriptorFields).
#pragma once

#include <cstdint>

namespace moekit::cuda::sm90 {

constexpr uint32_t kSw128AtomBytes = 1024;  // 8 rows x 128 bytes: the stride byte offset

constexpr uint64_t wgmma_desc_sw128(uint32_t smem_addr) {
  return uint64_t((smem_addr & 0x3FFFFu) >> 4)                  // start address
         | (uint64_t(1) << 16)                                   // leading byte offset: 16 B (unused)
         | (uint64_t((kSw128AtomBytes >> 4) & 0x3FFFu) << 32)   // stride byte offset: 1024 B
         | (uint64_t(1) << 62);                                  // 128-byte swizzle
}

}  // namespace moekit::cuda::sm90
