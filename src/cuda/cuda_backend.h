// The CUDA (sm_90a) backend's registration hook (declared without CUDA types).
#pragma once

#include "moekit/registry.h"

namespace moekit::cuda {
// Adds the CUDA kernels and the backend probe (available when an sm_90 device is present).
void register_kernels(Registry& r);
}  // namespace moekit::cuda
