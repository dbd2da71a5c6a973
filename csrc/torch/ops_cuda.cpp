// csrc/torch/ops_cuda.cpp: torch.ops.moekit.* on the CUDA dispatch key (built only with the CUDA
// backend). The implementations are the device-agnostic ones of ops.cpp; this file adds the current
// CUDA stream they pass in RunOptions (so the ops follow torch.cuda.stream(...) and are captured by
// torch.cuda.graph) and the registration. Tests: tests/python/test_ops.py (GPU cases).
#include <c10/cuda/CUDAStream.h>

#include "binding.h"

namespace moekit::torch_binding {

void* current_cuda_stream(c10::DeviceIndex index) {
  return static_cast<void*>(c10::cuda::getCurrentCUDAStream(index).stream());
}

}  // namespace moekit::torch_binding

TORCH_LIBRARY_IMPL(moekit, CUDA, m) { moekit::torch_binding::register_impls(m); }
