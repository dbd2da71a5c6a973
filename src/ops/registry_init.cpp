// Builds the process-wide kernel table from every compiled backend (moekit/registry.h).
#include "cpu/cpu_backend.h"
#include "moekit/registry.h"
#include "ref/ref_kernels.h"
#if defined(MOEKIT_WITH_CUDA)
#include "cuda/cuda_backend.h"
#endif

namespace moekit {

const Registry& registry() {
  static const Registry r = [] {
    Registry reg;
    ref::register_kernels(reg);
    cpu::register_kernels(reg);
#if defined(MOEKIT_WITH_CUDA)
    cuda::register_kernels(reg);
#endif
    return reg;
  }();
  return r;
}

}  // namespace moekit
