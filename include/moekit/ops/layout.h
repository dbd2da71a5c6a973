// moekit/ops/layout.h: weight pre-layout (SPEC 4) [shuffle_weight].
//
// shuffle_weight: bit-exact AITER (16, 16) layout. With V = 16 bytes / element size, each [N, K]
// matrix viewed as [N/16, 16, K/32, 32/V, V] is permuted to [N/16, K/32, 32/V, 16, V]:
//   dst(n, c) = (((n/16 * K/32 + c/32) * (32/V) + (c%32)/V) * 16 + n%16) * V + c%V
// Requires N % 16 == 0 and K % 32 == 0. unshuffle_weight is the exact inverse. The output view
// must carry layout = shuffled_16x16 (resp. row_major) and the input the other one.
#pragma once

#include <cstdint>

#include "moekit/core/tensor_view.h"
#include "moekit/registry.h"

namespace moekit {

struct ShuffleWeightParams {
  TensorView in;   // [..., N, K] (1-4 dims, contiguous), any dtype of 1, 2 or 4 bytes
  TensorView out;  // same shape and dtype, contiguous, must not alias `in`
};

// Closed-form element offset inside one [N, K] matrix (SPEC 4). elem_bytes in {1, 2, 4}.
constexpr int64_t shuffle_index(int64_t n, int64_t c, int64_t K, int elem_bytes) {
  const int64_t V = 16 / elem_bytes;
  return (((n / 16 * (K / 32) + c / 32) * (32 / V) + (c % 32) / V) * 16 + n % 16) * V + c % V;
}

Status shuffle_weight(const ShuffleWeightParams& p, const RunOptions& opts = {});
Status unshuffle_weight(const ShuffleWeightParams& p, const RunOptions& opts = {});
Status validate_shuffle_weight(const ShuffleWeightParams& p, bool inverse);

}  // namespace moekit
