// Register reallocation between the warpgroups of a warp-specialised sm_90a kernel (setmaxnreg),
// and the warpgroup index.
// CUDA-only header: include only from .cu / .cuh files.
#pragma once

namespace moekit::cuda::sm90 {

// Register reallocation between warpgroups (sm_90a; every warp of the warpgroup executes it): the
// producer gives registers back (dec), the consumers take them (inc); ptxas allocates the code after
// each up to the new count.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// The calling thread's warpgroup index, broadcast from lane 0 so ptxas knows it warp-uniform and
// keeps the descriptor math that depends on it in uniform registers (as CUTLASS's
// canonical_warp_group_idx); from threadIdx.x >> 7 it moved the A descriptors over every slice.
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x >> 7), 0); }

}  // namespace moekit::cuda::sm90
