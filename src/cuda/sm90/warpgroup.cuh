// Register reallocation between the warpgroups of a warp-specialised sm_90a kernel (setmaxnreg).
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

}  // namespace moekit::cuda::sm90
