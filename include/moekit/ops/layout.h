// moekit/ops/layout.h: weight pre-layout (SPEC 4) [shuffle_weight].
//
// shuffle_weight: bit-exact AITER (16, 16) layout. With V = 16 bytes / element size (f32: 4,
// bf16/f16: 8, fp8: 16), each [N, K] matrix viewed as [N/16, 16, K/32, 32/V, V] is permuted to
// [N/16, K/32, 32/V, 16, V] and stored contiguously with the same shape:
//   dst(n, c) = (((n/16 * K/32 + c/32) * (32/V) + (c%32)/V) * 16 + n%16) * V + c%V
// i.e. every 16 rows x 32 columns tile becomes 32/V runs of (16 rows x V columns) each 16 x 16
// bytes, tiles ordered row-block major. Leading dims (experts, ...) are independent matrices.
// unshuffle_weight is the exact inverse.
//
// Contract (validated before anything is written; messages name the argument and the value):
//   - in / out: 2-4 dims [..., N, K] (a 1-D tensor has no N and is rejected), contiguous, the same
//     shape and dtype (any dtype: elements of 1, 2 or 4 bytes are moved as raw bits), same device.
//   - N % 16 == 0 and K % 32 == 0.
//   - shuffle_weight: in.layout == row_major and out.layout == shuffled_16x16; unshuffle_weight:
//     the reverse. The tag travels with the tensor so a shuffled weight is never read as plain.
//   - out must not overlap in (the permutation is not in-place).
//   - a tensor with no elements returns at once.
// Test: tests/test_shuffle_weight.cpp (suites ShuffleWeight, UnshuffleWeight).
#pragma once

#include <cstdint>

#include "moekit/core/tensor_view.h"
#include "moekit/registry.h"

namespace moekit {

// Tile of the (16, 16) layout: rows per tile, and bytes per row segment (so V = 16 / elem_bytes).
constexpr int64_t kShuffleTileN = 16;
constexpr int64_t kShuffleTileK = 32;
constexpr int64_t kShuffleVecBytes = 16;

struct ShuffleWeightParams {
  TensorView in;   // [..., N, K] (2-4 dims, contiguous), any dtype (1, 2 or 4 bytes per element);
                   //   layout row_major (shuffle) or shuffled_16x16 (unshuffle)
  TensorView out;  // same shape and dtype, contiguous, the other layout tag; must not overlap `in`
};

// Closed-form element offset inside one [N, K] matrix (SPEC 4). elem_bytes in {1, 2, 4}.
constexpr int64_t shuffle_index(int64_t n, int64_t c, int64_t K, int elem_bytes) {
  const int64_t V = kShuffleVecBytes / elem_bytes;
  return (((n / 16 * (K / 32) + c / 32) * (32 / V) + (c % 32) / V) * 16 + n % 16) * V + c % V;
}
static_assert(shuffle_index(0, 8, 32, 2) == 128, "bf16: column 8 starts the second 16x8 run");
static_assert(shuffle_index(1, 0, 32, 1) == 16, "fp8: row 1 follows row 0's 16-byte vector");

Status shuffle_weight(const ShuffleWeightParams& p, const RunOptions& opts = {});
Status unshuffle_weight(const ShuffleWeightParams& p, const RunOptions& opts = {});
// inverse = false: the shuffle_weight contract; true: the unshuffle_weight contract.
Status validate_shuffle_weight(const ShuffleWeightParams& p, bool inverse);

}  // namespace moekit
