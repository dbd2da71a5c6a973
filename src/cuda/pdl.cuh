// Programmatic dependent launch (PDL) for the short kernels of the fused_moe paths
// (fused_moe_sm90_small_m, and the route / quantizers / BM 64 gemms / reduce of the grouped paths,
// and the fp8 per-row 64 x 256 TMA gemms, which wait right after their shared-memory setup):
// every such kernel is launched allowed to overlap its predecessor in the stream (launch_pdl). Each
// CTA first waits for the predecessor grid to COMPLETE (griddepcontrol.wait, which also makes its
// memory visible) before any global read or write, then lets the next kernel's CTAs be scheduled
// (they in turn wait for this grid's completion). So only launch latency and CTA scheduling overlap,
// never data; both instructions are no-ops in a kernel launched without the attribute, so a kernel
// that starts with wait_for_predecessor() may be launched either way.
// NOTE: not for the persistent 128 x 256 / 128 x 128 gemms nor the block variant's gemms: they ran
// slower with it, why is not known (docs/experiments.md E31).
// CUDA-only header: include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/cuda_utils.h"
#include "moekit/core/status.h"

namespace moekit::cuda {

__device__ __forceinline__ void wait_for_predecessor() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Launches kernel<<<grid, block, smem, s>>>(args...) with the PDL attribute; errors name `what`.
// The kernel must start with wait_for_predecessor().
template <class... P, class... A>
inline Status launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, const char* what,
                         A&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...), what));
  return last_launch(what);
}

}  // namespace moekit::cuda
