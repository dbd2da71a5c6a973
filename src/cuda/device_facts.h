// The current CUDA device's DeviceFacts (src/core/device_facts.h), queried once per device and
// cached: cheap enough for every supports() / workspace() / launch of a kernel.
#pragma once

#include "core/device_facts.h"
#include "moekit/core/status.h"

namespace moekit::cuda {

// The facts of the calling thread's current device. Thread-safe.
Status current_device_facts(DeviceFacts* out);

// The same where no Status can be returned (workspace sizing): a zeroed DeviceFacts (sm_count 0)
// when the device cannot be asked; the launch that follows then fails with the CUDA error.
DeviceFacts current_device_facts_or_zero();

}  // namespace moekit::cuda
