// Independent oracle of pack_weight / unpack_weight (moekit/ops/layout.h, layout cpu_vnni2_n32):
// the packed tensor is written sequentially by walking its 4-D view [N/32][K/2][32][2] per matrix
// (no closed-form offset), and unpacking scatters back through the same walk.
// Used by src/testing/check_pack_weight.cpp and tests/test_pack_weight.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/core/tensor_view.h"

namespace moekit::testing {

// The elements (raw bits, zero-extended to 16) of pack_weight(in) (inverse = false; in row_major) or
// unpack_weight(in) (inverse = true; in cpu_vnni2_n32). `in` must be a valid, contiguous host tensor
// of 2-byte (bf16, f16) or 1-byte (fp8) elements.
std::vector<uint16_t> oracle_pack_weight(const TensorView& in, bool inverse);

}  // namespace moekit::testing
