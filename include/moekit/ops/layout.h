// moekit/ops/layout.h: weight pre-layout (SPEC 4) [shuffle_weight, pack_weight].
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

// ---------------------------------------------------------------- pack_weight / unpack_weight
// pack_weight: row-major weights -> a kernel-specific packed layout named by out.layout (the
// target); unpack_weight: the exact inverse (the packed layout named by in.layout). Done once at
// load; the tag travels with the tensor, so a packed weight is never read as plain. Targets:
//   cpu_vnni2_n32 (the AVX-512 BF16 fused_moe kernel, fused_moe_avx512_bf16): each [N, K] matrix
//     becomes panels of 32 rows; inside a panel, K-pairs outermost, then the 32 rows, then the
//     pair, i.e. [N/32][K/2][32][2]:
//       dst(n, c) = ((n/32 * K/2 + c/2) * 32 + n%32) * 2 + c%2
//     so one 64-byte vector holds 16 rows x one K-pair (the operand of vdpbf16ps), and a panel is
//     read front to back as K advances.
// Contract (validated before anything is written; messages name the argument and the value):
//   - in / out: 2-4 dims [..., N, K], contiguous, the same shape and dtype, same device; dtype
//     bf16, f16 (K-pairs of 4 bytes) or fp8 e4m3fn / e4m3fnuz (2 bytes), moved as raw bits.
//   - cpu_vnni2_n32: N % 32 == 0 and K % 2 == 0.
//   - pack_weight: in.layout == row_major, out.layout a packed layout (cpu_vnni2_n32);
//     unpack_weight: in.layout packed, out.layout == row_major.
//   - out must not overlap in. A tensor with no elements returns at once.
// Test: tests/test_pack_weight.cpp (suites PackWeight, UnpackWeight).
constexpr int64_t kVnniPanelN = 32;  // rows per cpu_vnni2_n32 panel
constexpr int64_t kVnniPairK = 2;    // K elements per VNNI pair

struct PackWeightParams {
  TensorView in;   // [..., N, K] (2-4 dims, contiguous), bf16 or f16; row_major (pack) or packed (unpack)
  TensorView out;  // same shape and dtype, contiguous; the target layout (pack) or row_major (unpack);
                   //   must not overlap `in`
};

// Element offset of (n, c) inside one packed [N, K] matrix of layout cpu_vnni2_n32.
constexpr int64_t vnni2_index(int64_t n, int64_t c, int64_t K) {
  return ((n / kVnniPanelN * (K / kVnniPairK) + c / kVnniPairK) * kVnniPanelN + n % kVnniPanelN) * kVnniPairK +
         c % kVnniPairK;
}
static_assert(vnni2_index(0, 1, 8) == 1, "the pair partner follows");
static_assert(vnni2_index(1, 0, 8) == 2, "row 1 follows row 0's pair");
static_assert(vnni2_index(0, 2, 8) == 64, "the next K-pair follows the 32 rows");
static_assert(vnni2_index(32, 0, 8) == 256, "panel 1 follows panel 0 (32 x 8 elements)");

Status pack_weight(const PackWeightParams& p, const RunOptions& opts = {});
Status unpack_weight(const PackWeightParams& p, const RunOptions& opts = {});
// inverse = false: the pack_weight contract; true: the unpack_weight contract.
Status validate_pack_weight(const PackWeightParams& p, bool inverse);

}  // namespace moekit
