// moekit/ops/sorting.h: token sorting by expert (SPEC 2) [moe_sorting / moe_align_block_size].
//
// Groups the (token, slot) entries of a routing result by LOCAL expert so a grouped GEMM can walk
// each expert's rows in blocks of block_m. Test: tests/test_sort_tokens.cpp (suite SortTokens);
// `moekit check --op sort_tokens`.
//
// Outputs are fixed-size and caller-allocated so the op is CUDA-graph safe (sizes depend only on
// T, k, E and block_m, never on the data): sorted_token_ids / sorted_weights hold max_padded
// entries, sorted_expert_ids holds max_blocks entries (sort_tokens_max_padded/_max_blocks below).
//
// Layout of the outputs, for entries [0, num_valid):
//   - entries are grouped by LOCAL expert ascending; inside an expert by token ascending, then by
//     slot ascending (a token that lists the same expert twice contributes two entries);
//   - each expert's run is padded with padding entries up to a multiple of block_m, so every block
//     of block_m entries belongs to exactly one expert; experts with no entries get no block;
//   - sorted_expert_ids[b] = local expert of block b, for b < num_valid / block_m.
// Past num_valid every element is still written (outputs are fully deterministic):
//   - sorted_token_ids = the padding value, sorted_weights = +0.0f,
//   - sorted_expert_ids = -1 for every unused block.
// A padding entry always has weight +0.0f.
//
// Encodings of one entry (token t, slot j), both with padding values that are never a real entry:
//   packed: (j << 24) | t      padding (k << 24) | T     needs T <= 2^24 - 1 and k <= 127, so the
//                                                         largest value (127 << 24) | (2^24 - 1)
//                                                         = 2^31 - 1 fits in i32 (never negative)
//   flat:   t * k + j          padding T * k             needs T * k <= 2^31 - 1
//
// Expert parallelism (SPEC 2): topk_ids hold GLOBAL ids in [0, Eg). At most one of
//   - expert_mask [Eg] i32, values 0/1 with sum(mask) == E: global e is local when mask[e] == 1,
//     with local index cumsum(mask)[e] - 1 (the ascending order of the kept globals); entries of
//     masked-out experts are dropped;
//   - expert_map [Eg] i32, values in [-1, E): the local index of each global expert, -1 = remote
//     (dropped). Non-negative values must be distinct (two globals on one local slot would merge
//     two experts' tokens); a local index no global maps to is allowed and simply stays empty.
// Without either, Eg == E and every expert is local. An id of -1 in topk_ids means "no expert" and
// is skipped; any other id outside [0, Eg) is an error. Host backends report it (naming token,
// slot and value) before anything is written; validate_sort_tokens() scans the ids, the mask and
// the map whenever they live on the host (device data is checked by the device kernel).
#pragma once

#include <cstddef>
#include <cstdint>

#include "moekit/core/tensor_view.h"
#include "moekit/registry.h"

namespace moekit {

enum class SortEncoding : uint8_t {
  packed,  // (slot << 24) | token ; padding = (k << 24) | T   (AITER moe_sorting)
  flat,    // token * k + slot     ; padding = T * k           (vLLM moe_align_block_size)
};
const char* sort_encoding_name(SortEncoding e);

// Largest T and k the packed encoding can hold (see the table above).
constexpr int64_t kSortPackedMaxTokens = (int64_t(1) << 24) - 1;
constexpr int64_t kSortPackedMaxTopk = 127;

struct SortTokensParams {
  TensorView topk_ids;          // [T, k] i32, contiguous: GLOBAL expert ids in [0, Eg), or -1 = none
  TensorView topk_weights;      // [T, k] f32, contiguous: copied bit-exactly into sorted_weights
  int num_experts = 0;          // E >= 1: LOCAL experts (== Eg without mask/map; == sum(mask) with
                                //   a mask; the number of local slots expert_map indexes into)
  int block_m = 1;              // >= 1: every expert's run is padded to a multiple of this
  SortEncoding encoding = SortEncoding::packed;  // how sorted_token_ids encodes (token, slot)
  TensorView expert_mask;       // [Eg] i32 0/1, optional (expert parallelism); not with expert_map
  TensorView expert_map;        // [Eg] i32 in [-1, E), optional (expert parallelism); not with mask
  TensorView sorted_token_ids;  // [max_padded] i32 out: encoded entries, then padding values
  TensorView sorted_weights;    // [max_padded] f32 out: weight of each entry, 0 for padding
  TensorView sorted_expert_ids; // [max_blocks] i32 out: local expert of each block, -1 if unused
  TensorView num_valid;         // [1] i32 out: padded length actually used (a multiple of block_m)
  TensorView error_count;       // [1] i32 out, optional: number of ids outside [-1, Eg). Device
                                //   kernels skip such ids (they are never used as an index) and
                                //   count them here; host kernels reject them before any write, so
                                //   on success they write 0
};

// Capacity of sorted_token_ids / sorted_weights. The SPEC 2 formula T*k + E*block_m - k covers the
// worst case (every expert's run one entry short of a full block) whenever E >= k. With E < k
// (expert parallelism leaving fewer local experts than k, or tiny test shapes) a token can put
// several entries on one local expert (duplicate ids), and the worst case T*k + E*(block_m - 1)
// exceeds the formula, so the larger of the two is used; for T = 0 nothing can be placed and the
// result is the formula clamped at 0. Equal to the SPEC 2 formula for every T >= 1 with E >= k.
constexpr int64_t sort_tokens_max_padded(int64_t T, int64_t k, int64_t E, int64_t block_m) {
  const int64_t spec = T * k + E * block_m - k;
  const int64_t used_experts = E < T * k ? E : T * k;  // at most T*k experts can be non-empty
  const int64_t worst = T * k + used_experts * (block_m - 1);
  const int64_t m = spec > worst ? spec : worst;
  return m > 0 ? m : 0;
}
// Capacity of sorted_expert_ids: ceil(max_padded / block_m).
constexpr int64_t sort_tokens_max_blocks(int64_t T, int64_t k, int64_t E, int64_t block_m) {
  return (sort_tokens_max_padded(T, k, E, block_m) + block_m - 1) / block_m;
}

// Sorts one routing result. Unlike most ops, T = 0 still runs the kernel: num_valid is set to 0
// and the fixed-size outputs are filled with padding, so consumers never read stale values.
Status sort_tokens(const SortTokensParams& p, const RunOptions& opts = {});
// Workspace bytes the kernel selected for these params / options needs (0 for host kernels; the
// CUDA kernel needs device scratch, passed as RunOptions::workspace).
Status sort_tokens_workspace_size(const SortTokensParams& p, const RunOptions& opts, size_t* bytes);
// Every check sort_tokens() makes before writing anything (shapes, dtypes, limits, and the data
// checks of the header comment for host-resident ids / mask / map).
Status validate_sort_tokens(const SortTokensParams& p);

}  // namespace moekit
