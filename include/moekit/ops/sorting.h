// moekit/ops/sorting.h: token sorting by expert (SPEC 2) [moe_sorting / moe_align_block_size].
//
// Outputs are fixed-size and caller-allocated so the op is CUDA-graph safe:
//   max_padded = T*k + E*block_m - k, max_blocks = ceil(max_padded / block_m).
// Entries are grouped by LOCAL expert ascending, inside an expert by token ascending then slot;
// each expert's run is padded to a multiple of block_m; experts with no entries get no block.
// Entries past num_valid are padding too (ids = padding value, weights 0, expert ids -1... see
// docs/ops.md).
#pragma once

#include <cstdint>

#include "moekit/core/tensor_view.h"
#include "moekit/registry.h"

namespace moekit {

enum class SortEncoding : uint8_t {
  packed,  // (slot << 24) | token ; padding = (k << 24) | T
  flat,    // token * k + slot     ; padding = T * k
};
const char* sort_encoding_name(SortEncoding e);

struct SortTokensParams {
  TensorView topk_ids;          // [T, k] i32 GLOBAL expert ids in [-1, Eg); -1 = no expert
  TensorView topk_weights;      // [T, k] f32
  int num_experts = 0;          // E: local experts (== Eg without mask/map; == sum(mask) with a mask;
                                //    == number of local slots of expert_map)
  int block_m = 1;              // block size the runs are padded to (>= 1)
  SortEncoding encoding = SortEncoding::packed;
  TensorView expert_mask;       // [Eg] i32 0/1, optional (expert parallelism)
  TensorView expert_map;        // [Eg] i32 local index or -1, optional (not both with mask)
  TensorView sorted_token_ids;  // [max_padded] i32 out
  TensorView sorted_weights;    // [max_padded] f32 out
  TensorView sorted_expert_ids; // [max_blocks] i32 out: local expert of each block
  TensorView num_valid;         // [1] i32 out: padded length actually used
};

constexpr int64_t sort_tokens_max_padded(int64_t T, int64_t k, int64_t E, int64_t block_m) {
  return T * k + E * block_m - k;
}
constexpr int64_t sort_tokens_max_blocks(int64_t T, int64_t k, int64_t E, int64_t block_m) {
  return (sort_tokens_max_padded(T, k, E, block_m) + block_m - 1) / block_m;
}

Status sort_tokens(const SortTokensParams& p, const RunOptions& opts = {});
Status validate_sort_tokens(const SortTokensParams& p);

}  // namespace moekit
