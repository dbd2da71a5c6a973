// The CPU (AVX-512) backend's registration hook.
#pragma once

#include "moekit/registry.h"

namespace moekit::cpu {
// Adds the CPU kernels and the backend probe (available when the CPU and OS support AVX-512 BF16).
void register_kernels(Registry& r);
}  // namespace moekit::cpu
