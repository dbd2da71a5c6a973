// A measured memory ceiling for `moekit bench`: the time a kernel that only reads the given device
// byte ranges takes, timed as the op rows are (DeviceOps::time_graph: CUDA-graph replays, the same
// L2 flush before each). For fused_moe the ranges are the touched experts' w1 and w2 slabs, so
// stream_us is what streaming the op's weights costs under the bench's own harness (launch, the
// flush's dirty lines, the ramp), the ceiling a memory-bound kernel can approach (the D0 probe:
// docs/experiments.md E109). Declarations without CUDA types; weight_stream.cu.
#pragma once

#include <cstddef>
#include <vector>

#include "moekit/core/status.h"
#include "moekit/registry.h"

namespace moekit::cuda {

struct DeviceBytes {
  const void* data = nullptr;  // device pointer, 16-byte aligned
  size_t bytes = 0;            // read in 16-byte vectors; a tail under 16 bytes is not read
};

// Median us of `iters` replays of the read of sets[s] (rotating over the sets, as time_graph does),
// after `warmup` replays. Errors: an empty set list or set, a misaligned range, CUDA failures.
Status time_weight_stream(const std::vector<std::vector<DeviceBytes>>& sets, int warmup, int iters, L2Flush l2,
                          double* median_us);

// Runs the read of `ranges` once on the default stream and returns the XOR of every 32-bit word
// read (tests compare it with the host's XOR of the same bytes). Synchronous.
Status weight_stream_checksum(const std::vector<DeviceBytes>& ranges, uint32_t* xor_out);

}  // namespace moekit::cuda
