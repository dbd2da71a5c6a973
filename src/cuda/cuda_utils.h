// Helpers shared by the CUDA kernels (CUDA-only header: include only from .cu files).
#pragma once

#include <cuda_runtime.h>

#include "moekit/core/status.h"

namespace moekit::cuda {

// Status from a CUDA runtime result, naming the call.
inline Status check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return BackendError(what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

// The status of the last launch (cudaGetLastError, which also clears it).
inline Status last_launch(const char* kernel) { return check_cuda(cudaGetLastError(), kernel); }

constexpr int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

}  // namespace moekit::cuda
