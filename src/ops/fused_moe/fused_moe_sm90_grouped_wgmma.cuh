// The wgmma pieces the TMA + wgmma kernels share (fused_moe_sm90_grouped_tma.cuh and the fp8
// ring, fused_moe_sm90_grouped_fp8_ring.cuh) live in src/cuda/sm90/ (wgmma.cuh: accumulators, fences,
// instruction wrappers; smem.cuh: shared addresses); this header brings them into namespace grouped
// with the matrix descriptor (cuda/sm90/wgmma_desc.h) and the mma.sync mainloop's tile facts.
// (The cp.async wgmma mainloop that once lived here, built only with -DMOEKIT_GROUPED_TMA=0, is
// retired: docs/experiments.md E16-E18, E17 for its pipeline depth.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/sm90/smem.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/sm90/wgmma_desc.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_mma.cuh"

namespace moekit::cuda::grouped {

using sm90::acc_pair;
using sm90::AccW;
using sm90::align_smem_1024;
using sm90::fence_acc;
using sm90::kSw128AtomBytes;
using sm90::fence_regs;
using sm90::kWgN;
using sm90::kWgNT;
using sm90::wgmma_commit;
using sm90::wgmma_fence;
using sm90::wgmma_fp8_n128;
using sm90::wgmma_fp8_n64;
using sm90::wgmma_wait;
using sm90::WgmmaOp;
using sm90::wgmma_desc_sw128;

}  // namespace moekit::cuda::grouped
